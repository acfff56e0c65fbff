"""Models over Blocks: shapes, training, mini-batch vs full-graph agreement, argument checks, PyG parity."""
from __future__ import annotations

import inspect
import random

import pytest
import torch
import torch.nn.functional as F

from morphpipe.nn import GAT, GCN, MLP, MODELS, GATConv, GCNConv, GraphSAGE, SAGEConv, build_model
from morphpipe.sampling.minibatch import Block

NUM_NODES, IN_DIM, NUM_CLASSES, NUM_LAYERS = 40, 6, 3, 2


def random_graph(num_nodes: int, seed: int) -> list[list[int]]:
    """Symmetric, loop-free random adjacency lists; some nodes end up isolated."""
    rng = random.Random(seed)
    adj: list[set[int]] = [set() for _ in range(num_nodes)]
    for _ in range(2 * num_nodes):
        u, v = rng.randrange(num_nodes - 3), rng.randrange(num_nodes - 3)
        if u != v:
            adj[u].add(v)
            adj[v].add(u)
    return [sorted(n) for n in adj]


def full_graph(adj: list[list[int]]) -> Block:
    """The whole graph as one Block: num_src == num_dst == N."""
    indptr = torch.tensor([0] + [len(n) for n in adj]).cumsum(0)
    return Block(indptr, torch.tensor([j for n in adj for j in n], dtype=torch.int64), len(adj), len(adj))


def sample_blocks(adj, seeds, num_layers, fanout=None, seed=0) -> tuple[list[Block], list[int]]:
    """Blocks (input layer first) and input nodes; every neighbour when `fanout` is None, else up to `fanout` with repeats."""
    rng = random.Random(seed)
    blocks, dst = [], list(seeds)
    for _ in range(num_layers):
        local = {n: i for i, n in enumerate(dst)}
        src, indptr, indices = list(dst), [0], []
        for n in dst:
            nbrs = adj[n] if fanout is None or not adj[n] else [rng.choice(adj[n]) for _ in range(fanout)]
            for m in nbrs:
                if m not in local:
                    local[m] = len(src)
                    src.append(m)
                indices.append(local[m])
            indptr.append(len(indices))
        blocks.append(Block(torch.tensor(indptr), torch.tensor(indices, dtype=torch.int64), len(src), len(dst)))
        dst = src
    return blocks[::-1], dst


@pytest.fixture(scope="module")
def graph():
    torch.manual_seed(0)
    adj = random_graph(NUM_NODES, seed=0)
    x = torch.randn(NUM_NODES, IN_DIM)
    return adj, x


SEEDS = [0, 5, 9, 37, 2]  # 37 is isolated


@pytest.mark.parametrize("name", list(MODELS))
def test_models_share_the_interface_and_shapes(graph, name):
    adj, x = graph
    model = build_model(name, IN_DIM, NUM_CLASSES, num_layers=NUM_LAYERS, hidden=8)
    assert list(inspect.signature(model.forward).parameters) == ["blocks", "x"]
    blocks, input_nodes = sample_blocks(adj, SEEDS, NUM_LAYERS, fanout=3)
    out = model(blocks, x[input_nodes])
    assert out.shape == (len(SEEDS), NUM_CLASSES) and out.dtype == torch.float32 and out.isfinite().all()
    assert model([full_graph(adj)] * NUM_LAYERS, x).shape == (NUM_NODES, NUM_CLASSES)


@pytest.mark.parametrize("name", ["sage", "gat", "mlp"])
def test_exact_neighbourhood_minibatch_equals_full_graph(graph, name):
    adj, x = graph
    torch.manual_seed(1)
    model = build_model(name, IN_DIM, NUM_CLASSES, num_layers=NUM_LAYERS, hidden=8).eval()
    blocks, input_nodes = sample_blocks(adj, SEEDS, NUM_LAYERS)
    with torch.no_grad():
        minibatch = model(blocks, x[input_nodes])
        whole = model([full_graph(adj)] * NUM_LAYERS, x)
    torch.testing.assert_close(minibatch, whole[SEEDS])


