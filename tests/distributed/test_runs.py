"""Distributed training end to end: real ranks on localhost (gloo), launched as processes.

Two ranks train GraphSAGE with every neighbour sampled and no dropout, so the union of the
ranks' step-k batches has the same gradient however it is cut: the weighted run, and an even
run that is killed in its second epoch (a rank raises) and then resumed from rank 0's
checkpoint, must both end with the parameters of one process training the union batches in
the single-process order. RGAT on the mag-shaped heterogeneous preset must do the same (DDP
runs typed batches unchanged). torchrun and mpirun each run one short epoch of `morphpipe train`.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from morphpipe.data import PRESETS, GraphStore, generate
from morphpipe.data.hetero_generator import generate_hetero
from morphpipe.data.store import load_graph_dir
from morphpipe.distributed.env import free_port
from morphpipe.distributed.launcher import launch, rank_environment
from morphpipe.executor.checkpoint import load_checkpoint
from morphpipe.nn import NodeClassification
from morphpipe.nn.train_step import TrainStep
from morphpipe.profiler import Profile
from morphpipe.sampling.cpu_batcher import sample_neighbors
from morphpipe.sampling.epochs import epoch_order
from tests.support import distributed_worker as worker

WORKER = worker.__file__
BIN = Path(sys.executable).parent
EPOCHS = 2


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("distributed")


@pytest.fixture(scope="module")
def dataset(workdir) -> Path:
    return generate(PRESETS["tiny"].spec, workdir / "tiny", progress=False)


@pytest.fixture(scope="module")
def reference(dataset) -> dict[str, torch.Tensor]:
    """One process trains the union batches in the single-process order."""
    graph = GraphStore.load(dataset)
    model = worker.build(graph)
    step = TrainStep(model, torch.optim.Adam(model.parameters(), lr=worker.LR))
    for epoch in range(EPOCHS):
        order = epoch_order(graph.train_idx, worker.SEED, epoch)
        for start in range(0, order.numel(), worker.GLOBAL_BATCH):
            step(sample_neighbors(graph, order[start:start + worker.GLOBAL_BATCH], worker.FANOUTS))
    return {key: value.detach().clone() for key, value in model.state_dict().items()}


@pytest.fixture(scope="module")
def mag_dataset(workdir) -> Path:
    return generate_hetero(PRESETS["mag-tiny"].spec, workdir / "mag-tiny")


@pytest.fixture(scope="module")
def mag_reference(mag_dataset) -> dict[str, torch.Tensor]:
    """One process trains RGAT on the union typed batches (every neighbour of every relation) in the single-process
    order."""
    graph = load_graph_dir(mag_dataset)
    model = worker.build(graph, "rgat")
    step = TrainStep(model, torch.optim.Adam(model.parameters(), lr=worker.LR))
    for epoch in range(EPOCHS):
        order = epoch_order(graph.train_idx, worker.SEED, epoch)
        with NodeClassification().batcher(graph, worker.FANOUTS, worker.GLOBAL_BATCH, seeds=order, shuffle=False,
                                          serial=True, num_threads=1) as batcher:
            for batch in batcher.epoch(0):
                step(batch)
    return {key: value.detach().clone() for key, value in model.state_dict().items()}


def run_worker(dataset: Path, out: Path, split: str, epochs: int, *extra: str) -> int:
    out.mkdir(parents=True, exist_ok=True)
    return launch([sys.executable, WORKER, str(dataset), str(out), split, str(epochs), *extra], 2)


def check_same(params: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> None:
    assert params.keys() == reference.keys()
    for key, value in reference.items():
        torch.testing.assert_close(params[key], value, rtol=1e-3, atol=1e-4, msg=key)


def check_last_epoch(dataset: Path, out: Path, epoch: int, local: list[int]) -> None:
    """Every rank ran the same steps, in proportion, and step k's union is single-process batch k."""
    graph = load_graph_dir(dataset)
    ranks = [torch.load(out / f"rank{r}.pt") for r in range(2)]
    steps = [rank["steps"] for rank in ranks]
    assert len(steps[0]) == len(steps[1]) == -(-graph.train_idx.numel() // worker.GLOBAL_BATCH)
    assert [batch.numel() for batch in steps[0][:-1]] == [local[0]] * (len(steps[0]) - 1)
    assert [batch.numel() for batch in steps[1][:-1]] == [local[1]] * (len(steps[1]) - 1)
    last = steps[0][-1].numel() + steps[1][-1].numel()
    assert 0 < last < worker.GLOBAL_BATCH, "the tiny preset's epoch ends with a short step"
    order = epoch_order(graph.train_idx, worker.SEED, epoch)
    for k, (mine, theirs) in enumerate(zip(*steps)):
        union = torch.cat([mine, theirs])
        assert torch.equal(union, order[k * worker.GLOBAL_BATCH:(k + 1) * worker.GLOBAL_BATCH])
    trained = torch.cat([torch.cat(s) for s in steps])
    assert torch.equal(trained.sort().values, graph.train_idx.sort().values), "each training seed exactly once"
    assert ranks[0]["accuracy"] == ranks[1]["accuracy"], "the all-reduced test accuracy is the same on every rank"


def test_weighted_two_ranks_train_like_one_process_on_the_union_batches(dataset, workdir, reference) -> None:
    out = workdir / "weighted"
    assert run_worker(dataset, out, "weighted", EPOCHS) == 0
    check_last_epoch(dataset, out, EPOCHS - 1, [171, 85])
    for rank in range(2):
        check_same(torch.load(out / f"rank{rank}.pt")["params"], reference)


def test_a_failing_rank_stops_both_and_the_killed_run_resumes_to_the_same_result(dataset, workdir,
                                                                                  reference) -> None:
    out, checkpoint = workdir / "even", workdir / "checkpoint"
    out.mkdir()
    steps = -(-1800 // worker.GLOBAL_BATCH)
    port = free_port()
    command = [sys.executable, WORKER, str(dataset), str(out), "even", str(EPOCHS), "--checkpoint", str(checkpoint),
               "--fail-at", str(steps + 3)]
    ranks = [subprocess.Popen(command, env=rank_environment(r, 2, port), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(2)]
    outputs = [rank.communicate(timeout=120) for rank in ranks]
    ended = time.time()
    failed_at = float((out / "failed_at").read_text())
    assert [rank.returncode for rank in ranks] == [1, 1], outputs
    assert "rank 1 of 2 failed" in outputs[1][1] and "injected failure at step 11 on rank 1" in outputs[1][1]
    assert "rank 0 of 2 failed" in outputs[0][1], "rank 0 stops on the broken collective, with its own error"
    assert ended - failed_at < 10.0, "no rank waits for a collective timeout"
    assert (checkpoint / "checkpoint.pt").exists(), "the first epoch was checkpointed before the failure"
    assert not (out / "rank0.pt").exists()
    assert run_worker(dataset, out, "even", EPOCHS, "--checkpoint", str(checkpoint)) == 0
    check_last_epoch(dataset, out, EPOCHS - 1, [128, 128])
    resumed = torch.load(out / "rank0.pt")
    assert resumed["history"] == EPOCHS
    check_same(resumed["params"], reference)


def test_a_sigkilled_rank_is_named_the_other_stopped_and_the_resumed_run_is_the_same(dataset, workdir, reference,
                                                                                   capfd) -> None:
    out, checkpoint = workdir / "sigkill", workdir / "sigkill-checkpoint"
    steps = -(-1800 // worker.GLOBAL_BATCH)
    status = run_worker(dataset, out, "even", EPOCHS, "--checkpoint", str(checkpoint), "--kill-at", str(steps + 3))
    ended = time.time()
    assert status == 128 + 9
    assert "rank 1 of 2 was killed by SIGKILL (signal 9); stopped the run" in capfd.readouterr().err
    assert ended - float((out / "failed_at").read_text()) < 10.0, "rank 0 is stopped, not left in a collective"
    assert load_checkpoint(checkpoint).epoch == 1 and not (out / "rank0.pt").exists()
    assert run_worker(dataset, out, "even", EPOCHS, "--checkpoint", str(checkpoint)) == 0
    resumed = torch.load(out / "rank0.pt")
    assert resumed["history"] == EPOCHS
    check_same(resumed["params"], reference)
    assert not list(checkpoint.glob(".*partial-*"))


@pytest.mark.slow
def test_rgat_on_typed_batches_two_ranks_train_like_one_process_and_resume_the_same(mag_dataset, workdir,
                                                                                    mag_reference) -> None:
    """DDP on typed batches: a weighted run, and an even run failing in its second epoch then resumed, both end with
    the one-process parameters (typed batches leave some parameters without gradients: DDP must look for them).
    About 45 s here (three 2-rank launches and the reference): the only end-to-end run of DDP on typed batches."""
    out = workdir / "rgat-weighted"
    assert run_worker(mag_dataset, out, "weighted", EPOCHS, "--model", "rgat") == 0
    check_last_epoch(mag_dataset, out, EPOCHS - 1, [171, 85])
    for rank in range(2):
        check_same(torch.load(out / f"rank{rank}.pt")["params"], mag_reference)
    out, checkpoint = workdir / "rgat-even", workdir / "rgat-checkpoint"
    steps = -(-1800 // worker.GLOBAL_BATCH)
    assert run_worker(mag_dataset, out, "even", EPOCHS, "--model", "rgat", "--checkpoint", str(checkpoint),
                      "--fail-at", str(steps + 3)) != 0
    assert load_checkpoint(checkpoint).epoch == 1 and not (out / "rank0.pt").exists()
    assert run_worker(mag_dataset, out, "even", EPOCHS, "--model", "rgat", "--checkpoint", str(checkpoint)) == 0
    check_last_epoch(mag_dataset, out, EPOCHS - 1, [128, 128])
    check_same(torch.load(out / "rank0.pt")["params"], mag_reference)


def train_command(dataset: Path, workdir: Path, name: str) -> list[str]:
    profile = workdir / "profile.json"
    Profile.synthetic(t_cb=0.004, t_m=0.006, num_batches=8, cores=1,
                      workload={"batch_size": 256, "model": "sage", "fanouts": "5,5"}).save(profile)
    return ["-m", "morphpipe", "train", str(dataset), "--profile", str(profile), "--epochs", "1", "--no-progress",
            "--stats-json", str(workdir / f"{name}.json")]


def check_launch(result: subprocess.CompletedProcess, workdir: Path, name: str) -> None:
    assert result.returncode == 0, result.stdout + result.stderr
    assert "plans per rank:" in result.stdout and "weighted split: 8 steps of 256 seeds" in result.stdout
    assert "epoch 1/1" in result.stdout and "test accuracy" in result.stdout
    import json

    stats = json.loads((workdir / f"{name}.json").read_text())
    assert stats["world_size"] == 2 and len(stats["epochs"]) == 1 and stats["epochs"][0]["seeds"] == 1800


def test_torchrun_launches_one_short_epoch(dataset, workdir) -> None:
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
               *train_command(dataset, workdir, "torchrun")]
    check_launch(subprocess.run(command, capture_output=True, text=True, timeout=180), workdir, "torchrun")


def test_mpirun_launches_one_short_epoch(dataset, workdir) -> None:
    mpirun = shutil.which("mpirun", path=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    if mpirun is None:
        pytest.skip("Open MPI's mpirun is not installed (pip install morphpipe[mpi])")
    environ = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
               "OMPI_MCA_rmaps_base_oversubscribe": "1", "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe"}
    command = [mpirun, "-n", "2", "--bind-to", "none", sys.executable,
               *train_command(dataset, workdir, "mpirun")]
    check_launch(subprocess.run(command, capture_output=True, text=True, timeout=180, env=environ), workdir, "mpirun")
