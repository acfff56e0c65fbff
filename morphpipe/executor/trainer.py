"""The Trainer: trains a model for some epochs under a Plan, evaluates it, and checkpoints it.

It turns a plan into running parts: the training seeds split between the routes
(`route_seeds`), the C++ CpuBatcher for Route 0 with the plan's thread count, a GPU batcher
for Route 1 when the plan has one, the devices (CUDA streams, or the CPU), a `TrainStep`,
and the `Executor` that runs each epoch. On a CPU-only plan the training step runs with the
plan's training threads while the batcher's threads overlap it, or, when the plan's phases
take turns on the same cores, batches are built on demand (`SerialBatcher`: a turn samples one batch per batching
thread) and then trained. After each epoch it measures
validation accuracy, prints one line (time, throughput, loss, accuracy, predicted vs measured
epoch time) and writes a checkpoint, from which a killed run continues. A run stopped mid epoch
(SIGTERM, `StopRequest`) checkpoints the steps applied so far, and the resumed run trains only the
rest of that epoch (`morphpipe.executor.partial_epoch`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import psutil
import torch
from torch import nn
from tqdm.auto import tqdm

from morphpipe.cores import usable_cores
from morphpipe.data import GraphStore
from morphpipe.executor.checkpoint import Checkpointing, run_meta
from morphpipe.executor.devices import InFlight, default_devices
from morphpipe.executor.executor import EpochResult, Executor
from morphpipe.executor.partial_epoch import EpochProgress
from morphpipe.executor.replan import Replanner
from morphpipe.executor.routes import route_seeds
from morphpipe.executor.stats import EpochStats
from morphpipe.executor.stopping import StepStop, StopRequest, TrainingStopped, epoch_finish_estimate_s
from morphpipe.nn.finite_guard import FiniteGuard
from morphpipe.nn.task import EvalSettings, NodeClassification, Task, check_eval_mode, check_split
from morphpipe.nn.train_step import TrainStep, make_optimizer
from morphpipe.ops.choice import choice_counts
from morphpipe.ops.community import GraphBlock
from morphpipe.partitioner.partitioner import buffer_sizes
from morphpipe.sampling.batcher import Batcher
from morphpipe.sampling.validation import check_fanouts, check_positive
from morphpipe.scheduler.plan import Plan

# Makes a Route 1 batcher over `seeds` on the training device in place of the task's own: factory(graph, fanouts,
# batch_size, seeds=..., seed=..., device=...).
GpuBatcherFactory = Callable[..., Batcher]


def training_device(plan: Plan, device: str | torch.device | None = None) -> torch.device:
    """Where the plan trains: the CPU for a CPU-only plan, else a CUDA device (an error without one)."""
    requested = None if device in (None, "auto") else torch.device(device)
    if plan.kind == "cpu-only":
        if requested is not None and requested.type != "cpu":
            raise ValueError(f"device={str(device)!r}, but the plan is CPU-only (schedule 'cpu-only') and trains on "
                             "the CPU; plan on the GPU machine (morphpipe tune) to train there")
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ValueError(f"the plan (schedule {plan.kind!r}) trains on a GPU, but torch sees no CUDA device; plan for "
                         "this machine with `morphpipe tune` or `morphpipe train --auto`")
    if requested is not None and requested.type != "cuda":
        raise ValueError(f"device={str(device)!r}, but the plan (schedule {plan.kind!r}) trains on a GPU; use "
                         "device='cuda' or plan for the CPU")
    return requested or torch.device("cuda")


def training_threads(plan: Plan) -> int | None:
    """The intra-op threads a training step runs with: a CPU-only plan's training threads; None (unchanged) on a GPU."""
    return plan.train_threads if plan.kind == "cpu-only" else None


