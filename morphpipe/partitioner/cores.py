"""Core splitting for CPU-only machines: batching threads versus training threads.

Without a GPU both phases run on the CPU, so the planning problem has one device: batching
throughput grows with the batching threads P, the training step gets faster with the training
threads Q = cores - P. The lower bound of an epoch is n * max(T_CB(P), T_M(Q)); all P in
[1, cores - 1] are enumerated exactly (cores are few). The phases may also take turns on all
the cores (batch with every core, then train with every core): the bound is then
n * (T_CB(cores) + T_M(cores)). Turn-taking wins when batching is a small fraction of the
work and training scales with threads, and it is the only choice on a single core.
"""
from __future__ import annotations

from dataclasses import dataclass

from morphpipe.profiler.profile import Profile


@dataclass(frozen=True)
class CoreSplit:
    """Batching threads, training threads, whether the phases take turns on shared cores, and the bound."""

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
    serial = profile.cpu_batching.per_batch_time(cores, cores) + profile.cpu_training.per_batch_time(cores, cores)
    splits = [CoreSplit(cores, cores, True, n * serial)]
    for batch_threads in range(1, cores):
        train_threads = cores - batch_threads
        bound = n * max(profile.cpu_batching.per_batch_time(batch_threads, cores),
                        profile.cpu_training.per_batch_time(train_threads, cores))
        splits.append(CoreSplit(batch_threads, train_threads, False, bound))
    return sorted(splits, key=lambda s: (s.lower_bound_s, s.batch_threads))


def even_core_split(cores: int) -> CoreSplit:
    """The even-split baseline: half the cores batch, the rest train (taking turns on a single core); no bound."""
    batch_threads = max(1, cores // 2)
    return CoreSplit(batch_threads, max(1, cores - batch_threads), cores == 1, 0.0)
