"""Every script in examples/ runs on the tiny preset and does what its docstring says.

Each example exposes `main(argv)`; the tests call it with small arguments (few epochs, short
profiling) and check what it returns and prints: accuracies above chance, losses that fall, every
training seed trained once per epoch, the converter's output equal to `morphpipe data convert`'s,
what-if predictions that move the right way. The distributed example runs as users run it, as a
process that starts its 2 gloo ranks. The tests took about 25 s on the project's 2-core machine under load 12-24
(test_distributed 16 s of it: three interpreters, each importing torch, and a gloo rendezvous: that is what the
example shows).
"""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch

from morphpipe.data import GraphStore
from morphpipe.profiler import Profile

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def checkout_env() -> dict[str, str]:
    """The environment for a subprocess that must import this checkout's morphpipe: a script's own directory, not
    the working directory, starts sys.path, and a morphpipe installed elsewhere (another checkout's editable
    install) would be imported instead, and would rebuild the native ops from its own sources."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return env


def example(name: str) -> ModuleType:
    """examples/<name>.py imported as a module (examples/ is not a package: users copy the files)."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_example_is_tested_and_documented() -> None:
    """A new example gets a test here, a docstring and --help, and a row in docs/examples.md."""
    tested = {name[len("test_"):] for name in globals() if name.startswith("test_")}
    listed = (ROOT / "docs" / "examples.md").read_text()
    for path in sorted(EXAMPLES.glob("*.py")):
        module = example(path.stem)
        assert path.stem in tested, f"add test_{path.stem} to tests/test_examples.py"
        assert module.__doc__ and "What it shows" in module.__doc__, f"{path.name}: say what it shows"
        assert f"`{path.name}`" in listed, f"add {path.name} to docs/examples.md"
        assert callable(module.main) and callable(module.parse_args)


def test_train_preset(tiny, capsys) -> None:
    result = example("train_preset").main(["--dataset", "tiny", "--fanouts", "5,5", "--batch-size", "256",
                                           "--epochs", "2", "--profile-steps", "2"])
    history = result["history"]
    assert [stats.epoch for stats in history] == [0, 1]
    assert all(stats.seeds == len(tiny.train_idx) for stats in history)  # every training seed, once per epoch
    assert all(stats.predicted_epoch_s is not None and stats.predicted_epoch_s > 0 for stats in history)
    assert result["test_acc"] > 0.7  # 4 classes: chance is 0.25; measured 0.90
    out = capsys.readouterr().out
    assert f"test accuracy {result['test_acc']:.3f}" in out and "epoch 1:" in out


def test_own_graph(tmp_path, capsys) -> None:
    out_dir = tmp_path / "demo"
    result = example("own_graph").main(["--out", str(out_dir), "--demo-nodes", "1200", "--epochs", "3",
                                        "--batch-size", "128", "--profile-steps", "2"])
    graph = result["graph"]
    inputs = tmp_path / "demo-input"
    labels = np.load(inputs / "labels.npy")
    assert graph.num_nodes == 1200 and graph.feature_dim == 16 and graph.num_classes == 4
    assert np.array_equal(graph.labels.numpy(), labels)
    edges = np.loadtxt(inputs / "edges.txt", dtype=np.int64)
    assert graph.num_edges == len(edges)  # no --undirected, --dedupe or --drop-self-loops: every line is an edge
    assert np.array_equal(np.diff(graph.indptr.numpy()), np.bincount(edges[:, 1], minlength=1200))  # in-degrees
    assert np.array_equal(np.sort(graph.indices.numpy()), np.sort(edges[:, 0]))  # the same sources
    assert result["test_acc"] > 0.9  # 4 classes: chance is 0.25; the demo's features nearly give the class
    assert "same as: morphpipe data convert edgelist" in capsys.readouterr().out

    # The command line's converter, on the same files, writes the same graph.
    cli_dir = tmp_path / "cli"
    subprocess.run([sys.executable, "-m", "morphpipe", "data", "convert", "edgelist", str(inputs / "edges.txt"),
                    "-o", str(cli_dir), "--features", str(inputs / "features.npy"), "--labels",
                    str(inputs / "labels.npy"), "--name", "demo"], check=True, cwd=ROOT, capture_output=True,
                    env=checkout_env())
    cli = GraphStore.load(cli_dir)
    for field in ("indptr", "indices", "features", "labels", "train_idx", "val_idx", "test_idx"):
        assert torch.equal(getattr(cli, field), getattr(graph, field)), field


