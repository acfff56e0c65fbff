"""Edge batches on both routes (Route 0: the native builder; Route 1: the torch path, here on CPU tensors): negative
sampling's distribution and rejection, determinism per (seed, epoch), leakage control by construction, blocks equal
to a plain-Python reference, and every training edge exactly once per epoch."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from morphpipe.data import GraphStore
from morphpipe.data.edge_split import EdgeSplit
from morphpipe.data.generators import COMMUNITY, GeneratorSpec
from morphpipe.data.link_generator import EdgeSplitSpec, generate_link
from morphpipe.data.splits import SplitFractions
from morphpipe.sampling.edge_batcher import (EdgeBatcher, GpuEdgeBatcher, NegativeSampling, SerialEdgeBatcher,
                                             sample_edge_batch)

FANOUTS = [4, 3]


@pytest.fixture(scope="module")
def link_graph(tmp_path_factory) -> GraphStore:
    spec = GeneratorSpec(COMMUNITY, num_nodes=400, avg_degree=10, feature_dim=4, num_classes=4, homophily=0.9)
    path = generate_link(spec, EdgeSplitSpec(SplitFractions(0.8, 0.1, 0.1), negatives=5), tmp_path_factory.mktemp(
        "edges") / "g", progress=False)
    return GraphStore.load(path)


def in_lists(graph) -> list[set[int]]:
    indptr, indices = graph.indptr.numpy(), graph.indices.numpy()
    return [set(indices[indptr[v]:indptr[v + 1]].tolist()) for v in range(graph.num_nodes)]


def one_batch(route: int, graph, ids: torch.Tensor, fanouts, *, negatives: NegativeSampling | None = None,
              exclude: bool = True, seed: int = 0):
    """The edge batch of training edges `ids` built by `route`."""
    if route == 0:
        return sample_edge_batch(graph, ids, fanouts, negatives=negatives, exclude=exclude, seed=seed)
    batcher = GpuEdgeBatcher(graph, fanouts, ids.numel(), negatives=negatives, exclude=exclude, edge_ids=ids,
                             shuffle=False, seed=seed, device="cpu")
    return next(iter(batcher.epoch(0)))


ROUTES = pytest.mark.parametrize("route", [0, 1], ids=["route0", "route1"])


def negatives_drawn(graph, sampling: NegativeSampling, route: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(sources repeated per negative, global negative ids) of one batch of every training edge."""
    ids = torch.arange(graph.edge_split.train.shape[1])
    batch = one_batch(route, graph, ids, [1], negatives=sampling, seed=3)
    negatives = batch.seeds[batch.pairs.negative_dst].numpy()
    sources = batch.seeds[batch.pairs.src].numpy()
    return np.repeat(sources, negatives.shape[1]), negatives.reshape(-1)


@ROUTES
@pytest.mark.parametrize("kind", ["uniform", "degree"])
def test_negatives_follow_their_distribution(link_graph, kind, route):
    _, drawn = negatives_drawn(link_graph, NegativeSampling(20, kind), route)
    weights = np.ones(link_graph.num_nodes) if kind == "uniform" else \
        link_graph.in_degrees().numpy().astype(np.float64) ** 0.75
    expected = weights / weights.sum() * drawn.size
    observed = np.bincount(drawn, minlength=link_graph.num_nodes)
    assert stats.chisquare(observed, expected).pvalue > 1e-3
    if kind == "degree":  # and the uniform law is rejected for it: the test tells them apart
        uniform = np.full(link_graph.num_nodes, drawn.size / link_graph.num_nodes)
        assert stats.chisquare(observed, uniform).pvalue < 1e-6


@ROUTES
def test_no_positive_is_a_negative_when_rejection_is_asked(link_graph, route):
    neighbours = in_lists(link_graph)
    for reject in (True, False):
        sources, drawn = negatives_drawn(link_graph, NegativeSampling(30, reject_positives=reject), route)
        hits = sum(int(u == w or u in neighbours[w]) for u, w in zip(sources.tolist(), drawn.tolist()))
        assert (hits == 0) if reject else (hits > 0)  # without rejection, a dense enough graph draws some edges


def batches_equal(first, second) -> bool:
    return all(torch.equal(a.seeds, b.seeds) and torch.equal(a.input_nodes, b.input_nodes) and
               torch.equal(a.pairs.negative_dst, b.pairs.negative_dst) and torch.equal(a.x, b.x) and
               all(torch.equal(p.indices, q.indices) and torch.equal(p.indptr, q.indptr)
                   for p, q in zip(a.blocks, b.blocks)) for a, b in zip(first, second, strict=True))


