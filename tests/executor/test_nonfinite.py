"""Non-finite values in training: NaN/inf features and out-of-range labels in a store built from tensors, and a model
whose gradients are not finite, stop training with the epoch, batch and seeds, or are skipped and counted."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

from morphpipe.data import GraphStore
from morphpipe.executor import FullGraphTrainer, Trainer
from morphpipe.nn import build_model
from morphpipe.nn.finite_guard import FiniteGuard, NonFiniteError, check_on_nonfinite
from morphpipe.profiler import Profile
from morphpipe.scheduler import plan_from_profile

NODES, CLASSES, FEATURES, BATCH = 240, 3, 8, 40  # 160 training seeds: 4 batches per epoch
FANOUTS = [3, 3]
LONELY = 5  # a training seed no node has as an in-neighbour: bad values there reach its own output only


def graph_from_tensors() -> GraphStore:
    """A random graph built from tensors (so not validated), with node LONELY nobody's in-neighbour."""
    generator = torch.Generator().manual_seed(0)
    degrees = torch.randint(1, 5, (NODES,), generator=generator)
    indices = torch.randint(0, NODES, (int(degrees.sum()),), generator=generator)
    indices[indices == LONELY] = LONELY + 1
    indptr = torch.zeros(NODES + 1, dtype=torch.int64)
    indptr[1:] = torch.cumsum(degrees, 0)
    order = torch.randperm(NODES, generator=generator)
    return GraphStore(indptr, indices, torch.randn(NODES, FEATURES, generator=generator),
                      torch.randint(0, CLASSES, (NODES,), generator=generator), torch.sort(order[:160]).values,
                      order[160:200], order[200:], CLASSES, name="from-tensors")


def trainer(graph: GraphStore, on_nonfinite: str = "stop", model: torch.nn.Module | None = None) -> Trainer:
    plan = plan_from_profile(Profile.synthetic(t_cb=0.004, t_m=0.006, num_batches=4, cores=1), gbs=3)
    torch.manual_seed(0)
    model = model or build_model("sage", FEATURES, CLASSES, num_layers=2, hidden=16, dropout=0.0)
    return Trainer(graph, model, plan, fanouts=FANOUTS, batch_size=BATCH, progress=False, log=lambda _: None,
                   on_nonfinite=on_nonfinite)


@pytest.fixture(autouse=True)
def quiet_unvalidated():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_non_finite_feature_stops_training_naming_the_epoch_batch_and_seed(value: float) -> None:
    graph = graph_from_tensors()
    graph.features[LONELY, 2] = value
    with trainer(graph) as run, pytest.raises(NonFiniteError) as caught:
        run.fit(2, validate=False)
    message = str(caught.value)
    assert message.startswith("epoch 1, batch ") and " of Route 0: " in message
    # NaN may be swallowed on the way (a fused ReLU maps it to 0): then the loss is finite and a gradient is not
    assert "the loss is " in message or "non-finite gradients for " in message
    assert f"the features of nodes {LONELY} are NaN or infinite (seeds " in message
    assert "--on-nonfinite skip-batch" in message


def test_labels_out_of_range_stop_before_the_loss_with_the_seeds_and_labels() -> None:
    graph = graph_from_tensors()
    low, high = graph.train_idx[3].item(), graph.train_idx[7].item()
    graph.labels[low], graph.labels[high] = -1, CLASSES
    with trainer(graph) as run, pytest.raises(NonFiniteError) as caught:
        run.fit(1, validate=False)
    message = str(caught.value)
    assert message.startswith("epoch 1, batch ")
    bad = {f"{low} (label -1)", f"{high} (label {CLASSES})"}
    named = [part for part in bad if part in message]
    assert named, message
    assert f"labels outside [0, {CLASSES}) for seeds" in message


class NanGradient(torch.autograd.Function):
    """Identity forward; a NaN gradient backward on the calls `poisoned` says."""

    @staticmethod
    def forward(ctx, logits):
        return logits.clone()

    @staticmethod
    def backward(ctx, grad):
        return torch.full_like(grad, float("nan"))


