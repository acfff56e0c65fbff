"""What the executor measures in one epoch: phases per batch and device, blocks, buffer high-water marks.

Records use the simulator's types (`TraceRecord`, `BlockRecord` from morphpipe.scheduler.result)
with times in seconds since the epoch started, so a measured epoch and a simulated one compare
record by record and draw with the same Gantt chart code. Any thread may record.
"""
from __future__ import annotations

import threading
import time
from collections import defaultdict
from dataclasses import dataclass

from morphpipe.scheduler.result import BlockRecord, TraceRecord


class Trace:
    """Thread-safe recorder of one epoch; `origin` is the epoch's start on the `time.perf_counter` clock."""

    def __init__(self) -> None:
        self.origin = time.perf_counter()
        self._lock = threading.Lock()
        self.records: list[TraceRecord] = []
        self.blocks: list[BlockRecord] = []
        self.max_level: dict[str, int] = defaultdict(int)
        self.build_seconds: list[float] = []  # per Route 0 batch, from threaded batchers that time themselves

    def now(self) -> float:
        """Seconds since the epoch started."""
        return time.perf_counter() - self.origin

    def phase(self, batch: int, route: int, phase: str, device: str, lane: int, start: float, end: float) -> None:
        """One phase of one batch on one device lane, `start`/`end` in seconds since the epoch started."""
        with self._lock:
            self.records.append(TraceRecord(batch, route, phase, device, lane, start, end))

    def block(self, start: float, end: float, idle: str, weight: float = 1.0) -> None:
        """A stretch where `idle` waited on the other side (empty stretches are dropped)."""
        if end > start:
            with self._lock:
                self.blocks.append(BlockRecord(start, end, idle, weight))

    def built(self, seconds: float) -> None:
        """One Route 0 batch took `seconds` of one batching thread (threaded batchers are not traced per lane)."""
        with self._lock:
            self.build_seconds.append(seconds)

    def level(self, buffer: str, size: int) -> None:
        """Tracks the high-water mark of a buffer ('cpu' or 'gpu')."""
        with self._lock:
            self.max_level[buffer] = max(self.max_level[buffer], size)

    def busy(self, epoch_s: float, lanes: dict[str, int]) -> dict[str, float]:
        """Busy fraction per traced device over the epoch (a device with several lanes: per lane)."""
        seconds: dict[str, float] = defaultdict(float)
        for record in self.records:
            seconds[record.device] += record.end - record.start
        return {device: seconds[device] / (count * epoch_s) for device, count in lanes.items()
                if device in seconds and epoch_s > 0}


@dataclass(frozen=True)
class Overlap:
    """Two phases that overlap on one device lane (a scheduling bug when it happens)."""

    first: TraceRecord
    second: TraceRecord


def overlaps(records: list[TraceRecord], tolerance_s: float = 1e-6) -> list[Overlap]:
    """Phases sharing a device lane in time; an empty list when every lane does one phase at a time."""
    by_lane: dict[tuple[str, int], list[TraceRecord]] = defaultdict(list)
    for record in records:
        by_lane[(record.device, record.lane)].append(record)
    found = []
    for lane_records in by_lane.values():
        lane_records.sort(key=lambda r: (r.start, r.end))
        for before, after in zip(lane_records, lane_records[1:]):
            if after.start < before.end - tolerance_s:
                found.append(Overlap(before, after))
    return found
