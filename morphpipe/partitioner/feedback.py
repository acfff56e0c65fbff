"""Feedback: what a simulated epoch tells the partitioner about its CPU:GPU split.

Each block the simulator records is a stretch where one side idled because the other was
behind: "GPU busy, CPU idle" (CPU batching threads could not hand over their batches, or had
no batches left while the GPU route was still batching) or "CPU busy, GPU idle" (the GPU had
nothing to train while it waited for a CPU batch). The side with more idle time gets more of
the work. Idle time, not block count, decides: one long stall outweighs many short ones.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Feedback:
    """Idle seconds (and block counts) on each side of the split, from one simulated epoch."""

    cpu_idle_s: float
    gpu_idle_s: float
    cpu_idle_blocks: int
    gpu_idle_blocks: int

    @property
    def direction(self) -> int:
        """+1: move batches from Route 1 to Route 0 (CPU idles); -1: the reverse; 0: balanced."""
        return (self.cpu_idle_s > self.gpu_idle_s) - (self.cpu_idle_s < self.gpu_idle_s)

    @property
    def mismatch_s(self) -> float:
        """How unbalanced the two sides are, in seconds of idle time."""
        return abs(self.cpu_idle_s - self.gpu_idle_s)
