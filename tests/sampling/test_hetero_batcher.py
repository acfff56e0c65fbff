"""The typed Route 0 batcher: blocks equal a plain-Python reference over the typed lists, per-relation uniformity,
the epoch contract, empty relations and types, featureless types, and bad input."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from morphpipe.data.hetero_generator import MagSpec, mag_shaped
from morphpipe.data.hetero_store import HeteroGraphStore, Relation, csc_of, type_ranges
from morphpipe.sampling.hetero_batcher import HeteroCpuBatcher, relation_fanouts
from morphpipe.sampling.hetero_torch_batcher import HeteroTorchBatcher

FANOUTS = [4, 3]


@pytest.fixture(scope="module")
def graph() -> HeteroGraphStore:
    store = mag_shaped(MagSpec(num_papers=400, num_authors=300, num_institutions=12, num_fields=30, feature_dim=6))
    store.validate()
    return store


def typed_nodes(graph, batch) -> dict[str, list[int]]:
    """The batch's input nodes per type (input_nodes holds them type after type)."""
    counts = batch.blocks[0].num_src
    nodes, offset = {}, 0
    for name in graph.type_names:
        nodes[name] = batch.input_nodes[offset:offset + counts[name]].tolist()
        offset += counts[name]
    return nodes


def reference(graph, seeds: list[int], fanouts: list[list[int]], choose) -> tuple[dict, list]:
    """Plain-Python typed sampling: per-type relabelling in order of discovery, destinations frozen at each hop.
    `choose(hop, relation, dst_global, neighbours, fanout)` picks the source-local neighbours of one destination."""
    starts = {t.name: t.start for t in graph.node_types}
    type_of = {}
    for t in graph.node_types:
        type_of.update({node: t.name for node in range(t.start, t.stop)})
    nodes = {name: [] for name in graph.type_names}
    local = {}
    for seed in seeds:
        local[seed] = len(nodes[type_of[seed]])
        nodes[type_of[seed]].append(seed)
    layers = []
    for hop, hop_fanouts in enumerate(fanouts):
        num_dst = {name: len(found) for name, found in nodes.items()}
        blocks = {}
        for relation, fanout in zip(graph.relations, hop_fanouts):
            indptr, indices = [0], []
            csc_indptr, csc_indices = graph.indptr[relation].tolist(), graph.indices[relation].tolist()
            for dst in nodes[relation.dst][: num_dst[relation.dst]]:
                position = dst - starts[relation.dst]
                neighbours = csc_indices[csc_indptr[position]:csc_indptr[position + 1]]
                for source in choose(hop, relation, dst, neighbours, fanout):
                    node = source + starts[relation.src]
                    if node not in local:
                        local[node] = len(nodes[relation.src])
                        nodes[relation.src].append(node)
                    indices.append(local[node])
                indptr.append(len(indices))
            blocks[relation] = (indptr, indices)
        layers.insert(0, (blocks, num_dst, {name: len(found) for name, found in nodes.items()}))
    return nodes, layers


def assert_equals_reference(graph, batch, fanouts, choose) -> None:
    nodes, layers = reference(graph, batch.seeds.tolist(), relation_fanouts(graph, fanouts), choose)
    assert typed_nodes(graph, batch) == nodes
    for layer, (blocks, num_dst, num_src) in zip(batch.blocks, layers):
        assert layer.num_dst == num_dst and layer.num_src == num_src
        for relation, (indptr, indices) in blocks.items():
            block = layer.blocks[relation]
            assert block.indptr.tolist() == indptr and block.indices.tolist() == indices, relation
            assert (block.num_src, block.num_dst) == (num_src[relation.src], num_dst[relation.dst])
    for t in graph.node_types:
        ids = torch.tensor(nodes[t.name], dtype=torch.long) - t.start
        expected = graph.features[t.name][ids] if t.name in graph.features else ids
        assert torch.equal(batch.x[t.name], expected)
    assert torch.equal(batch.y, graph.labels[batch.seeds])


def take_all(hop, relation, dst, neighbours, fanout):
    return neighbours


def test_all_neighbours_equal_the_reference(graph) -> None:
    with HeteroCpuBatcher(graph, [-1, -1], 16, num_threads=2, seed=3) as batcher:
        for batch in batcher.epoch(0):
            assert_equals_reference(graph, batch, [-1, -1], take_all)


