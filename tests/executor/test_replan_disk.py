"""Re-planning with features on disk: the feature store's counted hits, misses and preads of an epoch correct the
profile's hit curve, rows per batch and preads per missed row before the planner sizes the cache again."""
from __future__ import annotations

import dataclasses

import pytest

from morphpipe.data.feature_store import FeatureStoreCounters
from morphpipe.executor.executor import EpochResult
from morphpipe.executor.replan import Replanner, predicted_phases, same_schedule
from morphpipe.profiler.disk import DiskProfile, DiskReadFacts, IoThreadsRate
from morphpipe.profiler.profile import Profile
from morphpipe.scheduler import plan_from_profile

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
