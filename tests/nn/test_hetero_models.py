"""R-GCN, HeteroSAGE and RGAT against straightforward per-relation implementations (and PyG's HeteroConv), and the
relation-aware models beating a type-blind one end to end on the mag-shaped graph."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.nn import functional as F

from morphpipe.data.hetero_convert import homogeneous_view
from morphpipe.data.hetero_generator import MagSpec, mag_shaped
from morphpipe.executor import Trainer
from morphpipe.nn import NodeClassification
from morphpipe.nn.finite_guard import FiniteGuard, NonFiniteError
from morphpipe.nn.hetero import build_hetero_model, relation_key
from morphpipe.nn.hetero_layerwise import typed_layerwise_inference
from morphpipe.nn.task import EvalSettings
from morphpipe.ops.choice import choice_counts, clear_choices, force_choices
from morphpipe.ops.reassociate import AGGREGATE_FIRST, PROJECT_FIRST
from morphpipe.profiler.profile import Profile
from morphpipe.sampling.hetero_batcher import HeteroCpuBatcher
from morphpipe.sampling.hetero_block import HeteroBlock
from morphpipe.sampling.minibatch import Block
from morphpipe.scheduler import plan_from_profile


@pytest.fixture(scope="module")
def graph():
    store = mag_shaped(MagSpec(num_papers=300, num_authors=200, num_institutions=8, num_fields=20, feature_dim=6))
    store.validate()
    return store


@pytest.fixture(scope="module")
def batch(graph):
    with HeteroCpuBatcher(graph, [3, 2], 12, seed=4, num_threads=1) as batcher:
        return next(iter(batcher))


def model_for(graph, name, **options):
    torch.manual_seed(0)
    return build_hetero_model(name, num_nodes={t.name: t.count for t in graph.node_types},
                              feature_dims=graph.feature_dims, relations=graph.relations,
                              target_type=graph.target_type, num_classes=graph.num_classes, num_layers=2,
                              dropout=0.0, **options).eval()


def dense_mean(block) -> torch.Tensor:
    """The block's row-normalised adjacency [num_dst, num_src] (duplicate edges count twice)."""
    matrix = torch.zeros(block.num_dst, block.num_src)
    dst = torch.repeat_interleave(torch.arange(block.num_dst), block.indptr[1:] - block.indptr[:-1])
    matrix.index_put_((dst, block.indices), torch.ones(block.nnz), accumulate=True)
    return matrix / matrix.sum(1, keepdim=True).clamp(min=1)


def reference_rgcn(conv, layer, h):
    weights = conv.relation_weights()
    out = {}
    for name, count in layer.num_dst.items():
        out[name] = h[name][:count] @ conv.root[name] + conv.bias[name]
        for relation in conv.relations:
            if relation[2] == name:
                out[name] = out[name] + dense_mean(layer.blocks[relation]) @ h[relation[0]] @ weights[relation]
    return out


def reference_sage(conv, layer, h):
    out = {}
    for name, count in layer.num_dst.items():
        out[name] = torch.zeros(count, conv.out_features)
        for relation in conv.relations:
            if relation[2] == name:
                key = relation_key(relation)
                mean = dense_mean(layer.blocks[relation]) @ h[relation[0]]
                out[name] = out[name] + conv.lin_l[key](mean) + conv.lin_r[key](h[name][:count])
    return out


def reference_gat(conv, layer, h):
    out = {}
    for name, count in layer.num_dst.items():
        out[name] = torch.zeros(count, conv.width)
        for relation in conv.relations:
            if relation[2] != name:
                continue
            gat, block = conv.convs[relation_key(relation)], layer.blocks[relation]
            z = gat.lin_src(h[relation[0]]).view(-1, gat.heads, gat.out_features)
            z_dst = gat.lin_dst(h[name][:count]).view(-1, gat.heads, gat.out_features)
            dst = torch.repeat_interleave(torch.arange(count), block.indptr[1:] - block.indptr[:-1])
            scores = F.leaky_relu((z[block.indices] * gat.att_src).sum(-1) + (z_dst[dst] * gat.att_dst).sum(-1),
                                  gat.negative_slope)  # [E, heads]
            top = torch.full((count, gat.heads), -torch.inf).scatter_reduce(
                0, dst[:, None].expand_as(scores), scores, "amax")
            weights = torch.exp(scores - top[dst])
            weights = weights / torch.zeros(count, gat.heads).index_add(0, dst, weights)[dst]
            result = torch.zeros(count, gat.heads, gat.out_features).index_add(
                0, dst, weights.unsqueeze(-1) * z[block.indices])
            out[name] = out[name] + (result.flatten(1) if gat.concat else result.mean(1)) + gat.bias
    return out