@pytest.mark.parametrize("fanouts", [FANOUTS, {"cites": [3, 2], "rev_cites": [2, 1], "writes": [1, 2],
                                               "rev_writes": [2, 0], "affiliated_with": [1, 1],
                                               "rev_affiliated_with": [0, 0], "has_topic": [-1, 2],
                                               "rev_has_topic": [2, 2]}], ids=["one-list", "per-relation"])
def test_sampled_blocks_equal_the_reference_given_the_choices(graph, fanouts) -> None:
    """The reference replays the batch's choices; each choice is a distinct subset of the list, of the fanout's size."""
    with HeteroCpuBatcher(graph, fanouts, 32, num_threads=2, seed=1) as batcher:
        for batch in list(batcher.epoch(0))[:3]:
            nodes = typed_nodes(graph, batch)
            starts = {t.name: t.start for t in graph.node_types}

            def replay(hop, relation, dst, neighbours, fanout, batch=batch, nodes=nodes):
                layer = batch.blocks[len(batch.blocks) - 1 - hop]
                block = layer.blocks[relation]
                position = nodes[relation.dst].index(dst)
                chosen = [nodes[relation.src][i] - starts[relation.src]
                          for i in block.indices[block.indptr[position]:block.indptr[position + 1]].tolist()]
                expected = len(neighbours) if fanout == -1 else min(fanout, len(neighbours))
                assert len(chosen) == expected and len(set(chosen)) == len(chosen)
                assert set(chosen) <= set(neighbours)
                return chosen

            assert_equals_reference(graph, batch, fanouts, replay)


def test_epochs_visit_every_seed_once_replay_and_do_not_depend_on_threads(graph) -> None:
    def epoch(batcher, k):
        return [(b.seeds.tolist(), b.input_nodes.tolist(), [l.blocks[r].indices.tolist() for l in b.blocks
                                                            for r in graph.relations]) for b in batcher.epoch(k)]

    with HeteroCpuBatcher(graph, FANOUTS, 50, num_threads=1, seed=5) as one, \
            HeteroCpuBatcher(graph, FANOUTS, 50, num_threads=3, seed=5) as three, \
            HeteroCpuBatcher(graph, FANOUTS, 50, seed=5, serial=True) as serial:
        first = epoch(three, 0)
        assert sorted(s for seeds, _, _ in first for s in seeds) == sorted(graph.train_idx.tolist())
        assert epoch(one, 0) == first == epoch(serial, 0) == epoch(three, 0)
        assert epoch(three, 1) != first
        three.epoch, serial.epoch = (lambda k: three.epoch_from(k, 2)), (lambda k: serial.epoch_from(k, 2))
        assert epoch(three, 0) == first[2:] == epoch(serial, 0), "an epoch from batch 2 on is the rest of it"


@pytest.mark.parametrize("route", [0, 1])
def test_each_relation_samples_uniformly_without_replacement(route) -> None:
    """Type a: 4 nodes each with 12 b-neighbours (fanout 3) and 4 a-neighbours (fanout 2): chi-square per relation."""
    counts = {"a": 4, "b": 20}
    ab_src = np.concatenate([np.arange(i, i + 12) for i in range(4)])
    ab_dst = np.repeat(np.arange(4), 12)
    aa_src = np.tile(np.arange(4), 4)  # every a node, itself included
    aa_dst = np.repeat(np.arange(4), 4)
    relations = (Relation("b", "x", "a"), Relation("a", "y", "a"))
    indptr, indices = {}, {}
    for relation, (src, dst) in zip(relations, ((ab_src, ab_dst), (aa_src, aa_dst))):
        indptr[relation], indices[relation] = csc_of(src, dst, counts[relation.dst], counts[relation.src])
    labels = torch.full((24,), -1, dtype=torch.long)
    labels[:4] = 0
    graph = HeteroGraphStore(node_types=type_ranges(counts), relations=relations, indptr=indptr, indices=indices,
                             features={}, labels=labels, train_idx=torch.arange(4), val_idx=torch.zeros(0).long(),
                             test_idx=torch.zeros(0).long(), num_classes=1, target_type="a")
    graph.validate()
    picks = {relations[0]: np.zeros((4, 12)), relations[1]: np.zeros((4, 4))}
    fanout = {relations[0]: 3, relations[1]: 2}
    make = HeteroCpuBatcher if route == 0 else HeteroTorchBatcher
    options = {"serial": True} if route == 0 else {}
    with make(graph, {"x": [3], "y": [2]}, 4, seed=11, **options) as batcher:
        for epoch in range(300):
            batch = next(iter(batcher.epoch(epoch)))
            nodes = typed_nodes(graph, batch)
            layer = batch.blocks[0]
            for relation, table in picks.items():
                block = layer.blocks[relation]
                for position, dst in enumerate(nodes["a"][:4]):
                    row = block.indptr[position:position + 2].tolist()
                    sampled = [nodes[relation.src][i] - (4 if relation.src == "b" else 0)
                               for i in block.indices[row[0]:row[1]].tolist()]
                    assert len(sampled) == fanout[relation]
                    start, stop = graph.indptr[relation][dst].item(), graph.indptr[relation][dst + 1].item()
                    listed = graph.indices[relation][start:stop].tolist()
                    table[dst, [listed.index(node) for node in sampled]] += 1
    for relation, table in picks.items():
        for dst in range(4):
            assert chisquare(table[dst]).pvalue > 1e-4, (relation, dst, table[dst])


