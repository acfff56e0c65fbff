"""Virtual devices: batchers, transfers and training steps that sleep for given durations, run by the real Executor.

CI has no GPU, yet the schedule (Algorithms 1-4) should be checked against the simulator's
prediction. Here every phase sleeps for the duration the simulator draws for it (same
`Durations`, same indexing: the j-th CPU batch, the j-th UVA batch, the j-th transfer, the
j-th training step), while the real `Executor` makes every decision:

- the CPU batcher runs P threads that build batches (sleep) and hand them out in batch order
  through a window of `queue_size` batches, as the C++ CpuBatcher does;
- the GPU and the PCIe link are `VirtualResource`s granted in request order; UVA batching
  holds both, like the simulator's resources and like work queued on a CUDA stream;
- features on disk: the disk is one more `VirtualResource`; a CPU batch's misses hold it before the
  batch is built, a GPU batch's (`Durations.gpu_disk`) before its UVA batching, both in one queue;
- transfers and training steps run on `VirtualStream`s (one thread each, in submission
  order), like CUDA streams: launching returns at once, the step waits for its transfer.

Sleeps need no CPU, so threads overlap as real devices would even on a busy 2-core machine.
Every phase goes into the trace with its device and lane.
"""
from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Iterator

import torch

from morphpipe.executor.devices import CpuDevices, Devices, InFlight, Launched, Step
from morphpipe.executor.executor import Executor
from morphpipe.executor.routes import route_seeds
from morphpipe.executor.threads import POLL_S, Stopped, ThreadGroup
from morphpipe.executor.trace import Trace
from morphpipe.partitioner.partitioner import Split
from morphpipe.partitioner.times import PhaseTimes
from morphpipe.sampling.batcher import Batcher
from morphpipe.sampling.epochs import batch_seeds, batches_per_epoch, epoch_order
from morphpipe.sampling.minibatch import MiniBatch
from morphpipe.scheduler.durations import Durations
from morphpipe.scheduler.result import CPU_ONLY_DEVICES


class VirtualResource:
    """A device doing one phase at a time, granted in request order (like work queued on a CUDA stream)."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._next_ticket = 0
        self._serving = 0

    def request(self) -> int:
        """Takes a place in the queue now; `hold` it later, on any thread."""
        with self._condition:
            ticket = self._next_ticket
            self._next_ticket += 1
            return ticket

    @contextlib.contextmanager
    def hold(self, ticket: int, group: ThreadGroup) -> Iterator[None]:
        """Waits for `ticket`'s turn, holds the device for the block, then serves the next ticket."""
        with self._condition:
            while self._serving != ticket:
                group.check_stopping()
                self._condition.wait(POLL_S)
        try:
            yield
        finally:
            with self._condition:
                self._serving += 1
                self._condition.notify_all()


class VirtualStream:
    """Work run in submission order on one thread of `group`, like a CUDA stream."""

    def __init__(self, name: str, group: ThreadGroup) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._group = group
        group.start(self._run, name)

    def submit(self, job) -> None:
        """Queues `job` (a callable) behind everything submitted before it."""
        self._jobs.put(job)

    def close(self) -> None:
        """Lets the stream's thread end once its queued work is done."""
        self._jobs.put(None)

    def _run(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=POLL_S)
            except queue.Empty:
                self._group.check_stopping()
                continue
            if job is None:
                return
            job()


class VirtualMachine:
    """The virtual CPU threads, PCIe link and GPU of one configuration, with the durations of their phases."""

    def __init__(self, durations: Durations, cpu_threads: int, cpu_device: str = "cpu") -> None:
        if cpu_threads < 1:
            raise ValueError(f"cpu_threads must be >= 1, got {cpu_threads!r}")
        self.durations = durations
        self.cpu_threads = cpu_threads
        self.cpu_device = cpu_device
        self.start_epoch(ThreadGroup("virtual-idle"), Trace())

    def start_epoch(self, group: ThreadGroup, trace: Trace) -> None:
        """Fresh resources; phases of this epoch go to `trace`, failures to `group`."""
        self.group = group
        self.trace = trace
        self.gpu = VirtualResource()
        self.pcie = VirtualResource()
        self.disk = VirtualResource()
        self.latest_wake_s = 0.0
        self._wakes = threading.Lock()

    def work(self, start: float, seconds: float) -> float:
        """Sleeps until `start + seconds` (perf_counter clock) unless the epoch stops; returns when it woke.

        How late the sleep woke is kept in `latest_wake_s` (the epoch's worst): a loaded machine wakes threads
        late, and a trace compared at millisecond resolution is only as faithful as that."""
        remaining = start + seconds - time.perf_counter()
        if remaining > 0 and self.group.stopping.wait(remaining):
            raise Stopped
        self.group.check_stopping()
        woke = time.perf_counter()
        with self._wakes:
            self.latest_wake_s = max(self.latest_wake_s, woke - (start + seconds))
        return woke

    def read_misses(self, index: int, turn: int, route: int = 0, number: int | None = None) -> None:
        """Batch `index`'s cache misses: holds the disk at `turn` for their drawn read time (Route 1: the
        `number`-th GPU batch's)."""
        seconds = self.durations.disk[index] if route == 0 else self.durations.gpu_disk[number]
        with self.disk.hold(turn, self.group):
            start = time.perf_counter()
            end = self.work(start, seconds)
        self.record(index, route, "read", ("disk",), 0, start, end)

    def record(self, batch: int, route: int, phase: str, devices: tuple[str, ...], lane: int, start: float,
               end: float) -> None:
        """Traces one phase (perf_counter times) on each of `devices`."""
        for device in devices:
            self.trace.phase(batch, route, phase, device, lane, start - self.trace.origin, end - self.trace.origin)


