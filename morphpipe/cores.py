"""How many CPU cores this process may use: the affinity mask, capped by a cgroup CPU quota.

Everything that picks a default thread count (batching, dataset generation, training, the
planner's machine facts) asks here, so a container limited to 2 of 64 cores runs 2 threads.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

import psutil


def usable_cores() -> int:
    """Cores this process may run on: the default thread count for batching and generation."""
    return usable_cores_with_notes(psutil.cpu_count(logical=True) or os.cpu_count() or 1)[0]


def usable_cores_with_notes(logical: int) -> tuple[int, list[str]]:
    """Cores this process may run on: the affinity mask, further capped by a cgroup CPU quota."""
    notes: list[str] = []
    usable = logical
    if hasattr(os, "sched_getaffinity"):
        usable = len(os.sched_getaffinity(0))
        if usable < logical:
            notes.append(f"CPU affinity allows {usable} of {logical} logical cores")
    quota = _cgroup_cpu_quota()
    if quota is not None and quota < usable:
        notes.append(f"cgroup CPU quota allows {quota} cores of the {usable} in the affinity mask")
        usable = quota
    return max(1, usable), notes


def _cgroup_cpu_quota() -> int | None:
    """Whole cores allowed by a cgroup v2 `cpu.max` or v1 CFS quota, None when unlimited or unknown."""
    v2 = Path("/sys/fs/cgroup/cpu.max")
    try:
        if v2.exists():
            quota, period = v2.read_text().split()[:2]
            return None if quota == "max" else max(1, math.ceil(int(quota) / int(period)))
        v1_quota = Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us")
        v1_period = Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us")
        if v1_quota.exists() and v1_period.exists():
            quota_us = int(v1_quota.read_text())
            return None if quota_us <= 0 else max(1, math.ceil(quota_us / int(v1_period.read_text())))
    except (OSError, ValueError):
        return None
    return None
