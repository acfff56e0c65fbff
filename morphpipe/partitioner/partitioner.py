"""The Partitioner: splits an epoch's batches between Route 0 (CPU batching) and Route 1 (UVA).

It starts from the exact minimiser of the lower bound LB (bounds.py), sizes the two buffers
(gbs given, cbs:gbs = n_c:n_g, cbs capped by a pinned-memory budget when one is given), and
then fine-tunes the split with the simulator's feedback (DESIGN.md, "Dual-buffer scheduling"):
when the CPU idles move batches to it, when the GPU idles move them away; stop once the
mismatch is below one GPU batching time.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from morphpipe.partitioner import bounds
from morphpipe.partitioner.feedback import Feedback
from morphpipe.partitioner.times import PhaseTimes


@dataclass(frozen=True)
class Split:
    """An integer CPU:GPU split of one epoch with its buffer sizes."""

    n_cpu: int
    n_gpu: int
    cbs: int
    gbs: int

    @property
    def cpu_share(self) -> float:
        """Fraction of the epoch's batches made by the CPU batcher."""
        return self.n_cpu / (self.n_cpu + self.n_gpu)


def buffer_sizes(n_cpu: int, n_gpu: int, gbs: int, max_cbs: int | None = None) -> tuple[int, int]:
    """(cbs, gbs): cbs follows cbs:gbs = n_c:n_g, at least 1 and at most n_c (and max_cbs) when n_c > 0.

    An all-CPU plan has no GPU route to balance against: its CPU buffer is as deep as `gbs` would
    be, and its GPU buffer is 0 (no Route 1 batch ever enters it).
    """
    if gbs < 1:
        raise ValueError(f"gbs (GPU buffer size) must be >= 1, got {gbs!r}")
    if max_cbs is not None and max_cbs < 1:
        raise ValueError(f"max_cbs must be >= 1, got {max_cbs!r}")
    if n_cpu == 0:
        return 0, gbs
    cbs = min(gbs, n_cpu) if n_gpu == 0 else min(n_cpu, max(1, math.floor(gbs * n_cpu / n_gpu + 0.5)))
    return (cbs if max_cbs is None else min(cbs, max_cbs)), (gbs if n_gpu else 0)


def pinned_buffer_limit(batch_bytes: int, host_memory_bytes: int, share: float = 0.25) -> int | None:
    """Most CPU-buffer batches that fit in `share` of host memory (None when batch size is unknown).

    The CPU buffer holds pinned (page-locked) batches; pinning a large part of host memory
    starves the rest of the process, so a quarter of the available memory is the budget.
    """
    if batch_bytes <= 0:
        return None
    return max(1, int(share * host_memory_bytes) // batch_bytes)


class Partitioner:
    """Chooses and adjusts the CPU:GPU split for one machine configuration."""

    def __init__(self, times: PhaseTimes, gbs: int = 10, max_cbs: int | None = None) -> None:
        if times.device != "cuda":
            raise ValueError("Partitioner splits batches between CPU and GPU; for a CPU-only machine use split_cores")
        buffer_sizes(1, 1, gbs, max_cbs)
        self.times = times
        self.gbs = gbs
        self.max_cbs = max_cbs

    @property
    def num_batches(self) -> int:
        return self.times.num_batches

    def lower_bound(self, n_cpu: int) -> float:
        """LB(n_c), seconds."""
        return bounds.lower_bound(self.times, n_cpu)

    def best_lower_bound(self) -> bounds.LowerBound:
        """The integer n_c minimising LB, exactly."""
        return bounds.best_lower_bound(self.times)

    def eq6(self, x: float) -> float:
        """The paper's relaxed makespan C'(x), seconds."""
        return bounds.eq6(self.times, x)

    def best_eq6(self) -> bounds.Eq6Optimum:
        """The x >= 0 minimising Eq. 6, exactly."""
        return bounds.best_eq6(self.times)

    def split(self, n_cpu: int) -> Split:
        """The split with n_cpu batches on Route 0 and its buffer sizes."""
        n = self.num_batches
        if not 0 <= n_cpu <= n:
            raise ValueError(f"n_cpu must be in [0, {n}], got {n_cpu!r}")
        cbs, gbs = buffer_sizes(n_cpu, n - n_cpu, self.gbs, self.max_cbs)
        return Split(n_cpu, n - n_cpu, cbs, gbs)

    def initial_split(self) -> Split:
        """The split minimising the lower bound: where the feedback loop starts."""
        return self.split(self.best_lower_bound().n_cpu)

    def is_balanced(self, feedback: Feedback) -> bool:
        """True when the idle-time mismatch is below one Route-1 batch (its disk reads, then T_GB): moving a batch
        cannot help."""
        return feedback.direction == 0 or feedback.mismatch_s < self.times.route_1_batch_s

    def step_size(self, feedback: Feedback) -> int:
        """Batches to move so the mismatch closes: each moved batch shifts about one Route-1 batch + T_CB of idle
        time."""
        return max(1, math.floor(feedback.mismatch_s / (self.times.route_1_batch_s + self.times.cpu_batch_s)))

    def adjust(self, split: Split, feedback: Feedback, step: int = 1) -> Split:
        """The feedback step: move `step` batches towards the idle side (clamped to [0, n])."""
        if step < 1:
            raise ValueError(f"step must be >= 1, got {step!r}")
        n_cpu = min(self.num_batches, max(0, split.n_cpu + feedback.direction * step))
        return self.split(n_cpu)
