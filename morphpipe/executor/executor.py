"""The Executor: epochs of dual-buffer scheduling (MorphGL Algorithms 1-4) with a plan's CPU:GPU split.

The loop is the one the simulator models (morphpipe/scheduler/model.py), decision for decision,
so a plan's predicted epoch is what this loop should measure:

- filling: while GPU batches remain and the GPU buffer has room, the GPU batcher makes one
  (Route 1, synchronous); the CPU batcher's threads fill the CPU buffer on their own meanwhile;
- blocking: with the GPU buffer full and the CPU buffer neither full nor holding all that is
  left, train the oldest GPU-buffer batch so the GPU does not idle, then refill (footnote 3);
- flushing: with both full, pop each GPU-buffer batch; while this overlap's CPU batches last,
  start one's transfer (DMA on its own stream, with an event) and append it to the GPU buffer;
  then train the popped batch after waiting on its event;
- once Route 1 is done, the rest of Route 0 runs as the naive three-stage pipeline: the next
  transfer overlaps the current training step. An all-CPU plan is only this pipeline
  (SALIENT-like), an all-GPU plan alternates filling and flushing (DUCATI-like). A CPU-only
  plan whose phases take turns on the same cores (`shares_cores`) builds each Route 0 batch
  when it is taken (its batcher builds a turn of batches at once, one per batching thread,
  and nothing between calls), then trains it.

Training is launched at most one step ahead of the training device. `Devices` decides what
launching, transferring and waiting mean (CUDA streams and events, the CPU, virtual devices).
An `on_step` that raises StepStop leaves the epoch after that step; the exception then carries the
epoch's `EpochProgress`, from which `run_epoch(..., done=)` continues it with the batches not applied.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from morphpipe.data.feature_store import FeatureStoreCounters
from morphpipe.executor.cpu_buffer import CpuBuffer, InlineCpuSource
from morphpipe.executor.devices import Devices, InFlight, Launched, Step
from morphpipe.executor.partial_epoch import EpochProgress
from morphpipe.executor.stopping import StepStop
from morphpipe.executor.threads import Stopped, ThreadGroup
from morphpipe.executor.trace import Trace
from morphpipe.partitioner.partitioner import Split
from morphpipe.sampling.batcher import Batcher
from morphpipe.sampling.minibatch import MiniBatch
from morphpipe.scheduler.model import cpu_side_full
from morphpipe.scheduler.result import CPU_ONLY_DEVICES, BlockRecord, TraceRecord, idle_seconds


@dataclass
class EpochResult:
    """One measured epoch: time, training order, loss, trace, blocks, busy fractions, buffer high-water marks."""

    epoch: int
    epoch_s: float
    order: list[tuple[int, int]]  # (route, position) of each batch, in training order
    seeds: int
    loss: float
    trace: list[TraceRecord]
    blocks: list[BlockRecord]
    busy: dict[str, float]
    max_cpu_buffer: int
    max_gpu_buffer: int
    n_cpu: int
    n_gpu: int
    build_s: list[float] = field(default_factory=list)  # per Route 0 batch, one batching thread's build time
    feature_reads: FeatureStoreCounters | None = None  # features on disk: the store's hits and misses this epoch

    @property
    def batches(self) -> int:
        return len(self.order)

    @property
    def batches_per_s(self) -> float:
        return self.batches / self.epoch_s if self.epoch_s > 0 else 0.0

    def idle_s(self, device: str) -> float:
        """Idle seconds of `device` ('cpu' or 'gpu') spent waiting on the other side (the feedback)."""
        return idle_seconds(self.blocks, device)


class Executor:
    """Runs training epochs under `split` (n_cpu, n_gpu, cbs, gbs) on `devices` with `step`."""

    def __init__(self, split: Split, devices: Devices, step: Step, *, cpu_batcher: Batcher | None = None,
                 gpu_batcher: Batcher | None = None, shares_cores: bool = False) -> None:
        for route, name, count, batcher, buffer, buffer_name in (
            (0, "cpu_batcher", split.n_cpu, cpu_batcher, split.cbs, "cbs"),
            (1, "gpu_batcher", split.n_gpu, gpu_batcher, split.gbs, "gbs"),
        ):
            if count and batcher is None:
                raise ValueError(f"the plan puts {count} batches on Route {route}; pass {name}")
            if count and len(batcher) != count:
                raise ValueError(f"{name} makes {len(batcher)} batches per epoch but the plan gives Route {route} "
                                 f"{count}; build it over that route's seeds (route_seeds)")
            if count and buffer < 1:
                raise ValueError(f"{buffer_name} must be >= 1 when Route {route} has batches, got {buffer!r}")
        if shares_cores and split.n_gpu:
            raise ValueError("shares_cores (batching and training take turns on the same cores) is for CPU-only "
                             f"plans, but this plan has {split.n_gpu} Route 1 batches")
        self.split = split
        self.shares_cores = shares_cores
        self.devices = devices
        self.step = step
        self.cpu_batcher = cpu_batcher if split.n_cpu else None
        self.gpu_batcher = gpu_batcher if split.n_gpu else None

    def close_batchers(self) -> None:
        """Stops both routes' batchers (their threads); the executor runs no epoch after this."""
        for batcher in (self.cpu_batcher, self.gpu_batcher):
            if batcher is not None:
                batcher.close()

    def run_epoch(self, epoch: int, on_step: Callable[[InFlight], None] | None = None,
                  done: EpochProgress | None = None) -> EpochResult:
        """Trains one epoch (batchers replay epoch `epoch`); `on_step` is called after each step ends. With `done`
        (a stopped run of this epoch under this split), only the batches it did not apply are trained."""
        group = ThreadGroup(f"executor-epoch{epoch}")
        trace = Trace()
        failure: BaseException | None = None
        loop: _EpochLoop | None = None
        first_cpu, first_gpu = self._first_batches(epoch, done)
        try:
            self.devices.start_epoch(group, trace)
            cpu: CpuBuffer | InlineCpuSource | None = None
            if self.cpu_batcher is not None:
                batches, count = _batches(self.cpu_batcher, epoch, first_cpu), self.split.n_cpu - first_cpu
                cpu = (InlineCpuSource(batches, count, trace, CPU_ONLY_DEVICES[0]) if self.shares_cores
                       else CpuBuffer(batches, self.split.cbs, count, group, trace))
            gpu_batches = _batches(self.gpu_batcher, epoch, first_gpu) if self.gpu_batcher is not None else None
            loop = _EpochLoop(self.split, self.devices, self.step, cpu, gpu_batches, trace, group, on_step, done)
            loop.run()
            epoch_s = trace.now()
            self.devices.finish_epoch()
            loop.check_complete()
        except BaseException as error:
            stopped_at = trace.now()
            group.stopping.set()
            for closer in (self.cpu_batcher, self.gpu_batcher, self.devices):
                if closer is not None:
                    _close_after(closer, error)
            if isinstance(error, StepStop) and loop is not None:  # after the batchers stopped, whatever it raises
                error.progress = loop.progress(epoch, stopped_at)
            if not isinstance(error, Stopped) or group.failure is None:
                raise
            failure = group.failure  # this thread was only told to stop: report why
        finally:
            group.stop_and_join()
        if failure is not None:
            raise failure
        return loop.result(epoch, epoch_s, {**self.devices.lanes, **(cpu.lanes if cpu is not None else {})})

    def _first_batches(self, epoch: int, done: EpochProgress | None) -> tuple[int, int]:
        """Where each route's batches start: 0, or after the ones `done` applied (which must be of this epoch and
        split)."""
        if done is None:
            return 0, 0
        if done.epoch != epoch or done.n_cpu != self.split.n_cpu:
            raise ValueError(f"the stopped epoch is epoch {done.epoch + 1} with {done.n_cpu} Route 0 batches; this "
                             f"executor runs epoch {epoch + 1} with {self.split.n_cpu}: continue it under its split")
        return done.first_batches(self.split.n_cpu + self.split.n_gpu)


