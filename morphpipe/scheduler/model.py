"""SimPy model of the dual-buffer executor (DESIGN.md, "Dual-buffer scheduling" and "Simulator").

Devices: P CPU batching threads, the PCIe link and the GPU. The PCIe link and the GPU are
SimPy resources (one phase at a time); UVA batching (Route 1) holds both. The CPU buffer is a
bounded store the batching threads put into; the GPU buffer is the executor's own queue of at
most gbs batches. The executor's loop is the paper's:

- filling: while the GPU buffer has room, make a GPU (UVA) batch; the CPU threads keep
  putting batches into the CPU buffer on their own;
- blocking: with the CPU buffer full, keep making GPU batches (the CPU threads wait); with the
  GPU buffer full and the CPU buffer not, train a GPU batch so the GPU does not idle
  (footnote 3), then refill;
- flushing: with both full, pop each GPU-buffer batch and, while this overlap's CPU batches
  last, start one's DMA and append it to the GPU buffer, then train the popped batch; the CPU
  threads meanwhile prepare the next overlap's batches;
- once the GPU route is done, the rest of the CPU route runs as the naive three-stage
  pipeline (an all-CPU plan is exactly SALIENT's pipeline; an all-GPU plan alternates UVA
  batching and training, DUCATI's).

Timing semantics of the real executor: UVA batching is synchronous (the sampler needs sizes
back on the host); DMA is asynchronous on its own stream; a training step is launched
asynchronously on the compute stream, waits there for its batch's transfer, and the executor
runs at most one step ahead of the GPU. The compute stream is FIFO, so a training step takes
the GPU in launch order even while it still waits for its transfer.

Features on disk: the disk is one more resource (one queue: the store keeps its reads in flight
at the depth its rate was measured at, so batches' misses are served one batch after another).
A Route-0 batching thread first holds the disk for its batch's cache misses, then builds the
batch. A Route-1 batch, too, first waits for and holds the disk for its misses (`Durations.gpu_disk`: the rows its
GPU cache lacks, read through the host's feature store), then does its UVA batching; the executor waits throughout
(the GPU batcher is synchronous) while the GPU and PCIe link stay free for work already launched. Both routes'
reads share the one disk queue, served in request order; at a tie a thread's claim goes first (the executor takes
one more turn of the clock before it asks). With no misses (`Durations.disk` and `gpu_disk` empty) the disk is not
modelled at all.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

import simpy

from morphpipe.partitioner.partitioner import Split
from morphpipe.partitioner.times import PhaseTimes
from morphpipe.scheduler.durations import Durations
from morphpipe.scheduler.result import CPU_ONLY_DEVICES, Recorder, SimulationResult

Process = Generator[simpy.Event, Any, Any]


def devices_of(durations: Durations, devices: dict[str, int]) -> dict[str, int]:
    """The lanes per device of a model, with the disk when batches read cache misses from it."""
    return {**devices, "disk": 1} if durations.disk or durations.gpu_disk else devices


def read_misses(env: simpy.Environment, disk: simpy.Resource, rec: Recorder, seconds: float, index: int,
                route: int = 0) -> Process:
    """A `route` batch's cache misses: wait for the disk, hold it for `seconds`."""
    with disk.request() as request:
        yield request
        start = env.now
        yield env.timeout(seconds)
        rec.phase(index, route, "read", "disk", 0, start, env.now)


def cpu_side_full(untaken: int, ready: int, cbs: int) -> bool:
    """Filling stops waiting on the CPU side: no CPU batch is left, or its buffer is full or holds all that is left."""
    return untaken == 0 or ready >= cbs or ready == untaken


@dataclass
class _Batch:
    """A batch in (or on its way to) GPU memory; `ready` fires once it is there."""

    index: int
    route: int
    ready: simpy.Event


