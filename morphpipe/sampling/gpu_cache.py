"""DUCATI's dual GPU cache: one memory budget split between hot neighbour lists and hot feature rows.

Route 1 reads topology and features over PCIe from pinned host memory; whatever sits in device
memory instead is read at device bandwidth. Which nodes are worth caching depends on how often
each is read (hotness) and on how many PCIe bytes a read costs against how many device bytes it
occupies. Hotness comes from the graph (how many neighbour lists hold a node: how many
destinations can sample it) or from a short pre-sampling pass (DUCATI). `plan_cache` ranks every
candidate (a node's feature row, a node's neighbour list) by PCIe bytes saved per cached byte and
fills the budget greedily; `GpuCache` materialises a plan in device memory and reports the bytes
it holds, which never exceed the budget.

PCIe cost model of one read over UVA: requests move whole 32-byte sectors, so a feature row costs
its size rounded up to sectors; a neighbour-list read costs one sector for the indptr pair plus
one sector per sampled neighbour (random offsets), or the list rounded up to sectors when all of
it is taken.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from morphpipe.sampling.minibatch import MiniBatch
from morphpipe.sampling.store_rows import StoreRows

SECTOR_BYTES = 32
SLOT_BYTES = 4  # int32 slot per node in each cached kind's lookup table
INDPTR_BYTES = 8
HOTNESS_SOURCES = ("degree", "presample")


@dataclass(frozen=True)
class CacheConfig:
    """How much device memory the cache may use, how it is split, and where hotness comes from."""

    budget_bytes: int = 0
    adjacency_fraction: float | None = None  # share of the budget for neighbour lists; None: by bytes saved
    hotness: str = "degree"  # "degree": occurrences in neighbour lists; "presample": a short sampling pass
    presample_batches: int = 8

    def __post_init__(self) -> None:
        if isinstance(self.budget_bytes, bool) or not isinstance(self.budget_bytes, int) or self.budget_bytes < 0:
            raise ValueError(f"cache budget_bytes={self.budget_bytes!r}: give the device bytes the cache may use, "
                             ">= 0 (0 disables the cache)")
        if self.adjacency_fraction is not None and not 0.0 <= self.adjacency_fraction <= 1.0:
            raise ValueError(f"cache adjacency_fraction={self.adjacency_fraction!r}: give the share of the budget "
                             "for neighbour lists in [0, 1], or None to split by expected PCIe bytes saved")
        if self.hotness not in HOTNESS_SOURCES:
            raise ValueError(f"cache hotness={self.hotness!r}: use one of {HOTNESS_SOURCES}")
        if isinstance(self.presample_batches, bool) or not isinstance(self.presample_batches, int) \
                or self.presample_batches < 1:
            raise ValueError(f"cache presample_batches={self.presample_batches!r}: expected a positive integer")


@dataclass(frozen=True)
class CachePlan:
    """Which nodes' feature rows and neighbour lists to cache, hottest first, and the device bytes each part takes."""

    feature_nodes: torch.Tensor  # int64
    adjacency_nodes: torch.Tensor  # int64
    feature_bytes: int  # cached rows
    adjacency_bytes: int  # cached indptr + neighbour lists
    slot_bytes: int  # the int32 [num_nodes] lookup table of each cached kind
    budget_bytes: int
    expected_saved_bytes: float  # PCIe bytes saved per unit of hotness (same units as the hotness counts)

    @classmethod
    def empty(cls, budget_bytes: int = 0) -> "CachePlan":
        """Nothing cached."""
        none = torch.empty(0, dtype=torch.int64)
        return cls(none, none, 0, 0, 0, budget_bytes, 0.0)

    @property
    def total_bytes(self) -> int:
        return self.feature_bytes + self.adjacency_bytes + self.slot_bytes

    def describe(self) -> str:
        return (f"GPU cache: {self.feature_nodes.numel():,} feature rows ({self.feature_bytes:,} B), "
                f"{self.adjacency_nodes.numel():,} neighbour lists ({self.adjacency_bytes:,} B), lookup tables "
                f"{self.slot_bytes:,} B; {self.total_bytes:,} of {self.budget_bytes:,} B used")


def sectors(nbytes: torch.Tensor) -> torch.Tensor:
    """Bytes moved over PCIe to read `nbytes` contiguous bytes: whole 32-byte sectors."""
    return torch.div(nbytes + SECTOR_BYTES - 1, SECTOR_BYTES, rounding_mode="floor") * SECTOR_BYTES


def list_read_bytes(degrees: torch.Tensor, index_bytes: int, fanout: int) -> torch.Tensor:
    """PCIe bytes of one sampling read of each node's neighbour list (see the module docstring)."""
    take_all = degrees if fanout < 0 else torch.minimum(degrees, torch.full_like(degrees, fanout))
    all_taken = sectors(degrees * index_bytes)
    some_taken = take_all * SECTOR_BYTES
    return SECTOR_BYTES + torch.where(take_all == degrees, all_taken, some_taken)