def test_custom_module(tiny) -> None:
    result = example("custom_module").main(["--dataset", "tiny", "--epochs", "3", "--batch-size", "256"])
    assert result["losses"][-1] < result["losses"][0]
    assert result["test_acc"] > 0.8  # measured 0.94


def test_pyg_model(tiny) -> None:
    pytest.importorskip("torch_geometric.nn", reason="torch_geometric is not installed", exc_type=ImportError)
    result = example("pyg_model").main(["--dataset", "tiny", "--epochs", "2", "--batch-size", "256"])
    assert result["losses"][-1] < result["losses"][0]
    assert result["test_acc"] > 0.75  # measured 0.91


def test_what_if(tmp_path, capsys) -> None:
    """A GPU machine nobody here has, from its profile's numbers (a PCIe 4.0 x16 link, about 32 GB/s). With a 32 GB/s link the
    all-CPU pipeline is batching-bound and gets faster with every core; with 8 GB/s it is DMA-bound and more cores
    do not help; a slower link never speeds up the all-GPU route; the plan is never predicted slower than both."""
    profile_path = tmp_path / "gpu-box.json"
    Profile.synthetic(t_cb=0.08, t_m=0.01, t_gb=0.03, t_dma=0.012, num_batches=60, cores=4, cpu_efficiency=0.8,
                      batch_bytes=24_000_000).save(profile_path)
    cores = (1, 2, 4, 8)
    plans = example("what_if").main(["--profile", str(profile_path), "--cores", "1,2,4,8",
                                     "--pcie-gbps", "8,32"])["plans"]
    assert set(plans) == {(c, g) for c in cores for g in (8.0, 32.0)}
    fast_link = [plans[c, 32.0].baselines_s["all-cpu"] for c in cores]
    assert fast_link == sorted(fast_link, reverse=True) and fast_link[0] > 3 * fast_link[-1]
    slow_link = [plans[c, 8.0].baselines_s["all-cpu"] for c in cores[1:]]
    assert max(slow_link) < 1.01 * min(slow_link)  # DMA-bound: 60 batches x 4 x 12 ms
    assert all(plans[c, 8.0].baselines_s["all-gpu"] > plans[c, 32.0].baselines_s["all-gpu"] for c in cores)
    for plan in plans.values():
        assert plan.predicted_epoch_s <= min(plan.baselines_s.values()) * 1.001
    out = capsys.readouterr().out
    assert out.count(" GB/s  plan ") == 8 and "profile: cuda, 4 cores" in out


def test_distributed(tiny, tmp_path) -> None:
    """Two gloo ranks started by the example itself: every training seed once per epoch over the ranks, the local
    batches adding up to the global batch, and a model that learned."""
    summary = tmp_path / "summary.json"
    command = [sys.executable, str(EXAMPLES / "distributed.py"), "--nproc", "2", "--dataset", "tiny", "--epochs", "2",
               "--batch-size", "512", "--profile-steps", "2", "--out", str(summary)]
    # its own session, so that a run past the timeout is ended with its ranks (they would hold the build lock)
    launcher = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=checkout_env(), start_new_session=True)
    try:
        output, _ = launcher.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(launcher.pid, signal.SIGKILL)
        output, _ = launcher.communicate()
        pytest.fail(f"examples/distributed.py ran past 300 s:\n{output}")
    assert launcher.returncode == 0, output
    run = json.loads(summary.read_text())
    assert run["world_size"] == 2 and sum(run["local_batches"]) == 512
    assert run["seeds_per_epoch"] == [len(tiny.train_idx)] * 2
    assert run["test_acc"] > 0.7  # measured 0.86
    assert "rank 0:" in output and "rank 1:" in output and "test accuracy" in output
