"""Data-parallel training on torch.distributed: one rank's Executor under its own plan, gradients all-reduced by DDP.

Each rank runs the ordinary dual-buffer Executor over its share of every global step
(`SeedSplit`), with a training step whose loss is normalised by the global step's seed count:
rank r's mean loss over its n_r seeds is scaled by n_r * world / N_k, and DDP averages the
gradients over the world, so the applied gradient is the gradient of the mean loss over the
union of the ranks' step-k batches, exactly as one process training that union would get.
After each epoch the ranks check, all-reduced, that every training seed was trained once;
evaluation is split across ranks with the counts all-reduced; rank 0 writes the checkpoint
(atomically) and every rank resumes from what rank 0 reads and broadcasts. Dropout masks are
seeded per (epoch, rank), so a resumed run draws what an uninterrupted one does.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from morphpipe.data import GraphStore
from morphpipe.distributed.batcher import RankBatcher
from morphpipe.distributed.split import SeedSplit, apportion, check_exactly_once
from morphpipe.executor.checkpoint import Checkpointing, TrainingState, run_meta
from morphpipe.executor.devices import default_devices
from morphpipe.executor.executor import Executor
from morphpipe.executor.trainer import (GpuBatcherFactory, metric_label, torch_threads, training_device,
                                       training_threads)
from morphpipe.nn.finite_guard import FiniteGuard, skipped_text
from morphpipe.nn.task import EvalSettings, NodeClassification, Task, check_split
from morphpipe.nn.train_step import TrainStep
from morphpipe.sampling.epochs import epoch_seed
from morphpipe.sampling.minibatch import MiniBatch
from morphpipe.sampling.validation import check_fanouts, check_positive
from morphpipe.scheduler.plan import Plan


class DistributedStep(TrainStep):
    """TrainStep with the loss normalised by the global step's seeds before backward (DDP all-reduces).

    A rank whose labels are out of range or whose loss is not finite makes its loss NaN before
    backward, so the all-reduced gradients are NaN on every rank and the guard's check, made on
    those gradients, stops or skips the step on all ranks alike, with no extra collective.
    """

    after_all_reduce = True

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, task: Task, split: SeedSplit, n_cpu: int,
                 guard: FiniteGuard | None = None) -> None:
        super().__init__(model, optimizer, task, guard)
        self.rank = dist.get_rank()
        self.split = split
        self.n_cpu = n_cpu
        self.trained: list[torch.Tensor] = []

    def step_of(self, batch: MiniBatch) -> int:
        """The global step a batch belongs to: Route 0 holds steps 0..n_cpu-1, Route 1 the rest."""
        return batch.batch_index + (self.n_cpu if batch.route == 1 else 0)

    def backward(self, batch: MiniBatch, loss: torch.Tensor, labels_ok: torch.Tensor) -> None:
        scale = batch.num_seeds * self.split.world_size / self.split.step_total(self.step_of(batch))
        poison = torch.where(labels_ok & torch.isfinite(loss), 1.0, float("nan"))
        (loss * (scale * poison)).backward()
        self.trained.append(batch.units.detach().to("cpu"))

    def place(self, batch: MiniBatch) -> str:
        return f"step {self.step_of(batch) + 1} on rank {self.rank}"


@dataclass
class DistEpochStats:
    """One epoch over all ranks: the slowest rank's time, every rank's, seeds, mean loss, validation accuracy."""

    epoch: int
    epoch_s: float
    rank_epoch_s: list[float]
    seeds: int
    loss: float
    val_acc: float | None
    predicted_epoch_s: float
    skipped_batches: dict[str, int] = field(default_factory=dict)  # steps left out on every rank, by this rank's reason
    metric: str = "acc"  # what val_acc measures (the task's metric)

    def line(self, epochs: int) -> str:
        ranks = "/".join(f"{s:.2f}" for s in self.rank_epoch_s)
        acc = f", val {self.metric} {self.val_acc:.4f}" if self.val_acc is not None else ""
        if self.skipped_batches:
            acc += f", {skipped_text(self.skipped_batches)}"
        return (f"epoch {self.epoch + 1}/{epochs}: {self.epoch_s:.2f} s (ranks {ranks} s), "
                f"{self.seeds / self.epoch_s:,.0f} seeds/s, loss {self.loss:.4f}{acc}; predicted "
                f"{self.predicted_epoch_s:.2f} s ({self.epoch_s / self.predicted_epoch_s - 1:+.0%})")


class DistributedTrainer:
    """Trains `model` data-parallel on this rank's share of each step under this rank's `plan`.

    The process group must be initialised. `predicted_epoch_s` is the cluster's prediction (the
    slowest rank's plan). `task` is what is trained (default: node classification with `loss_fn`, a
    mean-reducing `(logits, labels) -> loss`, cross entropy unless given). `on_nonfinite`
    ("stop" or "skip-batch") is what every rank does at a step with out-of-range labels or a
    non-finite loss or gradient on any rank (`DistributedStep`).
    """

    def __init__(self, graph: GraphStore, model: nn.Module, plan: Plan, split: SeedSplit, *, fanouts: Sequence[int],
                 predicted_epoch_s: float, optimizer: torch.optim.Optimizer | None = None,
                 loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None, lr: float = 3e-3,
                 device: str | torch.device | None = None, seed: int = 0,
                 gpu_batcher: GpuBatcherFactory | None = None, checkpoint_dir: str | os.PathLike | None = None,
                 eval_batch_size: int = 4096, log: Callable[[str], None] | None = None,
                 on_nonfinite: str = "stop", task: Task | None = None) -> None:
        if task is not None and loss_fn is not None:
            raise ValueError("give either task= (whose loss trains) or loss_fn= (for node classification), not both")
        self.task = task or NodeClassification(loss_fn)
        self.task.check_graph(graph)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        if split.world_size != self.world:
            raise ValueError(f"the split is for {split.world_size} ranks, the process group has {self.world}")
        if plan.num_batches != split.steps:
            raise ValueError(f"rank {self.rank}'s plan has {plan.num_batches} batches, the split {split.steps} steps; "
                             "plan the rank for its local batch (morphpipe.distributed.cluster.rank_plan)")
        self.graph = graph
        self.plan = plan
        self.split = split
        self.fanouts = check_fanouts(fanouts)
        self.eval_batch_size = check_positive("eval_batch_size", eval_batch_size)
        self.predicted_epoch_s = predicted_epoch_s
        self.seed = int(seed)
        self.device = training_device(plan, device)
        self.module = model.to(self.device)
        # A model whose batches may leave parameters without a gradient (typed models) has DDP look for them.
        self.model = DistributedDataParallel(
            self.module, find_unused_parameters=bool(getattr(self.module, "leaves_parameters_unused", False)))
        self.optimizer = optimizer or torch.optim.Adam(self.model.parameters(), lr=lr)
        self.step = DistributedStep(self.model, self.optimizer, self.task, split, plan.n_cpu, FiniteGuard(on_nonfinite))
        self.log = log or print
        self.checkpoints = (Checkpointing(checkpoint_dir, self.module, self.optimizer, log=self.log)
                            if checkpoint_dir is not None else None)
        self.history: list[DistEpochStats] = []
        train_units = self.task.seeds(graph)
        self.train_sorted = torch.sort(train_units).values
        local = split.local_batches[self.rank]
        cpu_route = gpu_route = None
        if plan.n_cpu:
            inner = self.task.batcher(graph, self.fanouts, local, route=0, shuffle=False, seed=self._sampling_seed(),
                                      serial=plan.shares_cores, num_threads=plan.cpu_threads,
                                      pin_memory=self.device.type == "cuda")
            cpu_route = RankBatcher(inner, split, self.rank, train_units, self.seed, 0, plan.n_cpu)
        if plan.n_gpu:
            if gpu_batcher is not None:
                inner = gpu_batcher(graph, self.fanouts, local, shuffle=False, seed=self._sampling_seed())
            else:
                inner = self.task.batcher(graph, self.fanouts, local, route=1, shuffle=False,
                                          seed=self._sampling_seed(), device=self.device)
            gpu_route = RankBatcher(inner, split, self.rank, train_units, self.seed, plan.n_cpu, plan.n_gpu)
        self.executor = Executor(plan.split, default_devices(self.device), self.step, cpu_batcher=cpu_route,
                                 gpu_batcher=gpu_route, shares_cores=plan.shares_cores)

    def _sampling_seed(self) -> int:
        """Each rank samples neighbours from its own stream."""
        return epoch_seed(self.seed, self.rank)

    def fit(self, epochs: int, *, validate: bool = True) -> list[DistEpochStats]:
        """Trains until `epochs` epochs are done (continuing from a checkpoint); every epoch's stats."""
        check_positive("epochs", epochs)
        first = self._resume()
        train_threads = training_threads(self.plan)
        for epoch in range(first, epochs):
            torch.manual_seed(epoch_seed(epoch_seed(self.seed, epoch), self.rank))
            self.step.trained = []
            self.step.guard.start_epoch(epoch)
            with torch_threads(train_threads):
                result = self.executor.run_epoch(epoch)
                self._check_exactly_once(epoch)
                val_acc = self.evaluate("val") if validate else None
            times = torch.zeros(self.world, dtype=torch.float64)
            times[self.rank] = result.epoch_s
            totals = torch.tensor([result.loss * result.seeds, result.seeds], dtype=torch.float64)
            dist.all_reduce(times)
            dist.all_reduce(totals)
            stats = DistEpochStats(epoch, float(times.max()), times.tolist(), int(totals[1]),
                                   float(totals[0] / totals[1]), val_acc, self.predicted_epoch_s,
                                   dict(self.step.guard.skipped), metric_label(self.task))
            self.history.append(stats)
            if self.rank == 0:
                self.log(stats.line(epochs))
            if self.checkpoints is not None:
                self.save(epoch + 1)
        return self.history

    def _check_exactly_once(self, epoch: int) -> None:
        """All-reduces how often each training seed was trained this epoch and checks it is once each."""
        trained = torch.cat(self.step.trained) if self.step.trained else torch.zeros(0, dtype=torch.long)
        positions = torch.searchsorted(self.train_sorted, trained).clamp_(max=self.train_sorted.numel() - 1)
        if not bool((self.train_sorted[positions] == trained).all()):
            raise RuntimeError(f"epoch {epoch + 1}: rank {self.rank} trained seeds outside the training split")
        counts = torch.bincount(positions, minlength=self.train_sorted.numel()).to(torch.int32)
        dist.all_reduce(counts)
        check_exactly_once(counts, epoch)

    def evaluate(self, split: str = "val") -> float:
        """The task's metric on a split: each rank measures its share of the units (by local batch), the
        count-weighted mean all-reduced (exact for per-unit means: accuracy, MRR, Hits@K)."""
        seeds = self.task.seeds(self.graph, check_split(split))
        if seeds.numel() < self.world:
            raise ValueError(f"the {split} split has {seeds.numel()} seeds, fewer than the {self.world} ranks")
        shares = apportion(seeds.numel(), self.split.local_batches)
        start = sum(shares[:self.rank])
        mine = seeds[start:start + shares[self.rank]]
        settings = EvalSettings(self.fanouts, self.eval_batch_size, self.seed, "sampled", progress=False)
        share = self.task.evaluate(self.module, self.graph, mine, settings, device=self.device)
        counts = torch.tensor([share * mine.numel(), mine.numel()], dtype=torch.float64)
        dist.all_reduce(counts)
        return float(counts[0] / counts[1])

    def meta(self) -> dict[str, Any]:
        """What a checkpoint must agree with to be continued by this run."""
        return {**run_meta(self.graph, self.module), **self.task.meta(), "fanouts": list(self.fanouts),
                "batch_size": self.split.global_batch, "seed": self.seed, "world_size": self.world,
                "local_batches": list(self.split.local_batches)}

    def save(self, epochs_done: int) -> None:
        """Rank 0 writes the checkpoint (atomically); every rank waits until it is on disk."""
        if self.rank == 0:
            assert self.checkpoints is not None
            self.checkpoints.save(epochs_done, [asdict(stats) for stats in self.history], self.meta())
        dist.barrier()

    def _resume(self) -> int:
        """Rank 0 reads the checkpoint and broadcasts it; every rank loads it; returns the epoch to continue from."""
        if self.checkpoints is None:
            return len(self.history)
        box: list[TrainingState | None] = [self.checkpoints.load() if self.rank == 0 else None]
        dist.broadcast_object_list(box, src=0)
        # The RNG states stay as they are: dropout masks are seeded per (epoch, rank) in `fit`.
        state = self.checkpoints.restore(box[0], self.meta(), rng=False, announce=self.rank == 0)
        if state is None:
            return len(self.history)
        self.history = self.checkpoints.history(state, DistEpochStats)
        return state.epoch

    def close(self) -> None:
        """Stops the batchers' threads."""
        self.executor.close_batchers()

    def __enter__(self) -> DistributedTrainer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
