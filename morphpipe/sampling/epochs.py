"""What an epoch is, for every batcher (CPU, GPU, serial, virtual): its seed, its seed order, its batch count.

Sharing these keeps the routes interchangeable: the same run seed visits the same seeds in the same
batches whichever batcher builds them.
"""
from __future__ import annotations

import math
from typing import Any

import torch


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