def _batches(batcher: Batcher, epoch: int, first: int) -> Iterator[MiniBatch]:
    """Epoch `epoch`'s batches of `batcher` from batch `first` on (a whole epoch: `epoch`, which any batcher has)."""
    return iter(batcher.epoch(epoch) if first == 0 else batcher.epoch_from(epoch, first))


def _close_after(closer: Batcher | Devices, error: BaseException) -> None:
    """Closes `closer` while `error` propagates; a second failure is noted on the first, not raised."""
    try:
        closer.close()
    except Exception as close_error:  # noqa: BLE001 - the original error is the one to report
        note = getattr(error, "add_note", None)
        if note is not None:
            note(f"while stopping {type(closer).__name__}: {close_error!r}")


class _EpochLoop:
    """One epoch of Algorithms 1-4: the two buffers, the routes' progress and the decisions."""

    def __init__(self, split: Split, devices: Devices, step: Step, cpu: CpuBuffer | InlineCpuSource | None,
                 gpu_batches: Iterator[MiniBatch] | None, trace: Trace, group: ThreadGroup,
                 on_step: Callable[[InFlight], None] | None, done: EpochProgress | None = None) -> None:
        self.split = split
        self.devices = devices
        self.step = step
        self.cpu = cpu
        self.gpu_batches = gpu_batches
        self.trace = trace
        self.group = group
        self.on_step = on_step
        self.gpu_buffer: deque[InFlight] = deque()
        first_cpu, first_gpu = done.first_batches(split.n_cpu + split.n_gpu) if done is not None else (0, 0)
        self.gpu_made = first_gpu  # Route 1 batches made (or applied before a stop), and Route 0 ones transferred
        self.transferred = first_cpu
        self.last: Launched | None = None
        self.last_uva_end = 0.0
        self.order: list[tuple[int, int]] = list(done.order) if done is not None else []
        self.losses: list[tuple[torch.Tensor, int]] = []
        # The stopped run's step losses (float32, on the CPU) and seed counts, before this run's.
        self.done_losses = done.losses if done is not None else torch.zeros(0)
        self.done_seeds = list(done.seeds) if done is not None else []
        self.done_s = done.elapsed_s if done is not None else 0.0

    @property
    def gpu_left(self) -> int:
        return self.split.n_gpu - self.gpu_made

    @property
    def cpu_untaken(self) -> int:
        return self.cpu.untaken if self.cpu is not None else 0

    def gpu_has_room(self) -> bool:
        """Filling can go on: GPU batches remain and the GPU buffer is not full."""
        return self.gpu_left > 0 and len(self.gpu_buffer) < self.split.gbs

    def cpu_full(self) -> bool:
        """The CPU side has nothing more to wait for: its buffer is full or holds all that is left."""
        ready = self.cpu.ready() if self.cpu is not None else 0
        return cpu_side_full(self.cpu_untaken, ready, self.split.cbs)

    def run(self) -> None:
        """The executor's loop: filling, blocking and flushing until both routes are trained."""
        while self.gpu_left or self.cpu_untaken or self.gpu_buffer:
            self.group.check()
            if not self.gpu_left and not self.gpu_buffer:
                self.pipeline_cpu_route()  # Route 1 done: dispose of the rest of Route 0
            elif self.gpu_has_room():
                self.gpu_batch()  # filling, or blocking on a full CPU buffer: take a GPU batch
            elif self.cpu_full():
                self.flush()  # flushing: both buffers full
            else:
                self.train(self.gpu_buffer.popleft())  # blocking, footnote 3: train, then refill
        if self.last is not None:
            self.finish(self.last)
        if self.cpu is not None and self.cpu.finished_at is not None:
            self.trace.block(self.cpu.finished_at, self.last_uva_end, "cpu")

    def gpu_batch(self) -> None:
        """Route 1: the GPU batcher makes a batch into the GPU buffer."""
        assert self.gpu_batches is not None
        item = self.devices.gpu_batch(self.gpu_batches, self.split.n_cpu + self.gpu_made)
        self.gpu_made += 1
        self.last_uva_end = self.trace.now()
        self.gpu_buffer.append(item)
        self.trace.level("gpu", len(self.gpu_buffer))

    def flush(self) -> None:
        """Flushing: train the GPU buffer in order while this overlap's CPU batches stream in behind it."""
        overlap = min(self.cpu.ready(), self.split.cbs) if self.cpu is not None else 0
        while self.gpu_buffer:
            item = self.gpu_buffer.popleft()
            if overlap:
                overlap -= 1
                self.gpu_buffer.append(self.transfer(self.cpu.get()))
                self.trace.level("gpu", len(self.gpu_buffer))
            self.train(item)

    def pipeline_cpu_route(self) -> None:
        """Naive three-stage pipeline for the rest of Route 0: the next transfer overlaps this training."""
        item: InFlight | None = self.transfer(self.take_cpu_batch())
        while item is not None:
            self.train(item)
            item = self.transfer(self.take_cpu_batch()) if self.cpu_untaken else None

    def take_cpu_batch(self) -> MiniBatch:
        """Waits for a CPU batch; time the training device spends with nothing to do meanwhile is a GPU-idle block."""
        assert self.cpu is not None
        asked = self.trace.now()
        batch = self.cpu.get()
        now = self.trace.now()
        idle_since = 0.0 if self.last is None else self.last.end
        if idle_since is not None and idle_since <= now:
            self.trace.block(max(asked, idle_since), now, "gpu")
        return batch

    def transfer(self, batch: MiniBatch) -> InFlight:
        """Starts moving a CPU batch to the training device; it is ready when its transfer lands."""
        item = self.devices.transfer(batch, self.transferred)
        self.transferred += 1
        return item

    def train(self, item: InFlight) -> None:
        """Launches a training step, at most one step ahead of the training device."""
        if self.last is not None:
            self.finish(self.last)
        self.last = self.devices.launch(item, self.step)
        self.order.append((item.route, item.position))

    def finish(self, launched: Launched) -> None:
        """Waits for a step to end and books its loss."""
        self.devices.wait(launched)
        assert launched.loss is not None
        self.losses.append((launched.loss, launched.item.batch.num_seeds))
        if self.on_step is not None:
            self.on_step(launched.item)

    def check_complete(self) -> None:
        """Every batch of the epoch was trained exactly once, and Route 1 has nothing left over."""
        n = self.split.n_cpu + self.split.n_gpu
        if sorted(position for _, position in self.order) != list(range(n)):
            raise RuntimeError(f"the epoch trained positions {sorted(p for _, p in self.order)} instead of each of "
                               f"0..{n - 1} once; this is a bug in the executor")
        if self.gpu_batches is not None and next(self.gpu_batches, None) is not None:
            raise RuntimeError(f"the GPU batcher yields more than the plan's {self.split.n_gpu} Route 1 batches; "
                               "build it over the Route 1 seeds of this plan (route_seeds)")

    def progress(self, epoch: int, elapsed_s: float) -> EpochProgress:
        """The steps of this epoch applied so far (with those of a run it continues), after a step ended."""
        if len(self.losses) + len(self.done_seeds) != len(self.order):
            raise RuntimeError(f"{len(self.order)} steps launched but {len(self.losses) + len(self.done_seeds)} "
                               "ended: an epoch stops only between steps; this is a bug in the executor")
        return EpochProgress(epoch, self.split.n_cpu, list(self.order), self.step_losses(),
                             self.done_seeds + [count for _, count in self.losses], self.done_s + elapsed_s)

    def step_losses(self) -> torch.Tensor:
        """Every applied step's loss in training order, float32 on the CPU (NaN: skipped for non-finite values)."""
        losses = torch.stack([loss.float() for loss, _ in self.losses]).cpu() if self.losses else torch.zeros(0)
        return torch.cat([self.done_losses, losses])

    def result(self, epoch: int, epoch_s: float, lanes: dict[str, int]) -> EpochResult:
        """The measured epoch (a continued one: its time includes the stopped run's; the trace is this run's)."""
        counts = self.done_seeds + [count for _, count in self.losses]
        seeds = sum(counts)
        losses = self.step_losses()
        weights = torch.tensor(counts, dtype=torch.float32)
        trained = torch.isfinite(losses)  # a step skipped for non-finite values returns a NaN loss
        loss = float((losses[trained] * weights[trained]).sum() / max(float(weights[trained].sum()), 1.0))
        return EpochResult(
            epoch=epoch, epoch_s=self.done_s + epoch_s, order=self.order, seeds=seeds, loss=loss,
            trace=sorted(self.trace.records, key=lambda r: (r.start, r.end, r.device, r.lane)),
            blocks=sorted(self.trace.blocks, key=lambda b: (b.start, b.end, b.idle)),
            busy=self.trace.busy(epoch_s, lanes), max_cpu_buffer=self.trace.max_level["cpu"],
            max_gpu_buffer=self.trace.max_level["gpu"], n_cpu=self.split.n_cpu, n_gpu=self.split.n_gpu,
            build_s=list(self.trace.build_seconds),
        )