CASES = [("rgcn", {"hidden": 7}, reference_rgcn, None), ("rgcn", {"hidden": 5, "num_bases": 3}, reference_rgcn, None),
         ("rsage", {"hidden": 9}, reference_sage, None),
         ("rgat", {"hidden": 4, "heads": 3}, reference_gat, PROJECT_FIRST),
         ("rgat", {"hidden": 4, "heads": 3}, reference_gat, AGGREGATE_FIRST)]


@pytest.mark.parametrize("name, options, reference, gat_order", CASES,
                         ids=["rgcn", "rgcn-bases", "rsage", "rgat-project-first", "rgat-attend-first"])
def test_forward_and_backward_equal_the_per_relation_reference(graph, batch, name, options, reference,
                                                               gat_order) -> None:
    with force_choices({"gat.order": gat_order} if gat_order else {}):
        check_against_reference(graph, batch, name, options, reference)


def with_empty_relation(batch, relation):
    """`batch` with `relation`'s block emptied in every layer (its destinations kept, no edges)."""
    layers = [HeteroBlock({r: Block(torch.zeros(b.num_dst + 1, dtype=torch.int64), b.indices[:0], b.num_src, b.num_dst)
                           if r == relation else b for r, b in layer.blocks.items()}, layer.num_src, layer.num_dst)
              for layer in batch.blocks]
    return dataclasses.replace(batch, blocks=layers)


@pytest.mark.parametrize("option", ["per_relation", "stacked"])
@pytest.mark.parametrize("name, options, reference", [case[:3] for case in CASES[:3]],
                         ids=["rgcn", "rgcn-bases", "rsage"])
def test_each_relations_choice_equals_the_per_relation_reference(graph, batch, name, options, reference,
                                                                 option) -> None:
    """R-GCN's and HeteroSAGE's means per relation or stacked per destination type, also with a relation emptied."""
    cites = next(r for r in graph.relations if r[0] == r[2] == graph.target_type)
    for each in (batch, with_empty_relation(batch, cites)):
        clear_choices()
        with force_choices({"hetero.relations": option}):
            check_against_reference(graph, each, name, options, reference)
        assert set(choice_counts()["hetero.relations"]) == {option}


