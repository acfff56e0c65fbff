"""A stop between the steps of an epoch: what is checkpointed, and that the resumed epoch trains exactly the rest.

In process and quick: the executor over two routes (the interleaving is dynamic) stopped after some steps
and continued must train every batch once, in the order a sequential loop reproduces; the trainer stopped
mid epoch and resumed from its checkpoint must end with the uninterrupted run's parameters and metrics
exactly (op choices forced, as in the kill soak); old and malformed checkpoints. The SIGTERM path through
`morphpipe train` is in test_kill_resume.py.
"""
from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from morphpipe.executor import CpuDevices, Executor, Trainer, load_checkpoint, route_seeds
from morphpipe.executor.checkpoint import (CHECKPOINT_FILE, CheckpointError, Checkpointing, TrainingState, capture_rng,
                                          save_checkpoint)
from morphpipe.executor.partial_epoch import EpochProgress
from morphpipe.executor.stopping import StepStop, StopRequest, TrainingStopped
from morphpipe.executor.trainer import torch_threads
from morphpipe.nn import TrainStep, build_model
from morphpipe.ops.choice import DECISIONS, FORCE_ENV
from morphpipe.partitioner import Split
from morphpipe.profiler import Profile
from morphpipe.sampling import CpuBatcher, SerialBatcher
from morphpipe.scheduler import plan_from_profile
from tests.conftest import checkpoint_bytes

FANOUTS = [5, 5]
BATCH = 128  # the tiny preset's 1800 training seeds make 15 batches, the last one short
FORCED_CHOICES = ",".join(f"{decision}={options[0]}" for decision, options in DECISIONS.items())


def sage(graph, seed: int = 0):
    torch.manual_seed(seed)
    return build_model("sage", graph.feature_dim, graph.num_classes, num_layers=2, hidden=32, dropout=0.5)


def stop_after(steps: int):
    """An on_step that leaves the epoch after `steps` steps; the steps' items are recorded."""
    seen = []

    def on_step(item) -> None:
        seen.append((item.route, item.position))
        if len(seen) == steps:
            raise StepStop(steps)
    return on_step, seen


@pytest.mark.parametrize("stop_at", [1, 7, 15])
def test_a_stopped_epoch_continues_with_exactly_the_batches_it_did_not_apply(tiny, stop_at: int) -> None:
    split = Split(6, 9, 3, 4)  # two routes: which route's batch comes next depends on the buffers
    routes = route_seeds(tiny.train_idx, BATCH, split.n_cpu, 15, seed=0)
    cpu = CpuBatcher(tiny, FANOUTS, BATCH, num_threads=2, seeds=routes.cpu, seed=5, pin_memory=False)
    gpu = SerialBatcher(tiny, FANOUTS, BATCH, seeds=routes.gpu, seed=5)
    model = sage(tiny)
    reference = copy.deepcopy(model)
    rng = torch.get_rng_state()
    trained_seeds = []
    step = TrainStep(model, torch.optim.Adam(model.parameters(), lr=0.01))
    executor = Executor(split, CpuDevices(), lambda batch: (trained_seeds.append(batch.seeds.clone()), step(batch))[1],
                        cpu_batcher=cpu, gpu_batcher=gpu)
    on_step, seen = stop_after(stop_at)
    with torch_threads(1), pytest.raises(StepStop) as stopped:
        executor.run_epoch(1, on_step=on_step)
    progress = stopped.value.progress
    assert progress.order == seen and progress.steps == stop_at and progress.losses.shape == (stop_at,)
    first_cpu, first_gpu = progress.first_batches(15)
    assert (first_cpu, first_gpu) == (sum(r == 0 for r, _ in seen), sum(r == 1 for r, _ in seen))
    with torch_threads(1):
        result = executor.run_epoch(1, done=progress)
    rest = result.order[stop_at:]
    assert result.order[:stop_at] == seen
    assert sorted(position for _, position in result.order) == list(range(15)), "every batch once"
    assert {position for _, position in rest} == set(range(15)) - {position for _, position in seen}
    assert sorted(torch.cat(trained_seeds).tolist()) == sorted(tiny.train_idx.tolist()), "no seed twice, none lost"
    assert result.seeds == 1800 and result.batches == 15

    torch.set_rng_state(rng)
    sequential = TrainStep(reference, torch.optim.Adam(reference.parameters(), lr=0.01))
    batches = {(0, b.batch_index): b for b in cpu.epoch(1)}
    batches.update({(1, split.n_cpu + b.batch_index): b for b in gpu.epoch(1)})
    with torch_threads(1):
        losses = [sequential(batches[key]) for key in result.order]
    cpu.close()
    for trained, expected in zip(model.parameters(), reference.parameters()):
        assert torch.equal(trained, expected)
    assert torch.equal(progress.losses, torch.stack([loss.float() for loss in losses[:stop_at]]))


