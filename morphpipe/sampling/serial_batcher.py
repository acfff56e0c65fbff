"""Route 0 for plans whose batching and training take turns on the same cores: batches built on demand.

A CPU-only plan with `shares_cores` batches with every core, then trains with every core, in
turns. The C++ CpuBatcher's threads build ahead in the background, which would overlap (and
oversubscribe) training; this batcher builds each batch only when asked, on the caller's
thread, with `sample_neighbors` (whose feature gather uses the caller's OpenMP threads), and
nothing runs between calls. Epochs visit the seeds in CpuBatcher's order for the same seed.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from morphpipe.data import GraphStore
from morphpipe.sampling.batcher import SeedBatcher
from morphpipe.sampling.cpu_batcher import sample_neighbors
from morphpipe.sampling.epochs import batch_seeds, epoch_seed
from morphpipe.sampling.minibatch import MiniBatch


class SerialBatcher(SeedBatcher):
    """Epoch iterator that samples and gathers each batch on the calling thread, when it is asked for."""

    route = 0

    def __init__(self, graph: GraphStore, fanouts: Sequence[int], batch_size: int, *, seeds: torch.Tensor | None = None,
                 shuffle: bool = True, seed: int = 0) -> None:
        super().__init__(graph, fanouts, batch_size, seeds, shuffle, False, seed)

    def epoch(self, epoch: int) -> Iterator[MiniBatch]:
        """The batches of epoch `epoch`, each built when `next()` asks for it."""
        return self.epoch_from(epoch, 0)

    def epoch_from(self, epoch: int, first: int) -> Iterator[MiniBatch]:
        """As `epoch`, from batch `first` on."""
        return self._build_each(epoch, self.check_first(first))

    def _build_each(self, epoch: int, first: int) -> Iterator[MiniBatch]:
        order = self.epoch_order(epoch)
        sampling_seed = epoch_seed(self.seed, epoch)
        for index in range(first, len(self)):
            seeds = batch_seeds(order, index, self.batch_size)
            batch = sample_neighbors(self.graph, seeds, self.fanouts, seed=epoch_seed(sampling_seed, index))
            batch.batch_index = index
            yield batch

    def close(self) -> None:
        """Nothing runs between calls."""
