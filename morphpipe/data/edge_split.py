"""Edge splits for link prediction: training, validation and test positive pairs, and fixed negatives to rank against.

Stored in the graph directory beside the node arrays: `train_edges.npy`, `val_edges.npy`,
`test_edges.npy` (int64 [2, E]: row 0 sources, row 1 destinations), `val_negatives.npy` and
`test_negatives.npy` (int64 [E, K]: K corrupted destinations per positive, ogbl-citation2 style;
or, with shared negatives, int64 [2, M]: M negative pairs every positive of the split is ranked
against, ogbl-collab style), and `edge_split.json` (written last: without it there is no split).
The graph's topology holds the training edges only: `split_edges` (random, or by per-edge
timestamps) removes the held-out pairs (and their reverses when the graph is undirected) from it,
so nothing a model reads leaks a held-out edge.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from morphpipe.data.csc import csc_from_sorted_keys
from morphpipe.data.dtypes import index_dtype_for
from morphpipe.data.ondisk import EDGE_ARRAYS, EDGE_SPLIT_FILE, load_array, save_array
from morphpipe.data.splits import SplitFractions
from morphpipe.data.validation import GraphValidationError

EDGE_SPLIT_FORMAT = "morphpipe-edge-split"
DEFAULT_EDGE_FRACTIONS = SplitFractions(0.9, 0.05, 0.05)
DEFAULT_EVAL_NEGATIVES = 100
# How a split's fixed negatives are stored (edge_split.json "negatives"): K per positive, or pairs the split shares.
PER_POSITIVE, SHARED_PAIRS = "per-positive", "shared-pairs"
SPLIT_EDGES_HINT = "make one with `morphpipe data split-edges DATASET --out DIR` (or split_edges in Python)"
# Redraws of a negative that hit a true edge; a node adjacent to nearly every node exhausts them.
MAX_NEGATIVE_REDRAWS = 64


@dataclass(repr=False)
class EdgeSplit:
    """Positive pairs per split (int64 [2, E]) and the held-out splits' fixed negatives: K negative destinations per
    positive (int64 [E, K]), or with `shared_negatives` M negative pairs (int64 [2, M]) shared by every positive.

    `undirected`: the topology holds every edge both ways, so a pair (u, v) stands for both directions.
    """

    train: torch.Tensor
    val: torch.Tensor
    test: torch.Tensor
    val_negatives: torch.Tensor
    test_negatives: torch.Tensor
    undirected: bool
    source: dict[str, Any] = field(default_factory=dict)  # how the split was made
    shared_negatives: bool = False  # negatives are [2, M] pairs ranked against every positive (Hits@K, ogbl-collab)

    def pairs(self, split: str) -> torch.Tensor:
        """The [2, E] positive pairs of `split` ("train", "val" or "test")."""
        return getattr(self, split)

    def negatives(self, split: str) -> torch.Tensor:
        """The fixed negatives of the held-out `split` ("val" or "test"): [E, K] destinations per positive, or [2, M]
        pairs shared by the split's positives when `shared_negatives`."""
        if split == "train":
            raise ValueError("the training split has no fixed negatives: they are drawn per batch; rank 'val' or "
                             "'test'")
        return getattr(self, f"{split}_negatives")

    def arrays(self) -> dict[str, torch.Tensor]:
        return {"train_edges": self.train, "val_edges": self.val, "test_edges": self.test,
                "val_negatives": self.val_negatives, "test_negatives": self.test_negatives}

    def validate(self, num_nodes: int) -> None:
        """Shapes, dtypes and every id in [0, num_nodes); raises GraphValidationError naming the array and the fix."""
        for name, tensor in self.arrays().items():
            if tensor.dtype != torch.int64:
                raise GraphValidationError(name, f"has dtype {tensor.dtype}, expected int64",
                                           f"re-create the edge split: {SPLIT_EDGES_HINT}")
            if name.endswith("_edges") and (tensor.dim() != 2 or tensor.shape[0] != 2):
                raise GraphValidationError(name, f"has shape {tuple(tensor.shape)}, expected (2, num_edges)",
                                           f"re-create the edge split: {SPLIT_EDGES_HINT}")
            if tensor.numel():
                low, high = int(tensor.min()), int(tensor.max())
                if low < 0 or high >= num_nodes:
                    raise GraphValidationError(name, f"holds node id {low if low < 0 else high} outside "
                                               f"[0, {num_nodes})", f"re-create the edge split: {SPLIT_EDGES_HINT}")
        if self.train.shape[1] == 0:
            raise GraphValidationError("train_edges", "is empty: there is nothing to train on",
                                       "split with a larger training fraction")
        for split in ("val", "test"):
            negatives, positives = self.negatives(split), self.pairs(split)
            if self.shared_negatives:
                if negatives.dim() != 2 or negatives.shape[0] != 2 or negatives.shape[1] == 0:
                    raise GraphValidationError(f"{split}_negatives", f"has shape {tuple(negatives.shape)}, expected "
                                               f"(2, M) with M >= 1: negative pairs shared by the {split} positives",
                                               f"re-create the edge split: {SPLIT_EDGES_HINT}")
            elif negatives.dim() != 2 or negatives.shape[0] != positives.shape[1]:
                raise GraphValidationError(f"{split}_negatives", f"has shape {tuple(negatives.shape)}, expected "
                                           f"({positives.shape[1]}, K): K negatives per {split} positive",
                                           f"re-create the edge split: {SPLIT_EDGES_HINT}")

    def save(self, directory: str | os.PathLike) -> None:
        """Writes the arrays (each atomically), then edge_split.json."""
        directory = Path(directory)
        (directory / EDGE_SPLIT_FILE).unlink(missing_ok=True)
        for name, tensor in self.arrays().items():
            save_array(directory, name, tensor.numpy())
        record = {"format": EDGE_SPLIT_FORMAT, "undirected": self.undirected, "source": self.source,
                  "sizes": {split: int(self.pairs(split).shape[1]) for split in ("train", "val", "test")},
                  "negatives": SHARED_PAIRS if self.shared_negatives else PER_POSITIVE}
        if self.shared_negatives:
            record["negative_pairs"] = {split: int(self.negatives(split).shape[1]) for split in ("val", "test")}
        else:
            record["negatives_per_positive"] = int(self.val_negatives.shape[1])
        temporary = directory / f".{EDGE_SPLIT_FILE}.tmp"
        temporary.write_text(json.dumps(record, indent=2) + "\n")
        os.replace(temporary, directory / EDGE_SPLIT_FILE)

    @classmethod
    def load(cls, directory: str | os.PathLike, num_nodes: int) -> "EdgeSplit | None":
        """The split stored in `directory`, checked against `num_nodes`; None when the directory has none."""
        path = Path(directory) / EDGE_SPLIT_FILE
        if not path.is_file():
            return None
        try:
            record = json.loads(path.read_text())
        except (ValueError, OSError) as error:
            raise GraphValidationError(EDGE_SPLIT_FILE, f"{path} is unreadable ({error})",
                                       f"re-create the edge split: {SPLIT_EDGES_HINT}") from None
        if not isinstance(record, dict) or record.get("format") != EDGE_SPLIT_FORMAT or \
                not isinstance(record.get("undirected"), bool):
            raise GraphValidationError(EDGE_SPLIT_FILE, f"{path} is not an edge split written by morphpipe",
                                       f"re-create the edge split: {SPLIT_EDGES_HINT}")
        kind = record.get("negatives", PER_POSITIVE)  # files written before shared negatives name no kind
        if kind not in (PER_POSITIVE, SHARED_PAIRS):
            raise GraphValidationError(EDGE_SPLIT_FILE, f"{path}: negatives {kind!r} is not {PER_POSITIVE!r} or "
                                       f"{SHARED_PAIRS!r}", f"re-create the edge split: {SPLIT_EDGES_HINT}")
        arrays = {name: torch.from_numpy(np.ascontiguousarray(load_array(directory, name, mmap=False)))
                  for name in EDGE_ARRAYS}
        split = cls(arrays["train_edges"], arrays["val_edges"], arrays["test_edges"], arrays["val_negatives"],
                    arrays["test_negatives"], record["undirected"], dict(record.get("source") or {}),
                    shared_negatives=kind == SHARED_PAIRS)
        split.validate(num_nodes)
        return split

    def __repr__(self) -> str:
        negatives = f"negative_pairs={self.val_negatives.shape[1]}" if self.shared_negatives else \
            f"negatives={self.val_negatives.shape[1]}"
        return (f"EdgeSplit(train={self.train.shape[1]}, val={self.val.shape[1]}, test={self.test.shape[1]}, "
                f"{negatives}, undirected={self.undirected})")