def test_a_continued_epoch_refuses_another_epoch_or_split(tiny) -> None:
    split = Split(15, 0, 3, 0)
    batcher = SerialBatcher(tiny, FANOUTS, BATCH, seed=5)
    model = sage(tiny)
    executor = Executor(split, CpuDevices(), TrainStep(model, torch.optim.Adam(model.parameters())),
                        cpu_batcher=batcher, shares_cores=True)
    progress = EpochProgress(0, 15, [(0, 0), (0, 1)], torch.ones(2), [128, 128], 0.1)
    with pytest.raises(ValueError, match="the stopped epoch is epoch 1 with 15 Route 0 batches; this executor runs "
                                         "epoch 2"):
        executor.run_epoch(1, done=progress)
    with pytest.raises(ValueError, match="with 14"):
        executor.run_epoch(0, done=dataclasses.replace(progress, n_cpu=14))
    with pytest.raises(ValueError, match=r"the Route 0 batches applied, \[0, 2\], are not its first 2 of 15"):
        executor.run_epoch(0, done=dataclasses.replace(progress, order=[(0, 0), (0, 2)]))
    with torch_threads(1):
        whole = executor.run_epoch(0, done=dataclasses.replace(progress, order=[(0, p) for p in range(15)],
                                                               losses=torch.ones(15), seeds=[120] * 15))
    assert whole.batches == 15 and whole.loss == 1.0, "nothing left to train: the epoch is the stopped run's"


class StopAfterSteps(StopRequest):
    """A stop requested once `steps` training steps ran (as a SIGTERM landing mid epoch would)."""

    def __init__(self, trainer_steps: list[int], steps: int) -> None:
        super().__init__(grace_s=0.0)
        self.trainer_steps = trainer_steps
        self.steps = steps

    @property
    def requested(self) -> bool:
        if len(self.trainer_steps) >= self.steps:
            self.request("test")
        return super().requested


def counting(trainer: Trainer, steps: list[int]) -> None:
    original = trainer.executor.step
    trainer.executor.step = lambda batch: (steps.append(1), original(batch))[1]


