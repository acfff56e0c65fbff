"""A rank's batcher for one route: each epoch, this rank's share of the global steps, in step order.

It keeps the batcher contract (`morphpipe.sampling.batcher`) by wrapping an ordinary batcher
(CpuBatcher, SerialBatcher or GpuBatcher, built with shuffle=False) and handing it, before each
epoch, the seeds of this rank's batches on its route: Route 0 takes the rank's first `n_cpu`
steps, Route 1 the rest (the short last step included), as `route_seeds` does in one process.
Its batches are therefore steps `first`, `first + 1`, ...
"""
from __future__ import annotations

from collections.abc import Iterator

import torch

from morphpipe.distributed.split import SeedSplit
from morphpipe.sampling.batcher import Batcher, SeedBatcher
from morphpipe.sampling.minibatch import MiniBatch


class RankBatcher(Batcher):
    """Steps [first, first + count) of rank `rank`'s epochs, built by `inner` (a shuffle=False batcher)."""

    def __init__(self, inner: SeedBatcher, split: SeedSplit, rank: int, train_seeds: torch.Tensor, seed: int,
                 first: int, count: int) -> None:
        if inner.shuffle:
            raise ValueError("RankBatcher needs an inner batcher built with shuffle=False (the split shuffles)")
        if inner.batch_size != split.local_batches[rank]:
            raise ValueError(f"the inner batcher's batch_size is {inner.batch_size}, rank {rank}'s local batch is "
                             f"{split.local_batches[rank]}")
        self.inner = inner
        self.split = split
        self.rank = rank
        self.train_seeds = train_seeds
        self.seed = seed
        self.first = first
        self.count = count

    def __len__(self) -> int:
        return self.count

    def epoch_seeds(self, epoch: int) -> torch.Tensor:
        """This route's seeds of epoch `epoch` on this rank, its batches one after the other."""
        seeds = self.split.rank_seeds(self.train_seeds, self.seed, epoch, self.rank)
        start = self.first * self.split.local_batches[self.rank]
        end = start + sum(self.split.rank_sizes(self.rank)[self.first:self.first + self.count])
        return seeds[start:end]

    def epoch(self, epoch: int) -> Iterator[MiniBatch]:
        self.inner.seeds = self.inner.check_units(self.epoch_seeds(epoch))
        return self.inner.epoch(epoch)

    def close(self) -> None:
        self.inner.close()
