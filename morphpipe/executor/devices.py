"""The machine as the executor sees it: make a GPU batch, transfer a CPU batch, launch and await training.

Three implementations share this interface, so one executor loop runs everywhere:
- `CudaDevices`: DMA on a copy stream s1 with an event per batch; training launched on the
  compute stream s0 after waiting on that event; phases timed with CUDA events.
- `CpuDevices`: training on the CPU, synchronously on the caller's thread; no transfer.
- `VirtualDevices` (morphpipe.executor.virtual): phases that sleep for given durations on
  virtual streams, for testing the schedule without a GPU.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from morphpipe.executor.threads import ThreadGroup
from morphpipe.executor.trace import Trace
from morphpipe.sampling.minibatch import MiniBatch
from morphpipe.sampling.streams import CUDA_STREAMS, StreamApi, record_batch

Step = Callable[[MiniBatch], torch.Tensor]


@dataclass
class InFlight:
    """A batch in, or on its way to, the training device's memory: its route, its place in the epoch, its readiness.

    `position` numbers the epoch's batches as the simulator does: Route 0 first (0..n_cpu-1),
    then Route 1. `ready` is whatever the devices wait on before training it (None: ready now);
    `host` keeps the host copy alive until its transfer has finished.
    """

    batch: MiniBatch
    route: int
    position: int
    ready: Any = None
    host: MiniBatch | None = None


@dataclass
class Launched:
    """A training step handed to the training device: `done` fires when it ends; its loss (not synced)."""

    item: InFlight
    done: Any = None
    loss: torch.Tensor | None = None
    end: float | None = None  # seconds since the epoch started, once known


class Devices:
    """The executor's view of the machine; subclasses implement transfer, launch and wait."""

    #: traced devices and their lane counts, for busy fractions
    lanes: dict[str, int] = {}

    def start_epoch(self, group: ThreadGroup, trace: Trace) -> None:
        """Called before an epoch's batchers start: where failures and records of this epoch go."""
        self.group = group
        self.trace = trace

    def gpu_batch(self, batches: Iterator[MiniBatch], position: int) -> InFlight:
        """Route 1: the GPU batcher makes the next batch, already in device memory (synchronous)."""
        return InFlight(self._next(batches), 1, position)

    def transfer(self, batch: MiniBatch, position: int) -> InFlight:
        """Route 0: starts moving a CPU batch to the training device."""
        raise NotImplementedError

    def launch(self, item: InFlight, step: Step) -> Launched:
        """Starts `step` on `item` once it is ready; may return before the step ends."""
        raise NotImplementedError

    def wait(self, launched: Launched) -> None:
        """Blocks until `launched` has ended."""
        raise NotImplementedError

    def finish_epoch(self) -> None:
        """After the last step: settles pending timings into the trace."""

    def close(self) -> None:
        """Stops whatever the devices run in the background (after a failure too)."""

    @staticmethod
    def _next(batches: Iterator[MiniBatch]) -> MiniBatch:
        batch = next(batches, None)
        if batch is None:
            raise RuntimeError("the GPU batcher's epoch ended before the plan's Route 1 batches did; build it "
                               "over the Route 1 seeds of this plan (route_seeds)")
        return batch


class CpuDevices(Devices):
    """Training on the CPU, on the caller's thread: batches are already where they are trained."""

    def __init__(self, train_device: str = "cpu-training") -> None:
        self.train_device = train_device
        self.lanes = {train_device: 1}

    def transfer(self, batch: MiniBatch, position: int) -> InFlight:
        return InFlight(batch, 0, position)

    def launch(self, item: InFlight, step: Step) -> Launched:
        start = self.trace.now()
        loss = step(item.batch)
        end = self.trace.now()
        self.trace.phase(item.position, item.route, "train", self.train_device, 0, start, end)
        return Launched(item, None, loss.detach(), end)

    def wait(self, launched: Launched) -> None:
        self.group.check()