def check_against_reference(graph, batch, name, options, reference) -> None:
    model = model_for(graph, name, **options)
    ours = model(batch.blocks, batch.x)
    ours.square().sum().backward()
    grads = {key: p.grad.clone() for key, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    h = model.input(batch.x)
    for i, (conv, layer) in enumerate(zip(model.convs, batch.blocks)):
        h = reference(conv, layer, h)
        if i == 0:
            h = {key: F.relu(value) for key, value in h.items()}
    expected = h[graph.target_type]
    expected.square().sum().backward()
    assert ours.shape == (batch.seeds.numel(), graph.num_classes)
    torch.testing.assert_close(ours, expected, rtol=1e-4, atol=1e-5)
    assert grads, "the loss reaches the parameters"
    for key, parameter in model.named_parameters():
        if key in grads:
            torch.testing.assert_close(grads[key], parameter.grad, rtol=1e-4, atol=1e-5, msg=key)
    assert model.input.embeddings["author"].weight.grad is not None, "featureless types train their embedding"


@pytest.mark.parametrize("name", ["rsage", "rgat"])
def test_one_layer_equals_pyg_heteroconv(graph, batch, name) -> None:
    pyg = pytest.importorskip("torch_geometric.nn")
    model = model_for(graph, name, hidden=5, **({"heads": 2} if name == "rgat" else {}))
    conv, layer = model.convs[0], batch.blocks[0]
    h = model.input(batch.x)
    convs = {}
    for relation in graph.relations:
        src, dst = model.input.dims[relation.src], model.input.dims[relation.dst]
        key = relation_key(relation)
        if name == "rsage":
            peer = pyg.SAGEConv((src, dst), 5, aggr="mean")
            peer.lin_l.load_state_dict(conv.lin_l[key].state_dict())
            peer.lin_r.load_state_dict(conv.lin_r[key].state_dict())
        else:
            ours = conv.convs[key]
            peer = pyg.GATConv((src, dst), 5, heads=2, add_self_loops=False)
            peer.lin_src.load_state_dict(ours.lin_src.state_dict())
            peer.lin_dst.load_state_dict(ours.lin_dst.state_dict())
            with torch.no_grad():
                peer.att_src.copy_(ours.att_src)
                peer.att_dst.copy_(ours.att_dst)
                peer.bias.copy_(ours.bias)
        convs[tuple(relation)] = peer
    hetero = pyg.HeteroConv(convs, aggr="sum")
    edges = {tuple(r): layer.blocks[r].edge_index() for r in graph.relations}
    expected = hetero(h, edges)
    ours = conv(layer, h)
    for type_name, count in layer.num_dst.items():
        if count:
            torch.testing.assert_close(ours[type_name], expected[type_name][:count], rtol=1e-4, atol=1e-5)


def test_model_arguments_are_checked(graph) -> None:
    with pytest.raises(ValueError, match="heads=2 only applies to name='rgat'"):
        model_for(graph, "rgcn", heads=2)
    with pytest.raises(ValueError, match="model 'sage' is not a heterogeneous model"):
        model_for(graph, "sage")
    with pytest.raises(ValueError, match="basis decomposition needs every relation's source rows to have one width"):
        model_for(graph, "rgcn", num_bases=2, embedding_dim=3)
    with pytest.raises(ValueError, match="ignores node and relation types"):
        NodeClassification().build_model("gat", graph, num_layers=2)


def fit(graph, name: str, epochs: int) -> float:
    task = NodeClassification()
    torch.manual_seed(0)
    model = task.build_model(name, graph, num_layers=2, hidden=16, **({"heads": 2} if name == "rgat" else {}))
    batches = -(-graph.train_idx.numel() // 100)
    plan = plan_from_profile(Profile.synthetic(t_cb=0.004, t_m=0.006, num_batches=batches, cores=2), gbs=3)
    with Trainer(graph, model, plan, fanouts=[6, 6], batch_size=100, lr=1e-2, progress=False, task=task,
                 log=lambda message: None) as trainer:
        trainer.fit(epochs, validate=False)
        return trainer.evaluate("test")


def test_rgat_clearly_beats_a_model_that_ignores_relation_types() -> None:
    """On the mag-shaped graph the class is carried by citation direction, which a type-blind model cannot see."""
    graph = mag_shaped(MagSpec(num_papers=800, num_authors=500, num_institutions=20, num_fields=40, feature_dim=16))
    graph.validate()
    relation_aware = fit(graph, "rgat", epochs=4)
    view = homogeneous_view(graph)
    view.validate()
    type_blind = fit(view, "sage", epochs=4)
    print(f"test accuracy: rgat {relation_aware:.3f}, type-blind sage {type_blind:.3f}")
    assert relation_aware > type_blind + 0.2, (relation_aware, type_blind)


def test_a_nan_in_one_types_features_is_named_by_node_id(graph, batch) -> None:
    """The finite guard walks a typed batch's per-type rows (type after type in input_nodes) to name the bad node."""
    x = {name: value.clone() for name, value in batch.x.items()}
    x["paper"][2, 1] = float("nan")
    model = model_for(graph, "rgcn")
    loss = functional_loss(model, batch, x)
    loss.backward()
    guard = FiniteGuard("stop")
    with pytest.raises(NonFiniteError, match=rf"features of nodes {int(batch.input_nodes[2])} are NaN"):
        guard.allows_update(loss=loss.detach(), labels_ok=torch.tensor(True), logits=torch.zeros(1, 1), labels=batch.y,
                            seeds=batch.seeds, inputs=(x, batch.input_nodes), model=model, where="batch 1 of Route 0")


def functional_loss(model, batch, x) -> torch.Tensor:
    return F.cross_entropy(model(batch.blocks, x), batch.y)


@pytest.mark.parametrize("name, options", [("rgcn", {"num_bases": 2}), ("rsage", {}), ("rgat", {"heads": 2})])
def test_layerwise_inference_equals_batches_of_every_neighbour(graph, name, options) -> None:
    """Exact (full) evaluation runs layer-wise inference; a batch taking every neighbour of every relation computes
    the same logits for its seeds."""
    model = model_for(graph, name, hidden=6, **options)
    logits = typed_layerwise_inference(model, graph, chunk_size=50, progress=False)
    assert logits.shape == (graph.node_type("paper").count, graph.num_classes)
    with HeteroCpuBatcher(graph, [-1, -1], 40, seeds=graph.test_idx, shuffle=False, num_threads=1) as batcher:
        for batch in batcher:
            with torch.no_grad():
                torch.testing.assert_close(model(batch.blocks, batch.x), logits[batch.seeds], rtol=1e-4, atol=1e-5)
    settings = EvalSettings([-1, -1], mode="full")
    expected = float((logits.argmax(1)[graph.test_idx] == graph.labels[graph.test_idx]).float().mean())
    assert NodeClassification().evaluate(model, graph, graph.test_idx, settings,
                                         device=torch.device("cpu")) == pytest.approx(expected)
