"""Every bad argument is answered in one line naming the field, the bad value and the fix (issue 25, section 4).

One parametrized test per class of bad input: numeric options of every command (argparse types of
morphpipe.commands.arguments), numbers at the Python API's boundaries (morphpipe.numeric), JSON
documents that are not UTF-8 or not JSON (morphpipe.documents.read_json), arrays and edge lists in
the wrong container, output paths the system cannot create, malformed plan and checkpoint fields,
and simulations too large for memory. CLI cases run in-process through `cli.main` (exit status 2).
"""
from __future__ import annotations

import argparse
import gzip
import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from morphpipe.commands import arguments
from morphpipe.commands.cli import build_parser, main
from morphpipe.data import GeneratorSpec, GraphStore, build_csc, generate
from morphpipe.executor.checkpoint import (CheckpointError, Checkpointing, TrainingState, capture_rng,
                                           load_checkpoint, save_checkpoint)
from morphpipe.executor.full_graph import FullGraphEpoch
from morphpipe.executor.stats import EpochStats
from morphpipe.outputs import OutputPathError, write_text_atomic
from morphpipe.profiler.profile import Profile
from morphpipe.sampling.cpu_batcher import CpuBatcher, sample_neighbors
from morphpipe.sampling.gpu_batcher import GpuBatcher
from morphpipe.sampling.serial_batcher import SerialBatcher
from morphpipe.scheduler import Plan, plan_from_profile
from tests.commands.conftest import snapshot


def fails_with(argv: list[str], capsys, *fragments: str) -> str:
    """Runs the CLI; expects exit status 2 and a last stderr line `morphpipe COMMAND...: error: ...` holding every
    fragment, with no traceback and no hidden partial name. Returns that line."""
    try:
        status = main([str(arg) for arg in argv])
    except SystemExit as stop:  # argparse refuses an argument by exiting 2
        status = stop.code
    assert status == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"morphpipe {argv[0]}") and ": error: " in line, err
    for fragment in fragments:
        assert fragment in line, line
    assert ".partial" not in line, line
    return line


@pytest.fixture(scope="module")
def graph_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("bad-arguments") / "graph"
    generate(GeneratorSpec(kind="community", num_nodes=120, avg_degree=3, feature_dim=4), path, progress=False)
    return path


@pytest.fixture(scope="module")
def profile_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("bad-arguments-profile") / "profile.json"
    Profile.synthetic(t_cb=0.8, t_m=0.06, t_gb=0.1, t_dma=0.04, cores=2, num_batches=10).save(path)
    return path


# --- numeric options of every command -------------------------------------------------------------------------

# The arguments each sub-command needs besides the option under test (never reached: argparse refuses first).
COMMAND_PREFIX = {
    ("tune",): ["tune", "tiny"], ("train",): ["train", "tiny"], ("bench",): ["bench", "tiny"],
    ("evaluate",): ["evaluate", "tiny", "--checkpoint", "ckpt"], ("simulate",): ["simulate", "p.json"],
    ("data", "generate"): ["data", "generate", "tiny"], ("data", "info"): ["data", "info", "tiny"], ("data", "convert"): ["data", "convert", "edgelist", "e.npy",
                                                                           "-o", "out"],
    ("data", "split-edges"): ["data", "split-edges", "tiny", "--out", "out"],
}
NUMERIC_TYPES = {"integer", "number"}


def numeric_options() -> list[tuple[tuple[str, ...], str, str]]:
    """(command path, option, 'integer' or 'number') for every option of every command that takes one number."""
    found = []

    def walk(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, path + (name,))
            elif action.option_strings and action.type in (int, float):
                found.append((path, action.option_strings[-1], f"raw {action.type.__name__}"))
            elif action.option_strings and getattr(action.type, "__name__", None) in NUMERIC_TYPES:
                found.append((path, action.option_strings[-1], action.type.__name__))

    walk(build_parser(), ())
    return found


def test_every_numeric_option_uses_a_checked_type():
    options = numeric_options()
    assert len(options) >= 40
    raw = [f"{' '.join(path)} {option}" for path, option, kind in options if kind.startswith("raw")]
    assert raw == [], f"options parsed by plain int()/float() (NaN, infinities, huge values pass): {raw}"
    assert {path for path, _, _ in options} <= set(COMMAND_PREFIX)


def test_a_feature_cache_larger_than_any_byte_count_is_refused(capsys):
    fails_with(["data", "info", "tiny", "--features-on-disk", "--feature-cache-mb", "1e306"], capsys,
               "argument --feature-cache-mb: must be a finite number >= 0 and <=")