class DualBufferModel:
    """One epoch of dual-buffer scheduling on CPU threads, PCIe and GPU."""

    def __init__(self, times: PhaseTimes, split: Split, durations: Durations, record_trace: bool = False) -> None:
        self.env = simpy.Environment()
        self.split = split
        self.d = durations
        self.threads = times.cpu_threads
        self.gpu = simpy.Resource(self.env, capacity=1)
        self.pcie = simpy.Resource(self.env, capacity=1)
        self.disk = simpy.Resource(self.env, capacity=1)
        self.cpu_buffer = simpy.Store(self.env, capacity=max(1, split.cbs))
        self.gpu_buffer: deque[_Batch] = deque()
        self.rec = Recorder(record_trace, devices_of(durations, {"cpu": self.threads, "pcie": 1, "gpu": 1}))
        self.cpu_claimed = 0
        self.cpu_taken = 0
        self.gpu_made = 0
        self.transfers = 0
        self.launched = 0
        self.in_gpu_memory = self.env.event().succeed()
        self.last_train: simpy.Event = self.env.event().succeed()
        self.last_train_end = 0.0
        self.last_uva_end = 0.0
        self.worker_done_at: list[float] = []

    @property
    def gpu_left(self) -> int:
        return self.split.n_gpu - self.gpu_made

    @property
    def cpu_untaken(self) -> int:
        return self.split.n_cpu - self.cpu_taken

    def gpu_has_room(self) -> bool:
        """Filling can go on: GPU batches remain and the GPU buffer is not full."""
        return self.gpu_left > 0 and len(self.gpu_buffer) < self.split.gbs

    def cpu_full(self) -> bool:
        """The CPU side has nothing more to wait for: its buffer is full or holds all that is left."""
        return cpu_side_full(self.cpu_untaken, len(self.cpu_buffer.items), self.split.cbs)

    def run(self) -> SimulationResult:
        """Simulates the epoch and returns its result."""
        for worker in range(self.threads):
            self.env.process(self.cpu_worker(worker))
        self.env.run(until=self.env.process(self.executor()))
        for done in self.worker_done_at:
            self.rec.block(done, self.last_uva_end, "cpu", 1.0 / self.threads)
        return self.rec.result(self.env.now, "simpy", n_cpu=self.split.n_cpu, n_gpu=self.split.n_gpu,
                               cbs=self.split.cbs, gbs=self.split.gbs, cpu_threads=self.threads)

    def cpu_worker(self, worker: int) -> Process:
        """A CPU batching thread: claim the next Route-0 batch, read its misses, build it, put it in the CPU buffer."""
        while self.cpu_claimed < self.split.n_cpu:
            index = self.cpu_claimed
            self.cpu_claimed += 1
            if self.d.disk:
                yield from read_misses(self.env, self.disk, self.rec, self.d.disk[index], index)
            start = self.env.now
            yield self.env.timeout(self.d.cpu_batch[index])
            self.rec.phase(index, 0, "batch", "cpu", worker, start, self.env.now)
            finished = self.env.now
            yield self.cpu_buffer.put(index)
            self.rec.block(finished, self.env.now, "cpu", 1.0 / self.threads)
            self.rec.cpu_buffer(len(self.cpu_buffer.items))
        self.worker_done_at.append(self.env.now)

    def executor(self) -> Process:
        """The executor's loop: filling, blocking and flushing until both routes are trained."""
        while self.gpu_left or self.cpu_untaken or self.gpu_buffer:
            yield self.env.timeout(0)  # batches finishing right now reach the CPU buffer before we look
            if not self.gpu_left and not self.gpu_buffer:
                yield from self.pipeline_cpu_route()  # GPU route done: dispose of the CPU route
            elif self.gpu_has_room():
                yield from self.gpu_batch()  # filling, or blocking on a full CPU buffer: take a GPU batch
            elif self.cpu_full():
                yield from self.flush()  # flushing: both buffers full
            else:
                yield from self.train(self.gpu_buffer.popleft())  # blocking, footnote 3: train, then refill
        yield self.last_train

    def gpu_batch(self) -> Process:
        """Route 1: its misses hold the disk, then UVA batching holds the GPU and the PCIe link together; the batch
        joins the GPU buffer."""
        number = self.gpu_made
        self.gpu_made += 1
        index = self.split.n_cpu + number
        if self.d.gpu_disk:
            yield self.env.timeout(0)  # a thread claiming its batch at this instant asks for the disk first
            yield from read_misses(self.env, self.disk, self.rec, self.d.gpu_disk[number], index, 1)
        with self.gpu.request() as gpu:
            yield gpu
            with self.pcie.request() as link:
                yield link
                start = self.env.now
                yield self.env.timeout(self.d.gpu_batch[number])
                self.rec.phase(index, 1, "uva", "gpu", 0, start, self.env.now)
                self.rec.phase(index, 1, "uva", "pcie", 0, start, self.env.now)
        self.last_uva_end = self.env.now
        self.gpu_buffer.append(_Batch(index, 1, self.in_gpu_memory))
        self.rec.gpu_buffer(len(self.gpu_buffer))

    def flush(self) -> Process:
        """Flushing: train the GPU buffer in order while this overlap's CPU batches stream in behind it."""
        overlap = min(len(self.cpu_buffer.items), self.split.cbs)
        while self.gpu_buffer:
            batch = self.gpu_buffer.popleft()
            if overlap:
                overlap -= 1
                self.gpu_buffer.append(self.transfer((yield self.cpu_buffer.get())))
                self.rec.gpu_buffer(len(self.gpu_buffer))
            yield from self.train(batch)

    def pipeline_cpu_route(self) -> Process:
        """Naive three-stage pipeline for the rest of Route 0: the next DMA overlaps this training."""
        batch = self.transfer((yield from self.take_cpu_batch()))
        while batch is not None:
            yield from self.train(batch)
            batch = self.transfer((yield from self.take_cpu_batch())) if self.cpu_untaken else None

    def take_cpu_batch(self) -> Process:
        """Waits for a CPU batch; time the GPU spends with nothing to do meanwhile is a GPU-idle block."""
        asked = self.env.now
        index = yield self.cpu_buffer.get()
        if self.last_train.processed:
            self.rec.block(max(asked, self.last_train_end), self.env.now, "gpu")
        return index

    def transfer(self, index: int) -> _Batch:
        """Starts the DMA of a CPU batch on the copy stream; the batch is ready when it lands."""
        self.cpu_taken += 1
        number = self.transfers
        self.transfers += 1
        return _Batch(index, 0, self.env.process(self.dma(index, number)))

    def dma(self, index: int, number: int) -> Process:
        with self.pcie.request() as link:
            yield link
            start = self.env.now
            yield self.env.timeout(self.d.dma[number])
            self.rec.phase(index, 0, "dma", "pcie", 0, start, self.env.now)

    def train(self, batch: _Batch) -> Process:
        """Launches a training step on the compute stream, at most one step ahead of the GPU."""
        yield self.last_train
        number = self.launched
        self.launched += 1
        self.last_train = self.env.process(self.training_step(batch, number))

    def training_step(self, batch: _Batch, number: int) -> Process:
        with self.gpu.request() as gpu:
            yield gpu
            yield batch.ready
            start = self.env.now
            yield self.env.timeout(self.d.train[number])
            self.rec.phase(batch.index, batch.route, "train", "gpu", 0, start, self.env.now)
        self.last_train_end = self.env.now


