"""Re-planning with features on disk: the feature store's counted hits, misses and preads of an epoch correct the
profile's hit curve, rows per batch and preads per missed row before the planner sizes the cache again."""
from __future__ import annotations

import dataclasses

import pytest

from morphpipe.data.feature_store import FeatureStoreCounters
from morphpipe.executor.executor import EpochResult
from morphpipe.executor.replan import Replanner, measure_phases, measured_disk, predicted_phases, same_schedule
from morphpipe.partitioner import Partitioner, PhaseTimes
from morphpipe.profiler.disk import DiskProfile, DiskReadFacts, IoThreadsRate
from morphpipe.profiler.profile import Profile
from morphpipe.scheduler import Scheduler, plan_from_profile
from tests.executor.virtual_time import faithful_runs, virtual_epoch

BATCHES = 40
ROWS_PER_BATCH = 4_000


def disk_profile() -> Profile:
    facts = DiskReadFacts("features.npy", 4096, 48, 10_000.0, 2e9, 4 << 20)  # the disk bounds the epoch
    curve = ((0, 0.0), (256_000, 0.4), (2_560_000, 0.72), (12_800_000, 0.93))
    disk = DiskProfile(facts, 256, 100_000, ROWS_PER_BATCH, 1.0, curve, 6_400_000, 1_000_000)
    return Profile.synthetic(t_cb=0.08, t_m=0.05, cores=4, cpu_efficiency=0.8, num_batches=BATCHES).replaced(disk=disk)


def epoch_with(plan, profile: Profile, hit_ratio: float, reads_per_miss: float) -> EpochResult:
    """An epoch whose batching threads took what the profile predicts, and whose store counted `hit_ratio`."""
    rows = BATCHES * ROWS_PER_BATCH
    hits = int(rows * hit_ratio)
    misses = rows - hits
    build = predicted_phases(profile, plan)["cpu_batch"] * plan.cpu_threads
    return EpochResult(0, 1.0, [(0, i) for i in range(BATCHES)], BATCHES * 64, 1.0, [], [], {}, 1, 0, BATCHES, 0,
                       build_s=[build] * BATCHES,
                       feature_reads=FeatureStoreCounters(hits, misses, int(misses * reads_per_miss), misses * 4096))


def test_a_lower_measured_hit_ratio_lengthens_the_prediction_and_corrects_the_profile() -> None:
    profile = disk_profile()
    plan = plan_from_profile(profile, engine="fast")
    predicted = plan.tiering.hit_ratio
    replanner = Replanner(profile)
    decision = replanner.observe(epoch_with(plan, profile, predicted - 0.2, 0.5), plan)
    disk = replanner.profile.disk
    assert disk.hit_ratio(plan.tiering.cache_bytes) == pytest.approx(predicted - 0.2, abs=1e-3)
    assert disk.reads_per_miss == pytest.approx(0.5, rel=1e-3) and disk.rows_per_batch == ROWS_PER_BATCH
    assert [ratio for _, ratio in disk.hit_curve] == sorted(ratio for _, ratio in disk.hit_curve)
    # Half the preads per miss outweighs the lower hit ratio here: the epoch is predicted shorter.
    assert decision.current_s < plan.predicted_epoch_s


def test_the_measured_hit_ratio_as_predicted_keeps_the_plan() -> None:
    profile = disk_profile()
    plan = plan_from_profile(profile, engine="fast")
    decision = Replanner(profile).observe(epoch_with(plan, profile, plan.tiering.hit_ratio, 1.0), plan)
    assert not decision.switched and decision.current_s == pytest.approx(plan.predicted_epoch_s, rel=0.02)


def test_more_misses_than_profiled_lengthen_the_prediction() -> None:
    profile = disk_profile()
    plan = plan_from_profile(profile, engine="fast")
    decision = Replanner(profile).observe(epoch_with(plan, profile, plan.tiering.hit_ratio - 0.3, 1.0), plan)
    assert decision.current_s > plan.predicted_epoch_s * 1.1


def test_plans_that_differ_only_in_their_cache_are_different_schedules() -> None:
    profile = disk_profile()
    assert not same_schedule(plan_from_profile(profile, cache_bytes=0), plan_from_profile(profile, cache_bytes=256_000))


def test_the_store_timed_read_rate_replaces_the_profiled_one() -> None:
    profile = disk_profile()  # profiled at 10,000 reads/s
    plan = plan_from_profile(profile, engine="fast")
    epoch = epoch_with(plan, profile, plan.tiering.hit_ratio, 1.0)
    reads = epoch.feature_reads
    slow = dataclasses.replace(reads, read_seconds=reads.reads / 5_000.0, read_gathers=BATCHES)  # half as fast
    decision = Replanner(profile).observe(dataclasses.replace(epoch, feature_reads=slow), plan)
    assert decision.current_s > plan.predicted_epoch_s * 1.5  # the disk bounds the epoch: about twice as long
    assert "the disk served 5,000 reads/s" in decision.reason
    replanner = Replanner(profile)
    replanner.observe(dataclasses.replace(epoch, feature_reads=slow), plan)
    assert replanner.profile.disk.store_reads_per_s == pytest.approx(5_000.0)
    assert replanner.profile.disk.reads_per_s_at(plan.tiering.cache_bytes) == pytest.approx(5_000.0)
    few = dataclasses.replace(reads, reads=100, read_seconds=1.0)  # too few reads to time: the rate stays
    replanner = Replanner(profile)
    replanner.observe(dataclasses.replace(epoch, feature_reads=few), plan)
    assert replanner.profile.disk.store_reads_per_s is None and replanner.profile.disk.reads_per_s_at(0) == 10_000.0


