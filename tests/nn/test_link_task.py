"""The link task on the seam: edge ids per split, BCE and BPR over pair scores, exact and sampled evaluation that
agree, the guard naming edges, shared negative pairs ranked by OGB's Hits@K, and end to end: SAGE + dot beats
common neighbours on validation MRR."""
from __future__ import annotations

import re

import numpy as np
import pytest
import scipy.sparse
import torch
from torch.nn import functional

from morphpipe.data import GraphStore, GraphValidationError
from morphpipe.data.edge_split import with_edge_split
from morphpipe.data.generators import COMMUNITY, GeneratorSpec
from morphpipe.data.link_generator import EdgeSplitSpec, generate_link
from morphpipe.data.splits import SplitFractions
from morphpipe.executor import Trainer
from morphpipe.nn import LinkModel, LinkPrediction, TrainStep, make_task
from morphpipe.nn.finite_guard import NonFiniteError
from morphpipe.nn.link_metrics import LinkMetrics
from morphpipe.nn.link_task import node_embeddings, split_of_edges
from morphpipe.nn.task import EvalSettings
from morphpipe.profiler.profile import Profile
from morphpipe.scheduler import plan_from_profile

CPU = torch.device("cpu")


def link_graph(directory, num_nodes: int, communities: int, degree: float, negatives: int) -> GraphStore:
    spec = GeneratorSpec(COMMUNITY, num_nodes=num_nodes, avg_degree=degree, feature_dim=32, num_classes=communities,
                         homophily=0.9, feature_noise=0.7)
    return GraphStore.load(generate_link(spec, EdgeSplitSpec(SplitFractions(0.8, 0.1, 0.1), negatives=negatives),
                                         directory / "g", progress=False))


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> GraphStore:
    return link_graph(tmp_path_factory.mktemp("small"), 500, 4, 8, 10)


def test_edge_ids_are_one_space_over_the_splits(small):
    task = LinkPrediction()
    edges = small.edge_split
    train, val, test = (task.seeds(small, split) for split in ("train", "val", "test"))
    assert torch.equal(train, torch.arange(edges.train.shape[1]))
    assert int(val[0]) == edges.train.shape[1] and int(test[0]) == int(val[-1]) + 1
    assert split_of_edges(small, val)[0] == "val" and torch.equal(split_of_edges(small, test)[1],
                                                                  torch.arange(edges.test.shape[1]))
    with pytest.raises(ValueError, match="mix the val split"):
        split_of_edges(small, torch.cat([val[-2:], test[:2]]))


def test_bce_and_bpr_losses_over_pair_scores(small, community_cache):
    torch.manual_seed(0)
    for loss in ("bce", "bpr"):
        task = make_task("link", negatives=3, loss=loss, decoder="mlp")
        assert task.meta() == {"task": "link", "negatives": 3, "negative_kind": "uniform", "decoder": "mlp",
                               "loss": loss, "exclude": True}
        model = task.build_model("sage", small, num_layers=2, hidden=16, dropout=0.0)
        assert isinstance(model, LinkModel)
        with task.batcher(small, [3, 3], 32, num_threads=1, seed=2) as batcher:
            batch = next(iter(batcher))
        scored = task.loss(model, batch, torch.float32)
        h = model(batch.blocks, batch.x)
        pairs = batch.pairs
        positive = model.score(h[pairs.src], h[pairs.dst])
        negative = model.score(h[pairs.src][:, None], h[pairs.negative_dst])
        if loss == "bce":
            expected = functional.binary_cross_entropy_with_logits(
                torch.cat([positive, negative.reshape(-1)]), torch.cat([torch.ones(32), torch.zeros(96)]))
        else:
            expected = -functional.logsigmoid(positive[:, None] - negative).mean()
        torch.testing.assert_close(scored.loss, expected)
        assert scored.outputs.shape == scored.targets.shape == (32 * 4,)
        assert torch.equal(scored.targets, torch.cat([torch.ones(32), torch.zeros(96)]))
        if loss == "bce":  # the loss reads the scores the guard is given, with no copies of its own: same value
            assert torch.equal(scored.loss, functional.binary_cross_entropy_with_logits(scored.outputs,
                                                                                        scored.targets))
        assert torch.equal(scored.output_units[:32], pairs.edge_ids)
        assert torch.equal(scored.output_units[32:], pairs.edge_ids.repeat_interleave(3))
    with pytest.raises(ValueError, match="bpr.*negatives >= 1"):
        LinkPrediction(0, loss="bpr")
    with pytest.raises(ValueError, match="decoder must be one of"):
        LinkPrediction(decoder="cosine")


