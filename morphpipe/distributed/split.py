"""How an epoch's training seeds are split across ranks: equal step counts, local batches in proportion to weights.

Every epoch the training seeds are shuffled with the run's common seed (the single-process order,
`epoch_order`) and cut into global steps of `global_batch` seeds, the last one short. Step k's
seeds are cut again between the ranks, in rank order: rank r takes `local_batches[r]` of a full
step and `last_batches[r]` of the short one. So every rank runs the same number of steps (DDP's
all-reduce needs that), the union of the ranks' step-k batches is the single-process batch k,
and every training seed is trained exactly once per epoch over all ranks.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from morphpipe.sampling.epochs import epoch_order

SPLIT_MODES = ("weighted", "even")


def apportion(total: int, weights: Sequence[float], minimum: int = 1) -> list[int]:
    """`total` cut in proportion to `weights` (largest remainder), each part at least `minimum`."""
    if not weights or any(not math.isfinite(w) or w <= 0 for w in weights):
        raise ValueError(f"weights must be finite numbers > 0 (one per rank), got {list(weights)!r}")
    if total < minimum * len(weights):
        raise ValueError(f"cannot give each of {len(weights)} ranks at least {minimum} of {total} seeds")
    scale = total / sum(weights)
    quotas = [w * scale for w in weights]
    parts = [max(minimum, math.floor(q)) for q in quotas]
    by_remainder = sorted(range(len(weights)), key=lambda r: (-(quotas[r] - math.floor(quotas[r])), r))
    index = 0
    while sum(parts) < total:
        parts[by_remainder[index % len(parts)]] += 1
        index += 1
    while sum(parts) > total:
        largest = max((r for r in range(len(parts)) if parts[r] > minimum), key=lambda r: (parts[r] - quotas[r], r))
        parts[largest] -= 1
    return parts


@dataclass(frozen=True)
class SeedSplit:
    """Per-rank local batch sizes of an epoch of `num_seeds` seeds in global steps of `global_batch`."""

    num_seeds: int
    global_batch: int
    local_batches: tuple[int, ...]
    last_batches: tuple[int, ...]
    mode: str

    @classmethod
    def make(cls, num_seeds: int, global_batch: int, weights: Sequence[float], mode: str = "weighted") -> SeedSplit:
        """Local batches in proportion to `weights` ('weighted') or equal ('even'); each rank >= 1 seed per step."""
        if mode not in SPLIT_MODES:
            raise ValueError(f"split must be one of {SPLIT_MODES}, got {mode!r}")
        world = len(weights)
        if global_batch < world:
            raise ValueError(f"the global batch ({global_batch} seeds per step) must give each of the {world} ranks at "
                             "least one seed; raise --batch-size or use fewer ranks")
        if num_seeds < 1:
            raise ValueError(f"num_seeds must be >= 1, got {num_seeds!r}")
        shares = list(weights) if mode == "weighted" else [1.0] * world
        local = apportion(global_batch, shares)
        steps = math.ceil(num_seeds / global_batch)
        last = num_seeds - (steps - 1) * global_batch
        if last < world:
            raise ValueError(f"{num_seeds} training seeds in global steps of {global_batch} leave {last} seeds for the "
                             f"last step, fewer than the {world} ranks (each must train in every step); choose a "
                             "--batch-size that leaves a longer last step")
        last_local = local if last == global_batch else apportion(last, local)
        return cls(num_seeds, global_batch, tuple(local), tuple(last_local), mode)

    @property
    def world_size(self) -> int:
        return len(self.local_batches)

    @property
    def steps(self) -> int:
        """Steps per epoch: the same on every rank."""
        return math.ceil(self.num_seeds / self.global_batch)

    def step_total(self, step: int) -> int:
        """Seeds in global step `step` over all ranks: what the loss is normalised by."""
        return self.global_batch if step < self.steps - 1 else self.num_seeds - (self.steps - 1) * self.global_batch

    def rank_sizes(self, rank: int) -> list[int]:
        """Rank `rank`'s batch size at every step."""
        return [self.local_batches[rank]] * (self.steps - 1) + [self.last_batches[rank]]

    def rank_seeds(self, seeds: torch.Tensor, seed: int, epoch: int, rank: int) -> torch.Tensor:
        """Rank `rank`'s seeds of epoch `epoch`, its batches one after the other (full batches, then the short one)."""
        if seeds.numel() != self.num_seeds:
            raise ValueError(f"the split is for {self.num_seeds} seeds, got {seeds.numel()}")
        order = epoch_order(seeds, seed, epoch)
        full = (self.steps - 1) * self.global_batch
        start = sum(self.local_batches[:rank])
        body = order[:full].view(self.steps - 1, self.global_batch)[:, start:start + self.local_batches[rank]]
        tail_start = full + sum(self.last_batches[:rank])
        tail = order[tail_start:tail_start + self.last_batches[rank]]
        return torch.cat([body.reshape(-1), tail])

    def describe(self) -> str:
        """One line: the mode, steps and local batch sizes."""
        return (f"{self.mode} split: {self.steps} steps of {self.global_batch} seeds; local batches "
                + "/".join(str(b) for b in self.local_batches)
                + (f" (last step " + "/".join(str(b) for b in self.last_batches) + ")"
                   if self.last_batches != self.local_batches else ""))


def check_exactly_once(counts: torch.Tensor, epoch: int) -> None:
    """Raises unless every training seed was trained once in epoch `epoch` (`counts`: per seed, over all ranks)."""
    wrong = torch.nonzero(counts != 1).flatten()
    if wrong.numel():
        examples = ", ".join(f"seed #{int(i)} x{int(counts[i])}" for i in wrong[:5])
        raise RuntimeError(f"epoch {epoch + 1}: {wrong.numel()} training seeds were not trained exactly once over "
                           f"all ranks ({examples}); this is a bug in the distributed split")