def virtual_batch(seeds: torch.Tensor, batch_index: int, route: int) -> MiniBatch:
    """A stand-in mini-batch with real seed ids (for coverage checks) and no sampled graph."""
    count = seeds.numel()
    return MiniBatch(seeds=seeds, input_nodes=seeds, blocks=[], x=torch.zeros(count, 1), y=torch.zeros(count,
                     dtype=torch.long), batch_index=batch_index, route=route)


class _VirtualCpuEpoch:
    """One epoch of the virtual CPU batcher: P threads build batches (sleep) and deliver them in order."""

    def __init__(self, machine: VirtualMachine, order: torch.Tensor, batch_size: int, window: int) -> None:
        self.machine = machine
        self.order = order
        self.batch_size = batch_size
        self.window = window
        self.count = batches_per_epoch(order.numel(), batch_size)
        self.condition = threading.Condition()
        self.claimed = 0
        self.delivered = 0
        self.built: dict[int, MiniBatch] = {}
        self.error: BaseException | None = None
        self.stopping = False
        self.threads = [threading.Thread(target=self._worker, args=(lane,), name=f"virtual-cpu-{lane}", daemon=True)
                        for lane in range(min(machine.cpu_threads, max(self.count, 1)))]
        for thread in self.threads:
            thread.start()

    def _worker(self, lane: int) -> None:
        try:
            while True:
                with self.condition:
                    while not (self.stopping or self.claimed >= self.count
                               or self.claimed < self.delivered + self.window):
                        self.condition.wait(POLL_S)
                    if self.stopping or self.claimed >= self.count:
                        return
                    index = self.claimed
                    self.claimed += 1
                    disk_turn = self.machine.disk.request() if self.machine.durations.disk else None
                batch = self.build(index, lane, disk_turn)
                with self.condition:
                    self.built[index] = batch
                    self.condition.notify_all()
        except Stopped:
            with self.condition:
                self.stopping = True
                self.condition.notify_all()
        except BaseException as error:  # noqa: BLE001 - re-raised from next(), as the C++ batcher does
            with self.condition:
                self.error = self.error or error
                self.stopping = True
                self.condition.notify_all()

    def build(self, index: int, lane: int, disk_turn: int | None = None) -> MiniBatch:
        """Builds batch `index` on CPU thread `lane`: reads its misses (holding the disk at `disk_turn`, features on
        disk), then sleeps its duration; traces both."""
        machine = self.machine
        if disk_turn is not None:
            machine.read_misses(index, disk_turn)
        start = time.perf_counter()
        end = machine.work(start, machine.durations.cpu_batch[index])
        machine.record(index, 0, "batch", (machine.cpu_device,), lane, start, end)
        return virtual_batch(batch_seeds(self.order, index, self.batch_size), index, 0)

    def __iter__(self) -> Iterator[MiniBatch]:
        return self

    def __next__(self) -> MiniBatch:
        with self.condition:
            if self.delivered >= self.count:
                raise StopIteration
            while self.delivered not in self.built:
                if self.error is not None:
                    raise self.error
                if self.stopping:
                    raise RuntimeError("VirtualCpuBatcher: the epoch was stopped; start a new epoch")
                self.condition.wait(POLL_S)
            batch = self.built.pop(self.delivered)
            self.delivered += 1
            self.condition.notify_all()
            return batch

    def close(self) -> None:
        with self.condition:
            self.stopping = True
            self.condition.notify_all()
        for thread in self.threads:
            thread.join()