@pytest.mark.parametrize("cores, efficiency, shares_cores", [(2, 0.2, False), (2, 1.0, True), (1, 1.0, True)])
def test_a_run_stopped_mid_epoch_resumes_to_exactly_the_uninterrupted_run(tiny, tmp_path, monkeypatch, cores: int,
                                                                         efficiency: float, shares_cores: bool) -> None:
    monkeypatch.setenv(FORCE_ENV, FORCED_CHOICES)  # the ops' cost model is calibrated per run; fix its choices
    # Two cores: batching beside training (a step that scales poorly) or turns of two batches; one core: turns of one.
    plan = plan_from_profile(Profile.synthetic(t_cb=0.004, t_m=0.006, num_batches=15, cores=cores,
                                               training_efficiency=efficiency), gbs=3)
    assert plan.shares_cores == shares_cores and plan.cpu_threads == (cores if shares_cores else 1)
    settings = dict(fanouts=FANOUTS, batch_size=BATCH, progress=False, log=lambda line: None, eval_batch_size=256)
    with torch_threads(1), Trainer(tiny, sage(tiny), plan, **settings) as whole:
        uninterrupted = whole.fit(3)

    steps: list[int] = []
    lines: list[str] = []
    stopper = Trainer(tiny, sage(tiny), plan, **{**settings, "log": lines.append}, checkpoint_dir=tmp_path,
                      stop=StopAfterSteps(steps, 15 + 6))
    counting(stopper, steps)
    with torch_threads(1), stopper, pytest.raises(TrainingStopped) as stopped:
        stopper.fit(3)
    assert str(stopped.value) == (f"stopped by test during epoch 2 after 6 of 15 steps; the checkpoint in {tmp_path} "
                                  "holds epoch 2 up to step 6 of 15: run the same command again to resume from it")
    state = load_checkpoint(tmp_path)
    assert state.epoch == 1 and state.partial_epoch["order"] == [[0, p] for p in range(6)]

    with torch_threads(1), Trainer(tiny, sage(tiny, seed=7), plan, **{**settings, "log": lines.append},
                                   checkpoint_dir=tmp_path) as resumed:
        trained: list[int] = []
        counting(resumed, trained)
        history = resumed.fit(3)
    assert len(trained) == 9 + 15, "the resume trains only the stopped epoch's other 9 batches, then epoch 3"
    assert f"resumed from {tmp_path} in epoch 2 after step 6 of 15" in lines
    for ours, theirs in zip(resumed.model.parameters(), whole.model.parameters()):
        assert torch.equal(ours, theirs)
    assert [(s.epoch, s.loss, s.val_acc, s.seeds, s.batches) for s in history] == [
        (s.epoch, s.loss, s.val_acc, s.seeds, s.batches) for s in uninterrupted]
    assert resumed.evaluate("test") == whole.evaluate("test")
    assert load_checkpoint(tmp_path).partial_epoch is None, "the epoch's end replaces the mid-epoch checkpoint"


def test_a_stopped_epoch_split_for_a_gpu_is_not_continued_on_the_cpu(tiny, tmp_path) -> None:
    plan = plan_from_profile(Profile.synthetic(t_cb=0.004, t_m=0.006, num_batches=15, cores=2), gbs=3)
    settings = dict(fanouts=FANOUTS, batch_size=BATCH, progress=False, log=lambda line: None, checkpoint_dir=tmp_path)
    with torch_threads(1), Trainer(tiny, sage(tiny), plan, **settings) as trainer:
        trainer.fit(1, validate=False)
        trainer.save(1, EpochProgress(1, 10, [(0, 0), (1, 10)], torch.ones(2), [128, 128], 0.5))
    with Trainer(tiny, sage(tiny), plan, **settings) as resumed, pytest.raises(
            ValueError, match="the checkpoint's stopped epoch 2 puts 5 batches on Route 1 \\(GPU batching\\), but "
                              "this run trains on the CPU: resume it on a GPU machine"):
        resumed.fit(2, validate=False)


def test_trainers_that_cannot_continue_a_stopped_epoch_refuse_its_checkpoint(tmp_path) -> None:
    save_checkpoint(tmp_path, mid_epoch_state(GOOD))
    model = torch.nn.Linear(2, 2)
    checkpoints = Checkpointing(tmp_path, model, torch.optim.Adam(model.parameters()), log=lambda line: None)
    with pytest.raises(CheckpointError, match="holds epoch 2 stopped mid epoch, which only `morphpipe train` "
                                              "\\(mini-batch, one process\\) continues"):
        checkpoints.resume({})
    with pytest.raises(CheckpointError, match="stopped mid epoch"):
        checkpoints.restore(load_checkpoint(tmp_path), {}, rng=False)  # the distributed trainer's way