def test_an_empty_relation_an_absent_type_and_a_featureless_type(graph) -> None:
    writes = Relation("author", "writes", "paper")
    indptr, indices = dict(graph.indptr), dict(graph.indices)
    indptr[writes] = torch.zeros_like(indptr[writes])
    indices[writes] = indices[writes][:0]
    store = HeteroGraphStore(**{**{f: getattr(graph, f) for f in ("node_types", "relations", "features", "labels",
                                                                  "train_idx", "val_idx", "test_idx",
                                                                  "num_classes", "target_type")},
                                "indptr": indptr, "indices": indices})
    store.validate()
    fanouts = {r.key: [0 if r.name == "affiliated_with" else 3, 2 if r.name == "cites" else 0]
               for r in store.relations}
    with HeteroCpuBatcher(store, fanouts, 20, seed=2, num_threads=2) as batcher:
        batch = next(iter(batcher))
    last, first = batch.blocks[1], batch.blocks[0]
    assert last.blocks[writes].nnz == 0 and last.blocks[writes].num_dst == 20
    assert last.num_dst == {"paper": 20, "author": 0, "institution": 0, "field_of_study": 0}
    assert first.num_src["institution"] == 0 and batch.x["institution"].shape == (0,)
    assert batch.x["author"].dtype == torch.int64 and batch.x["paper"].dtype == torch.float32
    assert_equals_reference(store, batch, fanouts, replay_from(store, batch))


def replay_from(graph, batch):
    nodes = typed_nodes(graph, batch)
    starts = {t.name: t.start for t in graph.node_types}

    def replay(hop, relation, dst, neighbours, fanout):
        block = batch.blocks[len(batch.blocks) - 1 - hop].blocks[relation]
        position = nodes[relation.dst].index(dst)
        return [nodes[relation.src][i] - starts[relation.src]
                for i in block.indices[block.indptr[position]:block.indptr[position + 1]].tolist()]

    return replay


@pytest.mark.parametrize("fanouts, message", [
    ({"cites": [2, 2]}, r"no fanouts for relation\(s\) \['author__writes__paper'"),
    ({**{name: [2, 2] for name in ("writes", "cites", "affiliated_with", "has_topic", "rev_writes", "rev_cites",
                                   "rev_affiliated_with", "rev_has_topic")}, "citez": [1, 1]},
     "fanouts: relation 'citez' is not in graph"),
    ({**{name: [2, 2] for name in ("writes", "affiliated_with", "has_topic", "rev_writes", "rev_cites",
                                   "rev_affiliated_with", "rev_has_topic")}, "cites": [1]}, "different hop counts"),
    ({"cites": [2], "paper__cites__paper": [2]}, "relation paper__cites__paper is given twice"),
    ([0, 2], r"fanouts\[0\] = 0"),
    ({"cites": [-2]}, r"fanouts\['paper__cites__paper'\]\[0\] = -2"),
])
def test_bad_fanouts_are_refused_naming_the_relation(graph, fanouts, message) -> None:
    with pytest.raises(ValueError, match=message):
        HeteroCpuBatcher(graph, fanouts, 8)


def test_seeds_outside_the_target_type_are_refused(graph) -> None:
    with pytest.raises(ValueError, match="node 400 is not of the target type 'paper'"):
        HeteroCpuBatcher(graph, FANOUTS, 8, seeds=torch.tensor([0, 400]))