def test_batches_are_deterministic_per_seed_and_epoch_on_every_batcher(link_graph):
    sampling = NegativeSampling(3, "degree")
    with EdgeBatcher(link_graph, FANOUTS, 64, negatives=sampling, num_threads=2, seed=7) as two, \
            EdgeBatcher(link_graph, FANOUTS, 64, negatives=sampling, num_threads=1, seed=7) as one:
        epoch1 = list(two.epoch(1))
        assert batches_equal(epoch1, list(one.epoch(1)))  # any thread count
        assert batches_equal(list(two.epoch(0)), list(one.epoch(0)))
        assert batches_equal(epoch1, list(two.epoch(1)))  # epoch(k) replays
        assert not batches_equal(epoch1, list(two.epoch(2)))
        assert batches_equal(epoch1[3:], list(two.epoch_from(1, 3)))  # a resumed epoch: the rest of it
    serial = SerialEdgeBatcher(link_graph, FANOUTS, 64, negatives=sampling, seed=7)
    assert batches_equal(epoch1, list(serial.epoch(1)))  # the on-demand batcher builds the same batches
    assert batches_equal(epoch1[3:], list(serial.epoch_from(1, 3)))
    with EdgeBatcher(link_graph, FANOUTS, 64, negatives=sampling, num_threads=2, seed=8) as other:
        assert not batches_equal(epoch1, list(other.epoch(1)))


def test_serial_batcher_builds_the_same_batches_several_at_a_time(link_graph):
    """Built several at a time (a turn of batching on every core), the on-demand batcher's epochs are the
    one-at-a-time epochs, in order, also when the batch count is no multiple of the thread count."""
    sampling = NegativeSampling(3)
    one = SerialEdgeBatcher(link_graph, FANOUTS, 64, negatives=sampling, seed=7)
    assert len(one) % 3 != 0  # with 3 threads the last turn builds fewer batches than threads
    for threads in (2, 3):
        several = SerialEdgeBatcher(link_graph, FANOUTS, 64, negatives=sampling, seed=7, num_threads=threads)
        for epoch in (0, 1):
            expected, got = list(one.epoch(epoch)), list(several.epoch(epoch))
            assert batches_equal(expected, got)
            assert [batch.batch_index for batch in got] == list(range(len(one)))
            assert all(torch.equal(a.units, b.units) for a, b in zip(expected, got, strict=True))
            assert batches_equal(expected[2:], list(several.epoch_from(epoch, 2)))  # a resumed epoch, in turns
    with pytest.raises(ValueError, match="num_threads"):
        SerialEdgeBatcher(link_graph, FANOUTS, 64, num_threads=0)


def test_route1_visits_the_edges_of_route0_in_the_same_batches(link_graph):
    with EdgeBatcher(link_graph, FANOUTS, 64, num_threads=1, seed=2) as cpu:
        route0 = [batch.units for batch in cpu.epoch(3)]
    gpu = GpuEdgeBatcher(link_graph, FANOUTS, 64, seed=2, device="cpu")
    batches = list(gpu.epoch(3))
    assert all(batch.route == 1 for batch in batches)
    assert all(torch.equal(a, b.units) for a, b in zip(route0, batches, strict=True))
    assert batches_equal(batches, list(gpu.epoch(3)))  # epoch(k) replays on Route 1 too
    assert batches_equal(batches[2:], list(gpu.epoch_from(3, 2)))  # and continues from any batch