@pytest.mark.parametrize("name", list(MODELS))
def test_models_train(graph, name):
    adj, x = graph
    torch.manual_seed(2)
    seeds = list(range(0, NUM_NODES, 2))
    blocks, input_nodes = sample_blocks(adj, seeds, NUM_LAYERS, fanout=4)
    y = (x[seeds, 0] > 0).long() + (x[seeds, 1] > 0).long()
    model = build_model(name, IN_DIM, NUM_CLASSES, num_layers=NUM_LAYERS, dropout=0.0)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
    losses = []
    for _ in range(15):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(blocks, x[input_nodes]), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0]


def test_mlp_reads_only_the_seed_prefix(graph):
    adj, x = graph
    mlp = MLP(IN_DIM, NUM_CLASSES, num_layers=2, hidden=8).eval()
    blocks, input_nodes = sample_blocks(adj, SEEDS, NUM_LAYERS, fanout=3)
    other, other_inputs = sample_blocks(adj, SEEDS, 1, fanout=2, seed=5)
    expected = mlp([], x[SEEDS])
    torch.testing.assert_close(mlp(blocks, x[input_nodes]), expected)
    torch.testing.assert_close(mlp(other, x[other_inputs]), expected)


def test_block_mismatches_are_clear_errors(graph):
    adj, x = graph
    model = GraphSAGE(IN_DIM, NUM_CLASSES, num_layers=NUM_LAYERS, hidden=8)
    blocks, input_nodes = sample_blocks(adj, SEEDS, NUM_LAYERS, fanout=3)
    with pytest.raises(ValueError, match="num_layers=2 but got 1 blocks"):
        model(blocks[:1], x[input_nodes])
    with pytest.raises(ValueError, match="blocks\\[0\\].num_src"):
        model(blocks, x[input_nodes][:-1])
    with pytest.raises(ValueError, match="input layer first"):
        model(blocks[::-1], x[: blocks[1].num_src])


def test_factory_defaults():
    sage, gcn, gat, mlp = (build_model(n, IN_DIM, NUM_CLASSES) for n in ("sage", "gcn", "gat", "mlp"))
    assert [c.out_features for c in sage.convs] == [256, 256, NUM_CLASSES]
    assert [c.out_features for c in gcn.convs] == [16, 16, NUM_CLASSES]
    assert [(c.in_features, c.out_features, c.heads, c.concat) for c in gat.convs] == [
        (IN_DIM, 64, 4, True), (256, 64, 4, True), (256, NUM_CLASSES, 4, False)
    ]
    assert [lin.out_features for lin in mlp.lins] == [256, 256, NUM_CLASSES]
    assert isinstance(build_model("gat", IN_DIM, NUM_CLASSES, num_layers=1, heads=2), GAT)
    assert build_model("gcn", IN_DIM, NUM_CLASSES, num_layers=1).num_layers == 1


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"name": "gin"}, "name='gin'"),
        ({"in_dim": 0}, "in_dim"),
        ({"num_classes": "3"}, "num_classes"),
        ({"num_layers": 0}, "num_layers"),
        ({"hidden": -4}, "hidden"),
        ({"dropout": 1.0}, "dropout"),
        ({"heads": 2}, "heads=2 only applies"),
        ({"name": "gat", "heads": 0}, "heads"),
    ],
)
def test_factory_rejects_bad_arguments(kwargs, field):
    args = {"name": "sage", "in_dim": IN_DIM, "num_classes": NUM_CLASSES} | kwargs
    with pytest.raises(ValueError, match=field):
        build_model(**args)


# ---- parity with PyTorch Geometric, layer by layer, when it is installed ----

def sampled_block(adj, seed=3) -> Block:
    """A bipartite block with repeated sources and a destination without sampled neighbours."""
    blocks, _ = sample_blocks(adj, SEEDS, 1, fanout=3, seed=seed)
    return blocks[0]


