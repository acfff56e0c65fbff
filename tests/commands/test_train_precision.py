"""`morphpipe train --precision`: bf16 training reaches the Trainer, auto decides from the CPU and a timed step."""
from __future__ import annotations

import json

import pytest

from morphpipe.commands.cli import main
from morphpipe.profiler.ceiling import BF16_FLAGS, isa_flags
from tests.commands.conftest import SyntheticProfiler

RUN = ["train", "--fanouts", "4,3", "--batch-size", "64", "--epochs", "1", "--no-progress", "--auto", "--replan",
       "off"]


@pytest.fixture
def planned(monkeypatch, tmp_path):
    """`train --auto` with a stand-in profiler (what is tested is the step's precision, not the plan)."""
    monkeypatch.setattr("morphpipe.commands.workload.Profiler", SyntheticProfiler)
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize("precision", ["bf16", "auto"])
def test_the_chosen_precision_trains_and_is_recorded(graph_dir, planned, tmp_path, capsys, precision):
    assert main([*RUN, str(graph_dir), "--precision", precision, "--stats-json", "stats.json"]) == 0
    recorded = json.loads((tmp_path / "stats.json").read_text())["settings"]["precision"]
    out = capsys.readouterr().out
    if precision == "bf16":
        assert recorded == "bf16"
        return
    if not any(flag in BF16_FLAGS for flag in isa_flags()):
        assert "precision float32 (auto: this CPU reports no AVX512-BF16 or AMX)" in out and recorded == "float32"
    else:
        assert f"precision {recorded} (auto: " in out and "ms in bf16)" in out


def test_precision_is_refused_where_it_does_not_apply(graph_dir, planned, capsys):
    assert main(["train", str(graph_dir), "--full-graph", "--precision", "bf16", "--epochs", "1"]) == 2
    assert capsys.readouterr().err.strip() == (
        "morphpipe train: error: --precision bf16 applies to mini-batch training in one process; drop it for "
        "--full-graph and distributed runs, which train in float32")
