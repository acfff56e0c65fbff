"""Exact evaluation end to end: Trainer.evaluate(mode=...), `train --eval full`, `train --full-graph`, `evaluate`."""
from __future__ import annotations

import json

import pytest
import torch

from morphpipe.commands.cli import main
from morphpipe.data import PRESETS, GraphStore, generate
from morphpipe.executor import FullGraphTrainer, Trainer
from morphpipe.nn.layerwise import layerwise_inference
from morphpipe.nn import build_model
from morphpipe.profiler import Profile
from morphpipe.sampling import batches_per_epoch
from morphpipe.scheduler import plan_from_profile

pytestmark = pytest.mark.usefixtures("community_cache")


@pytest.fixture(scope="module")
def graph_dir(tmp_path_factory):
    spec = PRESETS["tiny"].spec.with_overrides(num_nodes=1_500)
    return generate(spec, tmp_path_factory.mktemp("graphs") / "tiny", progress=False)


def test_trainer_evaluates_exactly_and_by_sampling(graph_dir):
    graph = GraphStore.load(graph_dir)
    torch.manual_seed(0)
    model = build_model("sage", graph.feature_dim, graph.num_classes, num_layers=2, hidden=16)
    plan = plan_from_profile(Profile.synthetic(t_cb=0.004, t_m=0.006,
                                               num_batches=batches_per_epoch(len(graph.train_idx), 128), cores=2))
    with Trainer(graph, model, plan, fanouts=[5, 5], batch_size=128, progress=False, log=lambda line: None,
                 eval_mode="full") as trainer:
        trainer.fit(1)
        full = trainer.evaluate("test")
        sampled = trainer.evaluate("test", mode="sampled")
        assert full == trainer.evaluate("test", mode="full") == trainer.evaluate("test"), "exact: no seed involved"
        logits = layerwise_inference(model, graph, graph.test_idx, progress=False)
        assert full == pytest.approx(float((logits.argmax(1) == graph.labels[graph.test_idx]).float().mean()))
        assert 0.0 <= sampled <= 1.0
        with pytest.raises(ValueError, match="eval mode must be one of"):
            trainer.evaluate("test", mode="exact")


def test_full_graph_training_learns(graph_dir):
    graph = GraphStore.load(graph_dir)
    torch.manual_seed(0)
    model = build_model("gcn", graph.feature_dim, graph.num_classes, num_layers=2, hidden=16, dropout=0.0)
    trainer = FullGraphTrainer(graph, model, lr=0.02, progress=False, log=lambda line: None)
    before = trainer.evaluate("val")
    history = trainer.fit(15, validate=False)
    assert len(history) == 15 and history[-1].loss < history[0].loss
    assert history[0].op_choices["graph.kernel"] == {"csr": 2}, "both full-graph layers go through the selector"
    assert trainer.evaluate("val") > before


def test_cli_full_graph_train_then_evaluate(graph_dir, tmp_path, capsys):
    checkpoint = tmp_path / "run"
    assert main(["train", str(graph_dir), "--full-graph", "--model", "sage", "--hidden", "16", "--fanouts", "5,5",
                 "--epochs", "2", "--checkpoint-dir", str(checkpoint), "--no-progress"]) == 0
    trained = capsys.readouterr().out
    assert "test accuracy" in trained and "(full)" in trained
    report = tmp_path / "acc.json"
    assert main(["evaluate", str(graph_dir), "--checkpoint", str(checkpoint), "--chunk-size", "300",
                 "--json", str(report), "--no-progress"]) == 0
    assert capsys.readouterr().out.count("layer-wise inference: layer 1 took") == 1, "one pass for the three splits"
    document = json.loads(report.read_text())
    test_line = [line for line in trained.splitlines() if line.startswith("test accuracy")][0]
    assert f"{document['accuracy']['test']:.4f}" in test_line, "evaluate reproduces train's exact test accuracy"
    on_disk = tmp_path / "on_disk.json"
    assert main(["evaluate", str(graph_dir), "--checkpoint", str(checkpoint), "--chunk-size", "300",
                 "--features-on-disk", "--feature-cache-mb", "0.01", "--memory-mb", "1", "--json", str(on_disk),
                 "--no-progress"]) == 0
    assert "features on disk, read through the feature store: 78 hottest rows by in-degree" in capsys.readouterr().out
    assert json.loads(on_disk.read_text())["accuracy"] == document["accuracy"], \
        "features and tables on disk, read through feature stores, give the same exact accuracies"
    assert main(["evaluate", str(graph_dir), "--checkpoint", str(checkpoint), "--mode", "sampled", "--split",
                 "val", "--no-progress"]) == 0
    assert "val accuracy" in capsys.readouterr().out


def test_cli_errors_are_one_line(graph_dir, tmp_path, capsys):
    # (`train` without --plan, --auto or --full-graph is no error: it profiles and plans first; see
    # tests/commands/test_train_plan_choice.py)
    assert main(["evaluate", str(graph_dir), "--checkpoint", str(tmp_path / "none")]) == 2
    assert "no checkpoint there" in capsys.readouterr().err