@contextlib.contextmanager
def torch_threads(count: int | None) -> Iterator[None]:
    """Runs the block with `count` intra-op threads (None: unchanged), restoring the setting after."""
    saved = torch.get_num_threads()
    if count is not None:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def choice_counts_since(before: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """The op choices made since `before` (a `choice_counts()` snapshot): calls per option per decision."""
    since: dict[str, dict[str, int]] = {}
    for decision, options in choice_counts().items():
        for option, count in options.items():
            made = count - before.get(decision, {}).get(option, 0)
            if made > 0:
                since.setdefault(decision, {})[option] = made
    return since


def metric_label(task: Task) -> str:
    """How the epoch line names the task's validation metric ("acc" for accuracy)."""
    return "acc" if task.metric == "accuracy" else task.metric


class LogOnce:
    """Logs each message the first time only (layer-wise inference says where its tables live on every call)."""

    def __init__(self, log: Callable[[str], None]) -> None:
        self.log = log
        self.said: set[str] = set()

    def __call__(self, message: str) -> None:
        if message not in self.said:
            self.said.add(message)
            self.log(message)


class Trainer:
    """Trains `model` on `graph` for epochs under `plan`, with validation, progress bars and checkpoints.

    `task` is what is trained (`morphpipe.nn.task`: the units an epoch visits, each route's batcher, the loss and
    the metric); the default is node classification with `loss_fn` (cross entropy unless given; give one or the
    other). `optimizer` defaults to torch's fused Adam(lr) (`make_optimizer`). `gpu_batcher`, when given, makes
    the Route 1 batcher in place of the task's. With `checkpoint_dir`
    a checkpoint is written after every epoch and `fit` continues from the one found there;
    `model_spec` (build_model's arguments) is saved with it so `morphpipe evaluate` can rebuild the
    model. `eval_mode` is how `evaluate` measures by default: "sampled" or "full" (exact).
    With a `replanner`, every epoch's measured phase times feed it, and the next epoch runs the
    plan it switches to (`self.plan` is always the plan in force). `on_nonfinite` is what a step with
    labels outside the classes or a NaN/infinite loss or gradient does: "stop" (a NonFiniteError naming
    the epoch, batch and seeds) or "skip-batch" (no update; counted in the epoch's stats). `precision` is the
    step's arithmetic ("float32", or "bf16": bfloat16 autocast with float32 master weights, `TrainStep`).
    When `stop` is requested, `fit` raises TrainingStopped after the current epoch (checkpointed) when the
    rest of it fits in the stop's grace period and there is a checkpoint directory, else after the current
    step: with a checkpoint directory the steps applied so far are checkpointed and a resumed run trains only
    the rest of the epoch; without one the unfinished epoch is dropped.
    """

    def __init__(self, graph: GraphStore, model: nn.Module, plan: Plan, *, fanouts: Sequence[int], batch_size: int,
                 optimizer: torch.optim.Optimizer | None = None,
                 loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None, lr: float = 3e-3,
                 device: str | torch.device | None = None, seed: int = 0, gpu_batcher: GpuBatcherFactory | None = None,
                 checkpoint_dir: str | os.PathLike | None = None, eval_batch_size: int = 4096,
                 progress: bool = True, log: Callable[[str], None] | None = None, eval_mode: str = "sampled",
                 model_spec: dict[str, Any] | None = None, replanner: Replanner | None = None,
                 on_nonfinite: str = "stop", stop: StopRequest | None = None, task: Task | None = None,
                 precision: str = "float32") -> None:
        if task is not None and loss_fn is not None:
            raise ValueError("give either task= (whose loss trains) or loss_fn= (for node classification), not both")
        self.task = task or NodeClassification(loss_fn)
        self.task.check_graph(graph)
        self.graph = graph
        self.plan = plan
        self.fanouts = check_fanouts(fanouts)
        self.batch_size = check_positive("batch_size", batch_size)
        self.eval_batch_size = check_positive("eval_batch_size", eval_batch_size)
        self.eval_mode = check_eval_mode(eval_mode)
        self._graph_block: GraphBlock | None = None
        self.seed = int(seed)
        self.device = training_device(plan, device)
        self.model = model.to(self.device)
        self.optimizer = optimizer or make_optimizer(self.model.parameters(), lr, self.device)
        self.guard = FiniteGuard(on_nonfinite)
        self.step = TrainStep(self.model, self.optimizer, self.task, self.guard, precision=precision)
        self.progress = progress
        self.log = log or tqdm.write
        self._say_once = LogOnce(self.log)
        self.checkpoints = (Checkpointing(checkpoint_dir, self.model, self.optimizer, log=self.log,
                                          model_spec=model_spec) if checkpoint_dir is not None else None)
        self.history: list[EpochStats] = []
        self.cores = usable_cores()
        self.gpu_batcher = gpu_batcher
        self.replanner = replanner
        self.stop = stop
        self.validation_s: float | None = None  # how long the last validation took
        self.executor = self._executor(plan)

    def _executor(self, plan: Plan) -> Executor:
        """The batchers of both routes and the Executor that runs `plan`'s epochs."""
        routes = route_seeds(self.task.seeds(self.graph), self.batch_size, plan.n_cpu, plan.num_batches, self.seed)
        cpu_batcher: Batcher | None = None
        if plan.n_cpu:
            cpu_batcher = self.task.batcher(self.graph, self.fanouts, self.batch_size, route=0, seeds=routes.cpu,
                                            seed=self.seed, serial=plan.shares_cores, num_threads=plan.cpu_threads,
                                            pin_memory=self.device.type == "cuda")
        gpu_route = None
        if plan.n_gpu and self.gpu_batcher is not None:
            gpu_route = self.gpu_batcher(self.graph, self.fanouts, self.batch_size, seeds=routes.gpu, seed=self.seed,
                                          device=self.device)
        elif plan.n_gpu:
            gpu_route = self.task.batcher(self.graph, self.fanouts, self.batch_size, route=1, seeds=routes.gpu,
                                          seed=self.seed, device=self.device)
        return Executor(plan.split, default_devices(self.device), self.step, cpu_batcher=cpu_batcher,
                        gpu_batcher=gpu_route, shares_cores=plan.shares_cores)

    def use_plan(self, plan: Plan) -> None:
        """Runs the next epochs under `plan` (same batch count): new batchers and executor, the old ones closed; with
        features on disk, the feature cache re-sized to the plan's."""
        if plan.num_batches != self.plan.num_batches:
            raise ValueError(f"the new plan has {plan.num_batches} batches per epoch, this run {self.plan.num_batches}; "
                             "plan for the same batch size and training seeds")
        if plan.kind == "cpu-only" and self.device.type != "cpu":
            raise ValueError("a CPU-only plan cannot replace a GPU plan during training")
        self.close()
        store = getattr(self.graph, "feature_store", None)
        if store is not None and plan.tiering is not None and not plan.tiering.matches(store):
            # the new batchers read through the new cache, with the plan's I/O threads
            self.graph.open_feature_store(plan.tiering.cache_bytes, plan.tiering.io_threads)
        self.plan, self.executor = plan, self._executor(plan)

    def fit(self, epochs: int, *, validate: bool = True) -> list[EpochStats]:
        """Trains until `epochs` epochs are done (continuing from a checkpoint), returns every epoch's stats."""
        check_positive("epochs", epochs)
        if validate and self.task.seeds(self.graph, "val").numel() == 0:
            self.log(f"the validation split is empty: epochs run without validation {self.task.metric}")
            validate = False
        first, done = self._resume()
        for epoch in range(first, epochs):
            self.guard.start_epoch(epoch)
            continued = done if epoch == first else None
            try:
                with torch_threads(training_threads(self.plan)), self._split_of(continued):
                    result, cpu_share, op_choices = self._train_epoch(epoch, epochs, validate, continued)
                    val_acc = self._validate() if validate else None
            except StepStop as stopped:
                raise self._stopped_in_epoch(epoch, stopped) from None
            stats = self._stats(result, val_acc, cpu_share, op_choices)
            if self.replanner is not None and epoch + 1 < epochs and continued is None:  # a whole epoch's times
                decision = self.replanner.observe(result, self.plan)
                stats.plan_change = decision.reason if decision.switched else None
                if decision.switched:
                    self.use_plan(decision.candidate)
            self.history.append(stats)
            self.log(stats.line(epochs))
            if self.checkpoints is not None:
                self.save(epoch + 1)
            if self.stop is not None and self.stop.requested and epoch + 1 < epochs:
                raise self._stopped(epoch + 1, f"after epoch {epoch + 1}")
        return self.history

    def _stopped_in_epoch(self, epoch: int, stopped: StepStop) -> TrainingStopped:
        """The TrainingStopped for a stop between the steps of `epoch`: with a checkpoint directory, the steps
        applied so far are checkpointed first; without, the epoch is dropped."""
        where = f"during epoch {epoch + 1} after {stopped.steps} of {self.plan.num_batches} steps"
        if self.checkpoints is None or stopped.progress is None:
            return self._stopped(epoch, f"{where} (that epoch is dropped)")
        progress = dataclasses.replace(stopped.progress, skipped=dict(self.guard.skipped))
        self.save(epoch, progress)
        reason = f"stopped by {self.stop.reason or 'request'}" if self.stop is not None else "stopped"
        return TrainingStopped(f"{reason} {where}; the checkpoint in {self.checkpoints.directory} holds epoch "
                               f"{epoch + 1} up to step {progress.steps} of {self.plan.num_batches}: run the same "
                               "command again to resume from it", epoch)

    def _stopped(self, epochs_done: int, where: str) -> TrainingStopped:
        """The TrainingStopped for a stop `where` with `epochs_done` completed: what is kept and how to resume."""
        reason = f"stopped by {self.stop.reason or 'request'} {where}" if self.stop is not None else f"stopped {where}"
        if self.checkpoints is None:
            return TrainingStopped(f"{reason}; nothing was saved (no checkpoint directory was given): a rerun starts "
                                   "over", epochs_done)
        if epochs_done == 0:
            return TrainingStopped(f"{reason}; no epoch was completed, so there is no checkpoint in "
                                   f"{self.checkpoints.directory} yet: a rerun starts over", epochs_done)
        return TrainingStopped(f"{reason}; the checkpoint in {self.checkpoints.directory} holds {epochs_done} "
                               "completed epochs: run the same command again to resume from it", epochs_done)

    def _validate(self) -> float:
        """The validation metric, timed (a stop request uses the time to judge whether an epoch can still end)."""
        start = time.perf_counter()
        value = self.evaluate("val")
        self.validation_s = time.perf_counter() - start
        return value

    def _finishes_in_grace(self, steps: int, left: int, elapsed_s: float, validate: bool) -> bool:
        """After a stop request mid epoch, with `steps` run in `elapsed_s` and `left` to go: can the epoch still be
        trained, validated and checkpointed in time? (Otherwise it is checkpointed where it stands, or dropped.)

        Validation is estimated by its last measured time, or before any by the steps' time per unit scaled to
        the validation units (sampled inference costs less than training per unit); a first exact validation
        cannot be estimated, so the epoch is then dropped.
        """
        if self.checkpoints is None or self.stop is None:
            return False
        validation_s = 0.0
        if validate and self.validation_s is not None:
            validation_s = self.validation_s
        elif validate and self.eval_mode == "full":
            return False
        elif validate:
            units = max(self.task.seeds(self.graph).numel(), 1)
            validation_s = elapsed_s * self.plan.num_batches / max(steps, 1) * (
                self.task.seeds(self.graph, "val").numel() / units)
        estimate = epoch_finish_estimate_s(steps, steps + left, elapsed_s, validation_s)
        return estimate <= self.stop.grace_left_s()

    @contextlib.contextmanager
    def _split_of(self, done: EpochProgress | None) -> Iterator[None]:
        """Runs the block under the route split the stopped epoch `done` was made under: which seeds each route's
        batches hold depends on it (`route_seeds`), so a plan that splits the epoch otherwise (re-planned, --auto)
        continues that epoch under the stopped run's split, with its own buffer sizes, and takes over after it."""
        if done is None or done.n_cpu == self.plan.n_cpu:
            yield
            return
        planned, n_gpu = self.plan, self.plan.num_batches - done.n_cpu
        if n_gpu and self.device.type != "cuda":
            raise ValueError(f"the checkpoint's stopped epoch {done.epoch + 1} puts {n_gpu} batches on Route 1 (GPU "
                             "batching), but this run trains on the CPU: resume it on a GPU machine, or delete the "
                             "checkpoint to start over")
        cbs, gbs = buffer_sizes(done.n_cpu, n_gpu, max(planned.gbs, 1))
        self.log(f"continuing epoch {done.epoch + 1} under the split it was stopped in ({done.n_cpu} of "
                 f"{planned.num_batches} batches on Route 0; the plan now has {planned.n_cpu})")
        kind = "all-cpu" if not n_gpu else "all-gpu" if not done.n_cpu else "adaptive"
        self.use_plan(dataclasses.replace(planned, kind=kind, n_cpu=done.n_cpu, n_gpu=n_gpu, cbs=cbs, gbs=gbs))
        try:
            yield
        finally:
            self.use_plan(planned)

    def _train_epoch(self, epoch: int, epochs: int, validate: bool,
                     done: EpochProgress | None = None) -> tuple[EpochResult, float, dict[str, dict[str, int]]]:
        """One epoch through the executor (with `done`, the rest of a stopped one), with a progress bar; also the
        process's CPU utilisation and op choices."""
        choices_before = choice_counts()
        process = psutil.Process()
        cpu_before = sum(process.cpu_times()[:2])
        wall_before = time.perf_counter()
        first = done.steps if done is not None else 0
        if done is not None:
            self.guard.skipped = Counter(done.skipped)
        with tqdm(total=self.plan.num_batches, initial=first, desc=f"epoch {epoch + 1}/{epochs}", unit="batch",
                  leave=False, disable=not self.progress) as bar:
            steps = first
            finishing = False

            def advance(_: InFlight) -> None:
                nonlocal steps, finishing
                steps += 1
                bar.update(1)
                if self.stop is None or not self.stop.requested or finishing:
                    return
                if not self._finishes_in_grace(steps - first, self.plan.num_batches - steps,
                                               time.perf_counter() - wall_before, validate):
                    raise StepStop(steps)
                finishing = True
                self.log(f"stop requested by {self.stop.reason or 'request'}: finishing epoch {epoch + 1} "
                         f"({self.plan.num_batches - steps} steps left) to checkpoint it within the "
                         f"{self.stop.grace_s:g} s grace period")

            store = getattr(self.graph, "feature_store", None)
            if store is not None:
                store.reset_counters()
            result = self.executor.run_epoch(epoch, on_step=advance, done=done)
            if store is not None:
                result.feature_reads = store.counters()
        wall = time.perf_counter() - wall_before
        cpu_share = (sum(process.cpu_times()[:2]) - cpu_before) / (wall * self.cores) if wall > 0 else 0.0
        return result, cpu_share, choice_counts_since(choices_before)

    def _stats(self, result: EpochResult, val_acc: float | None, cpu_share: float,
               op_choices: dict[str, dict[str, int]]) -> EpochStats:
        return EpochStats(
            epoch=result.epoch, epoch_s=result.epoch_s, batches=result.batches, seeds=result.seeds, loss=result.loss,
            val_acc=val_acc, n_cpu=result.n_cpu, n_gpu=result.n_gpu, cbs=self.plan.cbs, gbs=self.plan.gbs,
            max_cpu_buffer=result.max_cpu_buffer, max_gpu_buffer=result.max_gpu_buffer,
            cpu_idle_s=result.idle_s("cpu"), gpu_idle_s=result.idle_s("gpu"), cpu_utilisation=cpu_share,
            predicted_epoch_s=self.plan.predicted_epoch_s, busy=result.busy, predicted_busy=dict(self.plan.busy),
            op_choices=op_choices, skipped_batches=dict(self.guard.skipped), metric=metric_label(self.task),
        )

    def evaluate(self, split: str = "val", mode: str | None = None) -> float:
        """The task's metric (accuracy for node classification) on the 'train', 'val' or 'test' split: `mode`
        "sampled" (mini-batch inference with the training fanouts) or "full" (exact layer-wise inference); None:
        the trainer's `eval_mode`."""
        mode = self.eval_mode if mode is None else check_eval_mode(mode)
        settings = EvalSettings(self.fanouts, self.eval_batch_size, self.seed, mode, self.progress, self._say_once)
        return self.task.evaluate(self.model, self.graph, self.task.seeds(self.graph, check_split(split)), settings,
                                  device=self.device, graph_block=self.graph_block)

    def graph_block(self) -> GraphBlock:
        """The whole graph as one block, for exact inference; built on first use and kept."""
        if self._graph_block is None:
            self._graph_block = GraphBlock.of(self.graph.indptr, self.graph.indices)
        return self._graph_block

    def meta(self) -> dict[str, Any]:
        """What a checkpoint must agree with to be continued by this trainer."""
        return {**run_meta(self.graph, self.model), **self.task.meta(), "fanouts": list(self.fanouts),
                "batch_size": self.batch_size,
                "seed": self.seed, "num_batches": self.plan.num_batches}

    def save(self, epochs_done: int, partial: EpochProgress | None = None) -> Path:
        """Writes a checkpoint after `epochs_done` completed epochs and, mid epoch, the `partial` next one."""
        assert self.checkpoints is not None
        return self.checkpoints.save(epochs_done, [stats.to_dict() for stats in self.history], self.meta(),
                                     partial.to_dict() if partial is not None else None)

    def _resume(self) -> tuple[int, EpochProgress | None]:
        """Continues from the checkpoint in `checkpoint_dir`, if any; returns the epoch to continue from and, when
        that epoch was stopped between steps, what of it was applied."""
        state = self.checkpoints.load() if self.checkpoints is not None else None
        if state is not None:
            state = self.checkpoints.restore(state, self.meta(), announce=False, mid_epoch=True)
        if state is None:
            return len(self.history), None
        self.history = self.checkpoints.history(state, EpochStats)
        if state.partial_epoch is None:
            self.log(f"resumed from {self.checkpoints.directory} after epoch {state.epoch}")
            return state.epoch, None
        done = EpochProgress.from_checkpoint(state.partial_epoch, self.checkpoints.path, state.epoch,
                                             self.plan.num_batches)
        self.log(f"resumed from {self.checkpoints.directory} in epoch {state.epoch + 1} after step {done.steps} of "
                 f"{self.plan.num_batches}")
        return state.epoch, done

    def close(self) -> None:
        """Stops the batchers' threads."""
        self.executor.close_batchers()

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