def mid_epoch_state(partial: dict) -> TrainingState:
    return TrainingState(epoch=1, model={"w": torch.ones(2)}, optimizer={"state": {}, "param_groups": []},
                         rng=capture_rng(), meta={"dataset": "x"}, partial_epoch=partial)


GOOD = {"epoch": 1, "n_cpu": 15, "order": [[0, 0], [0, 1]], "losses": torch.tensor([1.5, 1.25]), "seeds": [128, 128],
        "elapsed_s": 0.5, "skipped": {}}


@pytest.mark.parametrize("change, message", [
    ({"epoch": 0}, "'partial_epoch.epoch' is 0, but the checkpoint holds 1 completed epochs"),
    ({"n_cpu": 16}, "'partial_epoch.n_cpu' is 16, expected Route 0's batch count in [0, 15]"),
    ({"order": [[0, 0], [0, 0]]}, "'partial_epoch.order' is not what an epoch applies: the Route 0 batches applied, "
                                  "[0, 0], are not its first 2 of 15"),
    ({"order": [[0, 0], "x"]}, "'partial_epoch.order' holds an entry that is not a [route, position] pair of ints"),
    ({"losses": torch.tensor([1.5])}, "'partial_epoch.losses' is a torch.float32 tensor of shape (1,), expected "
                                      "float32 of shape (2,)"),
    ({"seeds": [128]}, "'partial_epoch.seeds' holds 1 entries, expected 2 positive seed counts"),
    ({"elapsed_s": "soon"}, "'partial_epoch.elapsed_s' is str, expected float"),
    ({"skipped": {"nan loss": -1}}, "'partial_epoch.skipped' is {'nan loss': -1}, expected counts"),
    ({"order": None}, "'partial_epoch.order' is NoneType, expected list"),
])
def test_a_malformed_partial_epoch_is_refused_naming_the_file_and_the_field(tmp_path, change, message) -> None:
    save_checkpoint(tmp_path, mid_epoch_state({**GOOD, **change}))
    state = load_checkpoint(tmp_path)
    with pytest.raises(CheckpointError) as error:
        EpochProgress.from_checkpoint(state.partial_epoch, tmp_path / CHECKPOINT_FILE, state.epoch, 15)
    assert str(tmp_path / CHECKPOINT_FILE) in str(error.value) and message in str(error.value)
    good = EpochProgress.from_checkpoint(load_checkpoint(save_checkpoint(tmp_path, mid_epoch_state(GOOD)).parent)
                                         .partial_epoch, tmp_path / CHECKPOINT_FILE, 1, 15)
    assert good.first_batches(15) == (2, 0) and good.steps == 2


def test_a_version_2_checkpoint_loads_as_an_epoch_boundary_one_and_cannot_hold_a_partial_epoch(tmp_path) -> None:
    state = mid_epoch_state(None)
    document = {"epoch": 1, "model": state.model, "optimizer": state.optimizer, "rng": state.rng, "history": [],
                "meta": state.meta}
    (tmp_path / CHECKPOINT_FILE).write_bytes(checkpoint_bytes(document, version=2))
    loaded = load_checkpoint(tmp_path)
    assert loaded.epoch == 1 and loaded.partial_epoch is None and loaded.model["w"].tolist() == [1.0, 1.0]
    (tmp_path / CHECKPOINT_FILE).write_bytes(checkpoint_bytes({**document, "partial_epoch": GOOD}, version=2))
    with pytest.raises(CheckpointError, match="field 'partial_epoch' is in a version 2 checkpoint, which holds none"):
        load_checkpoint(tmp_path)
    save_checkpoint(tmp_path, mid_epoch_state([1, 2]))
    with pytest.raises(CheckpointError, match="field 'partial_epoch' is list, expected a dict or none"):
        load_checkpoint(tmp_path)
