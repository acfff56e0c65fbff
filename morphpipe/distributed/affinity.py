"""Ranks on one node split its usable cores between them, so each rank's profiler and threads see only its share.

Every rank reports its host and CPU affinity; ranks on the same host that were all given the same
cores (torchrun, `--nproc`, mpirun without binding) take contiguous, near-equal slices of them.
Ranks the launcher already bound to different cores (mpirun's --bind-to core) keep their binding.
"""
from __future__ import annotations

import os
import socket
from collections.abc import Sequence


def current_cores() -> list[int]:
    """The cores this process may run on now."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def whoami() -> tuple[str, list[int]]:
    """What a rank tells the others: its host and its cores."""
    return socket.gethostname(), current_cores()


def rank_cores(peers: Sequence[tuple[str, list[int]]], rank: int) -> list[int]:
    """Rank `rank`'s share of its node's cores, given every rank's (host, cores)."""
    host, cores = peers[rank]
    local = [r for r, (other_host, _) in enumerate(peers) if other_host == host]
    if any(list(peers[r][1]) != list(cores) for r in local):
        return list(cores)
    index, count = local.index(rank), len(local)
    if count > len(cores):
        return [cores[index % len(cores)]]
    start = index * len(cores) // count
    return list(cores[start:(index + 1) * len(cores) // count])


def apply_cores(cores: Sequence[int]) -> None:
    """Pins this process (and the threads it starts later) to `cores`, with one torch thread per core."""
    import torch

    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, set(cores))
    torch.set_num_threads(len(cores))