class _VirtualRoute(Batcher):
    """What every virtual batcher (each keeps the batcher contract) shares: its machine, seeds, batch size and run
    seed, and the batch count."""

    def __init__(self, machine: VirtualMachine, seeds: torch.Tensor, batch_size: int, *, seed: int = 0) -> None:
        self.machine = machine
        self.seeds = seeds
        self.batch_size = batch_size
        self.seed = seed

    def __len__(self) -> int:
        return batches_per_epoch(self.seeds.numel(), self.batch_size)

    def close(self) -> None:
        """Nothing runs in the background between calls."""


class VirtualCpuBatcher(_VirtualRoute):
    """Route 0 stand-in that delivers as CpuBatcher does: P threads, in-order delivery, a window of `queue_size`."""

    route = 0

    def __init__(self, machine: VirtualMachine, seeds: torch.Tensor, batch_size: int, *, seed: int = 0,
                 queue_size: int | None = None) -> None:
        super().__init__(machine, seeds, batch_size, seed=seed)
        self.queue_size = machine.cpu_threads if queue_size is None else queue_size
        self._current: _VirtualCpuEpoch | None = None

    def epoch(self, epoch: int) -> _VirtualCpuEpoch:
        """Starts epoch `epoch` (stopping one in progress): its seeds shuffled as CpuBatcher shuffles them."""
        self.close()
        order = epoch_order(self.seeds, self.seed, epoch)
        self._current = self.make_epoch(order)
        return self._current

    def make_epoch(self, order: torch.Tensor) -> _VirtualCpuEpoch:
        """The epoch object (tests override it to inject failures)."""
        return _VirtualCpuEpoch(self.machine, order, self.batch_size, self.queue_size)

    def close(self) -> None:
        """Stops and joins the worker threads of the epoch in progress."""
        if self._current is not None:
            self._current.close()
            self._current = None


class VirtualSerialBatcher(_VirtualRoute):
    """Route 0 stand-in for plans whose phases take turns on the same cores, as SerialBatcher builds: asked for every
    P-th batch, it reads the misses of the next P batches one after another, then sleeps for the slowest of their
    builds (P threads building one each); the turn's other batches are then handed out at once."""

    route = 0

    def epoch(self, epoch: int) -> Iterator[MiniBatch]:
        order = epoch_order(self.seeds, self.seed, epoch)
        machine = self.machine
        for first in range(0, len(self), machine.cpu_threads):
            turn = range(first, min(len(self), first + machine.cpu_threads))
            if machine.durations.disk:
                for index in turn:
                    machine.read_misses(index, machine.disk.request())
            machine.work(time.perf_counter(), max(machine.durations.cpu_batch[index] for index in turn))
            for index in turn:
                yield virtual_batch(batch_seeds(order, index, self.batch_size), index, 0)


class VirtualGpuBatcher(_VirtualRoute):
    """Route 1 stand-in: UVA batching that holds the virtual GPU and PCIe link for its duration."""

    route = 1

    def __init__(self, machine: VirtualMachine, seeds: torch.Tensor, batch_size: int, first_position: int, *,
                 seed: int = 0) -> None:
        super().__init__(machine, seeds, batch_size, seed=seed)
        self.first_position = first_position

    def epoch(self, epoch: int) -> Iterator[MiniBatch]:
        order = epoch_order(self.seeds, self.seed, epoch)
        for number in range(len(self)):
            yield self.make(number, order)

    def make(self, number: int, order: torch.Tensor) -> MiniBatch:
        """UVA batching of batch `number`: reads its misses (holding the disk, features on disk), then holds the
        GPU, then the PCIe link too, for its duration."""
        machine = self.machine
        if machine.durations.gpu_disk:
            machine.read_misses(self.first_position + number, machine.disk.request(), 1, number)
        with machine.gpu.hold(machine.gpu.request(), machine.group):
            with machine.pcie.hold(machine.pcie.request(), machine.group):
                start = time.perf_counter()
                end = machine.work(start, machine.durations.gpu_batch[number])
        machine.record(self.first_position + number, 1, "uva", ("gpu", "pcie"), 0, start, end)
        return virtual_batch(batch_seeds(order, number, self.batch_size), number, 1)


class VirtualTrainer:
    """A training step that sleeps for the j-th drawn training time and remembers which seeds it trained."""

    def __init__(self, machine: VirtualMachine) -> None:
        self.machine = machine
        self.steps = 0
        self.trained: list[torch.Tensor] = []

    def __call__(self, batch: MiniBatch) -> torch.Tensor:
        number = self.steps % len(self.machine.durations.train)
        self.steps += 1
        self.machine.work(time.perf_counter(), self.machine.durations.train[number])
        self.trained.append(batch.seeds)
        return torch.zeros(())