class NanGradientModel(torch.nn.Module):
    """A SAGE model whose backward is NaN on the training calls listed in `poisoned` (0-based), finite otherwise."""

    def __init__(self, poisoned: set[int]) -> None:
        super().__init__()
        self.inner = build_model("sage", FEATURES, CLASSES, num_layers=2, hidden=16, dropout=0.0)
        self.num_layers = self.inner.num_layers
        self.poisoned = poisoned
        self.calls = 0

    def forward(self, blocks, x):
        logits = self.inner(blocks, x)
        if not self.training:
            return logits
        call, self.calls = self.calls, self.calls + 1
        return NanGradient.apply(logits) if call in self.poisoned else logits


def test_a_non_finite_gradient_with_a_finite_loss_stops_naming_the_parameters() -> None:
    with trainer(graph_from_tensors(), model=NanGradientModel({5})) as run, pytest.raises(NonFiniteError) as caught:
        run.fit(3, validate=False)
    message = str(caught.value)
    assert message.startswith("epoch 2, batch ")  # the 6th step is the 2nd epoch's 2nd
    assert "non-finite gradients for inner." in message and "with a finite loss" in message
    assert "the inputs and outputs are finite (seeds " in message


def test_skip_batch_leaves_out_the_bad_batches_counts_them_and_trains_on() -> None:
    graph = graph_from_tensors()
    graph.features[LONELY] = float("nan")
    with trainer(graph, "skip-batch") as run:
        before = [p.detach().clone() for p in run.model.parameters()]
        history = run.fit(2, validate=False)
        after = list(run.model.parameters())
    assert [sum(stats.skipped_batches.values()) for stats in history] == [1, 1]
    assert all(torch.isfinite(p).all() for p in after)
    assert any(not torch.equal(a, b) for a, b in zip(after, before))  # the other batches trained
    assert all(torch.isfinite(torch.tensor(stats.loss)) for stats in history)  # the mean leaves the skipped out
    assert "skipped 1 batch (non-finite " in history[0].line(2)


def test_skip_batch_skips_exactly_the_steps_with_bad_gradients() -> None:
    model = NanGradientModel({1, 2, 6})
    with trainer(graph_from_tensors(), "skip-batch", model=model) as run:
        history = run.fit(2, validate=False)
    assert [stats.skipped_batches for stats in history] == [{"non-finite gradient": 2}, {"non-finite gradient": 1}]
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_skip_batch_counts_labels_out_of_range() -> None:
    graph = graph_from_tensors()
    graph.labels[graph.train_idx[0]] = 99
    with trainer(graph, "skip-batch") as run:
        history = run.fit(1, validate=False)
    assert history[0].skipped_batches == {"labels out of range": 1}


def test_full_graph_training_stops_or_skips() -> None:
    graph = graph_from_tensors()
    graph.features[LONELY] = float("inf")
    torch.manual_seed(0)
    model = build_model("sage", FEATURES, CLASSES, num_layers=2, hidden=16, dropout=0.0)
    with pytest.raises(NonFiniteError, match=rf"^epoch 1, the full-graph step: .*the features of nodes {LONELY} are"):
        FullGraphTrainer(graph, model, progress=False, log=lambda _: None).fit(1, validate=False)
    before = [p.detach().clone() for p in model.parameters()]
    skipping = FullGraphTrainer(graph, model, progress=False, log=lambda _: None, on_nonfinite="skip-batch")
    history = skipping.fit(2, validate=False)
    assert [sum(stats.skipped_batches.values()) for stats in history] == [1, 1]
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), before))  # every step was the bad one


def test_the_policy_is_checked() -> None:
    assert check_on_nonfinite("skip-batch") == "skip-batch"
    with pytest.raises(ValueError, match=r"on_nonfinite must be one of \('stop', 'skip-batch'\), got 'skip'"):
        FiniteGuard("skip")


def test_safe_labels_clamps_and_flags_without_changing_good_labels() -> None:
    labels = torch.tensor([0, 2, 1])
    safe, ok = FiniteGuard.safe_labels(labels, 3)
    assert torch.equal(safe, labels) and bool(ok)
    safe, ok = FiniteGuard.safe_labels(torch.tensor([-100, 1, 3]), 3)
    assert safe.tolist() == [0, 1, 2] and not bool(ok)


