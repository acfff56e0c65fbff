"""Exact minimisers of the lower bound LB(n_c) and of the paper's relaxed makespan, Eq. 6.

LB(n_c) = max(n_c*T_CB, n_c*T_DMA + n_g*T_GB, n_g*T_GB + n*T_M), n_g = n - n_c: the CPU,
the PCIe link and the GPU each need at least that long. With features on disk two more resources
bind: the disk serves every batch's misses, n_c*T_disk + n_g*T_gdisk, and the executor waits out
each Route-1 batch's reads before its UVA batching, n_g*(T_gdisk + T_GB); and a CPU thread waits out
its own batch's reads, so the CPU line becomes n_c*(T_CB + T_disk/P). It is the maximum of lines in
n_c, hence convex and piecewise linear: its integer minimum lies at 0, n, or the floor or
ceiling of a point where two lines cross. No grid search.

Eq. 6, with CPU:GPU batches = 1:x,
C'(x) = n * (x*T_UVA/(1+x) + max{T_DMA/(1+x), T_M, (T_CB - x*T_UVA)/(1+x)}), x >= 0,
becomes, with the CPU fraction y = 1/(1+x) in (0, 1],
C'/n = max{T_UVA + (T_DMA - T_UVA)*y, T_M + T_UVA*(1 - y), T_CB*y}:
again the maximum of three lines, so it is minimised exactly at y = 1 (x = 0), at a crossing,
or in the limit y -> 0 (x -> infinity, all batches on the GPU). This is LB(n*y)/n, i.e. Eq. 6 is
the continuous relaxation of LB, so min Eq. 6 <= min LB, with equality when n*y* is an integer.
The paper's Eq. 6 has no disk: with features on disk LB's disk lines only raise it, so Eq. 6 stays below LB.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations

from morphpipe.partitioner.times import PhaseTimes

_RELATIVE_TIE = 1e-12


@dataclass(frozen=True)
class LowerBound:
    """The integer split minimising LB, and LB there (seconds)."""

    n_cpu: int
    value_s: float


@dataclass(frozen=True)
class Eq6Optimum:
    """The minimiser of Eq. 6: ratio x (inf: all on the GPU), CPU fraction 1/(1+x), and C' there."""

    x: float
    cpu_fraction: float
    value_s: float


def _gpu_times(times: PhaseTimes) -> tuple[float, float, float, float]:
    if times.gpu_batch_s is None or times.dma_s is None:
        raise ValueError("the CPU/GPU lower bound needs GPU phase times; this is a CPU-only configuration")
    return times.cpu_batch_s, times.dma_s, times.gpu_batch_s, times.train_s


def _lines(times: PhaseTimes) -> list[tuple[float, float]]:
    """LB's lines (slope, intercept) in n_c: the CPU, the PCIe link, the GPU, the disk and the executor."""
    n = times.num_batches
    t_cb, t_dma, t_gb, t_m = _gpu_times(times)
    t_disk, t_gdisk = times.disk_read_s, times.gpu_read_s
    return [(t_cb + t_disk / times.cpu_threads, 0.0), (t_dma - t_gb, n * t_gb), (-t_gb, n * (t_gb + t_m)),
            (t_disk - t_gdisk, n * t_gdisk), (-(t_gdisk + t_gb), n * (t_gdisk + t_gb))]


def lower_bound(times: PhaseTimes, n_cpu: int) -> float:
    """LB(n_c) in seconds for n_c batches on Route 0 (CPU batching) and the rest on Route 1 (UVA)."""
    n = times.num_batches
    if not 0 <= n_cpu <= n:
        raise ValueError(f"n_cpu must be in [0, {n}], got {n_cpu!r}")
    return max(slope * n_cpu + intercept for slope, intercept in _lines(times))


def _crossings(lines: list[tuple[float, float]], low: float, high: float) -> list[float]:
    """Points in [low, high] where two of the lines slope*z + intercept cross."""
    points = [low, high]
    for (a1, b1), (a2, b2) in combinations(lines, 2):
        if a1 != a2:
            z = (b2 - b1) / (a1 - a2)
            if low <= z <= high:
                points.append(z)
    return points


def best_lower_bound(times: PhaseTimes) -> LowerBound:
    """The exact integer minimiser of LB (ties go to the smaller n_cpu)."""
    n = times.num_batches
    candidates = set()
    for z in _crossings(_lines(times), 0.0, float(n)):
        candidates.update({min(n, max(0, math.floor(z))), min(n, max(0, math.ceil(z)))})
    best: LowerBound | None = None
    for n_cpu in sorted(candidates):
        value = lower_bound(times, n_cpu)
        if best is None or value < best.value_s * (1.0 - _RELATIVE_TIE):
            best = LowerBound(n_cpu, value)
    assert best is not None
    return best


def eq6(times: PhaseTimes, x: float) -> float:
    """The paper's relaxed makespan C'(x) in seconds, for CPU:GPU batches = 1:x (x = inf: all GPU)."""
    if not x >= 0:
        raise ValueError(f"x must be >= 0, got {x!r}")
    t_cb, t_dma, t_uva, t_m = _gpu_times(times)
    n = times.num_batches
    if math.isinf(x):
        return n * (t_uva + t_m)
    return n * (x * t_uva / (1 + x) + max(t_dma / (1 + x), t_m, (t_cb - x * t_uva) / (1 + x)))


def best_eq6(times: PhaseTimes) -> Eq6Optimum:
    """The exact minimiser of Eq. 6 over x >= 0 at the breakpoints of its y = 1/(1+x) form (ties: less CPU)."""
    t_cb, t_dma, t_uva, t_m = _gpu_times(times)
    n = times.num_batches
    lines = [(t_dma - t_uva, t_uva), (-t_uva, t_m + t_uva), (t_cb, 0.0)]
    best_y, best_value = 1.0, math.inf
    for y in sorted(_crossings(lines, 0.0, 1.0)):
        value = n * max(a * y + b for a, b in lines)
        if value < best_value * (1.0 - _RELATIVE_TIE):
            best_y, best_value = y, value
    x = math.inf if best_y == 0.0 else (1.0 - best_y) / best_y
    return Eq6Optimum(x=x, cpu_fraction=best_y, value_s=best_value)
