"""Core splitting for CPU-only machines: batching threads versus training threads.

Without a GPU both phases run on the CPU, so the planning problem has one device: batching
throughput grows with the batching threads P, the training step gets faster with the training
threads Q = cores - P. The lower bound of an epoch is n * max(T_CB(P), T_M(Q)); all P in
[1, cores - 1] are enumerated exactly (cores are few). With a single core the two phases take
turns on it and the bound is n * (T_CB(1) + T_M(1)).
"""
from __future__ import annotations

from dataclasses import dataclass

from morphpipe.profiler.profile import Profile


@dataclass(frozen=True)
class CoreSplit:
    """Batching threads, training threads, whether they share one core, and the epoch lower bound."""

    batch_threads: int
    train_threads: int
    shared_core: bool
    lower_bound_s: float


def split_cores(profile: Profile, cores: int | None = None) -> list[CoreSplit]:
    """Every core split of a CPU-only profile, best lower bound first (ties: more training threads)."""
    if profile.device != "cpu" or profile.cpu_training is None:
        raise ValueError("split_cores needs a CPU-only profile (device 'cpu' with cpu_training)")
    cores = profile.cores if cores is None else cores
    if cores < 1:
        raise ValueError(f"cores must be >= 1, got {cores!r}")
    n = profile.num_batches
    if cores == 1:
        serial = profile.cpu_batching.per_batch_time(1) + profile.cpu_training.per_batch_time(1)
        return [CoreSplit(1, 1, True, n * serial)]
    splits = []
    for batch_threads in range(1, cores):
        train_threads = cores - batch_threads
        bound = n * max(profile.cpu_batching.per_batch_time(batch_threads, cores),
                        profile.cpu_training.per_batch_time(train_threads, cores))
        splits.append(CoreSplit(batch_threads, train_threads, False, bound))
    return sorted(splits, key=lambda s: (s.lower_bound_s, s.batch_threads))
