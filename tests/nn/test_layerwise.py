"""Layer-wise full-graph inference: equal to the model on whole-graph blocks, chunk by chunk, within its share."""
from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from morphpipe.data import GraphStore
from morphpipe.data.feature_store import FeatureStore
from morphpipe.nn.evaluate import full_accuracies, full_accuracy
from morphpipe.nn.layerwise import ChunkBuilder, LayerStats, layerwise_inference
from morphpipe.nn import build_model
from morphpipe.ops import force_choices
from morphpipe.sampling.minibatch import Block

pytestmark = pytest.mark.usefixtures("community_cache")
NUM_NODES, IN_DIM, NUM_CLASSES = 120, 12, 5


@dataclass
class SmallGraph:
    """The parts of a GraphStore that layer-wise inference reads."""

    indptr: torch.Tensor
    indices: torch.Tensor
    features: torch.Tensor

    @property
    def num_nodes(self) -> int:
        return self.indptr.numel() - 1

    @property
    def num_edges(self) -> int:
        return self.indices.numel()


def directed_graph(num_nodes: int, seed: int, dtype: torch.dtype = torch.float32) -> SmallGraph:
    """Random directed multigraph (duplicates, self edges, isolated nodes) in CSC, int32 indices as stored graphs have."""
    generator = torch.Generator().manual_seed(seed)
    edges = 4 * num_nodes
    src = torch.randint(0, num_nodes - 5, (edges,), generator=generator)
    dst = torch.randint(0, num_nodes - 5, (edges,), generator=generator)
    order = torch.argsort(dst * num_nodes + src)
    indptr = torch.zeros(num_nodes + 1, dtype=torch.int64)
    indptr[1:] = torch.cumsum(torch.bincount(dst, minlength=num_nodes), 0)
    features = torch.randn(num_nodes, IN_DIM, generator=generator, dtype=dtype)
    return SmallGraph(indptr, src[order].to(torch.int32), features)


def whole_graph_logits(model, graph: SmallGraph) -> torch.Tensor:
    """The model applied to one plain whole-graph block per layer (the definition of exact)."""
    block = Block(graph.indptr, graph.indices.to(torch.int64), graph.num_nodes, graph.num_nodes)
    model.eval()
    with torch.no_grad():
        return model([block] * model.num_layers, graph.features.to(next(model.parameters()).dtype))


def make_model(name: str, dtype: torch.dtype):
    torch.manual_seed(1)
    kwargs = {"heads": 2} if name == "gat" else {}
    return build_model(name, IN_DIM, NUM_CLASSES, num_layers=3, hidden=8, **kwargs).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("chunk_size", [7, 50, None])
