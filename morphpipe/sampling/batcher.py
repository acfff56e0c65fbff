"""The batcher contract: what every batcher (CPU, GPU, serial, a rank's share) promises whoever trains on it.

A batcher makes the mini-batches of one route's seeds, one epoch at a time:

- `len(batcher)` is the number of batches per epoch, the same every epoch;
- `batcher.epoch(k)` yields epoch k's batches in order (`batch_index` 0, 1, ...), every seed in
  exactly one of them; asking for epoch k again replays it (same seeds in the same batches);
  starting an epoch stops any epoch in progress;
- `batcher.epoch_from(k, first)` yields epoch k's batches `first`, `first + 1`, ... (the same batches as
  `epoch(k)` from there on): a resumed epoch continues where a stopped one left off;
- `iter(batcher)` starts the next epoch (0, 1, 2, ... in turn);
- `close()` stops whatever builds batches in the background; a later `epoch(k)` starts afresh;
  a batcher is a context manager that closes on leaving the block.

`Batcher` states the contract (like torch's `Sampler`): subclasses give `len`, `epoch` and `close`.
`SeedBatcher` is the batcher over a seed set of a graph that CpuBatcher, GpuBatcher and
SerialBatcher share: validated seeds and sizes, and every batcher's epoch order.
"""
from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

import torch

from morphpipe.data import GraphStore
from morphpipe.numeric import check_int
from morphpipe.sampling.epochs import batches_per_epoch, check_files, epoch_order, note_first_use
from morphpipe.sampling.minibatch import MiniBatch
from morphpipe.sampling.validation import check_fanouts, check_positive, check_seed_ids


class Batcher:
    """The contract of the module docstring: `len`, `epoch(k)`, `close()`; `iter` and `with` come with it."""

    _next_epoch = 0

    def __len__(self) -> int:
        """Batches per epoch."""
        raise NotImplementedError

    def epoch(self, epoch: int) -> Iterator[MiniBatch]:
        """Epoch `epoch`'s batches, in order, every seed in exactly one."""
        raise NotImplementedError

    def epoch_from(self, epoch: int, first: int) -> Iterator[MiniBatch]:
        """Epoch `epoch`'s batches from batch `first` on. This default builds and drops the ones before `first`;
        batchers that can start at any batch override it."""
        return itertools.islice(self.epoch(epoch), self.check_first(first), None)

    def check_first(self, first: int) -> int:
        """`first` as the index of an epoch's first batch to build: in [0, len(self)] (len: none left)."""
        return check_int("first", first, 0, len(self))

    def close(self) -> None:
        """Stops whatever builds batches in the background."""
        raise NotImplementedError

    def __iter__(self) -> Iterator[MiniBatch]:
        """Starts the next epoch."""
        epoch = self._next_epoch
        self._next_epoch = epoch + 1
        return self.epoch(epoch)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class SeedBatcher(Batcher):
    """A batcher over `seeds` of `graph` (default: its train split): validated seeds, fanouts and sizes, and the
    epoch order every batcher shares for the same `seed`. Subclasses implement `epoch(k)` and `close()`."""

    def __init__(self, graph: GraphStore, fanouts: Sequence[int], batch_size: int, seeds: torch.Tensor | None,
                 shuffle: bool, drop_last: bool, seed: int) -> None:
        self.graph = graph
        note_first_use(graph)
        self.fanouts = self.checked_fanouts(fanouts)
        self.batch_size = check_positive("batch_size", batch_size)
        self.seeds = self.check_units(graph.train_idx if seeds is None else seeds)
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.seed = check_int("seed", seed, 0)

    def checked_fanouts(self, fanouts):
        """`fanouts` as this batcher takes them (one count per hop); a typed batcher takes them per relation."""
        return check_fanouts(fanouts)
    def check_units(self, ids: torch.Tensor) -> torch.Tensor:
        """`ids` as this batcher's units (node ids of the graph; an edge batcher: training edge ids), checked."""
        return check_seed_ids(ids, self.graph.num_nodes)

    def __len__(self) -> int:
        """Batches per epoch."""
        return batches_per_epoch(self.seeds.numel(), self.batch_size, self.drop_last)

    def epoch_order(self, epoch: int) -> torch.Tensor:
        """The seeds in the order epoch `epoch` visits them (every batcher's order for the same seed); called at the
        start of every epoch, it first checks that no memory-mapped file of the graph shrank."""
        check_files(self.graph)
        return epoch_order(self.seeds, self.seed, epoch, self.shuffle)
