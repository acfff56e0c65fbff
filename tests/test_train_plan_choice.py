"""`morphpipe train`'s plan: ./plan.json when made for this run, refused when made for another, re-planning in the Trainer."""
from __future__ import annotations

import json

import pytest

from morphpipe.commands.cli import main
from morphpipe.data import load_dataset
from morphpipe.data.fingerprint import dataset_fingerprint
from morphpipe.executor.replan import Replanner
from morphpipe.executor.trainer import Trainer
from morphpipe.nn import build_model
from morphpipe.profiler import Profile
from morphpipe.scheduler import Plan, plan_from_profile
from morphpipe.scheduler.provenance import plan_mismatches

FANOUTS = [4, 3]
BATCH = 128


@pytest.fixture(scope="module")
def tiny():
    return load_dataset("tiny", progress=False)


def workload(graph, **changes) -> dict:
    made_for = {"dataset": graph.name, "num_nodes": graph.num_nodes, "num_edges": graph.num_edges,
                "dataset_fingerprint": dataset_fingerprint(graph), "model": "sage", "hidden": None,
                "fanouts": ",".join(map(str, FANOUTS)), "batch_size": BATCH, "seed": 0}
    return {**made_for, **changes}


def plan_for(graph, cores: int = 2, **changes) -> tuple[Plan, Profile]:
    batches = -(-len(graph.train_idx) // BATCH)
    profile = Profile.synthetic(t_cb=0.004, t_m=0.006, num_batches=batches, cores=cores,
                                workload=workload(graph, **changes))
    return plan_from_profile(profile, engine="fast"), profile


def test_fingerprint_tells_datasets_apart(tiny, tmp_path) -> None:
    assert dataset_fingerprint(tiny) == dataset_fingerprint(load_dataset("tiny", progress=False))
    other = load_dataset("default", progress=False)
    assert dataset_fingerprint(other) != dataset_fingerprint(tiny)
    assert plan_mismatches(workload(tiny), tiny, {"model": "sage", "fanouts": FANOUTS, "batch_size": BATCH}) == []
    differences = plan_mismatches(workload(tiny), other, {"model": "gat", "fanouts": [9], "batch_size": BATCH})
    assert any(d.startswith("dataset_fingerprint") for d in differences)
    assert any(d.startswith("model: plan 'sage', now 'gat'") for d in differences)
    assert any(d.startswith("fanouts") for d in differences)


def test_train_uses_plan_json_made_for_this_run(tiny, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    plan, profile = plan_for(tiny, cores=1)
    plan.save("plan.json")
    profile.save("profile.json")
    assert main(["train", "tiny", "--epochs", "2", "--no-progress", "--stats-json", "stats.json"]) == 0
    out = capsys.readouterr().out
    assert "using plan.json (made for this dataset and workload" in out
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["settings"]["fanouts"] == FANOUTS and len(stats["epochs"]) == 2


@pytest.mark.parametrize("change, named", [
    ({"fanouts": "9,9"}, "fanouts: plan '9,9', now '4,3'"),
    ({"dataset_fingerprint": "0123456789abcdef"}, "dataset_fingerprint"),
])
def test_train_refuses_a_plan_made_for_another_run(tiny, tmp_path, monkeypatch, capsys, change, named) -> None:
    monkeypatch.chdir(tmp_path)
    plan, _ = plan_for(tiny, cores=1, **change)
    plan.save("other.json")
    assert main(["train", "tiny", "--plan", "other.json", "--fanouts", "4,3", "--epochs", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "made for another run" in err and named in err and "--plan-mismatch replan" in err


def test_train_refuses_more_threads_than_cores(tiny, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    plan, _ = plan_for(tiny, cores=1)
    document = plan.to_dict()
    document["train_threads"] = 1000
    (tmp_path / "greedy.json").write_text(json.dumps(document))
    assert main(["train", "tiny", "--plan", "greedy.json", "--epochs", "1", "--no-progress"]) == 2
    assert "train_threads 1000 >" in capsys.readouterr().err


@pytest.mark.parametrize("field, value, named", [
    ("busy", {"cpu-batching": -0.5}, "must be >= 0.0"),
    ("busy", {"cpu-batching": 3.0}, "busy fraction"),
    ("idle_s", {"cpu": -1.0}, "must be >= 0.0"),
    ("baselines_s", {"even-split": 0.0}, "must be > 0"),
])
def test_plan_fields_are_validated(tiny, field, value, named) -> None:
    plan, _ = plan_for(tiny)
    document = {**plan.to_dict(), field: value}
    with pytest.raises(ValueError, match=named):
        Plan.from_dict(document)


def test_train_without_a_plan_profiles_first(tiny, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    args = ["train", "tiny", "--fanouts", "4,3", "--batch-size", "128", "--epochs", "1", "--no-progress",
            "--threads", "1", "--steps", "2", "--replan", "off"]
    assert main(args) == 0
    assert "no --plan given and no ./plan.json here: profiling and planning first" in capsys.readouterr().out
    plan, _ = plan_for(tiny, cores=1, fanouts="9,9")
    plan.save("plan.json")
    assert main(args) == 0
    assert "plan.json was made for another run (fanouts: plan '9,9', now '4,3'" in capsys.readouterr().out


def test_trainer_switches_plans_between_epochs_and_keeps_exactly_once(tiny) -> None:
    turns, profile = plan_for(tiny, cores=1)
    side_by_side, _ = plan_for(tiny, cores=2)
    assert turns.shares_cores != side_by_side.shares_cores or turns.cpu_threads != side_by_side.cpu_threads
    model = build_model("sage", tiny.feature_dim, tiny.num_classes, num_layers=2, hidden=16)
    with Trainer(tiny, model, turns, fanouts=FANOUTS, batch_size=BATCH, progress=False, log=lambda _: None,
                 replanner=Replanner(profile)) as trainer:
        trainer.fit(1, validate=False)
        trainer.use_plan(side_by_side)
        history = trainer.fit(3, validate=False)
        decisions = trainer.replanner.decisions
        assert [d.epoch for d in decisions] == [1]  # not after a run's last epoch: nothing would use it
        assert trainer.plan is (decisions[0].candidate if decisions[0].switched else side_by_side)
    assert [stats.seeds for stats in history] == [len(tiny.train_idx)] * 3
    assert history[0].predicted_epoch_s == turns.predicted_epoch_s
    assert history[1].predicted_epoch_s == side_by_side.predicted_epoch_s
    assert (history[1].plan_change is not None) == decisions[0].switched
    assert history[0].plan_change is None and history[2].plan_change is None
    with pytest.raises(ValueError, match="batches per epoch"):
        trainer.use_plan(plan_from_profile(Profile.synthetic(t_cb=0.004, t_m=0.006, num_batches=3, cores=1)))
