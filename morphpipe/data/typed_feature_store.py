"""A typed graph's features on disk as one store: one FeatureStore per featured node type, read through one shared
pool of I/O threads, their host cache shared by hotness per byte of row (`share_feature_cache`), and the whole seen
as one store whose rows are the featured types' rows one after another (in the graph's type order).

That one-store view is what the profiler, the planner, the trainer's per-epoch read counters and re-planning read
for a homogeneous graph's FeatureStore: counters summed over the types, the reads a set of rows takes counted by
each type's store, the cache a number of bytes buys as the rows `share_feature_cache` gives it, in its order.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from morphpipe.data.feature_store import FeatureStore, FeatureStoreCounters, hotness_order


def share_feature_cache(hotness: Mapping[str, torch.Tensor], row_bytes: Mapping[str, int],
                        cache_bytes: int) -> dict[str, int]:
    """Rows of each type the shared host cache of `cache_bytes` holds: the rows with the most hotness per byte of
    row over all types, taken in that order while they fit (ties: the type listed first, then the lower id).

    A cached row saves about `hotness` reads (its node's share of the sampled neighbours) and costs its width in
    bytes, so ranking by hotness per byte puts each byte of cache where it saves the most reads (the greedy
    answer to this knapsack, within one row of the best); splitting by node count or by file size would give a
    wide, cold type's rows the RAM a narrow, hot type's rows would serve more reads from. Within a type the
    order is `hotness_order`'s, so a FeatureStore given that type's share caches exactly these rows."""
    names = list(hotness)
    if cache_bytes <= 0 or not names:
        return {name: 0 for name in names}
    order, sizes, owner = shared_order(hotness, row_bytes)
    fits = torch.cumsum(sizes[order], 0) <= cache_bytes
    taken = torch.bincount(owner[order[fits]], minlength=len(names))
    return {name: int(taken[index]) for index, name in enumerate(names)}


def cache_density(hotness: Mapping[str, torch.Tensor], row_bytes: Mapping[str, int]) -> torch.Tensor:
    """float64 [rows of every type, one type after another]: each row's hotness per byte, the key the shared cache
    ranks rows by (`hotness_order` of it is `share_feature_cache`'s order)."""
    parts = [hotness[name].double() / row_bytes[name] for name in hotness]
    return torch.cat(parts) if parts else torch.empty(0, dtype=torch.float64)


def shared_order(hotness: Mapping[str, torch.Tensor],
                 row_bytes: Mapping[str, int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(the rows of every type from the hottest per byte down, each row's bytes, each row's type index), rows
    numbered one type after another."""
    names = list(hotness)
    sizes = torch.cat([torch.full((hotness[name].numel(),), row_bytes[name], dtype=torch.int64) for name in names])
    owner = torch.cat([torch.full((hotness[name].numel(),), index, dtype=torch.int64)
                       for index, name in enumerate(names)])
    return hotness_order(cache_density(hotness, row_bytes)), sizes, owner


class TypedFeatureStore:
    """The feature stores of a typed graph's featured node types (`stores`, in type order, the global id of each
    type's first node in `starts`) as one store over their rows, one type after another; `hotness` is each type's
    row hotness the shared cache was split by (HeteroGraphStore.cache_hotness: source degrees, or the workload's
    expected reads).

    Rows of this view: type t's row r is `offsets[t] + r`. `rows_of` turns a batch's global input node ids into
    these rows (nodes of types without features are not read), `count_reads` and `gather` split rows by type,
    `counters` sums the types' counters (the read time: their shared pool's), `rows_cached_by` is the rows a shared
    cache of that many bytes holds (its first rows in `hotness()`'s order), `row_bytes` the mean bytes of a row
    (rounded up)."""

    def __init__(self, stores: Mapping[str, FeatureStore], starts: Mapping[str, int],
                 hotness: Mapping[str, torch.Tensor]) -> None:
        if not stores:
            raise ValueError("TypedFeatureStore needs the store of at least one node type with features")
        self.stores = dict(stores)
        self.starts = {name: int(starts[name]) for name in self.stores}
        self._hotness = {name: hotness[name] for name in self.stores}
        counts = torch.tensor([store.num_rows for store in self.stores.values()], dtype=torch.int64)
        self.offsets = torch.zeros(len(self.stores) + 1, dtype=torch.int64)
        torch.cumsum(counts, 0, out=self.offsets[1:])
        self._row_bytes = {name: store.row_bytes for name, store in self.stores.items()}

    # --- what the profiler and planner read of a FeatureStore ---------------------------------------------------
    @property
    def num_rows(self) -> int:
        return int(self.offsets[-1])

    @property
    def features_bytes(self) -> int:
        return sum(store.num_rows * store.row_bytes for store in self.stores.values())

    @property
    def row_bytes(self) -> int:
        """Mean bytes of a row over the types (rounded up), so that rows x row_bytes covers every type's file."""
        return max(1, -(-self.features_bytes // max(self.num_rows, 1)))

    @property
    def path(self) -> Path:
        """The largest type's file: where the disk is measured."""
        return max(self.stores.values(), key=lambda store: store.num_rows * store.row_bytes).path

    @property
    def io_threads(self) -> int:
        return next(iter(self.stores.values())).io_threads

    @property
    def direct(self) -> bool:
        return all(store.direct for store in self.stores.values())

    @property
    def reader(self) -> str:
        return next(iter(self.stores.values())).reader

    @property
    def num_cached(self) -> int:
        return sum(store.num_cached for store in self.stores.values())

    @property
    def cache_bytes(self) -> int:
        return sum(store.cache_bytes for store in self.stores.values())

    def hotness(self) -> torch.Tensor:
        """Each row's hotness per byte, the order the shared cache takes rows in (`hotness_order` of it)."""
        return cache_density(self._hotness, self._row_bytes)

    def rows_cached_by(self, cache_bytes: int) -> int:
        """Rows a shared cache of `cache_bytes` holds: the first that many in `hotness()`'s order."""
        return sum(share_feature_cache(self._hotness, self._row_bytes, int(cache_bytes)).values())

    def cached_by_type(self, cache_bytes: int) -> dict[str, int]:
        """Rows of each type a shared cache of `cache_bytes` holds."""
        return share_feature_cache(self._hotness, self._row_bytes, int(cache_bytes))

    def rows_of(self, nodes: torch.Tensor) -> torch.Tensor:
        """This view's rows of global node ids `nodes` (those of types with features, in their order)."""
        nodes = torch.as_tensor(nodes).long()
        parts = []
        for index, (name, store) in enumerate(self.stores.items()):
            start = self.starts[name]
            inside = nodes[(nodes >= start) & (nodes < start + store.num_rows)]
            parts.append(inside - start + self.offsets[index])
        return torch.cat(parts)

    def _by_type(self, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each type's local row ids among `rows` (this view's rows), in their order; types not touched left out."""
        rows = torch.as_tensor(rows).long()
        owner = torch.searchsorted(self.offsets, rows, right=True) - 1
        parts = {name: rows[owner == index] - self.offsets[index] for index, name in enumerate(self.stores)}
        return {name: local for name, local in parts.items() if local.numel()}

    def count_reads(self, rows: torch.Tensor) -> tuple[int, int]:
        """The (reads, bytes) rows `rows` would take were none cached, each type's counted by its store."""
        counted = [self.stores[name].count_reads(local) for name, local in self._by_type(rows).items()]
        return sum(reads for reads, _ in counted), sum(size for _, size in counted)

    def gather(self, rows: torch.Tensor) -> list[torch.Tensor]:
        """Rows `rows` read type after type: each touched type's rows (in `rows`' order within the type)."""
        return [self.stores[name].gather(local) for name, local in self._by_type(rows).items()]

    def shares_one_pool(self) -> bool:
        """True when every type's store reads through one pread pool (its timer then times all their reads)."""
        first, *others = [store.native for store in self.stores.values()]
        return self.reader == "pread" and all(first.shares_io_with(other) for other in others)

    def counters(self) -> FeatureStoreCounters:
        """The types' counters summed; the read time is their shared pool's (reads of several types side by side,
        from several batching threads, counted once: the time the disk was held for them all), or with io_uring
        (a ring per gather, no pool) the types' read times summed."""
        parts = [store.counters() for store in self.stores.values()]
        summed = {name: sum(getattr(part, name) for part in parts)
                  for name in ("hits", "misses", "reads", "bytes_read", "read_seconds", "read_gathers")}
        if self.shares_one_pool():
            summed["read_seconds"] = next(iter(self.stores.values())).native.pool_read_ns() * 1e-9
        return FeatureStoreCounters(**summed)

    def reset_counters(self) -> None:
        for store in self.stores.values():
            store.reset_counters()
        next(iter(self.stores.values())).native.reset_pool_read_ns()

    def twin(self, *, io_threads: int | None = None, cached_rows: torch.Tensor | None = None) -> TypedFeatureStore:
        """The same files read the same way through a new shared pool of `io_threads` I/O threads (None: this one's),
        caching `cached_rows` (this view's rows; None: none)."""
        cached = {} if cached_rows is None else self._by_type(cached_rows)
        shared, twins = None, {}
        for name, store in self.stores.items():
            twins[name] = store.twin(io_threads=io_threads, cached_rows=cached.get(name), shares_io_with=shared)
            if shared is None and twins[name].reader == "pread":
                shared = twins[name]
        return TypedFeatureStore(twins, self.starts, self._hotness)

    def describe_reader(self) -> str:
        return next(iter(self.stores.values())).describe_reader() + f", shared by {len(self.stores)} node type(s)"

    def __repr__(self) -> str:
        return f"TypedFeatureStore({', '.join(f'{name}: {store!r}' for name, store in self.stores.items())})"
