"""The disk in the plan: misses of the host feature cache hold the disk in the simulator, and the planner chooses
the cache size (checked against every candidate simulated)."""
from __future__ import annotations

import dataclasses
import random

import pytest

from morphpipe.commands.cli import main
from morphpipe.partitioner import Partitioner, PhaseTimes
from morphpipe.profiler.disk import DiskProfile, DiskReadFacts
from morphpipe.profiler.profile import Profile
from morphpipe.scheduler import Plan, Scheduler, plan_from_profile, simulate_plan
from morphpipe.scheduler.planning import CACHE_TOLERANCE
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
    for profile in profiles():
        every_row = NUM_ROWS * ROW_BYTES
        cached = plan_from_profile(profile, cache_bytes=every_row)
        in_ram = plan_from_profile(profile.replaced(disk=None))
        assert cached.tiering is not None and cached.tiering.hit_ratio == 1.0 and cached.tiering.disk_read_s == 0.0
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
                       disk_read_s=rng.uniform(0.01, 2))
    scheduler = Scheduler(times, seed)
    bounds = scheduler.lower_bounds()
    for n_cpu in {0, times.num_batches, rng.randint(0, times.num_batches)}:
        result = scheduler.simulate(Partitioner(times, 4).split(n_cpu), engine="fast")
        assert result.epoch_s >= bounds[n_cpu] * (1 - 1e-12)


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
