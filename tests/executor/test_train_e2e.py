"""End to end: training on the CPU by the executor under a CPU-only plan, on labelled community graphs.

The plan gives one core to the C++ batcher's thread and one to training, overlapping. On the
`default` preset (150k nodes, 12 classes; structure and features carry the class) one epoch
of GraphSAGE must reach 0.9 test accuracy and clearly beat an MLP on the same features
(about 0.45). GCN and GAT must train and improve; they run on the preset's recipe at 12,000
nodes to keep within the CI budget.
"""
from __future__ import annotations

import pytest
import torch

from morphpipe.data import PRESETS, GraphStore, generate, load_dataset
from morphpipe.executor import Trainer
from morphpipe.sampling import batches_per_epoch
from morphpipe.nn import build_model
from morphpipe.profiler import Profile
from morphpipe.scheduler import Plan, plan_from_profile

FANOUTS = [10, 5]


def overlapping_plan(graph: GraphStore, batch_size: int) -> Plan:
    batches = batches_per_epoch(len(graph.train_idx), batch_size)
    # A step that scales poorly on 2 cores: one batching thread beside one training thread beats turns on both.
    plan = plan_from_profile(Profile.synthetic(t_cb=0.004, t_m=0.006, num_batches=batches, cores=2,
                                               training_efficiency=0.2), gbs=4)
    assert (plan.cpu_threads, plan.train_threads, plan.shares_cores) == (1, 1, False), "batching overlaps training"
    return plan


def train(graph: GraphStore, model_name: str, epochs: int, batch_size: int) -> tuple[Trainer, float, float]:
    """Trains `model_name` (paper's hidden width, one layer per hop); returns the trainer, val acc before, test acc."""
    torch.manual_seed(0)
    model = build_model(model_name, graph.feature_dim, graph.num_classes, num_layers=len(FANOUTS))
    with Trainer(graph, model, overlapping_plan(graph, batch_size), fanouts=FANOUTS, batch_size=batch_size,
                 progress=False, log=lambda line: None) as trainer:
        before = trainer.evaluate("val")
        trainer.fit(epochs)
        return trainer, before, trainer.evaluate("test")


def test_graphsage_reaches_090_on_the_default_preset_and_clearly_beats_an_mlp() -> None:
    graph = load_dataset("default", progress=False)
    sage, _, sage_acc = train(graph, "sage", epochs=1, batch_size=1024)
    _, _, mlp_acc = train(graph, "mlp", epochs=1, batch_size=1024)
    assert sage.history[-1].n_cpu == sage.history[-1].batches == 88
    assert sage_acc >= 0.9, f"GraphSAGE test accuracy {sage_acc:.3f}"
    assert sage_acc - mlp_acc >= 0.3, f"GraphSAGE {sage_acc:.3f} vs MLP {mlp_acc:.3f}"


@pytest.fixture(scope="module")
def small_community(tmp_path_factory) -> GraphStore:
    spec = PRESETS["default"].spec.with_overrides(num_nodes=12_000)
    return GraphStore.load(generate(spec, tmp_path_factory.mktemp("graphs") / "community", progress=False))


@pytest.mark.parametrize("model_name", ["gcn", "gat"])
def test_gcn_and_gat_train_and_improve(small_community, model_name: str) -> None:
    trainer, before, test_acc = train(small_community, model_name, epochs=2, batch_size=256)
    history = trainer.history
    assert history[-1].loss < history[0].loss
    assert history[-1].val_acc >= before + 0.3, f"{model_name}: val acc {before:.3f} -> {history[-1].val_acc:.3f}"
    assert test_acc >= before + 0.3
