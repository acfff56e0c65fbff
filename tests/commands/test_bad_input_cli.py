"""Bad input on the command line: one line on stderr naming the problem, exit status 2, files left as they were.

Nothing here can crash the interpreter (the native paths are covered in tests/test_bad_input_native.py),
so the CLI runs in-process through `morphpipe.commands.cli.main`.
"""
from __future__ import annotations

import gzip
import json
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest

from morphpipe.commands.cli import main
from morphpipe.data import GeneratorSpec, SplitFractions, generate
from morphpipe.profiler.profile import Profile
from tests.commands.conftest import SyntheticProfiler, snapshot

SMALL = ["--fanouts", "2,2", "--batch-size", "64"]


def fails_with(argv: list[str], capsys, *fragments: str) -> str:
    """Runs the CLI, expects exit status 2 and one error line holding every fragment; returns that line."""
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    line = captured.err.strip().splitlines()[-1]
    assert line.startswith(f"morphpipe {argv[0]}: error: "), captured.err
    for fragment in fragments:
        assert fragment in line, line
    return captured.out


@pytest.mark.parametrize("option, argv", [
    ("-o", ["tune", "GRAPH", "-o", "DIR"]),
    ("--profile-output", ["tune", "GRAPH", "--profile-output", "DIR"]),
    ("--stats-json", ["train", "GRAPH", "--auto", "--stats-json", "DIR"]),
    ("--save-plan", ["train", "GRAPH", "--auto", "--save-plan", "DIR"]),
    ("--json", ["bench", "GRAPH", "--json", "DIR"]),
    ("--plot", ["simulate", "PROFILE", "--plot", "DIR"]),
    ("--gantt", ["simulate", "PROFILE", "--gantt", "DIR"]),
])
def test_output_path_that_is_a_directory_is_refused_before_any_work(option, argv, tmp_path, graph_dir, capsys):
    profile = tmp_path / "profile.json"
    Profile.synthetic(t_cb=0.8, t_m=0.06, t_gb=0.1, t_dma=0.04, cores=2, num_batches=10).save(profile)
    (tmp_path / "dir").mkdir()
    replacements = {"GRAPH": str(graph_dir), "PROFILE": str(profile), "DIR": str(tmp_path / "dir")}
    argv = [replacements.get(arg, arg) for arg in argv]
    before = snapshot(tmp_path)
    out = fails_with(argv, capsys, option, "is a directory")
    assert "epoch" not in out and "measured" not in out  # refused before training or profiling
    assert snapshot(tmp_path) == before


def test_output_path_under_a_file_is_refused(tmp_path, graph_dir, capsys):
    (tmp_path / "file").write_text("x")
    fails_with(["train", str(graph_dir), "--auto", "--stats-json", str(tmp_path / "file" / "stats.json")], capsys,
               "--stats-json", "is a file")
    fails_with(["train", str(graph_dir), "--auto", "--checkpoint-dir", str(tmp_path / "file")], capsys,
               "--checkpoint-dir", "not a directory")
    fails_with(["data", "generate", "tiny", "-o", str(tmp_path / "file" / "graph")], capsys, "is a file")


def corrupt_sources(folder: Path) -> dict[str, tuple[list[str], str]]:
    """Inputs a user might hand `data convert` by mistake: (extra argv, what the error must name)."""
    folder.mkdir()
    (folder / "garbage.txt.gz").write_bytes(b"\x1f\x8b not really gzip")
    (folder / "pickle.npy").write_bytes(pickle.dumps({"edges": [1, 2]}))
    (folder / "zip.pt").write_bytes(b"PK\x03\x04 truncated zip")
    (folder / "binary.txt").write_bytes(bytes(range(256)) * 4)
    (folder / "latin1.csv").write_bytes("s\xe9ource,d\xe9st\n1,2\n".encode("latin-1"))
    (folder / "empty.npy").write_bytes(b"")
    np.save(folder / "edges.npy", np.array([[0, 1, 2], [1, 2, 0]]))
    (folder / "matrix.npz").write_text("not a zip archive")
    (folder / "data.pt").write_bytes(b"\x80\x04 not a pickle")
    edges = str(folder / "edges.npy")
    return {
        "gzip": (["edgelist", str(folder / "garbage.txt.gz")], "garbage.txt.gz"),
        "pickle": (["edgelist", str(folder / "pickle.npy")], "pickle.npy"),
        "binary": (["edgelist", str(folder / "binary.txt")], "binary.txt"),
        "non-utf8": (["edgelist", str(folder / "latin1.csv")], "latin1.csv"),
        "empty-features": (["edgelist", edges, "--features", str(folder / "empty.npy")], "--features"),
        "pickled-labels": (["edgelist", edges, "--labels", str(folder / "pickle.npy")], "--labels"),
        "splits-not-npz": (["edgelist", edges, "--splits", str(folder / "binary.txt")], "--splits"),
        "scipy-not-npz": (["scipy", str(folder / "matrix.npz")], "matrix.npz"),
        "pyg-not-pickle": (["pyg", str(folder / "data.pt")], "data.pt"),
        "pyg-not-torch-zip": (["pyg", str(folder / "zip.pt")], "zip.pt"),
        "pyg-plain-pickle": (["pyg", str(folder / "pickle.npy")], "pickle.npy"),
        "missing": (["edgelist", str(folder / "typo.txt")], "typo.txt"),
    }


