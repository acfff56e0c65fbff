"""Route 0 for plans whose batching and training take turns on the same cores: batches built on demand.

A CPU-only plan with `shares_cores` batches with every core, then trains with every core, in
turns. The C++ CpuBatcher's threads build ahead in the background, which would overlap (and
oversubscribe) training; this batcher builds batches only when asked, and nothing runs between
calls. A turn samples `num_threads` batches at once, one per thread (the native sampler runs
outside the GIL), then each batch's feature rows are gathered when it is asked for, on the
caller's thread with its OpenMP threads; so a turn uses every core the step uses, and only the
sampled blocks of the turn's later batches wait in memory. Epochs visit the seeds in
CpuBatcher's order for the same seed, and each batch is the same for any `num_threads`.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import torch

from morphpipe.data import GraphStore
from morphpipe.sampling.batcher import SeedBatcher
from morphpipe.sampling.cpu_batcher import gather_features, sample_blocks
from morphpipe.sampling.epochs import batch_seeds, epoch_seed
from morphpipe.sampling.minibatch import MiniBatch
from morphpipe.sampling.validation import check_positive


class SerialBatcher(SeedBatcher):
    """Epoch iterator that builds batches when they are asked for: `num_threads` batches sampled at once, one per
    thread, each gathered on the calling thread when its turn comes."""

    route = 0

    def __init__(self, graph: GraphStore, fanouts: Sequence[int], batch_size: int, *, seeds: torch.Tensor | None = None,
                 shuffle: bool = True, seed: int = 0, num_threads: int = 1) -> None:
        super().__init__(graph, fanouts, batch_size, seeds, shuffle, False, seed)
        self.num_threads = check_positive("num_threads", num_threads)

    def epoch(self, epoch: int) -> Iterator[MiniBatch]:
        """The batches of epoch `epoch`, each built when `next()` asks for it."""
        return self.epoch_from(epoch, 0)

    def epoch_from(self, epoch: int, first: int) -> Iterator[MiniBatch]:
        """As `epoch`, from batch `first` on."""
        return self._build_each(epoch, self.check_first(first))

    def _build_each(self, epoch: int, first: int) -> Iterator[MiniBatch]:
        order = self.epoch_order(epoch)
        sampling_seed = epoch_seed(self.seed, epoch)

        def sample(index: int) -> MiniBatch:
            batch = sample_blocks(self.graph, batch_seeds(order, index, self.batch_size), self.fanouts,
                                  seed=epoch_seed(sampling_seed, index))
            batch.batch_index = index
            return batch

        indices = range(first, len(self))
        if self.num_threads == 1:
            yield from map(self._gathered, map(sample, indices))
            return
        with ThreadPoolExecutor(self.num_threads, thread_name_prefix="node-batch") as pool:
            for start in range(0, len(indices), self.num_threads):
                turn = list(pool.map(sample, indices[start:start + self.num_threads]))
                while turn:
                    yield self._gathered(turn.pop(0))

    def _gathered(self, batch: MiniBatch) -> MiniBatch:
        """`batch` with its feature rows, gathered now."""
        batch.x = gather_features(self.graph, batch.input_nodes)
        return batch

    def close(self) -> None:
        """Nothing runs between calls."""
