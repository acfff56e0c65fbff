"""Link-prediction datasets from OGB link directories (ogbl-*), from torch_geometric's RandomLinkSplit output
(edge_label_index), and from edge lists whose third column names each edge's split.

Rows are `source destination split`, the split `train`, `val` (or `valid`) or `test`, or 0, 1, 2
(comma or whitespace separated, optional header, # comments; or an int .npy array [E, 3]). The
topology holds the training edges only (both ways with `make_undirected`); validation and test
edges become the edge split's held-out positives, each with `negatives` fixed negative
destinations drawn uniformly, none a true edge of the listed graph or the source itself.
"""
from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from morphpipe.data.converters import (ArrayLike, ConvertOptions, GraphParts, Splits, _ogb_split_dir, assemble,
                                      from_pyg, load_npy, read_edge_file)
from morphpipe.data.edge_split import (DEFAULT_EVAL_NEGATIVES, EdgeSplit, draw_negatives, edge_keys, is_symmetric,
                                       topology_pairs)
from morphpipe.data.store import GraphStore
from morphpipe.data.validation import GraphValidationError

SPLIT_CODES = {"train": 0, "val": 1, "valid": 1, "test": 2, "0": 0, "1": 1, "2": 2}
FIX = "give one 'source destination split' row per edge, split train, val (valid) or test, or 0, 1, 2"


