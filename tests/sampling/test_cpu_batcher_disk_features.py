"""The CPU batcher with features on disk (GraphStore.load(features_on_disk=True)): its batches equal those built
from in-RAM features, bit for bit; a features file truncated during an epoch stops it with the file named."""
from __future__ import annotations

import os

import pytest
import torch

from morphpipe import native
from morphpipe.data import GraphStore
from morphpipe.data.ondisk import array_path
from morphpipe.sampling import CpuBatcher
from tests.conftest import make_graph


@pytest.fixture(scope="module")
def graph_dir(tmp_path_factory):
    """A 3000-node graph with float16 features of width 24 (48-byte rows: rows straddle 4 KiB pages)."""
    graph = make_graph(3000, index_dtype=torch.int64)
    features = torch.randn(3000, 24, generator=torch.Generator().manual_seed(3)).to(torch.float16)
    store = GraphStore(indptr=graph.indptr, indices=graph.indices, features=features, labels=graph.labels,
                       train_idx=graph.train_idx, val_idx=torch.tensor([1]), test_idx=torch.tensor([3]),
                       num_classes=5, name="disk-features")
    directory = tmp_path_factory.mktemp("graph")
    store.save(directory)
    return directory


@pytest.mark.parametrize("cache_bytes", [0, 48 * 200, 48 * 3000], ids=["no-cache", "tiny-cache", "all-cached"])
def test_batches_equal_those_from_features_in_ram(graph_dir, cache_bytes):
    in_ram = GraphStore.load(graph_dir, mmap=False)
    on_disk = GraphStore.load(graph_dir, features_on_disk=True, feature_cache_bytes=cache_bytes, io_threads=4)
    assert on_disk.feature_store.num_cached == cache_bytes // 48
    with CpuBatcher(in_ram, [5, 3], 64, num_threads=2, seed=7) as ram, \
            CpuBatcher(on_disk, [5, 3], 64, num_threads=2, seed=7) as disk:
        gathered = 0
        for epoch in (0, 1):
            pairs = list(zip(ram.epoch(epoch), disk.epoch(epoch), strict=True))
            assert len(pairs) == len(ram)
            for expected, got in pairs:
                gathered += got.input_nodes.numel()
                assert torch.equal(got.input_nodes, expected.input_nodes)
                assert torch.equal(got.x.view(torch.int16), expected.x.view(torch.int16))
                assert torch.equal(got.y, expected.y)
    counters = on_disk.feature_store.counters()
    assert counters.hits + counters.misses == gathered
    assert (counters.misses == 0) == (cache_bytes == 48 * 3000)


def test_a_features_file_truncated_during_an_epoch_stops_it_naming_the_file(graph_dir, tmp_path):
    copy = tmp_path / "graph"
    copy.mkdir()
    for entry in graph_dir.iterdir():
        (copy / entry.name).write_bytes(entry.read_bytes())
    graph = GraphStore.load(copy, features_on_disk=True, io_threads=2)
    features = array_path(copy, "features")
    with CpuBatcher(graph, [5, 3], 64, num_threads=1, queue_size=1, seed=0) as batcher:
        batches = batcher.epoch(0)
        next(batches)
        os.truncate(features, os.path.getsize(features) // 3)
        # A worker between its file check and its reads meets the short read instead: both name the file.
        with pytest.raises(RuntimeError, match=f"features file {features} (shrank from|ends at byte)"):
            for _ in batches:
                pass


def test_the_native_batcher_takes_features_from_exactly_one_source(graph_dir):
    graph = GraphStore.load(graph_dir, features_on_disk=True)
    extension = native.load()
    arguments = (graph.indptr, graph.indices)
    with pytest.raises(RuntimeError, match="either as a features tensor or as a feature_store, exactly one"):
        extension.CpuBatcher(*arguments, None, graph.labels, [2], 1, 1, False)
    with pytest.raises(RuntimeError, match="either as a features tensor or as a feature_store, exactly one"):
        extension.CpuBatcher(*arguments, graph.features, graph.labels, [2], 1, 1, False, graph.feature_store.native)


def test_the_serial_batcher_gathers_through_the_store_too(graph_dir):
    # A CPU-only plan whose phases take turns on the same cores builds batches with SerialBatcher (sample_neighbors).
    from morphpipe.sampling.serial_batcher import SerialBatcher

    in_ram = GraphStore.load(graph_dir, mmap=False)
    on_disk = GraphStore.load(graph_dir, features_on_disk=True, feature_cache_bytes=48 * 100, io_threads=2)
    ram, disk = SerialBatcher(in_ram, [4, 2], 50, seed=3), SerialBatcher(on_disk, [4, 2], 50, seed=3)
    gathered = 0
    for expected, got in zip(ram.epoch(0), disk.epoch(0), strict=True):
        assert torch.equal(got.input_nodes, expected.input_nodes)
        assert torch.equal(got.x.view(torch.int16), expected.x.view(torch.int16))
        gathered += got.input_nodes.numel()
    counters = on_disk.feature_store.counters()
    assert counters.hits + counters.misses == gathered and counters.misses > 0