def test_route_1_with_every_neighbour_equals_route_0_and_the_reference(graph) -> None:
    """The torch path relabels as the C++ batcher does: with every neighbour taken, the batches are equal."""
    with HeteroCpuBatcher(graph, [-1, -1], 16, num_threads=1, seed=3) as route0:
        batches0 = list(route0.epoch(0))
    batches1 = list(HeteroTorchBatcher(graph, [-1, -1], 16, seed=3).epoch(0))
    assert len(batches0) == len(batches1)
    for zero, one in zip(batches0, batches1):
        assert torch.equal(zero.input_nodes, one.input_nodes) and torch.equal(zero.seeds, one.seeds)
        assert one.route == 1
        for layer0, layer1 in zip(zero.blocks, one.blocks):
            assert (layer0.num_src, layer0.num_dst) == (layer1.num_src, layer1.num_dst)
            for relation in graph.relations:
                assert torch.equal(layer0.blocks[relation].indptr, layer1.blocks[relation].indptr)
                assert torch.equal(layer0.blocks[relation].indices, layer1.blocks[relation].indices)
        assert_equals_reference(graph, one, [-1, -1], take_all)


def test_route_1_sampled_blocks_equal_the_reference_and_keep_the_epoch_contract(graph) -> None:
    fanouts = {r.key: [2 if r.name == "cites" else 1, 0 if r.name.startswith("rev_aff") else 2]
               for r in graph.relations}
    batcher = HeteroTorchBatcher(graph, fanouts, 50, seed=7)
    first = list(batcher.epoch(0))
    assert sorted(torch.cat([b.seeds for b in first]).tolist()) == sorted(graph.train_idx.tolist())
    again = list(batcher.epoch(0))
    for batch, replay in zip(first, again):
        assert torch.equal(batch.input_nodes, replay.input_nodes)
        assert_equals_reference(graph, batch, fanouts, checked_replay(graph, batch))
    assert not all(torch.equal(a.input_nodes, b.input_nodes) for a, b in zip(first, batcher.epoch(1)))


def checked_replay(graph, batch):
    """`replay_from`, also checking each choice: distinct neighbours from the list, min(fanout, degree) of them."""
    replay = replay_from(graph, batch)

    def choose(hop, relation, dst, neighbours, fanout):
        chosen = replay(hop, relation, dst, neighbours, fanout)
        expected = len(neighbours) if fanout == -1 else min(fanout, len(neighbours))
        assert len(chosen) == expected and len(set(chosen)) == len(chosen) and set(chosen) <= set(neighbours)
        return chosen

    return choose


def test_graphs_past_the_dense_relabelling_limit_give_the_same_batches(graph) -> None:
    """The typed sampler relabels through a dense per-node array up to 2**24 nodes and through a hash map beyond:
    the same graph with its last type padded by isolated nodes past that limit gives the same batches."""
    last = graph.node_types[-1]
    extra = (1 << 24) + 1 - graph.num_nodes
    counts = {t.name: t.count + (extra if t.name == last.name else 0) for t in graph.node_types}
    indptr = {r: torch.cat([p, p[-1:].expand(extra)]) if r.dst == last.name else p for r, p in graph.indptr.items()}
    padded = HeteroGraphStore(**{**{f: getattr(graph, f) for f in ("relations", "features", "indices", "train_idx",
                                                                   "val_idx", "test_idx", "num_classes",
                                                                   "target_type")},
                                 "node_types": type_ranges(counts), "indptr": indptr,
                                 "labels": torch.cat([graph.labels, graph.labels.new_full((extra,), -1)])})
    assert padded.num_nodes == (1 << 24) + 1
    batches = []
    for store in (graph, padded):
        with HeteroCpuBatcher(store, FANOUTS, 32, seed=3, num_threads=1) as batcher:
            batches.append(list(itertools.islice(batcher.epoch(0), 3)))
    for dense, hashed in zip(*batches, strict=True):
        assert torch.equal(dense.input_nodes, hashed.input_nodes)
        for dense_layer, hashed_layer in zip(dense.blocks, hashed.blocks, strict=True):
            assert dense_layer.num_src == hashed_layer.num_src
            for relation, block in dense_layer.blocks.items():
                assert torch.equal(block.indptr, hashed_layer.blocks[relation].indptr)
                assert torch.equal(block.indices, hashed_layer.blocks[relation].indices)