def test_plans_that_differ_only_in_their_io_threads_are_different_schedules_and_rates_are_read_at_them() -> None:
    curve = (IoThreadsRate(4, 5_000.0, 1e-5), IoThreadsRate(48, 10_000.0, 1e-5))
    profile = disk_profile()
    profile = profile.replaced(disk=dataclasses.replace(profile.disk, io_curve=curve, io_threads=48))
    few, many = (plan_from_profile(profile, engine="fast", cache_bytes=256_000, io_threads=count) for count in (4, 48))
    assert not same_schedule(few, many) and few.tiering.io_threads == 4
    assert few.tiering.disk_read_s == pytest.approx(2 * many.tiering.disk_read_s)  # half the rate at 4 threads
    # An epoch run with 4 I/O threads whose reads went as fast as predicted there leaves the profile's rates alone.
    epoch = epoch_with(few, profile, few.tiering.hit_ratio, 1.0)
    reads = epoch.feature_reads
    seconds = reads.reads / profile.disk.reads_per_s_at(256_000, 4)
    epoch = dataclasses.replace(epoch, feature_reads=dataclasses.replace(reads, read_seconds=seconds, read_gathers=1))
    replanner = Replanner(profile)
    replanner.observe(epoch, few)
    assert replanner.profile.disk.reads_per_s_at(256_000) == pytest.approx(10_000.0)


def route_1_profile(gpu_rows: float | None) -> Profile:
    """A GPU machine whose Route 1 gathers `gpu_rows` a batch through the store (None: not measured apart)."""
    facts = DiskReadFacts("features.npy", 4096, 48, 50_000.0, 2e9, 4 << 20)
    disk = DiskProfile(facts, 256, 100_000, 400.0, 1.0, ((0, 0.0), (2_560_000, 0.72)), 6_400_000, 1_000_000,
                       gpu_rows_per_batch=gpu_rows)
    return Profile.synthetic(t_cb=0.03, t_m=0.008, t_gb=0.006, t_dma=0.005, cores=2,
                             num_batches=24).replaced(disk=disk)


def test_replanning_measures_route_1_reads_as_part_of_its_batches() -> None:
    profile = route_1_profile(400.0)
    plan = plan_from_profile(profile, engine="fast", cache_bytes=0)
    read_s = 400 / 50_000.0  # no cache: every row a read
    expected = predicted_phases(profile, plan)
    assert expected["gpu_batch"] == pytest.approx(0.006 + read_s)
    assert predicted_phases(route_1_profile(None), plan)["gpu_batch"] == pytest.approx(0.006)  # inside T_GB
    # The executor on virtual devices: Route 1's reads are traced apart on the disk, and counted in its batches.
    times = PhaseTimes.from_profile(profile, plan.cpu_threads, cache_bytes=0)
    split = Partitioner(times, 6).split(12)
    for result, _ in faithful_runs(lambda: virtual_epoch(times, split, Scheduler(times, 1).durations, batch_size=4)):
        assert sum(r.phase == "read" and r.route == 1 for r in result.trace) == split.n_gpu
        measured = measure_phases(result, plan).gpu_batch
        assert measured.mean_s == pytest.approx(expected["gpu_batch"], rel=0.15)
        break


def test_the_store_counts_both_routes_rows() -> None:
    profile = route_1_profile(100.0)  # a GPU cache holds 3/4 of Route 1's rows
    plan = plan_from_profile(profile, engine="fast", cache_bytes=0)
    n_cpu, n_gpu = 16, 8
    rows = int(1.5 * (400 * n_cpu + 100 * n_gpu))  # both routes gathered half as many rows again as profiled
    counted = FeatureStoreCounters(0, rows, rows, rows * 4096)
    disk = measured_disk(profile.disk, counted, plan, n_cpu, n_gpu)
    assert disk.rows_per_batch == pytest.approx(600.0) and disk.gpu_rows_per_batch == pytest.approx(150.0)
    # A profile that did not measure Route 1's rows apart: its batches count as Route 0's.
    old = measured_disk(route_1_profile(None).disk, FeatureStoreCounters(0, 400 * 24, 400 * 24, 0), plan, n_cpu, n_gpu)
    assert old.rows_per_batch == pytest.approx(400.0) and old.gpu_rows_per_batch is None
