"""What one simulated epoch produces: epoch time, busy fractions, block records and a trace.

Both simulators (the SimPy model and its fast twin) fill a `Recorder` the same way, so their
results compare field by field.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from morphpipe.partitioner.feedback import Feedback

# Devices of a CPU+GPU machine, and of a CPU-only one (its cores split in two groups).
GPU_MACHINE_DEVICES = ("cpu", "pcie", "gpu")
CPU_ONLY_DEVICES = ("cpu-batching", "cpu-training")


@dataclass(frozen=True)
class TraceRecord:
    """One phase of one batch on one device lane (a CPU worker, the PCIe link, the GPU)."""

    batch: int
    route: int
    phase: str
    device: str
    lane: int
    start: float
    end: float


@dataclass(frozen=True)
class BlockRecord:
    """A stretch where `idle` (a device) waited on the other side; `weight` is the share of it idling."""

    start: float
    end: float
    idle: str
    weight: float = 1.0

    @property
    def idle_s(self) -> float:
        return (self.end - self.start) * self.weight


def idle_seconds(blocks: list[BlockRecord], device: str) -> float:
    """Idle seconds of `device` caused by the other side: the weighted durations of its blocks."""
    return sum(block.idle_s for block in blocks if block.idle == device)


@dataclass
class SimulationResult:
    """One simulated epoch of a plan."""

    epoch_s: float
    busy: dict[str, float]
    blocks: list[BlockRecord]
    trace: list[TraceRecord]
    n_cpu: int
    n_gpu: int
    cbs: int
    gbs: int
    cpu_threads: int
    max_cpu_buffer: int
    max_gpu_buffer: int
    engine: str
    trained: int

    def idle_s(self, device: str) -> float:
        """Idle seconds of `device` caused by the other side (weighted block durations)."""
        return idle_seconds(self.blocks, device)

    def feedback(self) -> Feedback:
        """The partitioner's feedback: CPU idle versus GPU idle (DESIGN.md, feedback)."""
        return Feedback(
            cpu_idle_s=self.idle_s("cpu"),
            gpu_idle_s=self.idle_s("gpu"),
            cpu_idle_blocks=sum(1 for block in self.blocks if block.idle == "cpu"),
            gpu_idle_blocks=sum(1 for block in self.blocks if block.idle == "gpu"),
        )


@dataclass
class Recorder:
    """Accumulates busy time, blocks, buffer high-water marks and (optionally) the trace."""

    record_trace: bool
    lanes: dict[str, int]
    busy_s: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    blocks: list[BlockRecord] = field(default_factory=list)
    trace: list[TraceRecord] = field(default_factory=list)
    max_cpu_buffer: int = 0
    max_gpu_buffer: int = 0
    trained: int = 0

    def phase(self, batch: int, route: int, phase: str, device: str, lane: int, start: float, end: float) -> None:
        """Counts one phase as busy time of its device (and traces it)."""
        self.busy_s[device] += end - start
        if phase == "train":
            self.trained += 1
        if self.record_trace:
            self.trace.append(TraceRecord(batch, route, phase, device, lane, start, end))

    def block(self, start: float, end: float, idle: str, weight: float = 1.0) -> None:
        """Records a stretch where `idle` waited on the other side (empty stretches are dropped)."""
        if end > start:
            self.blocks.append(BlockRecord(start, end, idle, weight))

    def cpu_buffer(self, level: int) -> None:
        """Tracks the CPU buffer's high-water mark."""
        self.max_cpu_buffer = max(self.max_cpu_buffer, level)

    def gpu_buffer(self, level: int) -> None:
        """Tracks the GPU buffer's high-water mark."""
        self.max_gpu_buffer = max(self.max_gpu_buffer, level)

    def result(self, epoch_s: float, engine: str, *, n_cpu: int, n_gpu: int, cbs: int, gbs: int,
               cpu_threads: int) -> SimulationResult:
        """The finished epoch; busy time becomes a fraction of the epoch per device (CPU: per thread)."""
        busy = {
            device: (self.busy_s[device] / (lanes * epoch_s) if epoch_s > 0 else 0.0)
            for device, lanes in self.lanes.items()
        }
        self.blocks.sort(key=lambda block: (block.start, block.end, block.idle))
        return SimulationResult(
            epoch_s=epoch_s, busy=busy, blocks=self.blocks, trace=self.trace, n_cpu=n_cpu, n_gpu=n_gpu,
            cbs=cbs, gbs=gbs, cpu_threads=cpu_threads, max_cpu_buffer=self.max_cpu_buffer,
            max_gpu_buffer=self.max_gpu_buffer, engine=engine, trained=self.trained,
        )