def read_split_edges(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(src, dst, split code) int64 arrays from a .npy [E, 3] or a text table of `source destination split` rows."""
    if not path.is_file():
        raise FileNotFoundError(f"edge list {path} does not exist")
    if path.suffix == ".npy":
        table = load_npy(path, "edges")
        if table.ndim != 2 or table.shape[1] != 3 or table.dtype.kind not in "iu":
            raise GraphValidationError("edges", f"{path} holds {table.dtype} {table.shape}, expected integers [E, 3]",
                                       FIX)
        src, dst, codes = (table[:, column].astype(np.int64) for column in range(3))
        bad = codes[(codes < 0) | (codes > 2)]
        if bad.size:
            raise GraphValidationError("edges", f"{path}: split code {int(bad[0])} is not 0 (train), 1 (val) or 2 "
                                       "(test)", FIX)
        return src, dst, codes
    try:
        rows = np.loadtxt(path, dtype=str, comments="#", delimiter="," if "," in _first_line(path) else None,
                          ndmin=2)
    except (ValueError, UnicodeDecodeError) as error:
        raise GraphValidationError("edges", f"{path} is not a table of `source destination split` rows ({error})",
                                   FIX) from error
    if rows.shape[1] < 3:
        raise GraphValidationError("edges", f"{path} has {rows.shape[1]} columns, expected 3 (source, destination, "
                                   "split)", FIX)
    if rows.shape[0] and not rows[0, 0].strip().lstrip("-").isdigit():
        rows = rows[1:]  # a header line
    names = np.char.lower(np.char.strip(rows[:, 2]))
    unknown = sorted(set(names.tolist()) - set(SPLIT_CODES))
    if unknown:
        raise GraphValidationError("edges", f"{path}: split {unknown[0]!r} is not train, val, valid, test, 0, 1 or 2",
                                   FIX)
    try:
        src, dst = rows[:, 0].astype(np.int64), rows[:, 1].astype(np.int64)
    except ValueError as error:
        raise GraphValidationError("edges", f"{path}: a node id is not an integer ({error})", FIX) from error
    return src, dst, np.array([SPLIT_CODES[name] for name in names.tolist()], dtype=np.int64)


def _first_line(path: Path) -> str:
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if line.strip() and not line.lstrip().startswith("#"):
                return line
    return ""


def from_edge_split_list(source: str | os.PathLike, *, features: ArrayLike | None = None,
                         labels: ArrayLike | None = None, splits: Splits | None = None,
                         options: ConvertOptions | None = None,
                         negatives: int = DEFAULT_EVAL_NEGATIVES) -> GraphStore:
    """A store whose topology is the listed training edges, with the listed edge split (module docstring)."""
    options = options or ConvertOptions()
    path = Path(source)
    src, dst, codes = read_split_edges(path)
    num_nodes = options.num_nodes or (int(max(src.max(initial=-1), dst.max(initial=-1))) + 1)
    train = codes == 0
    if not train.any():
        raise GraphValidationError("edges", f"{path} lists no training edge", FIX)
    store = assemble(GraphParts(src=src[train], dst=dst[train], num_nodes=num_nodes), options,
                     path.name.split(".")[0], {"kind": "converted", "converter": "edgelist-split", "input": str(path)},
                     features=features, labels=labels, splits=splits)
    undirected = options.make_undirected
    train_keys = edge_keys(src[train], dst[train], num_nodes)
    if undirected:
        train_keys = np.concatenate([train_keys, edge_keys(dst[train], src[train], num_nodes)])
    for code, name in ((1, "val"), (2, "test")):
        held = codes == code
        leaked = np.isin(edge_keys(src[held], dst[held], num_nodes), train_keys)
        if leaked.any():
            first = np.flatnonzero(held)[np.flatnonzero(leaked)[0]]
            raise GraphValidationError("edges", f"{path}: {name} edge {src[first]} -> {dst[first]} is also a training "
                                       f"edge{' (or its reverse)' if undirected else ''}, so a model would read it",
                                       "list every connection in one split only")
    true_keys = edge_keys(src, dst, num_nodes)
    if undirected:
        true_keys = np.concatenate([true_keys, edge_keys(dst, src, num_nodes)])
    true_keys = np.unique(true_keys)
    rng = np.random.default_rng(np.random.SeedSequence([options.seed, 0xED6E]))

    def pairs(mask: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.stack([src[mask], dst[mask]]).astype(np.int64))

    val, test = pairs(codes == 1), pairs(codes == 2)
    store.edge_split = EdgeSplit(
        pairs(train), val, test,
        torch.from_numpy(draw_negatives(rng, val[0].numpy(), negatives, num_nodes, true_keys)),
        torch.from_numpy(draw_negatives(rng, test[0].numpy(), negatives, num_nodes, true_keys)),
        bool(undirected), {"kind": "listed", "input": str(path), "negatives": int(negatives), "seed": options.seed})
    store.validate()
    return store


def _ogb_pairs(record: dict, path: Path) -> np.ndarray:
    """int64 [2, E] positive pairs of one OGB link split file: source_node/target_node (citation2) or edge."""
    if "source_node" in record and "target_node" in record:
        return np.stack([np.asarray(record["source_node"]), np.asarray(record["target_node"])]).astype(np.int64)
    if "edge" in record:
        return np.asarray(record["edge"]).astype(np.int64).T.copy()
    raise GraphValidationError("edge split", f"{path} holds keys {sorted(record)}, expected source_node and "
                               "target_node, or edge", "point at an OGB link-property-prediction directory (ogbl-*)")


def _ogb_edge_values(path: Path, num_edges: int, field: str) -> np.ndarray | None:
    """One number per raw edge (raw/edge_year.csv.gz, raw/edge_weight.csv.gz of ogbl-collab), checked; None when
    the file is absent."""
    if not path.is_file():
        return None
    values = np.loadtxt(path, dtype=np.float64, delimiter=",", ndmin=1)
    fix = "convert the unmodified OGB download (one value per line of raw/edge.csv.gz)"
    if values.ndim != 1 or values.size != num_edges:
        raise GraphValidationError(field, f"{path} holds {values.size:,} values for {num_edges:,} edges of "
                                   "raw/edge.csv.gz", fix)
    bad = np.flatnonzero(~np.isfinite(values) | ((values <= 0) if field == "edge weight" else False))
    if bad.size:
        raise GraphValidationError(field, f"{path}: edge {bad[0]} has {field} {values[bad[0]]}", fix)
    return values


def _value_range(values: Any) -> list[float] | None:
    """[min, max] of an array of values as plain numbers (None when absent or empty)."""
    if values is None or len(values) == 0:
        return None
    values = np.asarray(values)
    return [values.min().item(), values.max().item()]


def from_ogb_link(directory: str | os.PathLike, *, split_scheme: str | None = None,
                  features: ArrayLike | None = None, labels: ArrayLike | None = None, splits: Splits | None = None,
                  options: ConvertOptions | None = None, negatives: int | None = None) -> GraphStore:
    """A link dataset from an OGB link-property-prediction directory (ogbl-*, as downloaded by ogb).

    The topology is raw/edge.csv.gz (OGB's training graph; `make_undirected` adds the reverses, as
    OGB's loaders do for ogbl-collab, -ddi, -ppa), features raw/node-feat.csv.gz when present; the
    positives are split/<scheme>/{train,valid,test}.pt. OGB's fixed negatives are kept as they are:
    ogbl-citation2's per-positive target_node_neg ([E, 1000], ranked by MRR), or ogbl-collab's edge_neg
    pairs shared by every positive of the split ([M, 2], ranked by Hits@K). Only a split without either
    gets `negatives` (default DEFAULT_EVAL_NEGATIVES) drawn per positive, with a warning. ogbl-collab's
    per-edge years and weights (raw/edge_year.csv.gz, raw/edge_weight.csv.gz and the splits' year and
    weight) are checked and their ranges recorded in the split's source; the topology is unweighted.
    Split files are read with torch.load(weights_only=True): tensors and plain containers only.
    """
    options = options or ConvertOptions()
    root = Path(directory)
    raw = root / "raw"
    scheme_dir = _ogb_split_dir(root, split_scheme)
    if not (raw / "edge.csv.gz").is_file() or scheme_dir is None:
        raise FileNotFoundError(f"{root} is not an OGB link-property-prediction directory (expected raw/edge.csv.gz "
                                "and split/<scheme>/{train,valid,test}.pt)")
    edges = read_edge_file(raw / "edge.csv.gz")
    years = _ogb_edge_values(raw / "edge_year.csv.gz", edges.shape[1], "edge year")
    weights = _ogb_edge_values(raw / "edge_weight.csv.gz", edges.shape[1], "edge weight")
    num_nodes = int(np.loadtxt(raw / "num-node-list.csv.gz", dtype=np.int64, delimiter=",", ndmin=1)[0]) \
        if (raw / "num-node-list.csv.gz").is_file() else None
    parts = GraphParts(src=edges[0], dst=edges[1], num_nodes=num_nodes)
    if (raw / "node-feat.csv.gz").is_file():
        parts.features = np.loadtxt(raw / "node-feat.csv.gz", dtype=np.float32, delimiter=",", ndmin=2)
    records = {}
    for name, file in (("train", "train"), ("val", "valid"), ("test", "test")):
        path = scheme_dir / f"{file}.pt"
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: an OGB link split has train.pt, valid.pt and test.pt")
        records[name] = (torch.load(path, weights_only=True), path)
    shared = {name for name, (record, _) in records.items() if "edge_neg" in record}
    kept = {name for name, (record, _) in records.items() if "target_node_neg" in record}
    if shared and shared != {"val", "test"}:
        raise GraphValidationError("edge split", f"edge_neg (negative pairs shared by a split) is in "
                                   f"{sorted(shared)} only, expected in valid.pt and test.pt",
                                   "convert the unmodified OGB download")
    if negatives is not None and (shared or kept):
        raise ValueError(f"--negatives {negatives}: {root.name} gives its own fixed negatives "
                         f"({'edge_neg pairs' if shared else 'target_node_neg'}); drop --negatives")
    store = assemble(parts, options, root.name, {"kind": "converted", "converter": "ogb-link", "input": str(root),
                                                 "split_scheme": scheme_dir.name},
                     features=features, labels=labels, splits=splits)
    num_nodes = store.num_nodes
    pairs = {name: _ogb_pairs(record, path) for name, (record, path) in records.items()}
    topology_dst = np.repeat(np.arange(num_nodes, dtype=np.int64), np.diff(store.indptr.numpy()))
    topology_keys = np.unique(edge_keys(store.indices.numpy(), topology_dst, num_nodes))
    true_keys = np.unique(np.concatenate([topology_keys] + [edge_keys(p[0], p[1], num_nodes) for p in pairs.values()]
                                         + ([edge_keys(p[1], p[0], num_nodes) for p in pairs.values()]
                                            if options.make_undirected else [])))
    rng = np.random.default_rng(np.random.SeedSequence([options.seed, 0xED6E]))
    fixed = {}
    for name in ("val", "test"):
        record, path = records[name]
        if np.isin(edge_keys(pairs[name][0], pairs[name][1], num_nodes), topology_keys).any():
            raise GraphValidationError("edge split", f"{path}: some {name} edges are edges of raw/edge.csv.gz, so a "
                                       "model would read them", "convert the unmodified OGB download")
        if name in shared:
            negative_pairs = np.asarray(record["edge_neg"]).astype(np.int64)
            if negative_pairs.ndim != 2 or negative_pairs.shape[1] != 2:
                raise GraphValidationError("edge split", f"{path}: edge_neg has shape {negative_pairs.shape}, "
                                           "expected (M, 2)", "convert the unmodified OGB download")
            fixed[name] = negative_pairs.T.copy()
        elif name in kept:
            fixed[name] = np.asarray(record["target_node_neg"]).astype(np.int64)
        else:
            count = negatives or DEFAULT_EVAL_NEGATIVES
            warnings.warn(f"{path}: no fixed negatives (target_node_neg or edge_neg); drew {count} negative "
                          f"destinations per {name} positive (seed {options.seed})", stacklevel=2)
            fixed[name] = draw_negatives(rng, pairs[name][0], count, num_nodes, true_keys)
    source: dict[str, Any] = {"kind": "ogb", "input": str(root), "split_scheme": scheme_dir.name}
    year_ranges = {name: _value_range(record.get("year")) for name, (record, _) in records.items()}
    if years is not None or any(year_ranges.values()):
        source["edge_year"] = {"raw": _value_range(years), **year_ranges}
    if weights is not None:
        source["edge_weight"] = {"raw": _value_range(weights), "stored": False}
    store.edge_split = EdgeSplit(*(torch.from_numpy(pairs[name]) for name in ("train", "val", "test")),
                                 torch.from_numpy(fixed["val"]), torch.from_numpy(fixed["test"]),
                                 bool(options.make_undirected), source, shared_negatives=bool(shared))
    store.validate()
    return store


def _labelled_positives(data: Any, name: str) -> np.ndarray:
    """int64 [2, E]: the columns of `data.edge_label_index` whose `edge_label` is 1 (all of them without labels)."""
    index = getattr(data, "edge_label_index", None)
    if index is None:
        raise GraphValidationError(f"{name}.edge_label_index", "is missing",
                                   "pass the (train, val, test) Data objects of torch_geometric's RandomLinkSplit")
    index = index.detach().cpu().numpy().astype(np.int64)
    label = getattr(data, "edge_label", None)
    if label is None:
        return index
    return index[:, label.detach().cpu().numpy() == 1]


def from_pyg_link(datas: Sequence[Any], *, features: ArrayLike | None = None, labels: ArrayLike | None = None,
                  splits: Splits | None = None, options: ConvertOptions | None = None,
                  negatives: int = DEFAULT_EVAL_NEGATIVES) -> GraphStore:
    """A link dataset from torch_geometric's RandomLinkSplit output `(train_data, val_data, test_data)`.

    The topology is `train_data.edge_index` (the training message-passing edges; undirected when every
    edge has its reverse), features `train_data.x`; the positives of each split are its `edge_label_index`
    columns labelled 1. PyG's negatives are pairs shared by a split, not per positive: `negatives` fixed
    destinations per validation and test positive are drawn instead, with a warning.
    """
    if isinstance(datas, (str, bytes)) or not isinstance(datas, Sequence) or len(datas) != 3:
        raise GraphValidationError("data", f"got {type(datas).__name__}, expected (train_data, val_data, test_data)",
                                   "torch.save the tuple that torch_geometric's RandomLinkSplit returns")
    train_data = datas[0]
    store = from_pyg(train_data, features=features, labels=labels, splits=splits, options=options)
    store.source = {**store.source, "converter": "pyg-link"}
    num_nodes = store.num_nodes
    pairs = {name: _labelled_positives(data, f"{name}_data") for name, data in zip(("train", "val", "test"), datas)}
    src, dst = topology_pairs(store.indptr.numpy(), store.indices.numpy())
    keys = np.sort(edge_keys(src, dst, num_nodes))
    undirected = is_symmetric(keys, src, dst, num_nodes)
    for name in ("val", "test"):
        if np.isin(edge_keys(pairs[name][0], pairs[name][1], num_nodes), keys).any():
            raise GraphValidationError(f"{name}_data.edge_label_index", "holds edges of train_data.edge_index, so a "
                                       "model would read them", "pass RandomLinkSplit's output unchanged")
    true_keys = np.unique(np.concatenate([keys] + [edge_keys(p[0], p[1], num_nodes) for p in pairs.values()] +
                                         [edge_keys(p[1], p[0], num_nodes) for p in pairs.values()]))
    options = options or ConvertOptions()
    rng = np.random.default_rng(np.random.SeedSequence([options.seed, 0xED6E]))
    warnings.warn(f"PyG's negatives are pairs shared by a split; drew {negatives} negative destinations per "
                  f"validation and test positive instead (seed {options.seed})", stacklevel=2)
    store.edge_split = EdgeSplit(
        *(torch.from_numpy(pairs[name]) for name in ("train", "val", "test")),
        torch.from_numpy(draw_negatives(rng, pairs["val"][0], negatives, num_nodes, true_keys)),
        torch.from_numpy(draw_negatives(rng, pairs["test"][0], negatives, num_nodes, true_keys)),
        bool(undirected), {"kind": "pyg", "negatives": int(negatives), "seed": options.seed})
    store.validate()
    return store