def representative_fanout(fanouts: Sequence[int]) -> int:
    """The fanout the cost model assumes for a list read: -1 if any hop takes all, else the largest."""
    return -1 if any(f < 0 for f in fanouts) else max(fanouts)


def degree_hotness(indices: torch.Tensor, num_nodes: int, chunk: int = 1 << 24) -> torch.Tensor:
    """int64 [num_nodes]: in how many neighbour lists each node appears (how many destinations can sample it)."""
    counts = torch.zeros(num_nodes, dtype=torch.int64)
    for begin in range(0, indices.numel(), chunk):
        counts += torch.bincount(indices[begin:begin + chunk].to(torch.int64), minlength=num_nodes)
    return counts


def batch_hotness(batches: Iterable[MiniBatch], num_nodes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Counts from sampled batches: how often each node's feature row and its neighbour list were read.

    A node's row is read once per batch it is an input node of; its neighbour list once per hop
    it is a destination of (destinations of a block are the prefix of its sources).
    """
    features = torch.zeros(num_nodes, dtype=torch.int64)
    adjacency = torch.zeros(num_nodes, dtype=torch.int64)
    for batch in batches:
        input_nodes = batch.input_nodes.cpu()
        features.index_add_(0, input_nodes, torch.ones_like(input_nodes))
        for block in batch.blocks:
            destinations = input_nodes[:block.num_dst]
            adjacency.index_add_(0, destinations, torch.ones_like(destinations))
    return features, adjacency


@dataclass(frozen=True)
class _Candidates:
    """One kind of cache entry: per candidate node its cost in device bytes and PCIe bytes saved."""

    nodes: torch.Tensor
    cost: torch.Tensor
    saved: torch.Tensor

    def order(self) -> torch.Tensor:
        """The permutation putting the best PCIe bytes saved per device byte first (ties: stored order)."""
        density = self.saved.double() / self.cost.double()
        return torch.sort(density, descending=True, stable=True).indices

    def reordered(self, order: torch.Tensor) -> "_Candidates":
        return _Candidates(self.nodes[order], self.cost[order], self.saved[order])

    def ranked(self) -> "_Candidates":
        """Best PCIe bytes saved per device byte first (ties: lower node id first, for determinism)."""
        return self.reordered(self.order())

    def prefix(self, budget: int) -> int:
        """How many of the ranked candidates fit in `budget` bytes."""
        if budget <= 0 or self.nodes.numel() == 0:
            return 0
        return int(torch.searchsorted(torch.cumsum(self.cost, 0), budget, right=True))


def _candidates(hotness: torch.Tensor, cost: torch.Tensor, read_bytes: torch.Tensor) -> _Candidates:
    hot = torch.nonzero(hotness > 0).flatten()
    return _Candidates(hot, cost[hot], hotness[hot].double() * read_bytes[hot].double()).ranked()


def plan_cache(
    feature_hotness: torch.Tensor,
    adjacency_hotness: torch.Tensor,
    degrees: torch.Tensor,
    *,
    row_bytes: int,
    index_bytes: int,
    fanouts: Sequence[int],
    budget_bytes: int,
    adjacency_fraction: float | None = None,
) -> CachePlan:
    """The feature rows and neighbour lists to cache within `budget_bytes` (see the module docstring).

    With `adjacency_fraction` the budget is split in that ratio and each part filled by its own
    ranking; without, every way of using the budget (features only, lists only, both ranked
    together) is evaluated and the one saving the most PCIe bytes is kept. Lookup tables
    (int32 per node) and the cached indptr are counted in the budget.
    """
    num_nodes = degrees.numel()
    if feature_hotness.numel() != num_nodes or adjacency_hotness.numel() != num_nodes:
        raise ValueError(f"hotness: expected [num_nodes] = [{num_nodes}] counts, got "
                         f"{tuple(feature_hotness.shape)} and {tuple(adjacency_hotness.shape)}")
    degrees = degrees.to(torch.int64)
    features = _candidates(feature_hotness.to(torch.int64), torch.full_like(degrees, row_bytes),
                           sectors(torch.full_like(degrees, row_bytes)))
    adjacency = _candidates(adjacency_hotness.to(torch.int64), degrees * index_bytes + INDPTR_BYTES,
                            list_read_bytes(degrees, index_bytes, representative_fanout(fanouts)))
    table = SLOT_BYTES * num_nodes
    adjacency_fixed = table + INDPTR_BYTES  # lookup table and the cached indptr's leading 0

    def build(num_features: int, feature_set: _Candidates, num_lists: int, list_set: _Candidates) -> CachePlan:
        feature_nodes, list_nodes = feature_set.nodes[:num_features], list_set.nodes[:num_lists]
        list_bytes = int(list_set.cost[:num_lists].sum()) + (INDPTR_BYTES if num_lists else 0)
        saved = float(feature_set.saved[:num_features].sum()) + float(list_set.saved[:num_lists].sum())
        return CachePlan(feature_nodes, list_nodes, num_features * row_bytes, list_bytes,
                         table * (int(num_features > 0) + int(num_lists > 0)), budget_bytes, saved)

    if adjacency_fraction is not None:
        list_budget = int(budget_bytes * adjacency_fraction)
        return build(features.prefix(budget_bytes - list_budget - table), features,
                     adjacency.prefix(list_budget - adjacency_fixed), adjacency)
    options = [
        build(features.prefix(budget_bytes - table), features, 0, adjacency),
        build(0, features, adjacency.prefix(budget_bytes - adjacency_fixed), adjacency),
    ]
    both = _Candidates(torch.cat([features.nodes, adjacency.nodes]), torch.cat([features.cost, adjacency.cost]),
                       torch.cat([features.saved, adjacency.saved]))
    is_list = torch.cat([torch.zeros(features.nodes.numel(), dtype=torch.bool),
                         torch.ones(adjacency.nodes.numel(), dtype=torch.bool)])
    order = both.order()
    taken = both.reordered(order).prefix(budget_bytes - table - adjacency_fixed)
    chosen_lists = is_list[order][:taken]
    options.append(build(int((~chosen_lists).sum()), features, int(chosen_lists.sum()), adjacency))
    return max(options, key=lambda plan: (plan.expected_saved_bytes, -plan.total_bytes))


class GpuCache:
    """A CachePlan in device memory: lookup tables (-1: not cached), cached rows and a compact CSC of hot lists."""

    def __init__(self, plan: CachePlan, indptr: torch.Tensor, indices: torch.Tensor, features: torch.Tensor | StoreRows,
                 device: torch.device, chunk_nodes: int = 1 << 20) -> None:
        self.plan = plan
        num_nodes = indptr.numel() - 1
        empty_slots = torch.empty(0, dtype=torch.int32, device=device)
        self.feature_slot = empty_slots
        self.feature_rows = torch.empty((0, features.shape[1]), dtype=features.dtype, device=device)
        if plan.feature_nodes.numel():
            self.feature_slot = _slot_table(plan.feature_nodes, num_nodes, device)
            nodes = plan.feature_nodes
            self.feature_rows = torch.cat([features.index_select(0, nodes[begin:begin + chunk_nodes]).to(device)
                                           for begin in range(0, nodes.numel(), chunk_nodes)])
        self.adjacency_slot = empty_slots
        self.adjacency_indptr = torch.empty(0, dtype=torch.int64, device=device)
        self.adjacency_indices = torch.empty(0, dtype=indices.dtype, device=device)
        if plan.adjacency_nodes.numel():
            nodes = plan.adjacency_nodes
            self.adjacency_slot = _slot_table(nodes, num_nodes, device)
            degrees = indptr[nodes + 1] - indptr[nodes]
            cached_indptr = torch.zeros(nodes.numel() + 1, dtype=torch.int64)
            torch.cumsum(degrees, 0, out=cached_indptr[1:])
            self.adjacency_indptr = cached_indptr.to(device)
            self.adjacency_indices = torch.cat([_lists(indptr, indices, nodes[begin:begin + chunk_nodes]).to(device)
                                                for begin in range(0, nodes.numel(), chunk_nodes)])
        if self.bytes_used > plan.budget_bytes:
            raise AssertionError(f"GPU cache holds {self.bytes_used} B, over its budget {plan.budget_bytes} B")

    @property
    def bytes_used(self) -> int:
        """Device bytes the cache holds (lookup tables, rows, cached CSC)."""
        tensors = (self.feature_slot, self.feature_rows, self.adjacency_slot, self.adjacency_indptr,
                   self.adjacency_indices)
        return sum(t.numel() * t.element_size() for t in tensors)


def _slot_table(nodes: torch.Tensor, num_nodes: int, device: torch.device) -> torch.Tensor:
    """int32 [num_nodes] on `device`: the cache row of each node in `nodes`, -1 elsewhere."""
    table = torch.full((num_nodes,), -1, dtype=torch.int32)
    table[nodes] = torch.arange(nodes.numel(), dtype=torch.int32)
    return table.to(device)


def _lists(indptr: torch.Tensor, indices: torch.Tensor, nodes: torch.Tensor) -> torch.Tensor:
    """The neighbour lists of `nodes`, concatenated in that order."""
    begins = indptr[nodes]
    degrees = indptr[nodes + 1] - begins
    starts = torch.repeat_interleave(begins - (torch.cumsum(degrees, 0) - degrees), degrees)
    positions = starts + torch.arange(int(degrees.sum()), dtype=torch.int64)
    return indices[positions]