def edge_keys(src: np.ndarray, dst: np.ndarray, num_nodes: int) -> np.ndarray:
    """int64 keys `dst * N + src` of the pairs (the CSC's sort order)."""
    return dst.astype(np.int64) * num_nodes + src.astype(np.int64)


def topology_pairs(indptr: np.ndarray, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(src, dst) int64 of every edge of a CSC, in CSC order."""
    dst = np.repeat(np.arange(indptr.size - 1, dtype=np.int64), np.diff(indptr))
    return indices.astype(np.int64), dst


def contains(keys_sorted: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Whether each of `keys` is one of `keys_sorted` (sorted), as a bool array of keys' shape. The keys are looked
    up in sorted order, so the binary searches walk the table forward: on bench-1m's 20M keys about 10x less CPU
    than looking up the same keys in random order."""
    flat = keys.reshape(-1)
    if keys_sorted.size == 0 or flat.size == 0:
        return np.zeros(keys.shape, dtype=bool)
    order = np.argsort(flat)
    ordered = flat[order]
    found = np.empty(flat.size, dtype=bool)
    found[order] = keys_sorted[np.minimum(np.searchsorted(keys_sorted, ordered), keys_sorted.size - 1)] == ordered
    return found.reshape(keys.shape)


def is_symmetric(keys_sorted: np.ndarray, src: np.ndarray, dst: np.ndarray, num_nodes: int) -> bool:
    """True when every edge's reverse is an edge too (`keys_sorted`: the sorted keys of the same edges)."""
    return bool(np.all(contains(keys_sorted, edge_keys(dst, src, num_nodes))))


def check_edge_times(timestamps: Any, num_edges: int) -> np.ndarray:
    """`timestamps` as a 1-D array of `num_edges` finite numbers (one per edge of the topology, in CSC order);
    ValueError naming what is wrong and the fix."""
    fix = "give one number per edge of the graph, in the order of its indices.npy (or an edge list with a time column)"
    values = np.asarray(timestamps)
    if values.dtype.kind not in "iuf":
        raise ValueError(f"timestamps: dtype {values.dtype} is not a number type; {fix}")
    if values.ndim != 1 or values.size != num_edges:
        raise ValueError(f"timestamps: shape {values.shape}, expected ({num_edges},): the graph has {num_edges:,} "
                         f"edges; {fix}")
    if values.dtype.kind == "f":
        bad = np.flatnonzero(~np.isfinite(values))
        if bad.size:
            raise ValueError(f"timestamps: edge {bad[0]} has time {values[bad[0]]} ({bad.size:,} non-finite in all); "
                             "every edge needs a finite time: fill or drop the missing ones first")
    return values


def draw_negatives(rng: np.random.Generator, src: np.ndarray, count: int, num_nodes: int,
                   true_keys: np.ndarray) -> np.ndarray:
    """[len(src), count] destinations drawn uniformly, none of them `src` itself or a true edge src -> destination
    (`true_keys`: sorted keys of every edge of the original graph, both ways when undirected)."""
    negatives = rng.integers(0, num_nodes, (src.size, count), dtype=np.int64)
    drawn, sources = negatives.reshape(-1), np.repeat(np.asarray(src, dtype=np.int64), count)
    pending = np.arange(drawn.size)  # flat positions whose draw is not checked yet: all, then the redrawn ones
    for _ in range(MAX_NEGATIVE_REDRAWS):
        source, negative = sources[pending], drawn[pending]
        bad = (negative == source) | contains(true_keys, edge_keys(source, negative, num_nodes))
        if not bad.any():
            return negatives
        pending = pending[bad]
        drawn[pending] = rng.integers(0, num_nodes, pending.size, dtype=np.int64)
    raise ValueError(f"could not draw {count} negatives per held-out edge that are not true edges in "
                     f"{MAX_NEGATIVE_REDRAWS} tries: some source is adjacent to nearly every node; ask for fewer "
                     "negatives (--negatives)")


def draw_negative_pairs(rng: np.random.Generator, count: int, num_nodes: int, true_keys: np.ndarray) -> np.ndarray:
    """int64 [2, count] pairs (u, v) drawn uniformly, u != v and none a true edge (`true_keys` as in draw_negatives):
    the negatives every positive of a split is ranked against (ogbl-collab style)."""
    src = rng.integers(0, num_nodes, count, dtype=np.int64)
    return np.stack([src, draw_negatives(rng, src, 1, num_nodes, true_keys)[:, 0]])


def earliest_pair_times(src: np.ndarray, dst: np.ndarray, timestamps: np.ndarray, num_nodes: int,
                        undirected: bool) -> np.ndarray:
    """The earliest timestamp of each pair, in the order of the pairs' sorted keys (`edge_keys(u, v)`, u < v when
    undirected): a connection appears when its first edge, either way round, does. Self loops are no pair."""
    loops = src == dst
    low, high = (np.minimum(src, dst), np.maximum(src, dst)) if undirected else (src, dst)
    keys, times = edge_keys(low[~loops], high[~loops], num_nodes), timestamps[~loops]
    by_key = np.lexsort((times, keys))
    keys, times = keys[by_key], times[by_key]
    return times[np.r_[True, keys[1:] != keys[:-1]]] if keys.size else times


@dataclass(frozen=True)
class EdgeSplitResult:
    """The training topology (held-out edges removed) and the split."""

    indptr: np.ndarray
    indices: np.ndarray
    split: EdgeSplit


def split_edges(indptr: np.ndarray, indices: np.ndarray, num_nodes: int, *,
                fractions: SplitFractions = DEFAULT_EDGE_FRACTIONS, negatives: int = DEFAULT_EVAL_NEGATIVES,
                seed: int = 0, undirected: bool | None = None, timestamps: np.ndarray | None = None,
                negative_pairs: int | None = None) -> EdgeSplitResult:
    """An edge split of a CSC graph, random or by time: held-out pairs leave the topology (with their reverses when
    undirected).

    `undirected` None: detected (every edge has its reverse). An undirected graph's pairs are its
    edges u -> v with u < v (one per connection); a directed graph's pairs are its edges. Self loops
    are never held out (they stay in the topology and are no pair). `fractions.val` and `.test` of the pairs are
    held out; every other pair trains (`fractions.train` is not read). Without `timestamps` the held-out
    pairs are drawn at random; with them (one value per edge of the CSC, in its order: `edge_times`) a
    pair's time is its earliest edge's, pairs are ordered by time, ties by (destination, source), and the
    latest go to test, those before to validation. `negatives` fixed destinations per validation and test
    positive are drawn uniformly among the nodes, none a true edge of the original graph or the source
    itself; or with `negative_pairs` M, M such pairs per held-out split, shared by its positives.
    """
    if isinstance(negatives, bool) or not isinstance(negatives, (int, np.integer)) or negatives < 1:
        raise ValueError(f"negatives: expected a positive count of fixed negatives per held-out edge, got "
                         f"{negatives!r}")
    if negative_pairs is not None and (isinstance(negative_pairs, bool) or
                                       not isinstance(negative_pairs, (int, np.integer)) or negative_pairs < 1):
        raise ValueError(f"negative_pairs: expected a positive count of negative pairs per held-out split, got "
                         f"{negative_pairs!r}")
    src, dst = topology_pairs(np.asarray(indptr), np.asarray(indices))
    if timestamps is not None:
        timestamps = check_edge_times(timestamps, src.size)
    keys = np.sort(edge_keys(src, dst, num_nodes))
    symmetric = is_symmetric(keys, src, dst, num_nodes)
    if undirected is None:
        undirected = symmetric
    elif undirected and not symmetric:
        raise ValueError("undirected=True, but some edge of the graph has no reverse; split it as directed "
                         "(--directed) or make it undirected first (`data convert --undirected`)")
    candidate = (src < dst) if undirected else (src != dst)
    pair_src, pair_dst = src[candidate], dst[candidate]
    # Parallel edges are one pair: keys are unique per (src, dst).
    pair_keys, first = np.unique(edge_keys(pair_src, pair_dst, num_nodes), return_index=True)
    pair_src, pair_dst = pair_src[first], pair_dst[first]
    if pair_src.size < 3:
        raise ValueError(f"the graph has {pair_src.size} edges that could be split (self loops excluded); an edge "
                         "split needs at least 3")
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0xED6E]))
    if timestamps is None:
        order = rng.permutation(pair_src.size)
    else:
        pair_times = earliest_pair_times(src, dst, timestamps, num_nodes, bool(undirected))
        order = np.lexsort((pair_keys, pair_times))  # by time, ties by key: (destination, source)
    num_val = int(round(fractions.val * pair_src.size))
    num_test = int(round(fractions.test * pair_src.size))
    num_train = pair_src.size - num_val - num_test
    if num_train < 1:
        raise ValueError(f"edge split fractions {fractions.as_tuple()} leave no training edge of {pair_src.size}")
    train_at, val_at = order[:num_train], order[num_train:num_train + num_val]
    test_at = order[num_train + num_val:num_train + num_val + num_test]
    held_out = np.concatenate([val_at, test_at])
    removed = edge_keys(pair_src[held_out], pair_dst[held_out], num_nodes)
    if undirected:
        removed = np.concatenate([removed, edge_keys(pair_dst[held_out], pair_src[held_out], num_nodes)])
    kept_keys = keys[~np.isin(keys, removed)]
    new_indptr, new_indices = csc_from_sorted_keys(kept_keys, num_nodes)
    new_indices = new_indices.astype(index_dtype_for(num_nodes), copy=False)

    def pairs(at: np.ndarray) -> torch.Tensor:
        at = np.sort(at)
        return torch.from_numpy(np.stack([pair_src[at], pair_dst[at]]).astype(np.int64))

    val, test = pairs(val_at), pairs(test_at)
    if negative_pairs is None:
        val_negatives = draw_negatives(rng, val[0].numpy(), negatives, num_nodes, keys)
        test_negatives = draw_negatives(rng, test[0].numpy(), negatives, num_nodes, keys)
    else:
        val_negatives = draw_negative_pairs(rng, negative_pairs, num_nodes, keys)
        test_negatives = draw_negative_pairs(rng, negative_pairs, num_nodes, keys)
    source = {"kind": "random" if timestamps is None else "time", "seed": int(seed),
              "fractions": list(fractions.as_tuple()),
              "negatives": int(negatives if negative_pairs is None else negative_pairs),
              "shared_negatives": negative_pairs is not None, "held_out_reverses": bool(undirected)}
    if timestamps is not None:
        # Where the cuts fell: the first validation and test pairs' times (ties broken by pair, as ordered).
        source["ties"] = "by (destination, source)"
        source.update({f"{name}_from": pair_times[at[0]].item() for name, at in (("val", val_at), ("test", test_at))
                       if at.size})
    split = EdgeSplit(pairs(train_at), val, test, torch.from_numpy(val_negatives), torch.from_numpy(test_negatives),
                      bool(undirected), source, shared_negatives=negative_pairs is not None)
    return EdgeSplitResult(new_indptr, new_indices, split)


def with_edge_split(graph, *, fractions: SplitFractions = DEFAULT_EDGE_FRACTIONS,
                    negatives: int = DEFAULT_EVAL_NEGATIVES, seed: int = 0, undirected: bool | None = None,
                    timestamps: np.ndarray | None = None, negative_pairs: int | None = None):
    """A copy of GraphStore `graph` whose topology holds only its training edges, with the edge split attached
    (`split_edges`: random, or by `timestamps`, one per edge of `graph`); features, labels and node splits are
    shared with `graph`."""
    result = split_edges(graph.indptr.numpy(), graph.indices.numpy(), graph.num_nodes, fractions=fractions,
                         negatives=negatives, seed=seed, undirected=undirected, timestamps=timestamps,
                         negative_pairs=negative_pairs)
    source = {"kind": "edge-split", "split": result.split.source, "of": graph.source}
    return replace(graph, indptr=torch.from_numpy(result.indptr), indices=torch.from_numpy(result.indices),
                   edge_split=result.split, source=source, mapped_files={}, validated_signature=None)
