"""`train` and `evaluate` on a heterogeneous dataset: only the model name and optional relation fanouts are new."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from morphpipe.commands.cli import main
from morphpipe.data.hetero_generator import MagSpec, mag_shaped
from morphpipe.profiler.profile import Profile

RELATION_FANOUTS = ["cites=4,3", "rev_cites=4,3", "writes=2,2", "rev_writes=2,0", "affiliated_with=1,1",
                    "rev_affiliated_with=0,0", "has_topic=2,2", "rev_has_topic=2,0"]


@pytest.fixture(scope="module")
def hetero_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("hetero") / "mag"
    mag_shaped(MagSpec(num_papers=200, num_authors=150, num_institutions=6, num_fields=12, feature_dim=8)).save(path)
    return path


@pytest.fixture
def profile(tmp_path) -> Path:
    """A CPU-only profile of the graph's 2 batches per epoch (120 training papers, batches of 64)."""
    path = tmp_path / "profile.json"
    Profile.synthetic(t_cb=0.004, t_m=0.006, num_batches=2, cores=2).save(path)
    return path


def test_train_then_evaluate_a_relation_aware_model(hetero_dir, profile, tmp_path, capsys) -> None:
    checkpoint, stats = tmp_path / "ck", tmp_path / "stats.json"
    argv = ["train", str(hetero_dir), "--model", "rgat", "--fanouts", "4,3", "--batch-size", "64", "--epochs", "1",
            "--profile", str(profile), "--checkpoint-dir", str(checkpoint), "--stats-json", str(stats),
            "--no-progress", "--replan", "off", "--relation-fanouts", *RELATION_FANOUTS]
    assert main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "test accuracy" in out and len(json.loads(stats.read_text())["epochs"]) == 1
    assert main(["evaluate", str(hetero_dir), "--checkpoint", str(checkpoint), "--mode", "sampled", "--split", "val",
                 "--no-progress"]) == 0
    assert "val accuracy" in capsys.readouterr().out
    assert main(["evaluate", str(hetero_dir), "--checkpoint", str(checkpoint), "--split", "test", "--no-progress"]) == 0
    exact = capsys.readouterr().out
    assert "test accuracy" in exact and "layer-wise inference: chunks of" in exact
    assert main(["evaluate", str(hetero_dir), "--checkpoint", str(checkpoint), "--split", "test", "--no-progress",
                 "--chunk-size", "7", "--memory-mb", "1"]) == 0
    chunked = capsys.readouterr().out
    assert "chunks of 7 destinations" in chunked
    assert chunked.splitlines()[-1] == [line for line in exact.splitlines() if "test accuracy" in line][-1]


def test_a_relation_aware_model_on_a_homogeneous_dataset_is_refused(graph_dir, profile, capsys) -> None:
    assert main(["train", str(graph_dir), "--model", "rgat", "--batch-size", "90", "--profile", str(profile),
                 "--no-progress"]) == 2
    assert "model 'rgat' needs a heterogeneous dataset" in capsys.readouterr().err


@pytest.mark.parametrize("extra, message", [
    (["--model", "sage"], "model 'sage' is not a heterogeneous model (it ignores node and relation types)"),
    (["--model", "rgcn", "--relation-fanouts", "cites=4,3"], "no fanouts for relation(s)"),
    (["--model", "rgcn", "--relation-fanouts", *RELATION_FANOUTS[:-1], "rev_has_topic=2"],
     "relations have different hop counts"),
    (["--model", "rgcn", "--relation-fanouts", "cites"], "expected RELATION=F1,F2"),
])
def test_bad_hetero_workloads_are_refused(hetero_dir, profile, capsys, extra, message) -> None:
    argv = ["train", str(hetero_dir), "--fanouts", "4,3", "--batch-size", "64", "--epochs", "1", "--profile",
            str(profile), "--no-progress", *extra]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_bench_measures_typed_batches(hetero_dir, capsys) -> None:
    assert main(["bench", str(hetero_dir), "--fanouts", "4,3", "--batch-size", "32", "--threads", "1",
                 "--batches", "2"]) == 0
    row = capsys.readouterr().out.strip().splitlines()[-1].split()
    assert row[0] == "1" and float(row[1]) > 0 and float(row[3]) > 0  # threads, batches/s, GB/s of features


def test_train_with_a_typed_graphs_features_on_disk(hetero_dir, profile, tmp_path, capsys) -> None:
    argv = ["train", str(hetero_dir), "--model", "rgcn", "--fanouts", "4,3", "--batch-size", "64", "--epochs", "1",
            "--profile", str(profile), "--no-progress", "--replan", "off", "--features-on-disk",
            "--feature-cache-mb", "0.0032"]  # 100 of the 200 paper rows of 32 bytes
    assert main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert ("features on disk: hottest rows cached in RAM by type: paper 100 rows (0.0 MiB) (by expected access per "
            "byte (fanouts 4,3, batch 64, 120 seeds)), as --feature-cache-mb fixed them") in out
    assert "test accuracy" in out


def test_a_feature_cache_without_features_on_disk_is_refused(hetero_dir, profile, capsys) -> None:
    argv = ["train", str(hetero_dir), "--model", "rgcn", "--fanouts", "4,3", "--batch-size", "64", "--epochs", "1",
            "--profile", str(profile), "--no-progress", "--feature-cache-mb", "1"]
    assert main(argv) == 2
    assert "--feature-cache-mb sizes the cache of the feature store: add --features-on-disk" in capsys.readouterr().err