class CudaDevices(Devices):
    """One CUDA device: training on the compute stream s0, DMA on the copy stream s1, Route 1 on the batcher's stream.

    Each transfer records an event on s1 that the training step waits on (on s0), so the copy
    of the next batch overlaps the current step. A Route 1 batch made on the GPU batcher's own
    stream comes with a `Handoff` whose ready event s0 waits on, so sampling the next batch
    overlaps training instead of queueing behind it. Every tensor trained on s0 but made on
    another stream is marked as used on s0 (`record_stream`) so the caching allocator does not
    reuse it early, and the pinned host copy is kept until its step has ended. Phase times come
    from CUDA events, turned into seconds since the epoch started in `finish_epoch`. `streams`
    replaces torch.cuda's stream API (tests inject a recording double and run this on the CPU).
    """

    lanes = {"pcie": 1, "gpu": 1}

    def __init__(self, device: torch.device | str = "cuda", streams: StreamApi | None = None) -> None:
        self.device = torch.device(device)
        if streams is None and (self.device.type != "cuda" or not torch.cuda.is_available()):
            raise ValueError(f"CudaDevices needs a CUDA device, got device={str(device)!r} "
                             f"(torch.cuda.is_available() = {torch.cuda.is_available()}); use CpuDevices")
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.streams: StreamApi = streams if streams is not None else CUDA_STREAMS
        with self.streams.device(self.device):
            self.compute = self.streams.current_stream(self.device)
            self.copy = self.streams.Stream(self.device)
        self._timed: list[tuple[int, int, str, tuple[str, ...], Any, Any]] = []

    def _event(self, stream: Any) -> Any:
        event = self.streams.Event(enable_timing=True)
        event.record(stream)
        return event

    def start_epoch(self, group: ThreadGroup, trace: Trace) -> None:
        super().start_epoch(group, trace)
        self._timed = []
        self._origin = self._event(self.compute)
        self._origin_host = trace.now()

    def gpu_batch(self, batches: Iterator[MiniBatch], position: int) -> InFlight:
        with self.streams.device(self.device):
            start = self._event(self.compute)
            batch = self._next(batches)
            handoff = batch.handoff
            if handoff is None:  # made on the compute stream: ready in stream order
                self._timed.append((position, 1, "uva", ("gpu", "pcie"), start, self._event(self.compute)))
                return InFlight(batch, 1, position)
        self._timed.append((position, 1, "uva", ("gpu", "pcie"), handoff.start, handoff.ready))
        return InFlight(batch, 1, position, ready=handoff.ready)

    def transfer(self, batch: MiniBatch, position: int) -> InFlight:
        with self.streams.device(self.device), self.streams.stream(self.copy):
            start = self._event(self.copy)
            on_device = self.streams.copy_to(batch, self.device)
            ready = self._event(self.copy)
        self._timed.append((position, 0, "dma", ("pcie",), start, ready))
        return InFlight(on_device, 0, position, ready=ready, host=batch)

    def launch(self, item: InFlight, step: Step) -> Launched:
        with self.streams.device(self.device):
            if item.ready is not None:
                self.compute.wait_event(item.ready)
                record_batch(self.streams, item.batch, self.compute)
            with self.streams.stream(self.compute):
                start = self._event(self.compute)
                loss = step(item.batch)
                done = self._event(self.compute)
        self._timed.append((item.position, item.route, "train", ("gpu",), start, done))
        return Launched(item, done, loss.detach())

    def wait(self, launched: Launched) -> None:
        launched.done.synchronize()
        launched.item.host = None  # its copy finished before the step that waited on it
        self.group.check()

    def finish_epoch(self) -> None:
        self.streams.synchronize(self.device)
        for position, route, phase, devices, start, end in self._timed:
            begin = self._origin_host + self._origin.elapsed_time(start) / 1e3
            finish = self._origin_host + self._origin.elapsed_time(end) / 1e3
            for device in devices:
                self.trace.phase(position, route, phase, device, 0, begin, finish)
        self._timed = []

    def close(self) -> None:
        self.streams.synchronize(self.device)


def default_devices(device: torch.device | str) -> Devices:
    """CUDA devices for a CUDA device, else training on the CPU."""
    return CudaDevices(device) if torch.device(device).type == "cuda" else CpuDevices()
