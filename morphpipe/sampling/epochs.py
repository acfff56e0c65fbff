"""What an epoch is, for every batcher (CPU, GPU, serial, virtual): its seed, its seed order, its batch count.

Sharing these keeps the routes interchangeable: the same run seed visits the same seeds in the same
batches whichever batcher builds them.
"""
from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from morphpipe.sampling.validation import check_fanouts, check_positive, check_seed_ids


def epoch_seed(seed: int, epoch: int) -> int:
    """The seed of one epoch's shuffle and sampling, derived from the run seed."""
    return (int(seed) * 1_000_003 + int(epoch)) % (2**63)


def epoch_order(seeds: torch.Tensor, seed: int, epoch: int, shuffle: bool = True) -> torch.Tensor:
    """`seeds` in the order epoch `epoch` visits them: every batcher shuffles this way, so routes replay alike."""
    if not shuffle:
        return seeds
    generator = torch.Generator().manual_seed(epoch_seed(seed, epoch))
    return seeds[torch.randperm(seeds.numel(), generator=generator)]


def batches_per_epoch(num_seeds: int, batch_size: int, drop_last: bool = False) -> int:
    """Batches in an epoch over `num_seeds` seeds: the last one is short, or dropped with `drop_last`."""
    if drop_last:
        return num_seeds // batch_size
    return math.ceil(num_seeds / batch_size)


def batch_seeds(order: torch.Tensor, index: int, batch_size: int) -> torch.Tensor:
    """The seeds of batch `index` of an epoch that visits `order`."""
    return order[index * batch_size:(index + 1) * batch_size]


def note_first_use(graph: Any) -> None:
    """Lets a graph store warn that it is used unvalidated (other graph types have nothing to say)."""
    note = getattr(graph, "note_first_use", None)
    if note is not None:
        note()


def check_files(graph: Any) -> None:
    """Lets a graph store refuse to go on when a memory-mapped file shrank under it."""
    check = getattr(graph, "check_files", None)
    if check is not None:
        check()


class SeedBatcher:
    """The contract CpuBatcher, GpuBatcher and SerialBatcher share: validated seeds and sizes, `len` (batches per
    epoch), `iter` (starts the next epoch), `epoch_order`, and closing as a context manager.

    Subclasses implement `epoch(k)` (yield epoch k's batches) and `close()`.
    """

    def __init__(self, graph: Any, fanouts: Sequence[int], batch_size: int, seeds: torch.Tensor | None,
                 shuffle: bool, drop_last: bool, seed: int) -> None:
        self.graph = graph
        note_first_use(graph)
        self.fanouts = check_fanouts(fanouts)
        self.batch_size = check_positive("batch_size", batch_size)
        self.seeds = check_seed_ids(graph.train_idx if seeds is None else seeds, graph.num_nodes)
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.seed = int(seed)
        self._next_epoch = 0

    def __len__(self) -> int:
        """Batches per epoch."""
        return batches_per_epoch(self.seeds.numel(), self.batch_size, self.drop_last)

    def __iter__(self) -> Iterator:
        epoch = self._next_epoch
        self._next_epoch += 1
        return self.epoch(epoch)

    def epoch_order(self, epoch: int) -> torch.Tensor:
        """The seeds in the order epoch `epoch` visits them (every batcher's order for the same seed); called at the
        start of every epoch, it first checks that no memory-mapped file of the graph shrank."""
        check_files(self.graph)
        return epoch_order(self.seeds, self.seed, epoch, self.shuffle)

    def epoch(self, epoch: int) -> Iterator:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
