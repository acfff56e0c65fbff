"""The disk's measured read rates and the hit ratio of a static hot-row cache by cache size."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from morphpipe import native
from morphpipe.data.feature_store import FeatureStoreCounters
from morphpipe.profiler.disk import hit_ratio_by_cache_size, measure_disk_reads, presampled_hit_ratios
from morphpipe.profiler.profile import PhaseTiming
from morphpipe.profiler.profiler import MIN_GPU_SHARE, route_1_reads_apart
from tests.conftest import make_graph


def test_hit_ratio_by_cache_size_matches_a_count_by_hand():
    hotness = torch.tensor([0, 9, 3, 3, 0, 1])  # hot order: 1, 2, 3, 5, 0, 4
    gathered = [torch.tensor([1, 2, 0]), torch.tensor([3, 4, 1, 5])]
    # k=1 caches {1}: 2 of 7 rows; k=2 {1,2}: 3; k=3 {1,2,3}: 4; k=4 adds 5: 5; all 6: 7.
    assert hit_ratio_by_cache_size(hotness, gathered, [0, 1, 2, 3, 4, 6]) == [0, 2 / 7, 3 / 7, 4 / 7, 5 / 7, 1.0]


def test_presampled_hit_ratios_grow_with_the_cache_to_one():
    graph = make_graph(400)
    ratios = presampled_hit_ratios(graph, [4, 3], 32, 3, [0, 40, 200, 400])
    assert ratios[0] == 0.0 and ratios[-1] == 1.0
    assert ratios == sorted(ratios)


@pytest.mark.parametrize("reader", ["io_uring", "pread"])
def test_disk_read_rates_are_measured_on_a_file(tmp_path, reader):
    if reader == "io_uring" and native.load().io_uring_unavailable_reason():
        pytest.skip(f"io_uring is unavailable here: {native.load().io_uring_unavailable_reason()}")
    path = tmp_path / "blob"
    path.write_bytes(bytes(64 * 4096))
    try:
        facts = measure_disk_reads(path, queue_depth=4, seconds=0.05, sequential_block=16 * 4096, reader=reader)
    except RuntimeError as error:
        if "O_DIRECT" not in str(error):
            raise
        pytest.skip(f"this filesystem refuses O_DIRECT: {error}")
    assert facts.random_reads_per_s > 0 and facts.sequential_bytes_per_s > 0
    assert facts.random_bytes_per_s == facts.random_reads_per_s * 4096
    with pytest.raises(RuntimeError, match="holds 262144 bytes, less than one 4194304-byte block"):
        measure_disk_reads(path, queue_depth=1, seconds=0.01)  # the default sequential block
    with pytest.raises(ValueError, match="queue_depth"):
        measure_disk_reads(path, queue_depth=0)


def test_disk_profile_of_a_store_measures_through_it_where_o_direct_is_refused(tmp_path, monkeypatch):
    import numpy as np

    from morphpipe.data.feature_store import FeatureStore
    from morphpipe.profiler import disk

    path = tmp_path / "features.npy"
    np.save(path, np.arange(2000 * 64, dtype=np.float32).reshape(2000, 64))  # rows of 256 B
    store = FeatureStore(path, io_threads=2)

    def refused(*args, **kwargs):
        raise RuntimeError(f"{path}: open with O_DIRECT failed: Invalid argument")

    monkeypatch.setattr(disk, "measure_disk_reads", refused)
    hotness = torch.arange(2000, 0, -1)  # row 0 hottest
    gathered = [torch.arange(0, 100), torch.arange(50, 250)]
    profile = disk.measure_disk_profile(store, gathered, hotness, cache_budget_bytes=200 * 256, seconds=0.05,
                                        resident=1000)
    assert profile.facts.random_reads_per_s > 0 and profile.facts.sequential_bytes_per_s > 0
    assert profile.facts.queue_depth == 2 and profile.facts.block == 4096
    # Without a cache each batch's rows lie side by side in the file: one read each, for 300 rows.
    assert profile.rows_per_batch == 150 and profile.reads_per_miss == 2 / 300 and profile.resident_bytes == 1000
    assert profile.store_reads_per_s is None  # no reads of the store's were timed: the disk's rate stands in
    assert profile.hit_curve[0] == (0, 0.0) and profile.hit_curve[-1] == (200 * 256, 250 / 300)  # 200 hottest cached
    assert profile.cache_candidates()[-1] == 200 * 256


def test_a_features_file_smaller_than_one_read_is_refused_naming_it(tmp_path):
    import numpy as np

    from morphpipe.data.feature_store import FeatureStore
    from morphpipe.profiler.disk import measure_disk_profile

    path = tmp_path / "features.npy"
    np.save(path, np.zeros((4, 4), dtype=np.float32))
    with pytest.raises(ValueError, match=f"features file {path} holds .* bytes, less than one 4096-byte read"):
        measure_disk_profile(FeatureStore(path), [], torch.zeros(4), 0, 1.0)


def test_reads_per_miss_and_their_size_are_counted_with_each_cache_in_place(tmp_path):
    import numpy as np

    from morphpipe.data.feature_store import FeatureStore
    from morphpipe.profiler.disk import miss_reads_by_cache_size

    path = tmp_path / "features.npy"
    np.save(path, np.zeros((6000, 256), dtype=np.float16))  # rows of 512 B: 8 a page
    hotness = torch.arange(6000) % 97  # hot rows spread over the file
    generator = torch.Generator().manual_seed(4)
    gathered = [torch.randperm(6000, generator=generator)[:1500] for _ in range(3)]
    cache_rows = [0, 600, 3000, 6000]
    counted = miss_reads_by_cache_size(FeatureStore(path, io_threads=2), hotness, gathered, cache_rows)
    for rows, miss in zip(cache_rows, counted):
        store = FeatureStore(path, cache_bytes=rows * 512, hotness=hotness, io_threads=2)
        for ids in gathered:
            store.gather(ids)
        reads = store.counters()
        assert (miss.rows, miss.reads, miss.bytes) == (reads.misses, reads.reads, reads.bytes_read)  # as gathers read
        assert miss.reads_per_miss == (reads.reads / reads.misses if reads.misses else None)
        assert miss.read_bytes == (reads.bytes_read / reads.reads if reads.reads else None)
    # The rows a hot cache misses lie sparser: fewer of them share a read, and the reads are shorter.
    per_miss = [miss.reads_per_miss for miss in counted]
    assert per_miss[0] < per_miss[1] < per_miss[2] and per_miss[3] is None
    assert counted[0].read_bytes > counted[1].read_bytes > counted[2].read_bytes >= 4096


def test_the_io_thread_counts_are_timed_at_the_shortest_and_longest_reads_the_caches_leave():
    from morphpipe.profiler.disk import MIN_TIMED_READS, MissReads, io_timing_caches

    def misses(*read_bytes: float) -> list[MissReads]:  # caches of increasing size, each leaving 1,000 reads
        return [MissReads(4_000, 1_000, int(1_000 * size)) for size in read_bytes]

    # mag-like: long coalesced reads without a cache, short ones once most rows are cached: both ends and between.
    assert io_timing_caches(misses(130_000, 120_000, 60_000, 30_000, 8_192, 4_096)) == [5, 3, 0]
    assert io_timing_caches(misses(30_000, 6_000, 4_096)) == [2, 0]  # nothing IO_SIZE_STEP from both ends
    assert io_timing_caches(misses(6_000, 5_000, 4_096, 4_096)) == [3]  # sparse reads alike: one size, the larger
    few = [*misses(130_000, 4_096), MissReads(200, MIN_TIMED_READS - 1, 4_096 * (MIN_TIMED_READS - 1))]
    assert io_timing_caches(few) == [1, 0]  # a cache leaving too few reads to time is not timed
    assert io_timing_caches([MissReads(10, 10, 40_960)]) == [0]  # too few anywhere: no cache, as it is


def test_the_timed_read_rates_are_fitted_non_decreasing():
    from morphpipe.profiler.disk import increasing_fit

    assert increasing_fit([1.0, 2.0, 3.0]) == [1.0, 2.0, 3.0]
    assert increasing_fit([10.0, 2.0, 12.0, 13.0]) == [6.0, 6.0, 12.0, 13.0]  # a low point pooled with the one before
    assert increasing_fit([4.0, 9.0, 3.0, 2.0, 20.0]) == [4.0, 14 / 3, 14 / 3, 14 / 3, 20.0]
    assert increasing_fit([]) == []


def test_the_stores_reads_are_timed_at_each_io_thread_count(tmp_path):
    import numpy as np

    from morphpipe.data.feature_store import FeatureStore
    from morphpipe.profiler.disk import IO_THREAD_COUNTS, miss_reads_by_cache_size, read_rates_by_io_threads

    path = tmp_path / "features.npy"
    np.save(path, np.zeros((4000, 1024), dtype=np.float16))  # rows of 2 KiB: two a page
    store = FeatureStore(path, io_threads=3)
    if not store.direct:
        pytest.skip("this filesystem refuses O_DIRECT: the I/O thread counts are not timed through the page cache")
    hotness = torch.arange(4000) % 89
    gathered = [torch.randperm(4000, generator=torch.Generator().manual_seed(seed))[:400] for seed in range(3)]
    cache_rows = [0, 100, 2000]
    counted = miss_reads_by_cache_size(store, hotness, gathered, cache_rows)
    curve = read_rates_by_io_threads(store, hotness, gathered, cache_rows, counted, seconds=0.05)
    assert [point.io_threads for point in curve] == sorted({*IO_THREAD_COUNTS, 3})
    assert all(point.reads_per_s > 0 and point.cpu_s_per_read > 0 for point in curve)
    # Sparse misses alike at every cache (each leaving 256 reads or more): one size timed, the shortest.
    assert {point.read_bytes for point in curve} == {min(miss.read_bytes for miss in counted)}


def test_each_io_thread_count_stops_within_one_gather_of_its_time_at_each_read_size(tmp_path, monkeypatch):
    """Timing the I/O thread counts does not read every batch's misses at each count (minutes at papers100M scale
    with one I/O thread): a (size, count) that has spent its share of the time, with MIN_TIMED_READS reads, stops.
    Each batch's misses are read in gathers of about IO_TIMING_READS reads, dense misses (long reads) as sparse."""
    import numpy as np

    from morphpipe.data.feature_store import FeatureStore
    from morphpipe.profiler import disk

    path = tmp_path / "features.npy"
    np.save(path, np.zeros((80_000, 256), dtype=np.float16))  # rows of 512 B, 8 a page
    gathers = []

    class CountingStore(FeatureStore):  # its twins (the timed stores) count their gathers too
        def gather(self, ids):
            gathers.append((self.io_threads, self.count_reads(ids)[0]))
            return super().gather(ids)

    store = CountingStore(path, io_threads=2)
    if not store.direct:
        pytest.skip("this filesystem refuses O_DIRECT: the I/O thread counts are not timed through the page cache")
    monkeypatch.setattr(disk, "IO_TIMING_READS", 400)
    # Batches of every row: without a cache, 313 long reads each (128 KiB); a cache of all rows but every 64th
    # leaves those, 32 KiB apart (farther than the store reads through): 1,250 short reads a batch, in 3 gathers.
    hotness = (torch.arange(80_000) % 64 != 0).float()
    gathered = [torch.randperm(80_000, generator=torch.Generator().manual_seed(seed)) for seed in range(2)]
    cache_rows = [0, 78_750]
    counted = disk.miss_reads_by_cache_size(store, hotness, gathered, cache_rows)
    assert counted[0].read_bytes > disk.IO_SIZE_STEP * counted[1].read_bytes  # two sizes to time
    curve = disk.read_rates_by_io_threads(store, hotness, gathered, cache_rows, counted, seconds=1e-6)
    counts = sorted({*disk.IO_THREAD_COUNTS, 2})
    assert [(point.read_bytes, point.io_threads) for point in curve] == [
        (miss.read_bytes, count) for miss in (counted[1], counted[0]) for count in counts]
    # One gather each, the counts in turn at the short size, then the long; IO_TIMING_READS to twice as many reads a
    # gather (a batch's misses split), at least MIN_TIMED_READS, not a whole batch's 1,250.
    assert [threads for threads, _ in gathers] == counts * 2
    assert all(max(disk.MIN_TIMED_READS, 300) <= reads < 2 * 400 for _, reads in gathers)


def test_route_1_reads_are_taken_out_of_the_gpu_batching_time() -> None:
    """GPU batching timed while it gathered through the store: the disk's part leaves T_GB for the plan's disk."""
    timing = PhaseTiming.from_samples([0.030, 0.034, 0.026, 0.030])  # 4 timed batches after 2 warm-up ones
    reads = FeatureStoreCounters(hits=3_000, misses=3_000, reads=3_000, bytes_read=3_000 * 4096, read_seconds=0.06)
    gpu, rows, note = route_1_reads_apart(timing, reads, batches=6)
    assert gpu.mean_s == pytest.approx(0.020) and gpu.cv == pytest.approx(timing.cv) and gpu.samples == 4
    assert rows == 1_000.0 and note is None
    slow_warmup = dataclasses.replace(reads, read_seconds=0.3)  # 50 ms a batch on average: more than one took
    gpu, _, note = route_1_reads_apart(timing, slow_warmup, batches=6)
    assert gpu.mean_s == pytest.approx(0.030 * MIN_GPU_SHARE) and "kept at 5%" in note
    with pytest.raises(ValueError, match="batches made"):
        route_1_reads_apart(timing, reads, batches=0)