def test_on_demand_batches_are_built_on_the_trainers_threads(small):
    """The batcher of plans whose batching and training take turns builds `num_threads` batches per turn: the
    same batches as one at a time."""
    task = LinkPrediction(2)
    several = task.batcher(small, [3, 3], 32, serial=True, num_threads=2, seed=4)
    one = task.batcher(small, [3, 3], 32, serial=True, seed=4)
    assert (several.num_threads, one.num_threads) == (2, 1)
    for a, b in zip(one.epoch(0), several.epoch(0), strict=True):
        assert torch.equal(a.units, b.units) and torch.equal(a.x, b.x)
        assert torch.equal(a.pairs.negative_dst, b.pairs.negative_dst)


@pytest.mark.parametrize("decoder", ["dot", "mlp"])
def test_batch_scores_by_index_equal_the_gathered_rows_forward_and_backward(small, community_cache, decoder):
    """The decoders score a batch's pairs by index into the embeddings (the dot decoder by the fused pair scorer);
    logits and parameter gradients equal scoring gathered rows."""
    torch.manual_seed(0)
    task = make_task("link", negatives=5, decoder=decoder)
    model = task.build_model("sage", small, num_layers=2, hidden=16, dropout=0.0)
    with task.batcher(small, [3, 3], 32, num_threads=1, seed=2) as batcher:
        batch = next(iter(batcher))
    pairs = batch.pairs
    positive, negative = model(batch.blocks, batch.x, pairs)
    (positive.sum() + (negative * torch.linspace(-1, 1, 5)).sum()).backward()
    fused = [parameter.grad.clone() for parameter in model.parameters()]
    model.zero_grad()
    h = model(batch.blocks, batch.x)
    expected_positive = model.score(h[pairs.src], h[pairs.dst])
    expected_negative = model.score(h[pairs.src][:, None], h[pairs.negative_dst])
    (expected_positive.sum() + (expected_negative * torch.linspace(-1, 1, 5)).sum()).backward()
    torch.testing.assert_close(positive, expected_positive)
    torch.testing.assert_close(negative, expected_negative)
    for got, parameter in zip(fused, model.parameters()):
        torch.testing.assert_close(got, parameter.grad)


def test_exact_and_full_fanout_sampled_evaluation_agree(small, community_cache):
    task = LinkPrediction()
    torch.manual_seed(0)
    model = task.build_model("sage", small, num_layers=2, hidden=16, dropout=0.0)
    val = task.seeds(small, "val")
    full = task.metrics(model, small, val, EvalSettings([-1, -1], mode="full", progress=False), device=CPU)
    sampled = task.metrics(model, small, val, EvalSettings([-1, -1], mode="sampled"), device=CPU)
    assert full.mrr == pytest.approx(sampled.mrr, abs=1e-6)
    assert full.hits == pytest.approx(sampled.hits, abs=1e-6) and full.auc == pytest.approx(sampled.auc, abs=1e-6)
    assert task.evaluate(model, small, val, EvalSettings([-1, -1], mode="full", progress=False), device=CPU) == \
        pytest.approx(full.mrr)


def test_a_graph_without_edge_split_is_refused_by_name(tiny):
    with pytest.raises(GraphValidationError, match="split-edges"):
        plan = plan_from_profile(Profile.synthetic(t_cb=0.004, t_m=0.006, num_batches=2, cores=2))
        Trainer(tiny, torch.nn.Linear(1, 1), plan, fanouts=[2], batch_size=8, task=LinkPrediction(), progress=False)


def test_non_finite_scores_name_the_edges(small, community_cache):
    task = LinkPrediction(2)
    model = task.build_model("sage", small, num_layers=1, hidden=8, dropout=0.0)
    with task.batcher(small, [2], 16, num_threads=1) as batcher:
        batch = next(iter(batcher))
    step = TrainStep(model, torch.optim.Adam(model.parameters()), task)
    with torch.no_grad():
        next(model.parameters()).fill_(float("inf"))  # finite inputs, non-finite pair scores
    with pytest.raises(NonFiniteError) as raised:
        step(batch)
    edges = batch.pairs.edge_ids.tolist()
    shown = re.search(r"outputs are NaN or infinite for edges ([^;]*)", str(raised.value)).group(1)
    named = [int(i) for i in re.findall(r"\d+", shown.split("...")[0])]
    assert named == sorted(edges)[:len(named)]  # the first of the batch's edges, each once
    batch.x[:] = float("nan")
    with pytest.raises(NonFiniteError, match="features of nodes"):
        step(batch)