@pytest.mark.parametrize("name", ["sage", "gcn", "gat", "mlp"])
def test_layerwise_equals_whole_graph(name, chunk_size, dtype):
    graph = directed_graph(NUM_NODES, seed=3, dtype=dtype)
    model = make_model(name, dtype)
    expected = whole_graph_logits(model, graph)
    got = layerwise_inference(model, graph, chunk_size=chunk_size, progress=False)
    tolerance = 1e-10 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(got, expected, rtol=tolerance, atol=tolerance)
    nodes = torch.tensor([5, 0, 119, 42])
    some = layerwise_inference(model, graph, nodes, chunk_size=chunk_size, progress=False)
    torch.testing.assert_close(some, expected[nodes], rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("name", ["sage", "gcn"])
def test_whole_graph_on_decomposed_kernel_equals(name):
    graph = directed_graph(NUM_NODES, seed=8)
    model = make_model(name, torch.float32)
    with force_choices({"graph.kernel": "community16"}):
        got = layerwise_inference(model, graph, progress=False)
    torch.testing.assert_close(got, whole_graph_logits(model, graph), rtol=1e-5, atol=1e-5)


def test_tables_on_disk_when_over_budget(tmp_path):
    graph = directed_graph(NUM_NODES, seed=4)
    model = make_model("sage", torch.float32)
    messages: list[str] = []
    got = layerwise_inference(model, graph, chunk_size=16, memory_budget=4096, tmp_dir=tmp_path, progress=False,
                              log=messages.append)
    torch.testing.assert_close(got, whole_graph_logits(model, graph), rtol=1e-5, atol=1e-5)
    assert [m for m in messages if "on disk" in m and "layer 1" in m]
    # Layer 1's table is read back through a store, which holds no memory: layer 2's 3,840 bytes fit beside it.
    assert [m for m in messages if "read back through a feature store" in m] == \
        ["layer-wise inference: layer1.npy read back through a feature store (pread pool of 48 I/O threads, through "
         "the page cache)"], messages
    assert [m for m in messages if "layer 2" in m and "in memory" in m], messages
    assert not list(tmp_path.iterdir()), "the temporary tables are removed afterwards"
    in_memory: list[str] = []
    layerwise_inference(model, graph, chunk_size=16, memory_budget=1 << 30, progress=False, log=in_memory.append)
    tables = [m for m in in_memory if " table " in m]
    assert len(tables) == 2 and all("in memory" in m for m in tables), "one message per intermediate table"
    assert any("chunks of 16 destinations" in m for m in in_memory)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_features_and_tables_on_disk_are_read_through_feature_stores(tmp_path, dtype):
    """Features on disk (GraphStore.load(features_on_disk=True)) and the tables over the budget are read by feature
    stores, every row of every chunk from them, with the result equal bit for bit to every table in memory."""
    graph = directed_graph(NUM_NODES, seed=6)
    stored = GraphStore(indptr=graph.indptr, indices=graph.indices, features=graph.features.to(torch.float16),
                        labels=torch.zeros(NUM_NODES, dtype=torch.int64), train_idx=torch.arange(10, 20),
                        val_idx=torch.tensor([1]), test_idx=torch.tensor([3]), num_classes=NUM_CLASSES, name="disk")
    stored.save(tmp_path / "graph")
    in_ram = GraphStore.load(tmp_path / "graph", mmap=False)
    on_disk = GraphStore.load(tmp_path / "graph", features_on_disk=True, io_threads=2)
    model = make_model("sage", dtype)
    expected = layerwise_inference(model, in_ram, chunk_size=16, memory_budget=1 << 30, progress=False)
    (tmp_path / "tables").mkdir()
    reads: list[int] = []
    files: set[tuple[str, bool]] = set()
    original = FeatureStore.gather

    def counting(store, ids):
        reads.append(ids.numel())
        files.add((store.path.name, store.direct))
        return original(store, ids)

    FeatureStore.gather = counting
    try:
        got = layerwise_inference(model, on_disk, chunk_size=16, memory_budget=1, tmp_dir=tmp_path / "tables",
                                  progress=False)
    finally:
        FeatureStore.gather = original
    assert torch.equal(got.view(torch.int16 if dtype == torch.bfloat16 else torch.int32),
                       expected.view(torch.int16 if dtype == torch.bfloat16 else torch.int32))
    chunks = -(-NUM_NODES // 16)
    assert len(reads) == 3 * chunks, "every chunk of every layer reads its rows through a store"
    assert on_disk.feature_store.direct, "the graph's store reads with O_DIRECT (ext4 allows it)"
    assert files == {("features.npy", False), ("layer1.npy", False), ("layer2.npy", False)}, \
        "the features without a cache, and the tables, are read through the page cache"
    cached = GraphStore.load(tmp_path / "graph", features_on_disk=True, feature_cache_bytes=10 * IN_DIM * 2,
                             io_threads=2)
    got = layerwise_inference(model, cached, chunk_size=16, memory_budget=1, tmp_dir=tmp_path / "tables",
                              progress=False)
    assert torch.equal(got.view(torch.int16 if dtype == torch.bfloat16 else torch.int32),
                       expected.view(torch.int16 if dtype == torch.bfloat16 else torch.int32))
    assert cached.feature_store.counters().hits > 0, "a store with a cache is read as it is"


def test_tables_on_disk_are_written_unmapped_and_read_through_the_page_cache(tmp_path, monkeypatch):
    """A table on disk is never memory-mapped (its written pages would count in the resident set, up to the whole
    table), and its reader reads through the page cache (every chunk re-reads much of it)."""
    graph = directed_graph(NUM_NODES, seed=4)
    model = make_model("sage", torch.float32)
    original_layer, original_gather = model.layer, FeatureStore.gather
    mapped: list[str] = []
    direct: list[bool] = []

    def layer(i, block, h_src):
        mapped.extend(line for line in open("/proc/self/maps") if str(tmp_path) in line)
        return original_layer(i, block, h_src)

    def gather(store, ids):
        direct.append(store.direct)
        return original_gather(store, ids)

    model.layer = layer
    monkeypatch.setattr(FeatureStore, "gather", gather)
    got = layerwise_inference(model, graph, chunk_size=16, memory_budget=1, tmp_dir=tmp_path, progress=False)
    torch.testing.assert_close(got, whole_graph_logits(model, graph), rtol=1e-5, atol=1e-5)
    assert mapped == [], "no table file is mapped while the layers run"
    assert direct == [False] * 16, "layers 2 and 3 read their 8 chunks each through the page cache"


def test_layer_stats_say_where_each_layer_went(tmp_path):
    """One LayerStats per layer, logged: its chunks, the rows they read and, from a table on disk, the store's reads."""
    graph = directed_graph(NUM_NODES, seed=6)
    model = make_model("sage", torch.float32)
    stats: list[LayerStats] = []
    messages: list[str] = []
    nodes = torch.tensor([3, 9, 100])
    layerwise_inference(model, graph, nodes, chunk_size=16, memory_budget=1, tmp_dir=tmp_path, progress=False,
                        log=messages.append, stats=stats)
    chunks = -(-NUM_NODES // 16)
    assert [layer.layer for layer in stats] == [0, 1, 2]
    assert [layer.chunks for layer in stats] == [chunks, chunks, 1]
    builder = ChunkBuilder(graph.indptr, graph.indices, NUM_NODES)
    every = sum(builder.block(torch.arange(s, min(s + 16, NUM_NODES)))[0].num_src for s in range(0, NUM_NODES, 16))
    assert [layer.rows_read for layer in stats] == [every, every, builder.block(nodes)[0].num_src]
    assert stats[0].store_reads is None, "the features are in memory"
    assert stats[1].store_reads > 0 and stats[1].store_bytes >= stats[1].rows_read * 8 * 4, "layer 1's table on disk"
    for layer in stats:
        assert layer.seconds >= layer.build_seconds + layer.read_seconds + layer.compute_seconds > 0
    assert [m for m in messages if " took " in m] == [layer.line() for layer in stats]


def test_full_accuracies_take_one_pass_for_every_split():
    graph = directed_graph(NUM_NODES, seed=9)
    graph.labels = torch.arange(NUM_NODES) % NUM_CLASSES
    model = make_model("sage", torch.float32)
    splits = {"train": torch.arange(0, 60), "val": torch.tensor([70, 3, 90]), "test": torch.arange(100, 120)}
    calls: list[int] = []
    original = model.layer

    def counting(i, block, h_src):
        calls.append(i)
        return original(i, block, h_src)

    model.layer = counting
    got = full_accuracies(model, graph, splits, chunk_size=50, progress=False)
    assert calls == [0, 0, 0, 1, 1, 1, 2, 2], "layers 1 and 2 over the graph once, layer 3 over the 83 seeds"
    assert got == {name: full_accuracy(model, graph, seeds, chunk_size=50, progress=False)
                   for name, seeds in splits.items()}
    with pytest.raises(ValueError, match="split 'val' of the graph is empty"):
        full_accuracies(model, graph, {"train": splits["train"], "val": torch.tensor([], dtype=torch.int64)},
                        progress=False)


def test_chunks_hold_only_their_share():
    """Every layer call sees exactly its chunk's destinations and their in-neighbours, never more."""
    graph = directed_graph(NUM_NODES, seed=5)
    model = make_model("gcn", torch.float32)
    calls: list[tuple[int, Block, torch.Size]] = []
    original = model.layer

    def recording(i, block, h_src):
        calls.append((i, block, h_src.shape))
        return original(i, block, h_src)

    model.layer = recording
    chunk = 16
    layerwise_inference(model, graph, chunk_size=chunk, progress=False)
    indptr, indices = graph.indptr, graph.indices.long()
    assert len(calls) == 3 * -(-NUM_NODES // chunk)
    for position, (layer, block, shape) in enumerate(calls):
        start = (position % -(-NUM_NODES // chunk)) * chunk
        dst = range(start, min(start + chunk, NUM_NODES))
        share = set(dst) | {int(j) for d in dst for j in indices[indptr[d]:indptr[d + 1]]}
        assert block.num_dst == len(dst) <= chunk
        assert block.num_src == len(share) == shape[0], "h_src holds the chunk's share of the table, nothing more"
        assert block.nnz == int(indptr[dst.stop] - indptr[dst.start])


def test_chunk_builder_prefix_and_degrees():
    graph = directed_graph(30, seed=6)
    builder = ChunkBuilder(graph.indptr, graph.indices, 30)
    dst = torch.tensor([7, 2, 11])
    block, src_ids = builder.block(dst)
    assert src_ids[:3].tolist() == [7, 2, 11]
    for k, node in enumerate(dst.tolist()):
        neighbours = graph.indices[graph.indptr[node]:graph.indptr[node + 1]].long()
        assert src_ids[block.indices[block.indptr[k]:block.indptr[k + 1]]].tolist() == neighbours.tolist()
    whole = torch.bincount(graph.indices.long(), minlength=30)
    assert block.src_degrees.tolist() == whole[src_ids].tolist()
    again, _ = builder.block(dst)
    assert again.indices.tolist() == block.indices.tolist(), "the builder's scratch map is reset after each chunk"


def test_bad_arguments_are_named():
    graph = directed_graph(20, seed=7)
    model = make_model("sage", torch.float32)
    with pytest.raises(ValueError, match="chunk_size"):
        layerwise_inference(model, graph, chunk_size=0, progress=False)
    with pytest.raises(ValueError, match="nodes must be node ids"):
        layerwise_inference(model, graph, torch.tensor([20]), progress=False)