def test_every_training_edge_once_per_epoch(link_graph):
    train = link_graph.edge_split.train
    with EdgeBatcher(link_graph, FANOUTS, 50, num_threads=2, seed=1) as batcher:
        assert len(batcher) == -(-train.shape[1] // 50)
        orders = []
        for epoch in range(3):
            batches = list(batcher.epoch(epoch))
            units = torch.cat([batch.units for batch in batches])
            assert torch.equal(torch.sort(units).values, torch.arange(train.shape[1]))
            for batch in batches:  # each pair's endpoints are the training edge it names
                pairs = batch.pairs
                assert torch.equal(batch.seeds[pairs.src], train[0, pairs.edge_ids])
                assert torch.equal(batch.seeds[pairs.dst], train[1, pairs.edge_ids])
            orders.append(units)
        assert not torch.equal(orders[0], orders[1])


def isolated_pair_graph() -> GraphStore:
    """Nodes 0 and 1 joined only to each other (both ways); nodes 2..7 a cycle with chords; edge split of 3 pairs."""
    connections = [(0, 1), (2, 3), (3, 4), (4, 5), (5, 6), (6, 7), (7, 2), (2, 5), (3, 6)]
    src = [u for u, v in connections] + [v for u, v in connections]
    dst = [v for u, v in connections] + [u for u, v in connections]
    keys = np.sort(np.array(dst) * 8 + np.array(src))
    indptr = np.zeros(9, dtype=np.int64)
    np.cumsum(np.bincount(keys // 8, minlength=8), out=indptr[1:])
    train = torch.tensor([[0, 2, 4], [1, 3, 5]])
    split = EdgeSplit(train, torch.tensor([[3], [4]]), torch.tensor([[6], [7]]), torch.tensor([[0]]),
                      torch.tensor([[1]]), undirected=True)
    return GraphStore(torch.from_numpy(indptr), torch.from_numpy(keys % 8), torch.zeros(8, 2),
                      torch.zeros(8, dtype=torch.int64), torch.arange(8), torch.zeros(0, dtype=torch.int64),
                      torch.zeros(0, dtype=torch.int64), 1, edge_split=split)


def block_edges(batch) -> set[tuple[int, int]]:
    """Every (source, destination) global pair that some block of the batch holds."""
    edges = set()
    for block in batch.blocks:
        for dst in range(block.num_dst):
            for src in block.indices[block.indptr[dst]:block.indptr[dst + 1]].tolist():
                edges.add((int(batch.input_nodes[src]), int(batch.input_nodes[dst])))
    return edges


@ROUTES
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_batch_never_passes_messages_over_its_own_positive_edges(route):
    graph = isolated_pair_graph()
    for batcher_exclude in (True, False):
        batch = one_batch(route, graph, torch.tensor([0, 1]), [-1, -1], negatives=NegativeSampling(1),
                          exclude=batcher_exclude)
        edges = block_edges(batch)
        used = {(0, 1), (1, 0), (2, 3), (3, 2)} & edges
        if batcher_exclude:
            # 0 and 1 have no other connection: with their edge excluded no block reaches either from anywhere
            assert not used and not any(0 in edge or 1 in edge for edge in edges)
        else:
            assert used == {(0, 1), (1, 0), (2, 3), (3, 2)}


def reference_blocks(graph, seeds: list[int], excluded: set[tuple[int, int]], hops: int):
    """Full-neighbourhood blocks in plain Python: destinations first, new sources in order of discovery."""
    neighbours = [graph.indices[graph.indptr[v]:graph.indptr[v + 1]].tolist() for v in range(graph.num_nodes)]
    nodes, local, layers = list(seeds), {node: i for i, node in enumerate(seeds)}, []
    for _ in range(hops):
        destinations, indptr, indices = list(nodes), [0], []
        for node in destinations:
            for source in neighbours[node]:
                if (source, node) in excluded:
                    continue
                if source not in local:
                    local[source] = len(nodes)
                    nodes.append(source)
                indices.append(local[source])
            indptr.append(len(indices))
        layers.insert(0, (indptr, indices))
    return nodes, layers


@ROUTES
@pytest.mark.parametrize("exclude", [True, False])
def test_blocks_equal_a_plain_python_reference(link_graph, exclude, route):
    train = link_graph.edge_split.train
    ids = torch.tensor([5, 17, 3, 40, 41])
    batch = one_batch(route, link_graph, ids, [-1, -1], negatives=NegativeSampling(2), exclude=exclude, seed=11)
    # seeds: each positive's source and destination in order, then the negatives, each node once
    negatives = batch.seeds[batch.pairs.negative_dst]
    expected_seeds = list(dict.fromkeys(torch.stack([train[0, ids], train[1, ids]], 1).reshape(-1).tolist() +
                                        negatives.reshape(-1).tolist()))
    assert batch.seeds.tolist() == expected_seeds
    excluded = set()
    if exclude:
        excluded = {(int(u), int(v)) for u, v in train[:, ids].T} | {(int(v), int(u)) for u, v in train[:, ids].T}
    nodes, layers = reference_blocks(link_graph, expected_seeds, excluded, 2)
    assert batch.input_nodes.tolist() == nodes
    for block, (indptr, indices) in zip(batch.blocks, layers, strict=True):
        assert block.indptr.tolist() == indptr and block.indices.tolist() == indices
    assert torch.equal(batch.x, link_graph.features[batch.input_nodes])


@ROUTES
def test_sampled_blocks_take_fanout_of_the_allowed_neighbours(link_graph, route):
    train = link_graph.edge_split.train
    ids = torch.arange(0, 200, 3)
    batch = one_batch(route, link_graph, ids, FANOUTS, negatives=NegativeSampling(2), seed=4)
    neighbours = in_lists(link_graph)
    excluded = {(int(u), int(v)) for u, v in train[:, ids].T} | {(int(v), int(u)) for u, v in train[:, ids].T}
    for layer, block in enumerate(batch.blocks):
        fanout = FANOUTS[len(FANOUTS) - 1 - layer]
        for dst in range(block.num_dst):
            node = int(batch.input_nodes[dst])
            sampled = batch.input_nodes[block.indices[block.indptr[dst]:block.indptr[dst + 1]]].tolist()
            allowed = {source for source in neighbours[node] if (source, node) not in excluded}
            assert len(set(sampled)) == len(sampled) == min(fanout, len(allowed))
            assert set(sampled) <= allowed


def test_bad_edge_ids_and_settings_are_refused(link_graph, tiny):
    count = link_graph.edge_split.train.shape[1]
    with pytest.raises(ValueError, match=f"training edge id {count} is outside \\[0, {count}\\)"):
        EdgeBatcher(link_graph, FANOUTS, 8, edge_ids=torch.tensor([0, count]))
    with pytest.raises(RuntimeError, match=f"edge_ids\\[1\\] = {count} is not a training edge id"):
        sample_edge_batch(link_graph, torch.tensor([0, count]), FANOUTS)
    with pytest.raises(ValueError, match="negatives"):
        NegativeSampling(-1)
    with pytest.raises(ValueError, match="kind must be one of"):
        NegativeSampling(1, "popular")
    with pytest.raises(ValueError, match="data split-edges"):
        EdgeBatcher(tiny, FANOUTS, 8)