def test_a_value_that_begins_with_a_dash_is_told_how_to_attach_it(capsys):
    command = ["data", "generate", "tiny", "-o", "never-written", "--split"]
    fails_with([*command, "-0.1,0.5,0.6"], capsys, "argument --split: expected one argument",
               "(a value that begins with '-' is attached with '=': --split=VALUE)")
    fails_with([*command[:-1], "--split=-0.1,0.5,0.6"], capsys, "split fraction train must be", "got -0.1")


BAD_INTEGERS = ["nan", "inf", "-1", str(10**30), "abc", "2.5"]
BAD_NUMBERS = ["nan", "inf", "-inf", "-1", "abc"]


@pytest.mark.parametrize("path, option, kind", numeric_options(), ids=lambda v: " ".join(v) if isinstance(v, tuple)
                         else v)
def test_numeric_option_refuses_nan_infinity_negative_huge_and_text(path, option, kind, capsys):
    for value in BAD_INTEGERS if kind == "integer" else BAD_NUMBERS:
        line = fails_with([*COMMAND_PREFIX[path], f"{option}={value}"], capsys, f"argument {option}", "must be")
        assert value.lstrip("-") in line or (value == str(10**30) and "2**63" in line), line


@pytest.mark.parametrize("make, fragment", [
    (lambda: arguments.split_fractions("nan,0.2,0.2"), "split fraction train"),
    (lambda: arguments.split_fractions("0.6,inf,0"), "split fraction val"),
    (lambda: arguments.number(0, 1e7, above=True)("1e30"), "<= 1e+07"),
])
def test_list_and_bounded_option_types(make, fragment):
    with pytest.raises(argparse.ArgumentTypeError, match=fragment.replace("+", r"\+")):
        make()


# --- numbers at the Python API's boundaries (the native ops take int64) ----------------------------------------

def tiny_store() -> GraphStore:
    indptr, indices = build_csc([1, 2, 3, 0], [0, 1, 2, 3], 4)
    graph = GraphStore(indptr=indptr, indices=indices, features=torch.ones(4, 3), labels=torch.tensor([0, 1, 0, 1]),
                       train_idx=torch.tensor([0, 1]), val_idx=torch.tensor([2]), test_idx=torch.tensor([3]),
                       num_classes=2)
    graph.validate()
    return graph


API_CALLS = {
    "CpuBatcher batch_size": ("batch_size", lambda graph, v: CpuBatcher(graph, [2], v, num_threads=1)),
    "CpuBatcher num_threads": ("num_threads", lambda graph, v: CpuBatcher(graph, [2], 2, num_threads=v)),
    "CpuBatcher seed": ("seed", lambda graph, v: CpuBatcher(graph, [2], 2, num_threads=1, seed=v)),
    "SerialBatcher batch_size": ("batch_size", lambda graph, v: SerialBatcher(graph, [2], v)),
    "GpuBatcher batch_size": ("batch_size", lambda graph, v: GpuBatcher(graph, [2], v)),
    "GpuBatcher seed": ("seed", lambda graph, v: GpuBatcher(graph, [2], 2, seed=v)),
    "sample_neighbors seed": ("seed", lambda graph, v: sample_neighbors(graph, [0], [2], seed=v)),
    "GeneratorSpec num_nodes": ("num_nodes", lambda graph, v: GeneratorSpec(kind="community", num_nodes=v,
                                                                            avg_degree=2, feature_dim=2)),
}


@pytest.mark.parametrize("call", list(API_CALLS))
@pytest.mark.parametrize("value", [2**64, 2**63, -1, math.nan, "3", 2.5, True])
def test_api_integers_beyond_int64_or_not_integers_are_a_value_error_naming_the_argument(call, value):
    name, make = API_CALLS[call]
    with pytest.raises(ValueError, match=rf"{name} must be an integer") as caught:
        make(tiny_store(), value)
    assert repr(value) in str(caught.value) or str(value) in str(caught.value)


@pytest.mark.parametrize("name, changes", [
    ("avg_degree", {"avg_degree": math.inf}), ("avg_degree", {"avg_degree": math.nan}),
    ("exponent", {"exponent": math.inf}), ("homophily", {"homophily": math.nan}),
    ("feature_noise", {"feature_noise": -math.inf}),
])
def test_api_floats_that_are_not_finite_are_refused(name, changes):
    with pytest.raises(ValueError, match=f"{name} must be a finite number"):
        GeneratorSpec(**{"kind": "community", "num_nodes": 10, "avg_degree": 2, "feature_dim": 2, **changes})


# --- JSON documents: one reader -------------------------------------------------------------------------------

BAD_JSON = {"latin-1": (b'{"kind": "caf\xe9"}', "not UTF-8"), "syntax": (b'{"kind": ', "not valid JSON"),
            "deep": (b"[" * 100_000 + b"]" * 100_000, "not a JSON document")}


