"""The CPU buffer: Route 0 batches ready for transfer, at most `capacity`, filled in the background.

A feeder thread takes batches from the CPU batcher's epoch iterator (whose own threads build
them outside the GIL) and appends them here. It reserves a free slot *before* asking the
batcher for the next batch, so while the buffer is full the batcher's threads finish the
batches they hold and then wait, as the simulator's CPU workers do: memory stays bounded by
`capacity` plus the batcher's own window. The executor looks at the level without blocking
(`ready()`) and takes batches in order (`get()`).

`InlineCpuSource` is the same interface without a buffer, for plans whose batching and
training take turns on the same cores: each batch is built on the executor's thread when taken.
"""
from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator

from morphpipe.executor.threads import POLL_S, Stopped, ThreadGroup
from morphpipe.executor.trace import Trace
from morphpipe.sampling.minibatch import MiniBatch


class CpuBuffer:
    """Bounded buffer of `count` Route 0 batches, fed from `batches` by a thread of `group`."""

    def __init__(self, batches: Iterator[MiniBatch], capacity: int, count: int, group: ThreadGroup,
                 trace: Trace) -> None:
        if capacity < 1:
            raise ValueError(f"cbs (CPU buffer size) must be >= 1 when the plan has CPU batches, got {capacity!r}")
        self.count = count
        self._batches = batches
        self._group = group
        self._trace = trace
        self._ready: deque[MiniBatch] = deque()
        self._condition = threading.Condition()
        self._free_slots = capacity
        self._fed = 0
        self._taken = 0
        self.finished_at: float | None = None
        self.lanes: dict[str, int] = {}
        group.start(self._feed, "cpu-buffer")

    def ready(self) -> int:
        """Batches in the buffer now (no waiting)."""
        return len(self._ready)

    @property
    def untaken(self) -> int:
        """Route 0 batches of this epoch the executor has not taken yet (in the buffer or still coming)."""
        return self.count - self._taken

    def get(self) -> MiniBatch:
        """The oldest batch, waiting for one if the buffer is empty; frees its slot for the feeder."""
        if self._taken >= self.count:
            raise RuntimeError(f"the executor asked for CPU batch {self._taken + 1} of {self.count}; this is a bug")
        with self._condition:
            self._group.wait_until(lambda: bool(self._ready), self._condition)
            batch = self._ready.popleft()
            self._taken += 1
            self._free_slots += 1
            self._condition.notify_all()
        return batch

    def _feed(self) -> None:
        """The feeder: reserve a slot, take the next batch from the batcher, put it in the buffer."""
        for _ in range(self.count):
            waited_from = None
            with self._condition:
                while self._free_slots == 0:
                    if self._group.stopping.is_set():
                        raise Stopped
                    waited_from = self._trace.now() if waited_from is None else waited_from
                    self._condition.wait(POLL_S)
                self._free_slots -= 1
            if waited_from is not None:
                self._trace.block(waited_from, self._trace.now(), "cpu")
            batch = next(self._batches, None)
            self._group.check_stopping()
            if batch is None:
                raise RuntimeError(
                    f"the CPU batcher's epoch ended after {self._fed} batches, but the plan gives Route 0 "
                    f"{self.count}; build the batcher over the Route 0 seeds of this plan (route_seeds)"
                )
            if batch.build_s is not None:
                self._trace.built(batch.build_s)
            with self._condition:
                self._ready.append(batch)
                self._fed += 1
                self._trace.level("cpu", len(self._ready))
                self._condition.notify_all()
        self.finished_at = self._trace.now()
        if next(self._batches, None) is not None:
            raise RuntimeError(
                f"the CPU batcher yields more than the plan's {self.count} Route 0 batches; build it over the "
                "Route 0 seeds of this plan (route_seeds)"
            )


class InlineCpuSource:
    """Route 0 without a buffer: each batch is built on the executor's thread when it is taken, and traced."""

    def __init__(self, batches: Iterator[MiniBatch], count: int, trace: Trace, device: str) -> None:
        self.count = count
        self._batches = batches
        self._trace = trace
        self._device = device
        self._taken = 0
        self.finished_at: float | None = None
        self.lanes = {device: 1}

    def ready(self) -> int:
        """Nothing is ever built ahead."""
        return 0

    @property
    def untaken(self) -> int:
        return self.count - self._taken

    def get(self) -> MiniBatch:
        """Builds the next batch now (the batcher runs on this thread) and traces its batching phase."""
        start = self._trace.now()
        batch = next(self._batches, None)
        if batch is None:
            raise RuntimeError(f"the CPU batcher's epoch ended after {self._taken} batches, but the plan gives "
                               f"Route 0 {self.count}; build the batcher over the Route 0 seeds (route_seeds)")
        end = self._trace.now()
        self._trace.phase(self._taken, 0, "batch", self._device, 0, start, end)
        self._taken += 1
        if self._taken == self.count:
            self.finished_at = end
        return batch
