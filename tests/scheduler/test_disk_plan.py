"""The disk in the plan: misses of the host feature cache hold the disk in the simulator and their reads take CPU
time on the shared cores, and the planner chooses the cache size, the feature store's I/O threads and the core split
(checked against every candidate simulated)."""
from __future__ import annotations

import dataclasses
import random

import pytest

from morphpipe.commands.cli import main
from morphpipe.partitioner import Partitioner, PhaseTimes, best_lower_bound, lower_bound
from morphpipe.partitioner.cores import even_core_split, split_cores
from morphpipe.profiler.disk import DiskProfile, DiskReadFacts, IoThreadsRate
from morphpipe.profiler.profile import Profile
from morphpipe.scheduler import Plan, Scheduler, plan_from_profile, simulate_plan
from morphpipe.scheduler.planning import CACHE_TOLERANCE, TOLERANCE
from morphpipe.scheduler.whatif import what_if

ROW_BYTES = 256
NUM_ROWS = 100_000


def disk_profile(reads_per_s: float = 50_000.0, rows_per_batch: float = 4_000.0,
                 budget: int = NUM_ROWS * ROW_BYTES // 2) -> DiskProfile:
    """A power-law-like hit curve: the hottest rows serve most of what batches gather."""
    sizes = [0, 25_600, 256_000, 1_280_000, 2_560_000, 6_400_000, 12_800_000, 25_600_000]
    ratios = [0.0, 0.15, 0.4, 0.62, 0.72, 0.85, 0.93, 1.0]
    facts = DiskReadFacts("features.npy", 4096, 48, reads_per_s, 2e9, 4 << 20)
    return DiskProfile(facts, ROW_BYTES, NUM_ROWS, rows_per_batch, 1.0, tuple(zip(sizes, ratios)), budget)


def profiles() -> list[Profile]:
    cpu = Profile.synthetic(t_cb=0.08, t_m=0.05, cores=4, cpu_efficiency=0.8, num_batches=60, cv=0.2)
    cuda = Profile.synthetic(t_cb=0.05, t_m=0.01, t_gb=0.02, t_dma=0.004, cores=8, num_batches=80)
    return [cpu.replaced(disk=disk_profile()), cuda.replaced(disk=disk_profile(reads_per_s=200_000.0)),
            cpu.replaced(disk=disk_profile(reads_per_s=5e6)),  # a fast disk: a small cache suffices
            cuda.replaced(disk=disk_profile(budget=1_000_000))]  # a budget below most measured sizes


def test_an_epoch_with_every_row_cached_equals_the_model_without_the_disk() -> None:
    for profile in profiles() + route_1_profiles():  # neither route reads anything
        every_row = NUM_ROWS * ROW_BYTES
        cached = plan_from_profile(profile, cache_bytes=every_row)
        in_ram = plan_from_profile(profile.replaced(disk=None))
        assert cached.tiering is not None and cached.tiering.hit_ratio == 1.0 and cached.tiering.disk_read_s == 0.0
        assert cached.tiering.gpu_read_s == 0.0
        assert cached.predicted_epoch_s == in_ram.predicted_epoch_s
        assert (cached.n_cpu, cached.cpu_threads, cached.train_threads) == (in_ram.n_cpu, in_ram.cpu_threads,
                                                                            in_ram.train_threads)


def test_misses_hold_the_disk_and_lengthen_the_epoch() -> None:
    profile = profiles()[0]
    no_cache = plan_from_profile(profile, cache_bytes=0)
    half = plan_from_profile(profile, cache_bytes=2_560_000)
    in_ram = plan_from_profile(profile.replaced(disk=None))
    assert no_cache.predicted_epoch_s > half.predicted_epoch_s > in_ram.predicted_epoch_s
    # Without a cache every row a batch gathers is a read: the disk alone needs this long for the epoch.
    reads = profile.num_batches * 4_000 / 50_000.0
    assert no_cache.predicted_epoch_s >= reads and no_cache.busy["disk"] > 0.9
    assert "disk" not in in_ram.busy


def test_the_planner_chooses_the_cache_an_exhaustive_search_chooses() -> None:
    for profile in profiles():
        plan = plan_from_profile(profile, engine="fast")
        candidates = profile.disk.cache_candidates()
        epochs = {size: plan_from_profile(profile, engine="fast", cache_bytes=size).predicted_epoch_s
                  for size in candidates}
        assert all(epochs[a] >= epochs[b] for a, b in zip(candidates, candidates[1:]))  # more cache never hurts
        best = min(epochs.values())
        expected = min(size for size, epoch in epochs.items() if epoch <= best * (1.0 + CACHE_TOLERANCE))
        assert plan.tiering.cache_bytes == expected <= profile.disk.cache_budget_bytes
        assert plan.predicted_epoch_s == epochs[expected]
        assert len(plan.tiering.candidates_s) < len(candidates) or len(candidates) <= 3  # bisection, not every size


def test_plan_and_profile_keep_the_tiering_through_json() -> None:
    profile = profiles()[1]
    assert Profile.from_dict(profile.to_dict()) == profile
    plan = plan_from_profile(profile)
    again = Plan.from_dict(plan.to_dict())
    assert again.tiering == plan.tiering and "features on disk" in again.describe()
    assert simulate_plan(profile, again).epoch_s == pytest.approx(plan.predicted_epoch_s)


def test_a_bad_hit_curve_is_refused_with_the_field_named() -> None:
    data = profiles()[0].to_dict()
    data["disk"]["hit_curve"][2]["hit_ratio"] = 0.01
    with pytest.raises(ValueError, match="hit ratios must lie in"):
        Profile.from_dict(data)


@pytest.mark.parametrize("seed", range(12))
def test_no_simulated_epoch_beats_its_lower_bound_with_the_disk(seed: int) -> None:
    rng = random.Random(seed)
    times = PhaseTimes(rng.randint(1, 60), rng.uniform(0.05, 2), rng.randint(1, 8), rng.uniform(0.05, 2),
                       rng.uniform(0.05, 2), rng.uniform(0.05, 2), *([rng.choice([0.0, 0.3])] * 4),
                       disk_read_s=rng.uniform(0.01, 2), gpu_read_s=rng.choice([0.0, rng.uniform(0.01, 2)]))
    scheduler = Scheduler(times, seed)
    bounds = scheduler.lower_bounds()
    for n_cpu in {0, times.num_batches, rng.randint(0, times.num_batches)}:
        result = scheduler.simulate(Partitioner(times, 4).split(n_cpu), engine="fast")
        assert result.epoch_s >= bounds[n_cpu] * (1 - 1e-12)
        if times.cpu_batch_cv == 0.0:  # the closed form holds for the phase times themselves, not drawn ones
            assert result.epoch_s >= lower_bound(times, n_cpu) * (1 - 1e-12)


def test_the_closed_form_bound_counts_the_disk_and_the_executors_wait() -> None:
    # n = 10, P = 2: without the disk LB(n_c) = max(n_c, 10 - n_c + 1, ...) is least at n_c = 5 or 6 (about 6 s)
    times = PhaseTimes(10, 1.0, 2, 0.1, 1.0, 0.1)
    assert best_lower_bound(times).value_s == pytest.approx(6.0)
    on_disk = dataclasses.replace(times, disk_read_s=2.0, gpu_read_s=0.5)
    # CPU 2 n_c; disk 2 n_c + 0.5 (10 - n_c); executor 1.5 (10 - n_c): the disk and the executor cross at n_c = 10/3
    assert lower_bound(on_disk, 3) == pytest.approx(max(2 * 3 + 0.5 * 7, 1.5 * 7))
    assert lower_bound(on_disk, 0) == pytest.approx(15.0)  # the executor: ten reads and ten UVA batches in turn
    assert lower_bound(on_disk, 5) == pytest.approx(2 * 5 + 0.5 * 5)  # the disk binds: above CPU 10, executor 7.5
    best = best_lower_bound(on_disk)
    assert best.value_s == pytest.approx(min(lower_bound(on_disk, k) for k in range(11)))
    assert best.value_s > best_lower_bound(times).value_s


def test_a_cpu_only_plans_bound_counts_the_disk() -> None:
    # a slow disk binds: the cores' bound alone (n * max(T_CB, T_M)) would be far below the epoch
    profile = profiles()[0].replaced(disk=disk_profile(reads_per_s=5_000.0))
    plan = plan_from_profile(profile, engine="fast")
    reads = profile.num_batches * profile.disk.read_s_per_batch(plan.tiering.cache_bytes, plan.tiering.io_threads)
    assert plan.lower_bound_s >= reads * (1 - 1e-12)
    assert plan.lower_bound_s <= plan.predicted_epoch_s * (1 + 1e-9)
    assert plan.busy["disk"] > 0.9


def test_what_ifs_more_ram_and_a_faster_disk_shorten_the_predicted_epoch() -> None:
    profile = profiles()[0].replaced(disk=dataclasses.replace(disk_profile(), resident_bytes=1_000_000))
    base = plan_from_profile(profile, engine="fast")
    more_ram = plan_from_profile(what_if(profile, memory=2.0).profile, engine="fast")
    less_ram = plan_from_profile(what_if(profile, memory=0.5).profile, engine="fast")
    faster_disk = plan_from_profile(what_if(profile, disk_speed=4.0).profile, engine="fast")
    budget = profile.disk.cache_budget_bytes
    assert more_ram.tiering.cache_budget_bytes == 2 * (budget + 1_000_000) - 1_000_000
    assert less_ram.tiering.cache_budget_bytes == (budget + 1_000_000) // 2 - 1_000_000
    assert more_ram.predicted_epoch_s < base.predicted_epoch_s < less_ram.predicted_epoch_s
    assert more_ram.tiering.hit_ratio > base.tiering.hit_ratio
    assert faster_disk.predicted_epoch_s < base.predicted_epoch_s
    assert faster_disk.tiering.cache_bytes <= base.tiering.cache_bytes  # a faster disk needs no larger cache
    with pytest.raises(ValueError, match="--ram-scale needs a profile with features on disk"):
        what_if(profile.replaced(disk=None), memory=2.0)


def test_simulate_answers_the_disk_what_ifs(tmp_path, capsys) -> None:
    path = tmp_path / "profile.json"
    profiles()[0].save(path)
    assert main(["simulate", str(path), "--ram-scale", "2", "--disk-speed", "4"]) == 0
    out = capsys.readouterr().out
    assert "what-if: 2x the memory: feature cache budget 12.8 MB -> 25.6 MB" in out
    assert "what-if: a disk 4x as fast: 50,000 -> 200,000 random reads/s" in out
    assert "at 4 cores: features on disk behind a host cache of" in out


def test_hit_ratio_between_and_beyond_measured_sizes() -> None:
    disk = disk_profile()
    assert disk.hit_ratio(0) == 0.0 and disk.hit_ratio(256_000) == 0.4
    assert disk.hit_ratio(768_000) == pytest.approx(0.4 + 0.22 * 512_000 / 1_024_000)  # between 256 kB and 1.28 MB
    assert disk.hit_ratio(NUM_ROWS * ROW_BYTES) == 1.0
    short = dataclasses.replace(disk, hit_curve=disk.hit_curve[:3])  # measured up to 256 kB (0.4)
    assert short.hit_ratio(256_000 + (NUM_ROWS * ROW_BYTES - 256_000) // 2) == pytest.approx(0.7)  # towards 1 at all
    assert disk.read_s_per_batch(256_000) == pytest.approx(4_000 * 0.6 / 50_000.0)


IO_CURVE = (IoThreadsRate(1, 4_000.0, 20e-6), IoThreadsRate(4, 12_000.0, 25e-6), IoThreadsRate(16, 30_000.0, 40e-6),
            IoThreadsRate(48, 40_000.0, 80e-6))


def io_profiles() -> list[Profile]:
    """Profiles whose I/O threads trade a deeper queue (faster reads) for more CPU per read on the shared cores."""
    with_curve = dataclasses.replace(disk_profile(reads_per_s=40_000.0), io_curve=IO_CURVE, io_threads=48)
    cpu = Profile.synthetic(t_cb=0.08, t_m=0.05, cores=4, cpu_efficiency=0.8, num_batches=40, cv=0.2)
    cuda = Profile.synthetic(t_cb=0.05, t_m=0.01, t_gb=0.02, t_dma=0.004, cores=8, num_batches=50)
    return [cpu.replaced(disk=with_curve), cuda.replaced(disk=with_curve),
            cpu.replaced(disk=dataclasses.replace(with_curve, cache_budget_bytes=1_000_000)),
            cpu.replaced(disk=sized_disk()),  # room for a cache whose misses take short reads
            cuda.replaced(disk=dataclasses.replace(sized_disk(), cache_budget_bytes=0))]  # long reads: no cache


# The store's reads timed at two sizes: short reads gain from threads up to 48, long ones (their bytes' transfer)
# stop gaining at 16, and their CPU per read is a little higher.
SIZED_CURVE = (*(dataclasses.replace(point, read_bytes=4096.0) for point in IO_CURVE),
               IoThreadsRate(1, 2_500.0, 30e-6, 65536.0), IoThreadsRate(4, 6_000.0, 32e-6, 65536.0),
               IoThreadsRate(16, 8_000.0, 45e-6, 65536.0), IoThreadsRate(48, 7_600.0, 85e-6, 65536.0))
# A small cache's dense misses coalesce into long reads, a large cache's sparse ones are a page each.
SIZED_READ_BYTES = (65536.0, 65536.0, 32768.0, 16384.0, 8192.0, 4096.0, 4096.0, 4096.0)


def sized_rate(read_bytes: float, io_threads: int) -> float:
    """SIZED_CURVE's reads per second at a timed count, reads of `read_bytes`: time per read linear in the size."""
    short, long = (next(p.reads_per_s for p in SIZED_CURVE if (p.read_bytes, p.io_threads) == (size, io_threads))
                   for size in (4096.0, 65536.0))
    share = (min(max(read_bytes, 4096.0), 65536.0) - 4096.0) / (65536.0 - 4096.0)
    return 1.0 / ((1 - share) / short + share / long)


def sized_disk() -> DiskProfile:
    """A disk profile whose I/O curve was timed at the reads' sizes (4 KiB and 64 KiB), its read rates at 48
    threads those of each cache size's reads (rows coalesce into the long reads: fewer reads per missed row)."""
    return dataclasses.replace(disk_profile(), io_curve=SIZED_CURVE, io_threads=48,
                               read_bytes_curve=SIZED_READ_BYTES,
                               reads_per_s_curve=tuple(sized_rate(size, 48) for size in SIZED_READ_BYTES),
                               reads_per_miss_curve=(1 / 16, 1 / 16, 1 / 8, 1 / 4, 0.35, 0.6, 1.0, 1.0))


def exhaustive_epochs(profile: Profile, size: int, count: int) -> float:
    """The shortest simulated epoch (fast engine) over every core split (CPU-only) or CPU:GPU split, at a cache of
    `size` bytes read by `count` I/O threads."""
    if profile.device == "cpu":
        splits = [*split_cores(profile), even_core_split(profile.cores)]
        return min(Scheduler.from_profile(profile, 0, s.batch_threads, s.train_threads, size, count)
                   .simulate_cpu_only(10, s.shared_core, engine="fast").epoch_s for s in splits)
    scheduler = Scheduler.from_profile(profile, 0, None, None, size, count)
    partitioner = Partitioner(scheduler.times, 10, 10**9)
    return min(scheduler.simulate(partitioner.split(k), engine="fast").epoch_s
               for k in range(profile.num_batches + 1))


def check_fewest_io_threads_within_tolerance(profile: Profile, disk: DiskProfile):
    """Asserts the planner keeps the fewest I/O threads whose exhaustively simulated epoch (no cache) is within the
    tolerance of the fastest; returns the plan, those epochs by thread count and the fastest."""
    plan = plan_from_profile(profile, engine="fast")
    epochs = {count: exhaustive_epochs(profile, 0, count) for count in disk.io_thread_counts()}
    fastest = min(epochs.values())
    assert plan.tiering.io_threads == min(count for count, epoch in epochs.items()
                                          if epoch <= fastest * (1.0 + TOLERANCE))
    return plan, epochs, fastest


def test_the_planner_chooses_cache_io_threads_and_core_split_as_an_exhaustive_search_does() -> None:
    for profile in io_profiles():
        plan = plan_from_profile(profile, engine="fast")
        sizes, counts = profile.disk.cache_candidates(), profile.disk.io_thread_counts()
        epochs = {(size, count): exhaustive_epochs(profile, size, count) for size in sizes for count in counts}
        best_at = {size: min(epochs[size, count] for count in counts) for size in sizes}
        expected = min(size for size in sizes if best_at[size] <= best_at[sizes[-1]] * (1.0 + CACHE_TOLERANCE))
        assert plan.tiering.cache_bytes == expected
        assert plan.predicted_epoch_s <= best_at[expected] * (1.0 + TOLERANCE)
        # The fewest I/O threads within the planner's tolerance of the fastest (each count's plan is itself within
        # it of that count's exhaustive best).
        fastest = min(epochs[expected, count] for count in counts)
        assert epochs[expected, plan.tiering.io_threads] <= fastest * (1.0 + TOLERANCE) ** 2
        fewer = [count for count in counts if count < plan.tiering.io_threads]
        assert all(epochs[expected, count] > fastest for count in fewer)  # fewer threads: beyond the tolerance
        # Neither the most nor the fewest I/O threads win everywhere: the cores pay for every read.
        assert len({min(counts, key=lambda count: epochs[size, count]) for size in sizes}) > 1 or \
            plan.tiering.io_threads not in (counts[0], counts[-1])
        assert plan.tiering.read_cpu_s == pytest.approx(
            profile.disk.read_cpu_s_per_batch(plan.tiering.cache_bytes, plan.tiering.io_threads))


def test_reads_cost_the_cores_cpu_time_and_a_deeper_queue_reads_faster() -> None:
    disk = dataclasses.replace(disk_profile(reads_per_s=40_000.0), io_curve=IO_CURVE, io_threads=48)
    misses = 4_000 * 0.6  # rows a batch misses with 256 kB cached (hit ratio 0.4), one pread each
    assert disk.read_s_per_batch(256_000) == disk.read_s_per_batch(256_000, 48) == pytest.approx(misses / 40_000.0)
    assert disk.read_s_per_batch(256_000, 4) == pytest.approx(misses / 12_000.0)
    assert disk.read_s_per_batch(256_000, 10) == pytest.approx(misses / 21_000.0)  # between 4 and 16 threads
    assert disk.read_cpu_s_per_batch(256_000, 16) == pytest.approx(misses * 40e-6)
    assert disk_profile().read_cpu_s_per_batch(256_000) == 0.0  # not measured: no CPU charged, as before
    cpu = io_profiles()[0]
    at_16 = PhaseTimes.from_profile(cpu, 2, 2, 256_000, 16)
    unread = PhaseTimes.from_profile(cpu.replaced(disk=None), 2, 2)
    # The batching thread's core serves its reads while it waits for the disk: only the CPU time beyond that wait
    # (40 us a read against 33 us of the disk's) lands on the 2 batching cores; at 4 threads (25 us against 83 us)
    # the wait hides all of it.
    assert at_16.disk_read_s == pytest.approx(misses / 30_000.0)
    assert at_16.cpu_batch_s == pytest.approx(unread.cpu_batch_s + (misses * 40e-6 - misses / 30_000.0) / 2)
    assert PhaseTimes.from_profile(cpu, 2, 2, 256_000, 4).cpu_batch_s == pytest.approx(unread.cpu_batch_s)


# mag's curve, timed on sparse misses (short reads): the disk gains little past 24 threads.
SHORT_READS_CURVE = (IoThreadsRate(12, 70_000.0, 8.4e-6), IoThreadsRate(24, 116_000.0, 8.0e-6),
                     IoThreadsRate(48, 120_000.0, 6.8e-6), IoThreadsRate(96, 127_000.0, 8.5e-6))


def test_more_io_threads_shorten_a_reads_queue_wait_not_its_transfer() -> None:
    # mag's batches without a cache: coalesced reads of ~130 kB, 8.5k a second at 48 threads. A read's wait in the
    # queue, the curve's 1/120k s at 48 threads, becomes its 1/127k s at 96; the rest of the read stays.
    long_reads = dataclasses.replace(disk_profile(reads_per_s=8_500.0), io_curve=SHORT_READS_CURVE, io_threads=48)
    assert long_reads.reads_per_s_at(0, 96) == pytest.approx(1 / (1 / 8_500 - 1 / 120_000 + 1 / 127_000))
    assert long_reads.reads_per_s_at(0, 12) == pytest.approx(1 / (1 / 8_500 - 1 / 120_000 + 1 / 70_000))
    assert long_reads.reads_per_s_at(0, 48) == long_reads.reads_per_s_at(0) == pytest.approx(8_500.0)
    # Reads as short as the curve's (or shorter) are all wait: their rate scales as the curve's.
    for rate in (120_000.0, 200_000.0):
        short_reads = dataclasses.replace(long_reads, facts=dataclasses.replace(long_reads.facts,
                                                                                random_reads_per_s=rate))
        assert short_reads.reads_per_s_at(0, 96) == pytest.approx(rate * 127 / 120)


def test_the_planner_does_not_buy_more_io_threads_for_reads_the_disk_transfers() -> None:
    # Disk-bound, no room for a cache: 4,000 coalesced reads a batch at 8.5k a second. Scaled whole along the curve,
    # 96 threads read 6% faster than 48 and were chosen (mag measured them 10-17% slower); their gain on these long
    # reads is 0.4%, within the tolerance, so the fewer threads are kept. Below 24 the wait grows enough to matter.
    disk = dataclasses.replace(disk_profile(reads_per_s=8_500.0, budget=0), io_curve=SHORT_READS_CURVE,
                               io_threads=48)
    profile = Profile.synthetic(t_cb=0.02, t_m=0.02, cores=2, cpu_efficiency=0.8, num_batches=30).replaced(disk=disk)
    plan, epochs, fastest = check_fewest_io_threads_within_tolerance(profile, disk)
    assert plan.tiering.io_threads in (24, 48) and epochs[12] > fastest * (1.0 + TOLERANCE)


def test_a_read_between_the_timed_sizes_is_priced_between_them() -> None:
    disk = sized_disk()
    assert disk.io_read_sizes() == [4096.0, 65536.0] and disk.io_thread_counts() == [1, 4, 16, 48]
    # At a timed size and count: the timed point; between sizes, time per read linear in the size (at 16 threads:
    # 1/30k s at 4 KiB, 1/8k s at 64 KiB); between counts, the rate linear in the count at each size first.
    assert disk.io_rate(16, 4096.0) == 30_000.0 and disk.io_rate(16, 65536.0) == 8_000.0
    assert disk.io_rate(16, 16384.0) == pytest.approx(1 / (0.8 / 30_000 + 0.2 / 8_000))
    assert disk.io_rate(10, 34816.0) == pytest.approx(1 / (0.5 / 21_000 + 0.5 / 7_000))
    assert disk.io_rate(16, 1024.0) == 30_000.0 and disk.io_rate(16, 1 << 20) == 8_000.0  # the nearest size beyond
    assert disk.io_cpu_s_per_read(16, 34816.0) == pytest.approx((40e-6 + 45e-6) / 2)
    # A cache's reads are priced at their size: 256 kB cached leaves 32 KiB reads, timed at 48 threads at the rate
    # the curve gives them there, so at 16 threads they take the curve's time there (all of a read is its wait).
    assert disk.read_bytes_at(256_000) == 32768.0 and disk.read_bytes_at(768_000) == pytest.approx(24576.0)
    for cache_bytes in (0, 256_000, 768_000, 6_400_000):
        size = disk.read_bytes_at(cache_bytes)
        for count in (1, 4, 10, 16, 48):
            assert disk.reads_per_s_at(cache_bytes, count) == pytest.approx(
                disk.reads_per_s_at(cache_bytes) * disk.io_rate(count, size) / disk.io_rate(48, size))
    assert disk.reads_per_s_at(0, 16) == pytest.approx(8_000.0 / 7_600.0 * disk.reads_per_s_at(0))
    assert disk.reads_per_s_at(0, 48) < disk.reads_per_s_at(0, 16)  # long reads: 48 threads slower than 16
    assert disk.reads_per_s_at(6_400_000, 48) > disk.reads_per_s_at(6_400_000, 16)  # short reads: faster
    misses = 4_000 * (1 - 0.4) * disk.reads_per_miss_at(256_000)
    assert disk.read_cpu_s_per_batch(256_000, 16) == pytest.approx(misses * disk.io_cpu_s_per_read(16, 32768.0))


def test_the_size_of_the_reads_moves_the_planners_io_threads() -> None:
    # No cache: 64 KiB reads, which gain nothing past 16 threads. Priced on the curve at their size the plan keeps
    # 16 threads, the exhaustive search's choice; priced on the short reads' curve alone it took 48.
    profile = io_profiles()[4]
    plan = plan_from_profile(profile, engine="fast")
    epochs = {count: exhaustive_epochs(profile, 0, count) for count in profile.disk.io_thread_counts()}
    assert plan.tiering.io_threads == min(epochs, key=epochs.get) == 16
    short_only = profile.replaced(disk=dataclasses.replace(profile.disk, io_curve=IO_CURVE, read_bytes_curve=()))
    assert plan_from_profile(short_only, engine="fast").tiering.io_threads == 48


def test_on_long_reads_the_planner_keeps_the_threads_the_curve_at_their_size_favours() -> None:
    # Disk-bound, no room for a cache, mag's long reads (130 kB, 8.5k a second at 48 threads). Timed at their own
    # size as well as on short reads, 96 threads read them slower than 48 (as mag's batches measured); the plan
    # keeps the count an exhaustive search of the simulator keeps, and it is not 96.
    long_curve = (IoThreadsRate(12, 7_000.0, 9e-6, 130e3), IoThreadsRate(24, 8_300.0, 8.5e-6, 130e3),
                  IoThreadsRate(48, 8_500.0, 7.5e-6, 130e3), IoThreadsRate(96, 7_900.0, 9e-6, 130e3))
    curve = (*(dataclasses.replace(point, read_bytes=4096.0) for point in SHORT_READS_CURVE), *long_curve)
    disk = dataclasses.replace(disk_profile(reads_per_s=8_500.0, budget=0), io_curve=curve, io_threads=48,
                               read_bytes_curve=(130e3,) * 8)
    profile = Profile.synthetic(t_cb=0.02, t_m=0.02, cores=2, cpu_efficiency=0.8, num_batches=30).replaced(disk=disk)
    assert disk.reads_per_s_at(0, 96) == pytest.approx(7_900.0) and disk.reads_per_s_at(0, 12) == pytest.approx(7_000.0)
    plan, epochs, fastest = check_fewest_io_threads_within_tolerance(profile, disk)
    assert plan.tiering.io_threads in (24, 48) and epochs[96] > fastest * (1.0 + TOLERANCE)
    # Priced from the short reads' curve alone, 96 threads came out 0.4% faster than 48 (within the tolerance).
    short_only = dataclasses.replace(disk, io_curve=SHORT_READS_CURVE, read_bytes_curve=())
    assert short_only.reads_per_s_at(0, 96) > short_only.reads_per_s_at(0, 48)


def test_old_profiles_without_read_sizes_load_and_price_as_before() -> None:
    profile = io_profiles()[0]
    data = profile.to_dict()
    for point in data["disk"]["io_curve"]:  # what a profile saved before the read sizes were timed holds
        del point["read_bytes"]
    assert all("read_bytes" not in point for point in data["disk"]["hit_curve"])
    old = Profile.from_dict(data)
    assert old == profile and old.disk.io_read_sizes() == [None] and old.disk.read_bytes_at(0) is None
    assert old.disk.reads_per_s_at(256_000, 4) == pytest.approx(40_000.0 * 12_000 / 40_000)
    sized = io_profiles()[3]
    assert Profile.from_dict(sized.to_dict()) == sized  # the sizes go through JSON
    assert [point["read_bytes"] for point in sized.to_dict()["disk"]["hit_curve"]] == list(SIZED_READ_BYTES)


def test_a_bad_sized_io_curve_is_refused_with_the_field_named() -> None:
    disk = sized_disk()
    with pytest.raises(ValueError, match="read_bytes at every point or at none"):
        dataclasses.replace(disk, io_curve=(*IO_CURVE, *SIZED_CURVE[4:]))
    with pytest.raises(ValueError, match="ordered by read_bytes"):
        dataclasses.replace(disk, io_curve=(*SIZED_CURVE[4:], *SIZED_CURVE[:4]))
    with pytest.raises(ValueError, match="the same at every read size"):
        dataclasses.replace(disk, io_curve=SIZED_CURVE[:7])
    with pytest.raises(ValueError, match="needs read_bytes_curve"):
        dataclasses.replace(disk, read_bytes_curve=())
    data = io_profiles()[3].to_dict()
    data["disk"]["io_curve"][5]["read_bytes"] = -1.0
    with pytest.raises(ValueError, match=r"io_curve\[5\]\.read_bytes"):
        Profile.from_dict(data)
    data = io_profiles()[3].to_dict()
    del data["disk"]["hit_curve"][3]["read_bytes"]
    with pytest.raises(ValueError, match="must give read_bytes at every point or at none"):
        Profile.from_dict(data)


def test_the_chosen_io_threads_go_through_json_and_old_plans_keep_the_stores_own() -> None:
    profile = io_profiles()[0]
    assert Profile.from_dict(profile.to_dict()) == profile
    plan = plan_from_profile(profile)
    data = plan.to_dict()
    again = Plan.from_dict(data)
    assert again.tiering == plan.tiering and again.tiering.io_threads in profile.disk.io_thread_counts()
    assert f"read by {plan.tiering.io_threads} I/O thread" in again.describe()
    assert simulate_plan(profile, again).epoch_s == pytest.approx(plan.predicted_epoch_s)
    del data["tiering"]["io_threads"], data["tiering"]["read_cpu_s"]
    old = Plan.from_dict(data)
    assert old.tiering.io_threads is None and old.tiering.read_cpu_s == 0.0
    for bad, message in ((0.5, "must be an integer"), (-1, "must be >= 0"), (100_000, "must be at most 1024"),
                         (True, "must be an integer")):
        data["tiering"]["io_threads"] = bad
        with pytest.raises(ValueError, match=rf"tiering\.io_threads.*{message}|{message}.*io_threads"):
            Plan.from_dict(data)


def test_a_bad_io_curve_is_refused_with_the_field_named() -> None:
    data = io_profiles()[0].to_dict()
    data["disk"]["io_curve"][1]["cpu_s_per_read"] = -1.0
    with pytest.raises(ValueError, match=r"io_curve\[1\]\.cpu_s_per_read"):
        Profile.from_dict(data)
    data = io_profiles()[0].to_dict()
    data["disk"]["io_threads"] = 7
    with pytest.raises(ValueError, match="io_threads .*must be one of io_curve's"):
        Profile.from_dict(data)


def route_1_profiles() -> list[Profile]:
    """GPU profiles whose Route 1 gathers its rows through the store too (no GPU cache: every input row), so both
    routes' misses queue on the one disk."""
    cuda = Profile.synthetic(t_cb=0.05, t_m=0.01, t_gb=0.02, t_dma=0.004, cores=8, num_batches=60)
    shared = dataclasses.replace(disk_profile(reads_per_s=200_000.0), gpu_rows_per_batch=4_000.0)
    mixed = Profile.synthetic(t_cb=0.12, t_m=0.01, t_gb=0.004, t_dma=0.004, cores=8, num_batches=60)
    return [cuda.replaced(disk=shared),
            cuda.replaced(disk=dataclasses.replace(shared, io_curve=IO_CURVE, io_threads=48)),
            mixed.replaced(disk=shared),  # cheap UVA batching: a third of the batches on Route 1
            mixed.replaced(disk=dataclasses.replace(shared, gpu_rows_per_batch=1_000.0))]  # a GPU cache holds 3/4


def test_route_1_misses_hold_the_disk_before_uva_batching() -> None:
    profile = route_1_profiles()[0]
    times = PhaseTimes.from_profile(profile, cache_bytes=256_000)
    assert times.gpu_read_s == pytest.approx(4_000 * 0.6 / 200_000.0) == times.disk_read_s
    assert times.gpu_batch_s == profile.gpu_batching.mean_s  # no io_curve: no CPU time charged beyond the wait
    scheduler = Scheduler(times)
    all_gpu = scheduler.all_gpu(trace=True)
    reads = sorted((r for r in all_gpu.trace if r.phase == "read"), key=lambda r: r.start)
    assert [r.route for r in reads] == [1] * profile.num_batches and "disk" in all_gpu.busy
    # The executor waits out each read, then UVA-batches: the all-GPU epoch is at least both, batch after batch.
    assert all_gpu.epoch_s >= profile.num_batches * (times.gpu_read_s + times.gpu_batch_s)
    # The same machine with Route 1's reads inside T_GB (not measured apart): the disk holds Route 0 alone.
    unmodelled = Scheduler(PhaseTimes.from_profile(profile.replaced(disk=dataclasses.replace(
        profile.disk, gpu_rows_per_batch=None)), cache_bytes=256_000))
    assert unmodelled.times.gpu_read_s == 0.0 and unmodelled.durations.gpu_disk == []
    split = Partitioner(times, 10).split(30)
    contended, alone = scheduler.simulate(split, trace=True), unmodelled.simulate(split)
    assert contended.epoch_s > alone.epoch_s
    assert {r.route for r in contended.trace if r.phase == "read"} == {0, 1}


def test_the_planner_chooses_cache_io_threads_and_split_as_an_exhaustive_search_does_with_route_1_reads() -> None:
    for number, profile in enumerate(route_1_profiles()):
        plan = plan_from_profile(profile, engine="fast")
        sizes, counts = profile.disk.cache_candidates(), profile.disk.io_thread_counts() or [None]
        epochs = {(size, count): exhaustive_epochs(profile, size, count) for size in sizes for count in counts}
        best_at = {size: min(epochs[size, count] for count in counts) for size in sizes}
        assert all(best_at[a] >= best_at[b] for a, b in zip(sizes, sizes[1:]))  # more cache never hurts
        expected = min(size for size in sizes if best_at[size] <= best_at[sizes[-1]] * (1.0 + CACHE_TOLERANCE))
        assert plan.tiering.cache_bytes == expected
        assert plan.predicted_epoch_s <= best_at[expected] * (1.0 + TOLERANCE)
        assert plan.tiering.gpu_read_s == pytest.approx(
            profile.disk.read_s_per_batch(expected, plan.tiering.io_threads, route=1))
        # Route 1's reads move the choice: planned as if they were free (inside T_GB), a smaller cache would do.
        free = plan_from_profile(profile.replaced(disk=dataclasses.replace(profile.disk, gpu_rows_per_batch=None)),
                                 engine="fast")
        assert free.tiering.cache_bytes < plan.tiering.cache_bytes or number == 1  # (1: more I/O threads instead)
        assert free.tiering.io_threads != plan.tiering.io_threads or number != 1


def test_what_ifs_more_ram_and_a_faster_disk_shorten_route_1_too() -> None:
    profile = route_1_profiles()[0].replaced(disk=dataclasses.replace(route_1_profiles()[0].disk,
                                                                       resident_bytes=1_000_000))

    def all_gpu_epoch(candidate: Profile) -> float:  # the largest cache the budget allows, every batch on Route 1
        return Scheduler.from_profile(candidate).all_gpu(engine="fast").epoch_s

    base = all_gpu_epoch(profile)
    assert all_gpu_epoch(what_if(profile, memory=2.0).profile) < base < all_gpu_epoch(what_if(profile, memory=0.5)
                                                                                     .profile)
    assert all_gpu_epoch(what_if(profile, disk_speed=4.0).profile) < base
    in_ram = all_gpu_epoch(profile.replaced(disk=dataclasses.replace(profile.disk, gpu_rows_per_batch=0.0)))
    assert all_gpu_epoch(what_if(profile, memory=100.0).profile) == pytest.approx(in_ram)  # every row cached


def test_route_1_rows_and_reads_go_through_json_and_old_documents_read_none() -> None:
    profile = route_1_profiles()[1]
    assert Profile.from_dict(profile.to_dict()) == profile
    plan = plan_from_profile(profile)
    assert plan.tiering.gpu_read_s > 0 and "per GPU batch" in plan.describe()
    data = plan.to_dict()
    again = Plan.from_dict(data)
    assert again.tiering == plan.tiering
    assert simulate_plan(profile, again).epoch_s == pytest.approx(plan.predicted_epoch_s)
    del data["tiering"]["gpu_read_s"]
    assert Plan.from_dict(data).tiering.gpu_read_s == 0.0
    old = profile.to_dict()
    del old["disk"]["gpu_rows_per_batch"]
    assert Profile.from_dict(old).disk.gpu_rows_per_batch is None
    old["disk"]["gpu_rows_per_batch"] = -1.0
    with pytest.raises(ValueError, match="gpu_rows_per_batch"):
        Profile.from_dict(old)