def test_data_convert_refuses_corrupt_inputs_and_keeps_the_existing_graph(tmp_path, graph_dir, capsys):
    out = tmp_path / "out"
    shutil.copytree(graph_dir, out)
    sources = corrupt_sources(tmp_path / "sources")
    before = snapshot(tmp_path)
    for name, (argv, fragment) in sources.items():
        fails_with(["data", "convert", *argv, "-o", str(out), "--force"], capsys, fragment)
        assert snapshot(tmp_path) == before, name


def test_data_generate_says_how_much_memory_it_would_need(tmp_path, capsys):
    fails_with(["data", "generate", "--kind", "power-law", "--nodes", "2000000000", "--avg-degree", "50", "-o",
                str(tmp_path / "huge")], capsys, "GiB of memory", "--nodes")
    fails_with(["data", "generate", "--kind", "power-law", "--nodes", "10000000000", "-o", str(tmp_path / "huge")],
               capsys, "num_nodes")
    assert list(tmp_path.iterdir()) == []


def test_counts_that_mean_nothing_are_refused(tmp_path, graph_dir, capsys):
    fails_with(["bench", str(graph_dir), "--threads", "1", "--fanouts", "99999999999999999999"], capsys,
               "fanouts[0]", "-1")


@pytest.mark.parametrize("version", [0, True, "1", 2])
def test_meta_format_version_must_match_exactly(version, tmp_path, graph_dir, capsys):
    out = tmp_path / "graph"
    shutil.copytree(graph_dir, out)
    meta = json.loads((out / "meta.json").read_text())
    meta["format_version"] = version
    (out / "meta.json").write_text(json.dumps(meta))
    fails_with(["data", "info", str(out)], capsys, "format_version", repr(version))


def test_damaged_checkpoint_is_refused_with_one_line(tmp_path, graph_dir, monkeypatch, capsys):
    monkeypatch.setattr("morphpipe.commands.workload.Profiler", SyntheticProfiler)
    checkpoints = tmp_path / "ckpt"
    argv = ["train", str(graph_dir), "--auto", "--epochs", "1", *SMALL, "--hidden", "8", "--no-progress",
            "--checkpoint-dir", str(checkpoints)]
    assert main(argv) == 0
    capsys.readouterr()
    path = checkpoints / "checkpoint.pt"
    data = bytearray(path.read_bytes())
    data[-100] ^= 0xFF
    path.write_bytes(bytes(data))
    fails_with([*argv[:3], "--epochs", "2", *argv[5:]], capsys, "checkpoint.pt", "checksum")
    path.write_bytes(b'{"format": "morphpipe-checkpoint", "version": 2, "sha256": 7')
    fails_with([*argv[:3], "--epochs", "2", *argv[5:]], capsys, "checkpoint.pt", "header")


def test_empty_validation_split_is_announced_and_skipped(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("morphpipe.commands.workload.Profiler", SyntheticProfiler)
    graph = tmp_path / "graph"
    generate(GeneratorSpec(kind="community", num_nodes=240, avg_degree=4, feature_dim=8,
                           split=SplitFractions(0.8, 0.0, 0.2)), graph, progress=False)
    assert main(["train", str(graph), "--auto", "--epochs", "2", *SMALL, "--hidden", "8", "--no-progress",
                 "--stats-json", str(tmp_path / "stats.json")]) == 0
    out = capsys.readouterr().out
    assert "the val split is empty" in out and out.index("the val split is empty") < out.index("epoch 1/2")
    assert "test accuracy" in out
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert [epoch["val_acc"] for epoch in stats["epochs"]] == [None, None]


def test_gzip_text_edge_list_still_converts(tmp_path, capsys):
    """The corrupt-input handling does not refuse good compressed input."""
    with gzip.open(tmp_path / "edges.txt.gz", "wt") as handle:
        handle.write("0 1\n1 2\n2 0\n")
    assert main(["data", "convert", "edgelist", str(tmp_path / "edges.txt.gz"), "-o", str(tmp_path / "g")]) == 0
    assert "3 nodes, 3 edges" in capsys.readouterr().out