class VirtualDevices(Devices):
    """A virtual GPU machine: transfers on a copy stream, training on a compute stream, FIFO resources."""

    def __init__(self, machine: VirtualMachine) -> None:
        self.machine = machine
        self.lanes = {machine.cpu_device: machine.cpu_threads, "pcie": 1, "gpu": 1}

    def start_epoch(self, group: ThreadGroup, trace: Trace) -> None:
        super().start_epoch(group, trace)
        self.machine.start_epoch(group, trace)
        self.copy = VirtualStream("copy-stream", group)
        self.compute = VirtualStream("compute-stream", group)
        self.transfers = 0

    def transfer(self, batch: MiniBatch, position: int) -> InFlight:
        machine = self.machine
        number = self.transfers
        self.transfers += 1
        ticket = machine.pcie.request()
        ready = threading.Event()

        def dma() -> None:
            with machine.pcie.hold(ticket, machine.group):
                start = time.perf_counter()
                end = machine.work(start, machine.durations.dma[number])
            machine.record(position, 0, "dma", ("pcie",), 0, start, end)
            ready.set()

        self.copy.submit(dma)
        return InFlight(batch, 0, position, ready=ready)

    def launch(self, item: InFlight, step: Step) -> Launched:
        machine = self.machine
        ticket = machine.gpu.request()
        launched = Launched(item, threading.Event())

        def train() -> None:
            with machine.gpu.hold(ticket, machine.group):
                while item.ready is not None and not item.ready.wait(POLL_S):
                    machine.group.check_stopping()
                start = time.perf_counter()
                launched.loss = step(item.batch)
                end = time.perf_counter()
            machine.record(item.position, item.route, "train", ("gpu",), 0, start, end)
            launched.end = end - machine.trace.origin
            launched.done.set()

        self.compute.submit(train)
        return launched

    def wait(self, launched: Launched) -> None:
        self.group.wait_event(launched.done)

    def finish_epoch(self) -> None:
        self.copy.close()
        self.compute.close()


class VirtualCpuOnlyDevices(CpuDevices):
    """A virtual CPU-only machine: training sleeps on the caller's thread, P batching threads feed it."""

    def __init__(self, machine: VirtualMachine) -> None:
        super().__init__(CPU_ONLY_DEVICES[1])
        self.machine = machine
        self.lanes = {machine.cpu_device: machine.cpu_threads, CPU_ONLY_DEVICES[1]: 1}

    def start_epoch(self, group: ThreadGroup, trace: Trace) -> None:
        super().start_epoch(group, trace)
        self.machine.start_epoch(group, trace)


def virtual_executor(times: PhaseTimes, split: Split, durations: Durations, *, batch_size: int = 4,
                     seed: int = 0, shares_cores: bool = False) -> tuple[Executor, VirtualTrainer]:
    """An Executor on virtual devices for `times` and `split`, with the simulator's `durations`.

    The seeds are 0..(num_batches * batch_size - 2) (so the epoch has one short batch), split
    between the routes with `route_seeds` as real training splits them. On a CPU-only
    configuration (`times.device == 'cpu'`) the split must put every batch on Route 0, and
    `shares_cores` makes batching and training take turns on the executor's thread.
    """
    n = times.num_batches
    if split.n_cpu + split.n_gpu != n:
        raise ValueError(f"split has {split.n_cpu} + {split.n_gpu} batches, times.num_batches is {n}")
    num_seeds = n * batch_size - 1 if batch_size > 1 else n
    routes = route_seeds(torch.arange(num_seeds), batch_size, split.n_cpu, n, seed)
    cpu_only = times.device == "cpu"
    if cpu_only and split.n_gpu:
        raise ValueError("a CPU-only configuration has no Route 1; give every batch to Route 0")
    machine = VirtualMachine(durations, times.cpu_threads, CPU_ONLY_DEVICES[0] if cpu_only else "cpu")
    devices: Devices = VirtualCpuOnlyDevices(machine) if cpu_only else VirtualDevices(machine)
    trainer = VirtualTrainer(machine)
    cpu_batcher: VirtualCpuBatcher | VirtualSerialBatcher | None = None
    if split.n_cpu:
        batcher_type = VirtualSerialBatcher if shares_cores else VirtualCpuBatcher
        cpu_batcher = batcher_type(machine, routes.cpu, batch_size, seed=seed)
    gpu_batcher = VirtualGpuBatcher(machine, routes.gpu, batch_size, split.n_cpu, seed=seed) if split.n_gpu else None
    executor = Executor(split, devices, trainer, cpu_batcher=cpu_batcher, gpu_batcher=gpu_batcher,
                        shares_cores=shares_cores)
    return executor, trainer
