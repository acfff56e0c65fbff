"""A printable summary of a graph store: sizes, degree statistics, features, classes, splits, and the memory tier
each array is on."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from morphpipe.data.dtypes import dtype_name, tensor_to_numpy
from morphpipe.data.feature_store import FeatureStore
from morphpipe.data.hetero_store import HeteroGraphStore
from morphpipe.data.ondisk import ARRAY_FIELDS
from morphpipe.data.store import GraphStore


@dataclass
class DegreeStats:
    """Distribution of one degree over all nodes."""

    min: int
    mean: float
    median: float
    p99: float
    max: int
    zero: int  # nodes with degree 0

    @classmethod
    def of(cls, degrees: np.ndarray) -> "DegreeStats":
        median, p99 = np.percentile(degrees, [50, 99])
        return cls(min=int(degrees.min()), mean=float(degrees.mean()), median=float(median), p99=float(p99),
                   max=int(degrees.max()), zero=int(np.count_nonzero(degrees == 0)))

    def __str__(self) -> str:
        return (f"min {self.min}, mean {self.mean:.2f}, median {self.median:g}, p99 {self.p99:g}, max {self.max} "
                f"({self.zero:,} nodes with none)")


@dataclass
class GraphSummary:
    """What `morphpipe data info` prints."""

    name: str
    num_nodes: int
    num_edges: int
    in_degree: DegreeStats
    out_degree: DegreeStats
    feature_shape: tuple[int, int]
    feature_dtype: str
    indices_dtype: str
    num_classes: int
    labelled: int
    train: int
    val: int
    test: int
    source: dict
    edge_split: str | None = None  # link prediction's split, described; None without one
    tiers: dict[str, str] = field(default_factory=dict)  # array -> where its values are read from

    def __str__(self) -> str:
        made = self.source.get("kind", "unknown")
        detail = self.source.get("preset") or self.source.get("converter") or ""
        return "\n".join([
            f"name        {self.name} ({made}{' ' + detail if detail else ''})",
            f"nodes       {self.num_nodes:,}",
            f"edges       {self.num_edges:,} (indices {self.indices_dtype})",
            f"in-degree   {self.in_degree}",
            f"out-degree  {self.out_degree}",
            f"features    {self.feature_shape[0]:,} x {self.feature_shape[1]} {self.feature_dtype}",
            f"classes     {self.num_classes} ({self.labelled:,} labelled nodes)",
            f"splits      train {self.train:,}, val {self.val:,}, test {self.test:,}",
            *([f"edge split  {self.edge_split}"] if self.edge_split else []),
            f"tiers       {'; '.join(f'{name} {tier}' for name, tier in self.tiers.items())}",
        ])


def array_tiers(store: GraphStore) -> dict[str, str]:
    """Where each array's values are read from: host RAM, a memory map (the page cache), or the disk through the
    feature store (its hot rows in host RAM)."""
    mapped = {Path(path).stem for path in store.mapped_files}
    tiers = {name: "memory-mapped (page cache)" if name in mapped else "RAM" for name in ARRAY_FIELDS}
    if store.feature_store is not None:
        tiers["features"] = disk_tier(store.feature_store)
    return tiers


def disk_tier(feature_store: FeatureStore) -> str:
    """"disk (feature store, READER[, O_DIRECT]), N hottest rows (S%, M MB) cached in RAM"."""
    share = feature_store.num_cached / max(feature_store.shape[0], 1)
    direct = ", O_DIRECT" if feature_store.direct else ""
    return (f"disk (feature store, {feature_store.describe_reader()}{direct}), {feature_store.num_cached:,} hottest "
            f"rows ({share:.1%}, {feature_store.cache_bytes / 1e6:,.1f} MB) cached in RAM")


def typed_feature_tiers(store: HeteroGraphStore) -> dict[str, str]:
    """Where each node type's feature rows are read from (a type without features has none: the model embeds it)."""
    in_memory = "memory-mapped (page cache)" if store.features_mapped else "RAM"
    return {name: disk_tier(store.feature_stores[name]) if name in store.feature_stores else
            in_memory if name in store.features else "none (embedded by the model)" for name in store.type_names}


def summarize(store: GraphStore) -> GraphSummary:
    """Degree statistics need one pass over the indices; nothing else reads the features."""
    in_degrees = np.diff(tensor_to_numpy(store.indptr))
    out_degrees = np.bincount(tensor_to_numpy(store.indices), minlength=store.num_nodes)
    return GraphSummary(
        name=store.name,
        num_nodes=store.num_nodes,
        num_edges=store.num_edges,
        in_degree=DegreeStats.of(in_degrees),
        out_degree=DegreeStats.of(out_degrees),
        feature_shape=(store.features.shape[0], store.feature_dim),
        feature_dtype=dtype_name(store.feature_dtype),
        indices_dtype=dtype_name(store.indices.dtype),
        num_classes=store.num_classes,
        labelled=int((store.labels >= 0).sum()),
        train=store.train_idx.numel(),
        val=store.val_idx.numel(),
        test=store.test_idx.numel(),
        source=store.source,
        edge_split=_describe_edge_split(store.edge_split),
        tiers=array_tiers(store),
    )


def _describe_edge_split(split) -> str | None:
    """"train 16,000, val 900, test 900 edges; 100 negatives each (undirected)" (or "...; 3,000 val and 3,000 test
    negative pairs shared (undirected, by time)"), or None without a split."""
    if split is None:
        return None
    sizes = ", ".join(f"{name} {split.pairs(name).shape[1]:,}" for name in ("train", "val", "test"))
    negatives = f"{split.val_negatives.shape[1]} val and {split.test_negatives.shape[1]} test negative pairs shared" \
        if split.shared_negatives else f"{split.val_negatives.shape[1]} negatives each"
    timing = ", by time" if split.source.get("kind") == "time" else ""
    return f"{sizes} edges; {negatives} ({'undirected' if split.undirected else 'directed'}{timing})"
