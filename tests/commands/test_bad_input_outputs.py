"""Every command that replaces a result leaves the previous one byte-identical when it fails or is interrupted.

Failures are injected at the worst moment (the new result is fully written, not yet swapped in) by making
the final flush raise; interruptions send SIGINT to a child process held at that same moment by the
MORPHPIPE_TEST_STALL_BEFORE_REPLACE hook. Afterwards the output's parent directory must hold exactly what
it held before: the old result, unchanged, and no partial files.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from morphpipe import outputs
from morphpipe.commands.cli import main
from morphpipe.executor.checkpoint import CHECKPOINT_FILE, TrainingState, capture_rng, save_checkpoint
from morphpipe.profiler.profile import Profile
from tests.commands.conftest import SyntheticProfiler, snapshot

OLD = b"the previous result, which must survive\n"
SMALL_GRAPH = ["--kind", "community", "--nodes", "300", "--avg-degree", "4", "--feature-dim", "8", "--quiet"]
TINY_WORKLOAD = ["--fanouts", "2,2", "--batch-size", "64"]


@pytest.fixture(scope="module")
def profile_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("profile") / "profile.json"
    Profile.synthetic(t_cb=0.8, t_gb=0.1, t_dma=0.04, t_m=0.06, cores=2, num_batches=50).save(path)
    return path


def edge_list(path: Path) -> Path:
    path.write_text("# src dst\n0 1\n1 2\n2 0\n3 0\n")
    return path


def command(case: str, out: Path, graph_dir: Path, profile_path: Path) -> tuple[list[str], Path | None]:
    """(argv, file or directory the command replaces) for one case, its outputs under `out`."""
    old_graph = out / "graph"
    cases = {
        "data convert": (["data", "convert", "edgelist", str(edge_list(out.parent / "edges.txt")), "-o",
                          str(old_graph), "--force"], old_graph),
        "data generate": (["data", "generate", *SMALL_GRAPH, "--seed", "7", "-o", str(old_graph), "--force"],
                          old_graph),
        "simulate --plot": (["simulate", str(profile_path), "--cores", "2,4", "--plot", str(out / "fig.png")],
                            out / "fig.png"),
        "bench --json": (["bench", str(graph_dir), "--threads", "1", "--batches", "1", *TINY_WORKLOAD, "--json",
                          str(out / "bench.json")], out / "bench.json"),
        "tune -o": (["tune", str(graph_dir), "--threads", "1", "--steps", "1", "--warmup", "0", *TINY_WORKLOAD,
                     "--hidden", "8", "-o", str(out / "plan.json"), "--profile-output", str(out / "profile.json")],
                    out / "profile.json"),
        "train --stats-json": (["train", str(graph_dir), "--auto", "--threads", "1", "--steps", "1", "--epochs", "1",
                                *TINY_WORKLOAD, "--hidden", "8", "--no-progress", "--stats-json",
                                str(out / "stats.json")], out / "stats.json"),
    }
    return cases[case]


def prepare(out: Path, graph_dir: Path) -> None:
    """The previous results: a graph directory and a file for every file output."""
    out.mkdir(parents=True)
    shutil.copytree(graph_dir, out / "graph")
    for name in ("fig.png", "bench.json", "plan.json", "profile.json", "stats.json"):
        (out / name).write_bytes(OLD + name.encode())


CASES = ["data convert", "data generate", "simulate --plot", "bench --json", "tune -o", "train --stats-json"]


@pytest.mark.parametrize("case", CASES)
def test_failure_while_replacing_keeps_the_previous_result(case, tmp_path, graph_dir, profile_path, monkeypatch,
                                                           capsys) -> None:
    out = tmp_path / "out"
    prepare(out, graph_dir)
    argv, _ = command(case, out, graph_dir, profile_path)
    before = snapshot(out)

    def disk_full(path: Path) -> None:
        raise OSError(28, "No space left on device (injected)")

    monkeypatch.setattr(outputs, "_fsync", disk_full)
    monkeypatch.setattr("morphpipe.commands.workload.Profiler", SyntheticProfiler)
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert "Traceback" not in error
    assert error.splitlines()[-1].startswith(f"morphpipe {argv[0]}: error: ")
    assert "No space left on device" in error.splitlines()[-1]
    assert snapshot(out) == before


# Runs every case in one child process (the CLI turns SIGINT into exit status 130 and the child goes on
# with the next case); before each, it points the stall hook at a fresh marker and reports the status.
SIGINT_CHILD = """
import json, os, signal, sys, torch
signal.signal(signal.SIGINT, signal.default_int_handler)  # a background job of a script starts with SIGINT ignored
from morphpipe import outputs
from morphpipe.commands.cli import main
from morphpipe.executor.checkpoint import TrainingState, capture_rng, save_checkpoint
from morphpipe.profiler.profile import Profile
import morphpipe.commands.workload

class SyntheticProfiler:
    def __init__(self, *args, **kwargs):
        pass

    def run(self):
        return Profile.synthetic(t_cb=0.004, t_m=0.006, num_batches=3, cores=2).replaced(
            workload={"precision": "float32"})

morphpipe.commands.workload.Profiler = SyntheticProfiler