RANK = textwrap.dedent('''
    import json, sys, warnings
    import torch, torch.distributed as dist
    sys.path.insert(0, {tests!r})
    from test_nonfinite import FEATURES, CLASSES, FANOUTS, LONELY, graph_from_tensors
    from morphpipe.distributed import SeedSplit, local_profile
    from morphpipe.distributed.runtime import finish_rank
    from morphpipe.distributed.trainer import DistributedTrainer
    from morphpipe.nn import build_model
    from morphpipe.nn.finite_guard import NonFiniteError
    from morphpipe.profiler import Profile
    from morphpipe.scheduler import plan_from_profile

    warnings.simplefilter("ignore")
    rank = int(sys.argv[1])
    dist.init_process_group("gloo", init_method="file://{store}", rank=rank, world_size=2)
    graph = graph_from_tensors()
    if rank == 1:
        graph.labels[LONELY] = CLASSES  # only rank 1's copy: a finite loss there, so only the all-reduce can tell rank 0
    split = SeedSplit.make(len(graph.train_idx), 80, [1.0, 1.0], "even")
    profile = Profile.synthetic(t_cb=0.004, t_m=0.006, num_batches=split.steps, cores=1, workload={{"batch_size": 80}})
    plan = plan_from_profile(local_profile(profile, split.local_batches[rank], split.steps))
    results = {{}}
    for policy in ("stop", "skip-batch"):
        torch.manual_seed(0)
        model = build_model("sage", FEATURES, CLASSES, num_layers=2, hidden=16, dropout=0.0)
        result = results[policy] = {{}}
        with DistributedTrainer(graph, model, plan, split, fanouts=FANOUTS, predicted_epoch_s=1.0, log=lambda _: None,
                                on_nonfinite=policy) as trainer:
            try:
                history = trainer.fit(2, validate=False)
                result["skipped"] = [sum(stats.skipped_batches.values()) for stats in history]
                result["params"] = [p.detach().double().sum().item() for p in trainer.module.parameters()]
                result["finite"] = all(bool(torch.isfinite(p).all()) for p in trainer.module.parameters())
            except NonFiniteError as error:
                result["error"] = str(error)
    print(json.dumps(results), flush=True)
    dist.destroy_process_group()
    finish_rank(0)
''')


def test_two_ranks_agree_when_only_one_rank_meets_a_non_finite_value(tmp_path) -> None:
    """Two gloo ranks, each trying both policies (some 10 s: two processes importing torch); rank 1 alone has a label
    out of range (its loss stays finite), and rank 0 must stop or skip the same step."""
    script = tmp_path / "rank.py"
    script.write_text(RANK.format(tests=str(Path(__file__).parent), store=tmp_path / "store"))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}  # the repository root
    ranks = [subprocess.Popen([sys.executable, str(script), str(rank)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for rank in range(2)]
    try:
        outputs = [rank.communicate(timeout=120) for rank in ranks]
    finally:
        for rank in ranks:
            rank.kill()
    assert all(rank.returncode == 0 for rank in ranks), outputs
    stop, skip = zip(*((result["stop"], result["skip-batch"])
                       for result in (json.loads(out.strip().splitlines()[-1]) for out, _ in outputs)))
    assert f" on rank 1: labels outside [0, {CLASSES}) for seeds {LONELY} (label {CLASSES})." in stop[1]["error"]
    assert " on rank 0: non-finite gradients for " in stop[0]["error"]
    assert "another rank's batch of this step is the cause" in stop[0]["error"]
    assert stop[0]["error"].split(":")[0] == stop[1]["error"].split(":")[0].replace("rank 1", "rank 0")
    assert skip[0]["skipped"] == skip[1]["skipped"] and sum(skip[1]["skipped"]) >= 1  # the steps with LONELY on rank 1
    assert skip[0]["params"] == skip[1]["params"] and skip[0]["finite"]