@pytest.mark.parametrize("content", list(BAD_JSON))
@pytest.mark.parametrize("document", ["meta.json", "plan", "profile"])
def test_json_documents_that_are_not_utf8_or_not_json_name_the_file(document, content, tmp_path, graph_dir, capsys):
    data, fragment = BAD_JSON[content]
    if document == "meta.json":
        target = tmp_path / "graph"
        target.mkdir()
        for file in graph_dir.iterdir():
            (target / file.name).write_bytes(file.read_bytes())
        (target / "meta.json").write_bytes(data)
        fails_with(["data", "info", target], capsys, str(target / "meta.json"), fragment, "fix")
    else:
        target = tmp_path / f"{document}.json"
        target.write_bytes(data)
        argv = ["train", graph_dir, "--plan", target] if document == "plan" else ["simulate", target]
        fails_with(argv, capsys, str(target), fragment)
        assert target.read_bytes() == data


# --- arrays and edge lists in the wrong container -------------------------------------------------------------

def wrong_containers(folder: Path) -> dict[str, tuple[list[str], str]]:
    folder.mkdir()
    np.save(folder / "edges.npy", np.array([[0, 1, 2], [1, 2, 0]]))
    np.savez(folder / "edges.npz", edges=np.array([[0, 1, 2], [1, 2, 0]]))
    np.savez(folder / "features.npz", x=np.ones((3, 2), np.float32))
    text = gzip.compress(b"0 1\n1 2\n2 0\n" * 50)
    (folder / "truncated.txt.gz").write_bytes(text[: len(text) // 2])
    damaged = bytearray(text)
    damaged[-6] ^= 0xFF  # the CRC no longer matches
    (folder / "crc.txt.gz").write_bytes(bytes(damaged))
    edges = str(folder / "edges.npy")
    return {
        "npz edge list": (["edgelist", str(folder / "edges.npz")], "np.load("),
        "npz --features": (["edgelist", edges, "--features", str(folder / "features.npz")], "--features"),
        "npz --labels": (["edgelist", edges, "--labels", str(folder / "features.npz")], "--labels"),
        "truncated gzip": (["edgelist", str(folder / "truncated.txt.gz")], "truncated.txt.gz"),
        "gzip with a bad CRC": (["edgelist", str(folder / "crc.txt.gz")], "crc.txt.gz"),
    }


def test_npz_archives_and_damaged_gzip_where_an_array_or_text_belongs(tmp_path, capsys):
    sources = wrong_containers(tmp_path / "sources")
    before = snapshot(tmp_path)
    for name, (argv, fragment) in sources.items():
        fails_with(["data", "convert", *argv, "-o", str(tmp_path / "out")], capsys, fragment, "fix")
        assert snapshot(tmp_path) == before, name


# --- output paths the system cannot create --------------------------------------------------------------------

@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
@pytest.mark.parametrize("argv, option", [
    (["simulate", "PROFILE", "--json", "/proc/morphpipe-stats.json"], "--json"),
    (["simulate", "PROFILE", "--plot", "/proc/morphpipe-test/plot.png"], "--plot"),
])
def test_output_paths_the_system_cannot_create_are_named_as_given(argv, option, profile_file, capsys):
    argv = [str(profile_file) if arg == "PROFILE" else arg for arg in argv]
    fails_with(argv, capsys, option.lstrip("-"), f"{argv[-1]}: cannot be written")
    with pytest.raises(OutputPathError, match="/proc/morphpipe.json: cannot be written") as caught:
        write_text_atomic("/proc/morphpipe.json", "{}", "--json")
    assert ".partial" not in str(caught.value)


# --- plan fields ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("change, field", [
    (lambda d: d["profile"].__setitem__("workload", [1]), "profile.workload"),
    (lambda d: d["profile"].__setitem__("workload", "sage"), "profile.workload"),
    (lambda d: d["profile"]["workload"].__setitem__("batch_size", "big"), "profile.workload.batch_size"),
    (lambda d: d["profile"]["workload"].__setitem__("batch_size", 0), "profile.workload.batch_size"),
    (lambda d: d["profile"]["workload"].__setitem__("fanouts", "a,b"), "profile.workload.fanouts"),
    (lambda d: d.__setitem__("baselines_s", {}), "baselines_s"),
    (lambda d: d.__setitem__("profile", "x"), "profile"),
])
def test_plan_fields_of_the_wrong_shape_are_named(change, field, tmp_path, graph_dir, profile_file, capsys):
    document = plan_from_profile(Profile.load(profile_file), gbs=2).to_dict()
    document["profile"]["workload"] = {"model": "sage", "fanouts": "2,2", "batch_size": 16}
    Plan.from_dict(document)  # the unchanged plan reads
    change(document)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(document))
    with pytest.raises(ValueError, match=f"field '{field}'"):
        Plan.load(path)
    fails_with(["train", graph_dir, "--plan", path], capsys, str(path), f"field '{field}'")


