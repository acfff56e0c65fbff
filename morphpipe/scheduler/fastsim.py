"""The fast twin of the SimPy model: the same executor, computed with plain arithmetic.

The planner evaluates many splits of epochs with thousands of batches; SimPy's event
machinery costs tens of microseconds per phase. Here the executor's loop (model.py) is
replayed as straight-line code: the GPU and the PCIe link are "free at" times, training is
launched at most one step ahead, and the CPU batching threads are advanced lazily up to the
executor's clock whenever it looks at the CPU buffer. Batches finishing at the very moment
the executor looks are visible to it, as in the SimPy model (which yields once before each
decision). The disk (features on disk) serves the batches' cache misses in claim order, each
read starting when its thread claims the batch and the disk is free; a Route-1 batch's read joins the same queue
when the executor asks for it, after every claim made until then (ties included). tests/scheduler/test_engines.py
checks that both give the same epochs, busy fractions, blocks and buffer levels.
"""
from __future__ import annotations

import heapq
from collections import deque

from morphpipe.partitioner.partitioner import Split
from morphpipe.partitioner.times import PhaseTimes
from morphpipe.scheduler.durations import Durations
from morphpipe.scheduler.model import cpu_side_full, devices_of
from morphpipe.scheduler.result import CPU_ONLY_DEVICES, Recorder, SimulationResult


class _CpuWorkers:
    """P batching threads filling a bounded CPU buffer, advanced on demand to a given time."""

    def __init__(self, latencies: list[float], count: int, threads: int, capacity: int, device: str,
                 rec: Recorder, reads: list[float]) -> None:
        self.latencies = latencies
        self.reads = reads
        self.disk_free = 0.0
        self.count = count
        self.threads = threads
        self.capacity = capacity
        self.device = device
        self.rec = rec
        self.claimed = 0
        self.order = 0
        self.running: list[tuple[float, int, int, int, float]] = []
        self.buffer: deque[int] = deque()
        self.blocked: deque[tuple[int, int, float]] = deque()
        self.done_at: list[float] = []
        for worker in range(threads):
            self._claim(worker, 0.0)

    def _claim(self, worker: int, now: float) -> None:
        if self.claimed < self.count:
            index = self.claimed
            self.claimed += 1
            if self.reads:
                start = max(now, self.disk_free)
                self.disk_free = now = start + self.reads[index]
                self.rec.phase(index, 0, "read", "disk", 0, start, now)
            heapq.heappush(self.running, (now + self.latencies[index], self.order, worker, index, now))
            self.order += 1
        else:
            self.done_at.append(now)

    def _finish(self, end: float, worker: int, index: int, start: float) -> None:
        self.rec.phase(index, 0, "batch", self.device, worker, start, end)
        if len(self.buffer) < self.capacity:
            self.buffer.append(index)
            self.rec.cpu_buffer(len(self.buffer))
            self._claim(worker, end)
        else:
            self.blocked.append((worker, index, end))

    def advance(self, now: float) -> None:
        """Lets every batch finishing at or before `now` reach the buffer (or block its thread)."""
        running = self.running
        while running and running[0][0] <= now:
            end, _, worker, index, start = heapq.heappop(running)
            self._finish(end, worker, index, start)

    def wait(self, now: float) -> float:
        """The earliest time >= `now` at which the buffer holds a batch."""
        self.advance(now)
        while not self.buffer:
            now = self.running[0][0]
            self.advance(now)
        return now

    def pop(self, now: float) -> int:
        """Takes the oldest batch; a thread waiting on the full buffer hands its batch over now."""
        index = self.buffer.popleft()
        if self.blocked:
            worker, waiting, since = self.blocked.popleft()
            self.rec.block(since, now, self.device, 1.0 / self.threads)
            self.buffer.append(waiting)
            self.rec.cpu_buffer(len(self.buffer))
            self._claim(worker, now)
        return index


