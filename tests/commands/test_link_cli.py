"""`train --task link` and `evaluate` of its checkpoint through the CLI, and the link flags' errors."""
from __future__ import annotations

import json
import math
import re

import pytest

from morphpipe.commands.cli import main
from morphpipe.data import GraphStore
from morphpipe.profiler import Profile
from morphpipe.scheduler import plan_from_profile

BATCH = 2048


@pytest.fixture(scope="module")
def split_graph(tmp_path_factory):
    out = tmp_path_factory.mktemp("link") / "tiny-link"
    assert main(["data", "split-edges", "tiny", "--out", str(out), "--negatives", "20"]) == 0
    return out


def test_train_and_evaluate_a_link_model(split_graph, tmp_path, capsys, community_cache):
    graph = GraphStore.load(split_graph)
    batches = math.ceil(graph.edge_split.train.shape[1] / BATCH)
    plan_from_profile(Profile.synthetic(t_cb=0.004, t_m=0.006, num_batches=batches, cores=2)).save(tmp_path / "p.json")
    checkpoint = tmp_path / "ck"
    assert main(["train", str(split_graph), "--task", "link", "--plan", str(tmp_path / "p.json"), "--epochs", "1",
                 "--fanouts", "4,4", "--batch-size", str(BATCH), "--hidden", "16", "--negatives", "2", "--loss", "bpr",
                 "--decoder", "mlp", "--negative-kind", "degree", "--checkpoint-dir", str(checkpoint),
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "training edges" in out and "val mrr" in out and "test mrr" in out
    assert main(["evaluate", str(split_graph), "--checkpoint", str(checkpoint), "--json", str(tmp_path / "e.json"),
                 "--no-progress"]) == 0
    result = json.loads((tmp_path / "e.json").read_text())["link"]
    assert set(result) == {"val", "test"} and 0 < result["val"]["mrr"] <= 1
    assert set(result["test"]["hits"]) == {"10", "20", "50", "100"}
    assert main(["evaluate", str(split_graph), "--checkpoint", str(checkpoint), "--split", "train"]) == 2
    assert "no stored negatives" in capsys.readouterr().err
    # the same model on a split whose negatives are pairs shared by each held-out split: OGB's Hits@K, no MRR
    shared = tmp_path / "tiny-shared"
    assert main(["data", "split-edges", "tiny", "--out", str(shared), "--negative-pairs", "300"]) == 0
    capsys.readouterr()
    assert main(["evaluate", str(shared), "--checkpoint", str(checkpoint), "--json", str(tmp_path / "s.json"),
                 "--no-progress"]) == 0
    assert re.search(r"val hits@10 [0-9.]+, hits@20 [0-9.]+, hits@50 [0-9.]+, hits@100 [0-9.]+, auc",
                     capsys.readouterr().out)
    result = json.loads((tmp_path / "s.json").read_text())["link"]
    assert result["test"]["mrr"] is None and 0 <= result["test"]["hits"]["50"] <= 1


@pytest.mark.parametrize("argv, message", [
    (["train", "tiny", "--negatives", "3"], "--negatives sets up link prediction; add --task link"),
    (["train", "tiny", "--task", "link", "--auto"], "no edge split.*data split-edges"),
    (["train", "tiny", "--task", "link", "--full-graph"], "--full-graph trains node classification only"),
    (["tune", "tiny", "--task", "link"], "no edge split.*data split-edges"),
])
def test_link_runs_are_refused_with_the_fix(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert re.search(message, err), err


def test_a_negative_count_below_zero_is_an_argument_error(capsys):
    with pytest.raises(SystemExit):
        main(["train", "tiny", "--task", "link", "--negatives", "-1"])
    assert "--negatives" in capsys.readouterr().err