class CpuOnlyModel:
    """One epoch on a CPU-only machine: P batching threads feed a CPU buffer, Q threads train.

    With shared cores the two phases take turns: every P batches all P threads build the next P batches at once,
    one each, then every core trains them one after another.
    """

    def __init__(self, times: PhaseTimes, cbs: int, durations: Durations, shared_core: bool = False,
                 record_trace: bool = False) -> None:
        self.env = simpy.Environment()
        self.times = times
        self.cbs = cbs
        self.d = durations
        self.shared_core = shared_core
        self.threads = times.cpu_threads
        self.buffer = simpy.Store(self.env, capacity=cbs)
        self.disk = simpy.Resource(self.env, capacity=1)
        self.rec = Recorder(record_trace, devices_of(durations, {CPU_ONLY_DEVICES[0]: self.threads,
                                                                 CPU_ONLY_DEVICES[1]: 1}))
        self.claimed = 0

    def run(self) -> SimulationResult:
        """Simulates the epoch and returns its result."""
        if not self.shared_core:
            for worker in range(self.threads):
                self.env.process(self.cpu_worker(worker))
        self.env.run(until=self.env.process(self.trainer()))
        return self.rec.result(self.env.now, "simpy", n_cpu=self.times.num_batches, n_gpu=0, cbs=self.cbs,
                               gbs=0, cpu_threads=self.threads)

    def cpu_worker(self, worker: int) -> Process:
        """A batching thread: claim, read the misses, build, put into the CPU buffer (waiting while it is full)."""
        while self.claimed < self.times.num_batches:
            index = self.claimed
            self.claimed += 1
            if self.d.disk:
                yield from read_misses(self.env, self.disk, self.rec, self.d.disk[index], index)
            start = self.env.now
            yield self.env.timeout(self.d.cpu_batch[index])
            self.rec.phase(index, 0, "batch", CPU_ONLY_DEVICES[0], worker, start, self.env.now)
            finished = self.env.now
            yield self.buffer.put(index)
            self.rec.block(finished, self.env.now, CPU_ONLY_DEVICES[0], 1.0 / self.threads)
            self.rec.cpu_buffer(len(self.buffer.items))

    def batching_turn(self, first: int) -> Process:
        """On shared cores, a turn of batching: the misses of batches `first` .. `first` + P - 1 (fewer at the
        epoch's end) read one after another, then the batches built at once, one per thread; the turn ends with the
        slowest."""
        turn = range(first, min(self.times.num_batches, first + self.threads))
        if self.d.disk:
            for index in turn:
                yield from read_misses(self.env, self.disk, self.rec, self.d.disk[index], index)
        start = self.env.now
        for lane, index in enumerate(turn):
            self.rec.phase(index, 0, "batch", CPU_ONLY_DEVICES[0], lane, start, start + self.d.cpu_batch[index])
        yield self.env.timeout(max(self.d.cpu_batch[index] for index in turn))

    def trainer(self) -> Process:
        """The training loop: take the next batch (or, on shared cores, build the next turn's batches every P
        batches), train on it."""
        for number in range(self.times.num_batches):
            if self.shared_core:
                if number % self.threads == 0:
                    yield from self.batching_turn(number)
                index = number
            else:
                asked = self.env.now
                index = yield self.buffer.get()
                self.rec.block(asked, self.env.now, CPU_ONLY_DEVICES[1])
            start = self.env.now
            yield self.env.timeout(self.d.train[number])
            self.rec.phase(index, 0, "train", CPU_ONLY_DEVICES[1], 0, start, self.env.now)

