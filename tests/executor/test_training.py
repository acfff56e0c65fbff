"""Training under the executor: same model as a sequential loop, exact resume, checkpoints, routes, the CLI."""
from __future__ import annotations

import copy
import json
import random

import numpy as np
import pytest
import torch

from morphpipe import ops
from morphpipe.commands.cli import main
from morphpipe.executor import (CpuDevices, Executor, Trainer, load_checkpoint, route_seeds, save_checkpoint,
                                training_device)
from morphpipe.executor.checkpoint import CHECKPOINT_FILE, TrainingState, capture_rng, restore_rng
from morphpipe.executor.trainer import torch_threads
from morphpipe.nn import TrainStep, build_model
from morphpipe.partitioner import Split
from morphpipe.profiler import Profile
from morphpipe.sampling import CpuBatcher
from morphpipe.scheduler import Plan, plan_from_profile

FANOUTS = [5, 5]
BATCH = 128  # the tiny preset's 1800 training seeds make 15 batches, the last one short


def cpu_only_plan(num_batches: int = 15, cores: int = 2, training_efficiency: float = 0.2) -> Plan:
    """Two cores and a step that scales poorly: one batching thread beside one training thread; one core, or two and
    a step that scales perfectly (efficiency 1): the phases take turns on every core."""
    return plan_from_profile(Profile.synthetic(t_cb=0.004, t_m=0.006, num_batches=num_batches, cores=cores,
                                               training_efficiency=training_efficiency), gbs=3)


def gpu_plan(num_batches: int = 15) -> Plan:
    profile = Profile.synthetic(t_cb=0.01, t_m=0.004, t_gb=0.005, t_dma=0.002, num_batches=num_batches, cores=2)
    return plan_from_profile(profile)


def sage(graph, seed: int = 0):
    torch.manual_seed(seed)
    return build_model("sage", graph.feature_dim, graph.num_classes, num_layers=2, hidden=32, dropout=0.5)


def test_executor_training_equals_a_sequential_loop_over_the_same_batches(tiny) -> None:
    split = Split(6, 9, 3, 4)
    routes = route_seeds(tiny.train_idx, BATCH, split.n_cpu, 15, seed=0)
    cpu = CpuBatcher(tiny, FANOUTS, BATCH, num_threads=2, seeds=routes.cpu, seed=5, pin_memory=False)
    gpu = CpuBatcher(tiny, FANOUTS, BATCH, num_threads=1, seeds=routes.gpu, seed=5, pin_memory=False)
    model = sage(tiny)
    reference = copy.deepcopy(model)
    rng = torch.get_rng_state()
    step = TrainStep(model, torch.optim.Adam(model.parameters(), lr=0.01))
    executor = Executor(split, CpuDevices(), step, cpu_batcher=cpu, gpu_batcher=gpu)
    with torch_threads(1):
        orders = [executor.run_epoch(epoch).order for epoch in range(2)]
    assert {route for route, _ in orders[0]} == {0, 1}

    torch.set_rng_state(rng)
    sequential = TrainStep(reference, torch.optim.Adam(reference.parameters(), lr=0.01))
    with torch_threads(1):
        for epoch, order in enumerate(orders):
            batches = {(0, b.batch_index): b for b in cpu.epoch(epoch)}
            batches.update({(1, split.n_cpu + b.batch_index): b for b in gpu.epoch(epoch)})
            for key in order:
                sequential(batches[key])
    cpu.close()
    gpu.close()
    for (name, trained), expected in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(trained, expected, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("cores, efficiency, shares_cores", [(2, 0.2, False), (2, 1.0, True), (1, 0.2, True)])
def test_every_training_seed_is_trained_once_per_epoch_by_the_trainer(tiny, cores: int, efficiency: float,
                                                                      shares_cores: bool) -> None:
    seen = []
    plan = cpu_only_plan(cores=cores, training_efficiency=efficiency)
    assert plan.shares_cores == shares_cores
    with Trainer(tiny, sage(tiny), plan, fanouts=FANOUTS, batch_size=BATCH, progress=False,
                 log=lambda line: None) as trainer:
        if shares_cores:  # a batching turn builds one batch per batching thread
            assert trainer.executor.cpu_batcher.num_threads == plan.cpu_threads == cores
        original = trainer.executor.step
        trainer.executor.step = lambda batch: (seen.append(batch.seeds), original(batch))[1]
        stats = trainer.fit(2, validate=False)
    assert sorted(torch.cat(seen).tolist()) == sorted(tiny.train_idx.tolist() * 2)
    assert [(s.seeds, s.batches) for s in stats] == [(1800, 15)] * 2 and stats[-1].max_cpu_buffer <= 3
    assert stats[-1].loss < stats[0].loss
    assert ("cpu-batching" in stats[0].busy) == shares_cores, "turn-taking traces its batching on this thread"
    if ops.current_backend().name == "fused":
        layers_per_epoch = 15 * len(FANOUTS)
        assert all(sum(s.op_choices["sage.order"].values()) == layers_per_epoch for s in stats), stats[0].op_choices


def test_resume_after_a_kill_matches_an_uninterrupted_run(tiny, tmp_path) -> None:
    plan = cpu_only_plan()
    lines: list[str] = []
    with Trainer(tiny, sage(tiny), plan, fanouts=FANOUTS, batch_size=BATCH, checkpoint_dir=tmp_path / "whole",
                 progress=False, log=lines.append) as whole:
        uninterrupted = whole.fit(3)

    calls = []

    def killed_in_the_second_epoch(logits, labels):
        calls.append(1)
        if len(calls) == 20:
            raise KeyboardInterrupt
        return torch.nn.functional.cross_entropy(logits, labels)

    with Trainer(tiny, sage(tiny), plan, fanouts=FANOUTS, batch_size=BATCH, loss_fn=killed_in_the_second_epoch,
                 checkpoint_dir=tmp_path / "killed", progress=False, log=lines.append) as first_try:
        with pytest.raises(KeyboardInterrupt):
            first_try.fit(3)
    assert load_checkpoint(tmp_path / "killed").epoch == 1

    with Trainer(tiny, sage(tiny, seed=99), plan, fanouts=FANOUTS, batch_size=BATCH,
                 checkpoint_dir=tmp_path / "killed", progress=False, log=lines.append) as resumed:
        history = resumed.fit(3)
        for ours, theirs in zip(resumed.model.parameters(), whole.model.parameters()):
            torch.testing.assert_close(ours, theirs)
    assert any("resumed" in line for line in lines)
    assert [stats.epoch for stats in history] == [0, 1, 2]
    assert [stats.loss for stats in history] == pytest.approx([stats.loss for stats in uninterrupted], rel=1e-5)
    assert history[-1].val_acc == pytest.approx(uninterrupted[-1].val_acc, abs=1e-9)


def test_a_checkpoint_of_another_run_is_refused(tiny, tmp_path) -> None:
    with Trainer(tiny, sage(tiny), cpu_only_plan(), fanouts=FANOUTS, batch_size=BATCH, checkpoint_dir=tmp_path,
                 progress=False, log=lambda line: None) as trainer:
        trainer.fit(1, validate=False)
    other = Trainer(tiny, sage(tiny), cpu_only_plan(8), fanouts=FANOUTS, batch_size=256, checkpoint_dir=tmp_path,
                    progress=False, log=lambda line: None)
    with pytest.raises(ValueError, match="batch_size: checkpoint 128 vs now 256"):
        other.fit(2)
    other.close()


def test_checkpoints_are_written_atomically_and_restore_every_rng(tmp_path) -> None:
    torch.manual_seed(1)
    np.random.seed(2)
    random.seed(3)
    rng = capture_rng()
    expected = (torch.rand(3), np.random.rand(3), random.random())
    state = TrainingState(epoch=4, model={"w": torch.ones(2)}, optimizer={"state": {}, "param_groups": []}, rng=rng,
                          history=[{"epoch": 0, "loss": 1.5}], meta={"dataset": "x"})
    save_checkpoint(tmp_path, state)
    assert sorted(path.name for path in tmp_path.iterdir()) == [CHECKPOINT_FILE]
    loaded = load_checkpoint(tmp_path)
    assert loaded.epoch == 4 and loaded.history == state.history and loaded.meta == state.meta
    restore_rng(loaded.rng)
    again = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(again[0], expected[0]) and np.array_equal(again[1], expected[1]) and again[2] == expected[2]
    assert load_checkpoint(tmp_path / "empty") is None
    (tmp_path / CHECKPOINT_FILE).write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="delete it to start over"):
        load_checkpoint(tmp_path)


