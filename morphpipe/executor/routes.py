"""Which training seeds each route batches: every seed is trained exactly once per epoch, whatever the plan.

The training seeds are shuffled once (seeded) and cut in two: the first `n_cpu * batch_size`
go to the CPU batcher (Route 0: exactly n_cpu full batches), the rest to the GPU batcher
(Route 1: n_gpu batches, the epoch's one short batch last). Each batcher shuffles its own
seeds every epoch, so batches differ from epoch to epoch while the two sets stay disjoint
and together cover the split. An all-CPU plan gives Route 0 every seed (short batch included).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from morphpipe.sampling.epochs import batches_per_epoch


@dataclass(frozen=True)
class RouteSeeds:
    """The seeds of Route 0 (CPU batching) and Route 1 (GPU batching)."""

    cpu: torch.Tensor
    gpu: torch.Tensor


def route_seeds(seeds: torch.Tensor, batch_size: int, n_cpu: int, num_batches: int, seed: int = 0) -> RouteSeeds:
    """Splits `seeds` so Route 0 makes `n_cpu` full batches and Route 1 the other `num_batches - n_cpu`."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size!r}")
    expected = batches_per_epoch(seeds.numel(), batch_size)
    if num_batches != expected:
        raise ValueError(
            f"the plan has num_batches={num_batches}, but {seeds.numel()} training seeds in batches of {batch_size} "
            f"make {expected}; plan for this dataset and batch size (morphpipe tune, or train --auto)"
        )
    if not 0 <= n_cpu <= num_batches:
        raise ValueError(f"n_cpu must be in [0, {num_batches}], got {n_cpu!r}")
    order = seeds[torch.randperm(seeds.numel(), generator=torch.Generator().manual_seed(int(seed)))]
    cut = seeds.numel() if n_cpu == num_batches else n_cpu * batch_size
    return RouteSeeds(order[:cut].clone(), order[cut:].clone())
