"""`--precision` of `tune` and `train`: the profiler is asked for it, the plan records it, training runs the precision
its plan was profiled in, and a plan profiled in another precision is not used silently."""
from __future__ import annotations

import json

import pytest

from morphpipe.commands.cli import main
from tests.commands.conftest import SyntheticProfiler

WORKLOAD = ["--fanouts", "4,3", "--batch-size", "64"]
RUN = ["train", *WORKLOAD, "--epochs", "1", "--no-progress", "--replan", "off"]


class SettlingProfiler(SyntheticProfiler):
    """A stand-in profiler that, like the real one on a CPU where bf16 steps are faster, settles "auto" on bf16; it
    records what it was asked."""

    asked: list[str] = []

    def __init__(self, *args, precision: str = "float32", **kwargs) -> None:
        SettlingProfiler.asked.append(precision)
        super().__init__(precision="bf16" if precision == "auto" else precision)


@pytest.fixture
def profiler(monkeypatch, tmp_path):
    """The stand-in profiler (what is tested is which precision flows where, not the plan), in a fresh directory."""
    SettlingProfiler.asked = []
    monkeypatch.setattr("morphpipe.commands.workload.Profiler", SettlingProfiler)
    monkeypatch.chdir(tmp_path)
    return SettlingProfiler.asked


def trained_precision(tmp_path) -> str:
    return json.loads((tmp_path / "stats.json").read_text())["settings"]["precision"]


@pytest.mark.parametrize("given, profiled", [("bf16", "bf16"), ("auto", "bf16"), ("float32", "float32")])
def test_train_auto_profiles_the_precision_and_trains_the_one_profiled(graph_dir, profiler, tmp_path, given,
                                                                       profiled):
    assert main([*RUN, str(graph_dir), "--auto", "--precision", given, "--stats-json", "stats.json"]) == 0
    assert profiler == [given]
    assert trained_precision(tmp_path) == profiled


def test_a_plan_tuned_in_bf16_trains_in_bf16_and_is_refused_for_float32(graph_dir, profiler, tmp_path, capsys):
    assert main(["tune", str(graph_dir), *WORKLOAD, "--precision", "bf16"]) == 0
    assert json.loads((tmp_path / "plan.json").read_text())["profile"]["workload"]["precision"] == "bf16"
    for flags in ([], ["--precision", "auto"]):  # the plan's precision, unless another is asked for
        assert main([*RUN, str(graph_dir), "--plan", "plan.json", *flags, "--stats-json", "stats.json"]) == 0
        assert trained_precision(tmp_path) == "bf16"
    capsys.readouterr()
    assert main([*RUN, str(graph_dir), "--plan", "plan.json", "--precision", "float32"]) == 2
    err = capsys.readouterr().err
    assert "plan.json: the plan was made for another run (precision: plan 'bf16', now 'float32')" in err
    assert profiler == ["bf16"], "refused before any profiling"


def test_precision_is_refused_where_it_does_not_apply(graph_dir, profiler, capsys):
    assert main(["train", str(graph_dir), "--full-graph", "--precision", "bf16", "--epochs", "1"]) == 2
    assert capsys.readouterr().err.strip() == (
        "morphpipe train: error: --precision bf16 applies to mini-batch training in one process; drop it for "
        "--full-graph and distributed runs, which train in float32")
