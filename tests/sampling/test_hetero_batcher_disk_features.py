"""The typed batcher with features on disk (HeteroGraphStore.load(features_on_disk=True)): its batches equal those
built from in-RAM features bit for bit, whatever share of each type's rows the shared cache holds; a type without
features still gets its local ids; Route 1's typed batcher reads them through the stores too; the native batcher
takes each type's rows from one source."""
from __future__ import annotations

import pytest
import torch

from morphpipe import native
from morphpipe.data.hetero_generator import MagSpec
from morphpipe.data.hetero_store import HeteroGraphStore
from morphpipe.sampling.hetero_batcher import HeteroCpuBatcher
from morphpipe.sampling.hetero_torch_batcher import HeteroTorchBatcher
from tests.conftest import saved_mag_with_float16_authors

FANOUTS = [4, 3]
PAPER_ROW, AUTHOR_ROW = 6 * 4, 3 * 2  # float32 rows of width 6, float16 rows of width 3 (both straddle pages)


@pytest.fixture(scope="module")
def graph_dir(tmp_path_factory):
    """A small mag-shaped graph: float32 paper features, float16 author features, institutions and fields without."""
    spec = MagSpec(num_papers=400, num_authors=300, num_institutions=12, num_fields=30, feature_dim=6)
    return saved_mag_with_float16_authors(tmp_path_factory.mktemp("typed") / "mag", spec, author_width=3, seed=5)


def same_rows(got: torch.Tensor, expected: torch.Tensor) -> bool:
    """Bit-for-bit equality (NaN payloads and signed zeros included)."""
    bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[expected.element_size()]
    return got.dtype == expected.dtype and torch.equal(got.view(bits), expected.view(bits))


@pytest.mark.parametrize("cache_bytes", [0, 1000, 400 * PAPER_ROW + 300 * AUTHOR_ROW],
                         ids=["no-cache", "tiny-cache", "all-cached"])
@pytest.mark.parametrize("serial", [False, True], ids=["threads", "serial"])
def test_typed_batches_equal_those_from_features_in_ram(graph_dir, cache_bytes, serial):
    in_ram = HeteroGraphStore.load(graph_dir, mmap=False)
    on_disk = HeteroGraphStore.load(graph_dir, features_on_disk=True, feature_cache_bytes=cache_bytes, io_threads=2)
    assert set(on_disk.feature_stores) == {"paper", "author"}
    if cache_bytes == 1000:  # the shared cache holds some rows of each type: 12 papers and 115 authors
        assert [store.num_cached for store in on_disk.feature_stores.values()] == [12, 115]
    settings = dict(num_threads=2, seed=7, serial=serial)
    with HeteroCpuBatcher(in_ram, FANOUTS, 64, **settings) as ram, \
            HeteroCpuBatcher(on_disk, FANOUTS, 64, **settings) as disk:
        gathered = {"paper": 0, "author": 0}
        for epoch in (0, 1):
            pairs = list(zip(ram.epoch(epoch), disk.epoch(epoch), strict=True))
            assert len(pairs) == len(ram)
            for expected, got in pairs:
                assert torch.equal(got.input_nodes, expected.input_nodes)
                assert torch.equal(got.y, expected.y)
                for name in in_ram.type_names:
                    assert same_rows(got.x[name], expected.x[name]), name
                for name in gathered:
                    gathered[name] += got.x[name].shape[0]
                for name in ("institution", "field_of_study"):  # no features: local ids, as in RAM
                    assert got.x[name].dtype == torch.int64
    for name, store in on_disk.feature_stores.items():
        counters = store.counters()
        assert counters.hits + counters.misses == gathered[name]
        assert (counters.hits > 0) == (cache_bytes > 0), name  # the tiny cache serves both types some rows
        assert (counters.misses == 0) == (store.num_cached == store.shape[0]), name


def test_the_native_typed_batcher_takes_each_types_rows_from_one_source(graph_dir):
    graph = HeteroGraphStore.load(graph_dir, features_on_disk=True, io_threads=1)
    types = {name: index for index, name in enumerate(graph.type_names)}
    features = [graph.features.get(name) for name in graph.type_names]
    stores = [graph.feature_stores[name].native if name in graph.feature_stores else None for name in graph.type_names]
    arguments = (graph.type_offsets(), [types[r.src] for r in graph.relations], [types[r.dst] for r in graph.relations],
                 [graph.indptr[r] for r in graph.relations], [graph.indices[r] for r in graph.relations])
    rest = (graph.labels, [[fanout] * len(graph.relations) for fanout in FANOUTS], 1, 1, False)
    with pytest.raises(RuntimeError, match="give the rows either as a features tensor or as a feature store, not both"):
        native.load().HeteroCpuBatcher(*arguments, features, *rest, stores)
    with pytest.raises(RuntimeError, match="feature_stores: 1 entries for 4 node types"):
        native.load().HeteroCpuBatcher(*arguments, [None] * 4, *rest, stores[:1])
    swapped = [stores[types["author"]] if name == "paper" else None for name in graph.type_names]
    with pytest.raises(RuntimeError, match="feature store of node type 0: 300 rows in .* for 400 nodes"):
        native.load().HeteroCpuBatcher(*arguments, [None] * 4, *rest, swapped)


def test_route_1_typed_batches_read_through_the_stores_equal_those_from_ram(graph_dir):
    in_ram = HeteroGraphStore.load(graph_dir, mmap=False)
    on_disk = HeteroGraphStore.load(graph_dir, features_on_disk=True, feature_cache_bytes=1000, io_threads=1)
    ram, disk = HeteroTorchBatcher(in_ram, FANOUTS, 64, seed=3), HeteroTorchBatcher(on_disk, FANOUTS, 64, seed=3)
    gathered = 0
    for expected, got in zip(ram.epoch(0), disk.epoch(0), strict=True):
        assert torch.equal(got.input_nodes, expected.input_nodes)
        for name in in_ram.type_names:
            assert same_rows(got.x[name], expected.x[name]), name
        gathered += got.x["paper"].shape[0]
    counters = on_disk.feature_stores["paper"].counters()
    assert counters.hits + counters.misses == gathered and counters.misses > 0