class FastDualBuffer:
    """The dual-buffer executor of model.DualBufferModel, as straight-line arithmetic."""

    def __init__(self, times: PhaseTimes, split: Split, durations: Durations, record_trace: bool = False) -> None:
        self.split = split
        self.d = durations
        self.threads = times.cpu_threads
        self.rec = Recorder(record_trace, devices_of(durations, {"cpu": self.threads, "pcie": 1, "gpu": 1}))
        self.cpu = _CpuWorkers(durations.cpu_batch, split.n_cpu, self.threads, max(1, split.cbs), "cpu", self.rec,
                               durations.disk)
        self.gpu_buffer: deque[tuple[int, int, float]] = deque()
        self.now = 0.0
        self.gpu_free = 0.0
        self.pcie_free = 0.0
        self.last_train_end = 0.0
        self.last_uva_end = 0.0
        self.cpu_taken = 0
        self.gpu_made = 0
        self.transfers = 0
        self.launched = 0

    def run(self) -> SimulationResult:
        """Simulates the epoch and returns its result."""
        split = self.split
        while self.gpu_made < split.n_gpu or self.cpu_taken < split.n_cpu or self.gpu_buffer:
            self.cpu.advance(self.now)  # batches finishing right now are in the buffer when we look
            gpu_left = split.n_gpu - self.gpu_made
            if not gpu_left and not self.gpu_buffer:
                self.pipeline_cpu_route()
            elif gpu_left and len(self.gpu_buffer) < split.gbs:
                self.gpu_batch()
            elif self.cpu_full():
                self.flush()
            else:
                self.train(self.gpu_buffer.popleft())
        epoch = max(self.now, self.last_train_end)
        for done in self.cpu.done_at:
            self.rec.block(done, self.last_uva_end, "cpu", 1.0 / self.threads)
        return self.rec.result(epoch, "fast", n_cpu=split.n_cpu, n_gpu=split.n_gpu, cbs=split.cbs,
                               gbs=split.gbs, cpu_threads=self.threads)

    def cpu_full(self) -> bool:
        """As DualBufferModel.cpu_full: the CPU buffer is full or holds all the CPU batches left."""
        return cpu_side_full(self.split.n_cpu - self.cpu_taken, len(self.cpu.buffer), self.split.cbs)

    def gpu_batch(self) -> None:
        """Route 1: its misses wait for the disk (behind every claim made until now), then UVA batching starts when
        both the GPU and the PCIe link are free; the executor waits for both."""
        number = self.gpu_made
        self.gpu_made += 1
        index = self.split.n_cpu + number
        if self.d.gpu_disk:  # the loop advanced the CPU threads to now: every claim until now holds its place
            start = max(self.now, self.cpu.disk_free)
            self.cpu.disk_free = self.now = start + self.d.gpu_disk[number]
            self.rec.phase(index, 1, "read", "disk", 0, start, self.now)
        start = max(self.now, self.gpu_free, self.pcie_free)
        end = start + self.d.gpu_batch[number]
        self.rec.phase(index, 1, "uva", "gpu", 0, start, end)
        self.rec.phase(index, 1, "uva", "pcie", 0, start, end)
        self.gpu_free = self.pcie_free = self.last_uva_end = self.now = end
        self.gpu_buffer.append((index, 1, end))
        self.rec.gpu_buffer(len(self.gpu_buffer))

    def flush(self) -> None:
        """Flushing: each popped GPU-buffer batch lets one of this overlap's CPU batches start its DMA."""
        overlap = min(len(self.cpu.buffer), self.split.cbs)
        while self.gpu_buffer:
            batch = self.gpu_buffer.popleft()
            if overlap:
                overlap -= 1
                self.cpu.advance(self.now)
                self.gpu_buffer.append(self.transfer(self.cpu.pop(self.now)))
                self.rec.gpu_buffer(len(self.gpu_buffer))
            self.train(batch)

    def pipeline_cpu_route(self) -> None:
        """The naive three-stage pipeline for the rest of Route 0."""
        batch: tuple[int, int, float] | None = self.transfer(self.take_cpu_batch())
        while batch is not None:
            self.train(batch)
            batch = self.transfer(self.take_cpu_batch()) if self.cpu_taken < self.split.n_cpu else None

    def take_cpu_batch(self) -> int:
        """Waits for a CPU batch; the GPU's idle time meanwhile is a GPU-idle block."""
        asked = self.now
        self.now = self.cpu.wait(self.now)
        index = self.cpu.pop(self.now)
        if self.last_train_end <= self.now:
            self.rec.block(max(asked, self.last_train_end), self.now, "gpu")
        return index

    def transfer(self, index: int) -> tuple[int, int, float]:
        """DMA on the copy stream, in issue order on the PCIe link; returns (batch, route, ready time)."""
        self.cpu_taken += 1
        start = max(self.now, self.pcie_free)
        end = start + self.d.dma[self.transfers]
        self.transfers += 1
        self.rec.phase(index, 0, "dma", "pcie", 0, start, end)
        self.pcie_free = end
        return index, 0, end

    def train(self, batch: tuple[int, int, float]) -> None:
        """Launch after the previous step ends (one step ahead at most); runs once its batch is ready."""
        self.now = max(self.now, self.last_train_end)
        index, route, ready = batch
        start = max(self.now, self.gpu_free, ready)
        end = start + self.d.train[self.launched]
        self.launched += 1
        self.rec.phase(index, route, "train", "gpu", 0, start, end)
        self.gpu_free = self.last_train_end = end


class FastCpuOnly:
    """The CPU-only model of model.CpuOnlyModel, as straight-line arithmetic."""

    def __init__(self, times: PhaseTimes, cbs: int, durations: Durations, shared_core: bool = False,
                 record_trace: bool = False) -> None:
        self.times = times
        self.cbs = cbs
        self.d = durations
        self.shared_core = shared_core
        self.threads = times.cpu_threads
        self.rec = Recorder(record_trace, devices_of(durations, {CPU_ONLY_DEVICES[0]: self.threads,
                                                                 CPU_ONLY_DEVICES[1]: 1}))

    def run(self) -> SimulationResult:
        """Simulates the epoch and returns its result."""
        n = self.times.num_batches
        batching, training = CPU_ONLY_DEVICES
        now = 0.0
        workers = None if self.shared_core else _CpuWorkers(self.d.cpu_batch, n, self.threads, self.cbs, batching,
                                                            self.rec, self.d.disk)
        for number in range(n):
            if workers is None:
                if number % self.threads == 0:
                    now = self._batching_turn(number, now)
                index = number
            else:
                asked = now
                now = workers.wait(now)
                index = workers.pop(now)
                self.rec.block(asked, now, training)
            end = now + self.d.train[number]
            self.rec.phase(index, 0, "train", training, 0, now, end)
            now = end
        return self.rec.result(now, "fast", n_cpu=n, n_gpu=0, cbs=self.cbs, gbs=0, cpu_threads=self.threads)

    def _batching_turn(self, first: int, now: float) -> float:
        """A turn of batching on shared cores from `now` (model.CpuOnlyModel.batching_turn); returns its end."""
        turn = range(first, min(self.times.num_batches, first + self.threads))
        if self.d.disk:
            for index in turn:
                end = now + self.d.disk[index]
                self.rec.phase(index, 0, "read", "disk", 0, now, end)
                now = end
        for lane, index in enumerate(turn):
            self.rec.phase(index, 0, "batch", CPU_ONLY_DEVICES[0], lane, now, now + self.d.cpu_batch[index])
        return now + max(self.d.cpu_batch[index] for index in turn)