# --- checkpoint fields behind a valid checksum ----------------------------------------------------------------

def history_entry() -> dict:
    return {"epoch": 0, "epoch_s": 1.0, "loss": 0.5, "val_acc": None}


@pytest.mark.parametrize("change, field", [
    (lambda s: s.rng.__setitem__("torch", torch.zeros(5, dtype=torch.uint8)), "'rng' 'torch'"),
    (lambda s: s.rng.__setitem__("torch", "state"), "'rng' 'torch'"),
    (lambda s: s.rng.__setitem__("numpy", [1, 2]), "'rng' 'numpy'"),
    (lambda s: s.rng.__setitem__("python", 3), "'rng' 'python'"),
    (lambda s: s.rng.__setitem__("cuda", ["x"]), "'rng' 'cuda'"),
    (lambda s: s.history.__setitem__(0, [1, 2]), "'history[0]'"),
    (lambda s: s.history.__setitem__(0, {1: 2}), "'history[0]'"),
    (lambda s: s.history[0].pop("loss"), "'history[0]' lacks loss"),
    (lambda s: s.history[0].__setitem__("loss", "low"), "'history[0].loss'"),
    (lambda s: s.history[0].__setitem__("op_choices", {"kernel": "csr"}), "'history[0].op_choices'"),
])
def test_checkpoint_fields_behind_a_valid_checksum_are_named(change, field, tmp_path):
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    state = TrainingState(epoch=1, model=model.state_dict(), optimizer=optimizer.state_dict(), rng=capture_rng(),
                          history=[history_entry()], meta={})
    change(state)
    save_checkpoint(tmp_path, state)
    with pytest.raises(CheckpointError, match="checkpoint .*checkpoint.pt") as caught:
        checkpoints = Checkpointing(tmp_path, model, optimizer, log=print)
        checkpoints.history(checkpoints.restore(load_checkpoint(tmp_path), {}), FullGraphEpoch)
    assert f"field {field}" in str(caught.value)


def test_a_well_formed_checkpoint_restores_its_history_and_rng(tmp_path):
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    random.seed(5)
    save_checkpoint(tmp_path, TrainingState(epoch=1, model=model.state_dict(), optimizer=optimizer.state_dict(),
                                            rng=capture_rng(), history=[history_entry()], meta={}))
    expected = random.random()
    checkpoints = Checkpointing(tmp_path, model, optimizer, log=lambda _: None)
    history = checkpoints.history(checkpoints.resume({}), FullGraphEpoch)
    assert history == [FullGraphEpoch(**history_entry())] and random.random() == expected
    stats = {"epoch": 0, "epoch_s": 1.0, "batches": 2, "seeds": 8, "loss": 0.5, "val_acc": 0.5, "n_cpu": 2,
             "n_gpu": 0, "cbs": 2, "gbs": 0, "max_cpu_buffer": 1, "max_gpu_buffer": 0, "cpu_idle_s": 0.0,
             "gpu_idle_s": 0.0, "cpu_utilisation": None, "batches_per_s": 2.0}  # a derived rate, dropped
    state = load_checkpoint(tmp_path)
    state.history = [stats]
    assert checkpoints.history(state, EpochStats)[0].batches == 2


# --- simulations too large for memory -------------------------------------------------------------------------

@pytest.mark.parametrize("argv", [["simulate", "BIG"], ["simulate", "--node", "BIG:2"]])
def test_a_simulation_too_large_for_memory_is_refused_up_front_with_the_memory_it_needs(argv, tmp_path, capsys):
    big = tmp_path / "big.json"
    Profile.synthetic(t_cb=0.8, t_m=0.06, t_gb=0.1, t_dma=0.04, cores=2, num_batches=10**9,
                      workload={"batch_size": 1024}).save(big)
    argv = [arg.replace("BIG", str(big)) for arg in argv]
    fails_with(argv, capsys, "1,000,000,000 batches", "GB of memory", "fix")


def test_evaluate_checks_its_json_path_before_the_evaluation_runs(profile_file, capsys):
    """A --json that cannot be written is refused up front, not after a long evaluation whose result it would lose."""
    fails_with(["evaluate", str(profile_file), "--checkpoint", "/nonexistent-checkpoint",
                "--json", f"{profile_file}/eval.json"], capsys, "--json", "is a file")