@pytest.mark.parametrize("in_features,out_features", [(6, 4), (4, 6)])
def test_sage_conv_matches_pyg(graph, in_features, out_features):
    pyg = pytest.importorskip("torch_geometric.nn", exc_type=ImportError)
    adj, _ = graph
    block = sampled_block(adj)
    x = torch.randn(block.num_src, in_features)
    ours, theirs = SAGEConv(in_features, out_features), pyg.SAGEConv(in_features, out_features, aggr="mean")
    with torch.no_grad():
        theirs.lin_l.weight.copy_(ours.lin_neigh.weight)
        theirs.lin_l.bias.copy_(ours.lin_neigh.bias)
        theirs.lin_r.weight.copy_(ours.lin_self.weight)
    expected = theirs((x, x[: block.num_dst]), block.edge_index(), size=(block.num_src, block.num_dst))
    torch.testing.assert_close(ours(block, x), expected)


@pytest.mark.parametrize("in_features,out_features", [(6, 4), (4, 6)])
def test_gcn_conv_matches_pyg_on_a_whole_graph(graph, in_features, out_features):
    pyg = pytest.importorskip("torch_geometric.nn", exc_type=ImportError)
    adj, _ = graph
    block = full_graph(adj)
    x = torch.randn(NUM_NODES, in_features)
    ours, theirs = GCNConv(in_features, out_features), pyg.GCNConv(in_features, out_features)
    torch.nn.init.normal_(ours.bias)
    with torch.no_grad():
        theirs.lin.weight.copy_(ours.lin.weight)
        theirs.bias.copy_(ours.bias)
    torch.testing.assert_close(ours(block, x), theirs(x, block.edge_index()))


def test_gcn_conv_matches_pyg_with_block_degrees(graph):
    pyg = pytest.importorskip("torch_geometric.nn", exc_type=ImportError)
    adj, _ = graph
    block = sampled_block(adj)
    src, dst = block.edge_index().tolist()
    loops = list(range(block.num_dst))
    src, dst = src + loops, dst + loops
    in_degree = [dst.count(i) for i in range(block.num_dst)]
    out_degree = [src.count(j) for j in range(block.num_src)]
    weight = torch.tensor([(in_degree[i] * out_degree[j]) ** -0.5 for j, i in zip(src, dst)])
    x = torch.randn(block.num_src, 5)
    ours = GCNConv(5, 3)
    theirs = pyg.GCNConv(5, 3, normalize=False, add_self_loops=False)
    with torch.no_grad():
        theirs.lin.weight.copy_(ours.lin.weight)
    expected = theirs(x, torch.tensor([src, dst]), weight)[: block.num_dst]
    torch.testing.assert_close(ours(block, x), expected)


@pytest.mark.parametrize("concat", [True, False])
def test_gat_conv_matches_pyg(graph, concat):
    pyg = pytest.importorskip("torch_geometric.nn", exc_type=ImportError)
    adj, _ = graph
    block = sampled_block(adj)
    x = torch.randn(block.num_src, 5)
    ours = GATConv(5, 4, heads=3, concat=concat)
    theirs = pyg.GATConv(5, 4, heads=3, concat=concat, negative_slope=0.2, dropout=0.0, add_self_loops=True)
    torch.nn.init.normal_(ours.bias)
    with torch.no_grad():
        theirs.lin.weight.copy_(ours.lin.weight)
        theirs.att_src.copy_(ours.att_src)
        theirs.att_dst.copy_(ours.att_dst)
        theirs.bias.copy_(ours.bias)
    expected = theirs((x, x[: block.num_dst]), block.edge_index(), size=(block.num_src, block.num_dst))
    torch.testing.assert_close(ours(block, x), expected)


def test_models_accept_double_precision(graph):
    adj, x = graph
    blocks, input_nodes = sample_blocks(adj, SEEDS, NUM_LAYERS, fanout=3)
    models = (GraphSAGE(IN_DIM, NUM_CLASSES, NUM_LAYERS, 8), GCN(IN_DIM, NUM_CLASSES, NUM_LAYERS, 8), GAT(IN_DIM, NUM_CLASSES, NUM_LAYERS, 8))
    for model in models:
        assert model.double()(blocks, x[input_nodes].double()).dtype == torch.float64