def test_route_seeds_split_every_seed_between_the_routes() -> None:
    seeds = torch.arange(1000, 2000)
    routes = route_seeds(seeds, 64, 10, 16, seed=1)
    assert routes.cpu.numel() == 640 and routes.gpu.numel() == 360
    assert sorted(torch.cat([routes.cpu, routes.gpu]).tolist()) == seeds.tolist()
    assert route_seeds(seeds, 64, 16, 16).gpu.numel() == 0
    assert route_seeds(seeds, 64, 0, 16).cpu.numel() == 0
    with pytest.raises(ValueError, match="num_batches=20"):
        route_seeds(seeds, 64, 10, 20)
    with pytest.raises(ValueError, match="n_cpu must be in"):
        route_seeds(seeds, 64, 17, 16)


def test_plans_are_checked_against_the_machine_and_the_data(tiny) -> None:
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device"):
            training_device(gpu_plan())
    with pytest.raises(ValueError, match="trains on the CPU"):
        training_device(cpu_only_plan(), "cuda")
    with pytest.raises(ValueError, match="num_batches=15.*make 8"):
        Trainer(tiny, sage(tiny), cpu_only_plan(), fanouts=FANOUTS, batch_size=256, progress=False)


def test_train_command_with_auto_then_with_the_saved_plan(tmp_path, capsys) -> None:
    common = ["--fanouts", "5,5", "--batch-size", "256", "--hidden", "16", "--no-progress",
              "--checkpoint-dir", str(tmp_path / "ckpt")]
    assert main(["train", "tiny", "--auto", "--threads", "1,2", "--steps", "3", "--epochs", "1",
                 "--save-plan", str(tmp_path / "plan.json"), *common]) == 0
    first = capsys.readouterr().out
    assert "measured phases" in first and "epoch 1/1:" in first and "test accuracy" in first
    assert main(["train", "tiny", "--plan", str(tmp_path / "plan.json"), "--epochs", "2",
                 "--stats-json", str(tmp_path / "stats.json"), *common]) == 0
    second = capsys.readouterr().out
    assert "resumed" in second and "epoch 2/2:" in second and "predicted" in second
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert [epoch["epoch"] for epoch in stats["epochs"]] == [0, 1] and 0 <= stats["test_acc"] <= 1
    assert main(["train", "tiny", "--plan", str(tmp_path / "plan.json"), "--batch-size", "128",
                 "--no-progress"]) == 2
    assert "batches per epoch: plan 8, now 15" in capsys.readouterr().err
