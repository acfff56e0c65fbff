"""The disk as a measured resource for features on disk: its random-read rate at the feature store's queue depth,
its sequential rate, and the hit ratio of a static hot-row cache as a function of its size (from presampled
batches). Not yet part of the Profile JSON nor the planner's model (issue 21, section 3)."""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

from morphpipe import native
from morphpipe.data.feature_store import hotness_order
from morphpipe.numeric import check_float, check_int
from morphpipe.sampling.cpu_batcher import sample_neighbors
from morphpipe.sampling.epochs import epoch_order

PAGE = 4096  # what a buffered pread of one row fetches from the disk at least


@dataclass(frozen=True)
class DiskReadFacts:
    """O_DIRECT read rates measured on one file: random `block`-byte reads, `queue_depth` in flight, and
    sequential reads of `sequential_block` bytes."""

    path: str
    block: int
    queue_depth: int
    random_reads_per_s: float
    sequential_bytes_per_s: float
    sequential_block: int

    @property
    def random_bytes_per_s(self) -> float:
        return self.random_reads_per_s * self.block

    def to_dict(self) -> dict:
        return asdict(self)


def measure_disk_reads(path: str | os.PathLike, queue_depth: int, seconds: float = 2.0, block: int = PAGE,
                       sequential_block: int = 4 << 20) -> DiskReadFacts:
    """Measures the disk under `path` (best a file larger than the disk's own cache) for about 2 x `seconds`."""
    queue_depth = check_int("queue_depth", queue_depth, 1)
    seconds = check_float("seconds", seconds, 0.0, above=True)
    extension = native.load()
    reads, _, elapsed = extension.measure_random_reads(str(path), check_int("block", block, PAGE), queue_depth,
                                                       seconds)
    _, sequential_bytes, sequential_elapsed = extension.measure_sequential_reads(
        str(path), check_int("sequential_block", sequential_block, PAGE), seconds)
    return DiskReadFacts(str(path), block, queue_depth, reads / elapsed, sequential_bytes / sequential_elapsed,
                         sequential_block)


def hit_ratio_by_cache_size(hotness: torch.Tensor, gathered: Sequence[torch.Tensor],
                            cache_rows: Sequence[int]) -> list[float]:
    """Share of the rows in `gathered` (each batch's input nodes) that a static cache of the `k` hottest rows by
    `hotness` would serve, for every k in `cache_rows`."""
    num_rows = hotness.numel()
    rank = torch.empty(num_rows, dtype=torch.int64)
    rank[hotness_order(hotness)] = torch.arange(num_rows)  # the k hottest rows are those of rank < k
    ranks = torch.sort(torch.cat([rank[ids] for ids in gathered])).values
    total = ranks.numel()
    if total == 0:
        return [0.0 for _ in cache_rows]
    counts = torch.searchsorted(ranks, torch.tensor([check_int("cache_rows", k, 0) for k in cache_rows]))
    return [int(count) / total for count in counts]


def presampled_hit_ratios(graph, fanouts: Sequence[int], batch_size: int, num_batches: int,
                          cache_rows: Sequence[int], seed: int = 0) -> list[float]:
    """`hit_ratio_by_cache_size` of an in-degree cache over the first `num_batches` batches of epoch 0."""
    order = epoch_order(graph.train_idx, seed, 0)
    gathered = [sample_neighbors(graph, order[start:start + batch_size], fanouts, seed=seed + index).input_nodes
                for index, start in enumerate(range(0, min(order.numel(), num_batches * batch_size), batch_size))]
    return hit_ratio_by_cache_size(graph.indptr[1:] - graph.indptr[:-1], gathered, cache_rows)