def save_new_checkpoint(directory):
    try:
        save_checkpoint(directory, TrainingState(epoch=2, model={"w": torch.zeros(3)},
                                                 optimizer={"state": {}, "param_groups": []}, rng=capture_rng()))
    except KeyboardInterrupt:
        return 130
    return 0

REPORT = "@@report "
for number, (argv, target) in enumerate(json.loads(sys.argv[1])):
    os.environ[outputs.STALL_BEFORE_REPLACE_ENV] = f"{sys.argv[2]}/stalled-{number}"
    os.environ[outputs.STALL_ONLY_ENV] = os.path.basename(target)
    code = save_new_checkpoint(argv[1]) if argv[0] == "checkpoint" else main(argv)
    print(REPORT + json.dumps({"case": number, "code": code}), flush=True)
"""


def test_sigint_while_replacing_keeps_the_previous_result(tmp_path, graph_dir, profile_path) -> None:
    cases, befores = [], []
    for number, case in enumerate(CASES):
        out = tmp_path / f"case-{number}"
        prepare(out, graph_dir)
        argv, target = command(case, out, graph_dir, profile_path)
        cases.append((argv, str(target)))
        befores.append(snapshot(out))
    checkpoints = tmp_path / "checkpoints"
    save_checkpoint(checkpoints / "ckpt", TrainingState(epoch=1, model={"w": torch.ones(3)},
                                                        optimizer={"state": {}, "param_groups": []},
                                                        rng=capture_rng()))
    cases.append((["checkpoint", str(checkpoints / "ckpt")], str(checkpoints / "ckpt" / CHECKPOINT_FILE)))
    befores.append(snapshot(checkpoints))
    child = subprocess.Popen([sys.executable, "-c", SIGINT_CHILD, json.dumps(cases), str(tmp_path)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for number, (argv, target) in enumerate(cases):
            marker = tmp_path / f"stalled-{number}"
            deadline = time.monotonic() + 300
            while not marker.exists() and child.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert marker.exists(), f"{argv[:2]} never reached its replacement:\n{child.stderr.read()}"
            assert marker.read_text() == target
            child.send_signal(signal.SIGINT)
            line = child.stdout.readline()
            while line and not line.startswith("@@report "):
                line = child.stdout.readline()
            report = json.loads(line.removeprefix("@@report "))
            assert report == {"case": number, "code": 130}, argv[:2]
        child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate(timeout=60)
    assert child.returncode == 0
    for number, before in enumerate(befores[:-1]):
        assert snapshot(tmp_path / f"case-{number}") == before, CASES[number]
    assert snapshot(checkpoints) == befores[-1]


def test_checkpoint_replacement_failure_keeps_the_previous_checkpoint(tmp_path, monkeypatch) -> None:
    directory = tmp_path / "ckpt"
    save_checkpoint(directory, TrainingState(epoch=1, model={"w": torch.ones(3)},
                                             optimizer={"state": {}, "param_groups": []}, rng=capture_rng()))
    before = snapshot(directory)

    def fail_midway(path: Path) -> None:
        raise OSError("injected failure after writing, before the swap")

    monkeypatch.setattr(outputs, "_fsync", fail_midway)
    with pytest.raises(OSError, match="injected"):
        save_checkpoint(directory, TrainingState(epoch=2, model={}, optimizer={}, rng={}))
    assert snapshot(directory) == before


def test_replacing_file_and_directory_clean_up_after_an_exception(tmp_path) -> None:
    target = tmp_path / "result.json"
    target.write_bytes(OLD)
    with pytest.raises(KeyboardInterrupt), outputs.replacing_file(target) as temporary:
        temporary.write_text("half")
        raise KeyboardInterrupt
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "a.npy").write_bytes(OLD)
    with pytest.raises(RuntimeError), outputs.replacing_directory(folder) as staging:
        (staging / "a.npy").write_text("new")
        raise RuntimeError("failed midway")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["folder", "result.json"]
    assert target.read_bytes() == OLD and (folder / "a.npy").read_bytes() == OLD
    with outputs.replacing_directory(folder) as staging:
        (staging / "b.npy").write_text("new")
    assert [path.name for path in folder.iterdir()] == ["b.npy"]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["folder", "result.json"]


def test_a_stale_staging_directory_of_a_reused_pid_does_not_block(tmp_path) -> None:
    """A killed run leaves `.NAME.partial-PID` behind; a later process that gets the same PID replaces it."""
    folder = tmp_path / "folder"
    stale = outputs.partial_path(folder)
    stale.mkdir()
    (stale / "half.npy").write_text("half")
    with outputs.replacing_directory(folder) as staging:
        (staging / "a.npy").write_text("new")
    assert [path.name for path in folder.iterdir()] == ["a.npy"]
    assert [path.name for path in tmp_path.iterdir()] == ["folder"]


def test_replacing_a_directory_without_renameat2_leaves_only_the_new_one(tmp_path, monkeypatch) -> None:
    """Where RENAME_EXCHANGE is unavailable, two renames swap the directories; the old one is then removed."""
    monkeypatch.setattr(outputs, "_rename_exchange", lambda first, second: False)
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "old.npy").write_bytes(OLD)
    with outputs.replacing_directory(folder) as staging:
        (staging / "new.npy").write_text("new")
    assert [path.name for path in folder.iterdir()] == ["new.npy"]
    assert [path.name for path in tmp_path.iterdir()] == ["folder"]