def common_neighbour_metrics(graph: GraphStore) -> LinkMetrics:
    """The common-neighbours heuristic's validation metrics on the training topology."""
    indptr, indices = graph.indptr.numpy(), graph.indices.numpy().astype(np.int64)
    adjacency = scipy.sparse.csr_matrix((np.ones(indices.size), indices, indptr), shape=(graph.num_nodes,) * 2)
    src, dst = graph.edge_split.val.numpy()
    negatives = graph.edge_split.val_negatives.numpy()

    def common(a, b):
        return np.asarray(adjacency[a].multiply(adjacency[b]).sum(axis=1)).ravel()

    positive = common(src, dst)
    negative = common(np.repeat(src, negatives.shape[1]), negatives.reshape(-1)).reshape(negatives.shape)
    return LinkMetrics.of(torch.tensor(positive), torch.tensor(negative))


def test_sage_with_dot_decoder_beats_common_neighbours(tmp_path, community_cache):
    """The planted structure (large communities, features a noisy community mean) is what a GNN reads and common
    neighbours miss: 3000 nodes, 16 communities, 50 negatives per validation edge."""
    graph = link_graph(tmp_path, 3000, 16, 6, 50)
    baseline = common_neighbour_metrics(graph)
    task = LinkPrediction(1)
    torch.manual_seed(0)
    model = task.build_model("sage", graph, num_layers=2, hidden=64, dropout=0.0)
    batches = -(-graph.edge_split.train.shape[1] // 512)
    plan = plan_from_profile(Profile.synthetic(t_cb=0.004, t_m=0.006, num_batches=batches, cores=2), gbs=3)
    with Trainer(graph, model, plan, fanouts=[10, 10], batch_size=512, task=task, lr=0.01, progress=False,
                 eval_mode="full", log=lambda line: None) as trainer:
        trainer.fit(5, validate=False)
        mrr = trainer.evaluate("val")
    assert mrr > 1.5 * baseline.mrr and mrr > 0.25, (mrr, baseline.line())


def test_shared_negative_pairs_are_ranked_by_ogb_hits(small, community_cache):
    """A split with negative pairs shared by its positives (ogbl-collab style) is scored pair by pair and validated
    by Hits@50, per epoch too; the figures equal OGB's Hits@K over the model's own pair scores."""
    graph = with_edge_split(small, fractions=SplitFractions(0.8, 0.1, 0.1), negative_pairs=60, seed=1)
    graph.validate()
    task = LinkPrediction()
    task.check_graph(graph)
    assert task.metric == "hits@50"
    torch.manual_seed(0)
    model = task.build_model("sage", graph, num_layers=2, hidden=16, dropout=0.0)
    settings = EvalSettings([-1, -1], mode="full", progress=False)
    val = task.seeds(graph, "val")
    metrics = task.metrics(model, graph, val, settings, device=CPU)
    assert metrics.mrr is None and sorted(metrics.hits) == [10, 20, 50, 100]
    with torch.no_grad():
        h = node_embeddings(model, graph, torch.arange(graph.num_nodes), settings, device=CPU)
        positive = model.score(h[graph.edge_split.val[0]], h[graph.edge_split.val[1]])
        negative = model.score(h[graph.edge_split.val_negatives[0]], h[graph.edge_split.val_negatives[1]])
    for k in (10, 20, 50):
        kth = torch.sort(negative, descending=True).values[k - 1]
        assert metrics.hits[k] == pytest.approx(float((positive > kth).double().mean()), abs=1e-6)
    assert metrics.hits[100] == 1.0  # fewer than 100 negative pairs: every positive counts (OGB)
    assert task.evaluate(model, graph, val, settings, device=CPU) == pytest.approx(metrics.hits[50])
    batches = -(-graph.edge_split.train.shape[1] // 512)
    plan = plan_from_profile(Profile.synthetic(t_cb=0.004, t_m=0.006, num_batches=batches, cores=2))
    with Trainer(graph, model, plan, fanouts=[3, 3], batch_size=512, task=task, progress=False, eval_mode="full",
                 log=lambda line: None) as trainer:
        assert trainer.fit(1)[0].metric == "hits@50"
