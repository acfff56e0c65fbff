"""A typed graph's feature stores as one (`TypedFeatureStore`): one pool of I/O threads for every type, counters
summed over the types, reads counted by each type's store, and the cache a number of bytes buys as the shared
cache's rows, so the disk profiler, planner and trainer read it as they read a homogeneous graph's store."""
from __future__ import annotations

import pytest
import torch

from morphpipe.data.feature_store import FeatureStore
from morphpipe.data.hetero_generator import MagSpec
from morphpipe.data.hetero_store import HeteroGraphStore, share_feature_cache
from morphpipe.profiler.disk import hit_ratio_by_cache_size, miss_reads_by_cache_size
from morphpipe.sampling.hetero_batcher import HeteroCpuBatcher
from tests.conftest import saved_mag_with_float16_authors


@pytest.fixture(scope="module")
def graph_dir(tmp_path_factory):
    """mag-shaped: float32 paper rows of 32 bytes, float16 author rows of 8 bytes, two types without features."""
    spec = MagSpec(num_papers=300, num_authors=200, num_institutions=10, num_fields=20, feature_dim=8)
    return saved_mag_with_float16_authors(tmp_path_factory.mktemp("typed") / "mag", spec, author_width=4, seed=2)


def test_the_types_stores_read_through_one_pool_and_batches_equal_those_from_ram(graph_dir):
    graph = HeteroGraphStore.load(graph_dir, features_on_disk=True, feature_cache_bytes=1500, io_threads=3)
    paper, author = graph.feature_stores["paper"], graph.feature_stores["author"]
    assert paper.native.shares_io_with(author.native) and author.io_threads == paper.io_threads == 3
    alone = FeatureStore(paper.path, io_threads=3)
    assert not alone.native.shares_io_with(paper.native)
    in_ram = HeteroGraphStore.load(graph_dir)
    fanouts = [4, 3]
    with HeteroCpuBatcher(graph, fanouts, 64, num_threads=2, seed=5, pin_memory=False) as on_disk, \
            HeteroCpuBatcher(in_ram, fanouts, 64, num_threads=2, seed=5, pin_memory=False) as from_ram:
        for disk_batch, ram_batch in zip(on_disk.epoch(0), from_ram.epoch(0), strict=True):
            for name in graph.type_names:
                assert torch.equal(disk_batch.x[name], ram_batch.x[name]), name
    reads = graph.feature_store.counters()
    assert reads.misses > 0 and reads.hits > 0  # both tiers served rows, through the one pool


def test_a_store_shares_only_a_pread_pool_of_as_many_threads(graph_dir):
    graph = HeteroGraphStore.load(graph_dir, features_on_disk=True, io_threads=2)
    with pytest.raises(RuntimeError, match="shares_io_with: a store shares the pread pool of a pread store with as "
                                           "many I/O threads"):
        FeatureStore(graph.feature_stores["paper"].path, io_threads=5, shares_io_with=graph.feature_stores["author"])


def test_the_one_store_view_counts_and_reads_as_its_types_stores(graph_dir):
    graph = HeteroGraphStore.load(graph_dir, features_on_disk=True, feature_cache_bytes=1000, io_threads=2)
    store = graph.feature_store
    paper, author = graph.node_type("paper"), graph.node_type("author")
    assert store.num_rows == paper.count + author.count
    assert store.row_bytes == -(-(paper.count * 32 + author.count * 8) // store.num_rows)
    nodes = torch.tensor([author.start + 5, 3, graph.node_type("institution").start, paper.start + 7, author.start])
    rows = store.rows_of(nodes)  # papers first (type order), the institution dropped
    assert rows.tolist() == [3, 7, 5 + paper.count, paper.count]
    store.reset_counters()
    gathered = store.gather(rows)
    assert torch.equal(gathered[0], graph.features["paper"][[3, 7]])
    assert torch.equal(gathered[1], graph.features["author"][[5, 0]])
    summed = [graph.feature_stores[name].counters() for name in ("paper", "author")]
    total = store.counters()
    assert total.hits + total.misses == 4 and total.hits == sum(part.hits for part in summed)
    assert total.reads == sum(part.reads for part in summed) and total.bytes_read == sum(p.bytes_read for p in summed)
    # The read time is the shared pool's: each type's reads within it, the two (one after the other) at most summed.
    assert max(part.read_seconds for part in summed) <= total.read_seconds
    assert total.read_seconds <= sum(part.read_seconds for part in summed) + 1e-3
    paper_reads = graph.feature_stores["paper"].count_reads(torch.tensor([3, 7]))
    author_reads = graph.feature_stores["author"].count_reads(torch.tensor([5, 0]))
    assert store.count_reads(rows) == (paper_reads[0] + author_reads[0], paper_reads[1] + author_reads[1])
    store.reset_counters()
    assert store.counters().hits == store.counters().misses == 0 and store.counters().read_seconds == 0


@pytest.mark.parametrize("cache_bytes", [0, 700, 4000, 10**6])
def test_the_hit_curve_of_the_view_is_what_the_shared_cache_serves(graph_dir, cache_bytes):
    """The profiler's hit ratio and preads per miss at a shared cache size, from the view's hotness and
    `rows_cached_by`, equal what the stores opened with that shared cache count gathering the same rows."""
    graph = HeteroGraphStore.load(graph_dir, features_on_disk=True, feature_cache_bytes=cache_bytes, io_threads=1)
    store = graph.feature_store
    hotness = {name: graph.source_degrees(name) for name in ("paper", "author")}
    assert store.rows_cached_by(cache_bytes) == sum(share_feature_cache(hotness, {"paper": 32, "author": 8},
                                                                        cache_bytes).values())
    assert store.cached_by_type(cache_bytes) == {name: part.num_cached for name, part in graph.feature_stores.items()}
    batches = [store.rows_of(torch.randint(0, graph.num_nodes, (90,), generator=torch.Generator().manual_seed(seed)))
               for seed in range(4)]
    k = store.rows_cached_by(cache_bytes)
    [ratio] = hit_ratio_by_cache_size(store.hotness(), batches, [k])
    [miss] = miss_reads_by_cache_size(store, store.hotness(), batches, [k])
    store.reset_counters()
    for rows in batches:
        store.gather(rows)
    counted = store.counters()
    assert ratio == pytest.approx(counted.hit_ratio)
    assert (miss.rows, miss.reads, miss.bytes) == (counted.misses, counted.reads, counted.bytes_read)


def test_twins_cache_the_rows_asked_for_and_share_their_own_pool(graph_dir):
    graph = HeteroGraphStore.load(graph_dir, features_on_disk=True, io_threads=2)
    store = graph.feature_store
    rows = torch.tensor([1, 4, store.num_rows - 1])
    twin = store.twin(cached_rows=rows, io_threads=3)
    assert twin.io_threads == 3 and twin.num_cached == 3
    assert twin.stores["paper"].native.shares_io_with(twin.stores["author"].native)
    assert not twin.stores["paper"].native.shares_io_with(store.stores["paper"].native)
    twin.gather(rows)
    assert twin.counters().misses == 0 and twin.counters().hits == 3
