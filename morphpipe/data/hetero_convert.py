"""Heterogeneous graphs in and out: from OGB's ogbn-mag directory, an IGBH-style directory of per-type .npy files
and PyG's `HeteroData`, back to `HeteroData`, and the homogeneous view.

The homogeneous view drops the relation and node types (one CSC of every relation's edges, each type's
features zero-padded to the widest, zeros for types without features): what a model that ignores
types trains on, for comparisons.
"""
from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import numpy as np
import torch

from morphpipe.data.converters import _ogb_labels, _ogb_split_dir, _read_ids, read_edge_file
from morphpipe.data.hetero_store import HeteroGraphStore, Relation, csc_of, type_ranges
from morphpipe.data.ondisk import load_array
from morphpipe.data.splits import SplitFractions, as_split_ids, random_split
from morphpipe.data.store import GraphStore
from morphpipe.data.validation import SPLIT_FIELDS, GraphValidationError

PYG_SPLITS = {"train_idx": ("train_mask", "train_idx"), "val_idx": ("val_mask", "valid_mask", "val_idx"),
              "test_idx": ("test_mask", "test_idx")}


def from_pyg_hetero(data: Any, target_type: str, *, num_classes: int | None = None,
                    name: str = "pyg-hetero") -> HeteroGraphStore:
    """A store from a torch_geometric `HeteroData`: `data[type].num_nodes` and `.x`, `data[relation].edge_index`
    (row 0 source, row 1 destination, local ids), and on `target_type` `.y` and train/val/test masks or ids."""
    counts = {node_type: int(data[node_type].num_nodes) for node_type in data.node_types}
    if target_type not in counts:
        raise GraphValidationError("target_type", f"{target_type!r} is not a node type of the HeteroData "
                                   f"({list(counts)})", "name the node type whose labels to learn")
    node_types = type_ranges(counts)
    relations = tuple(Relation(*edge_type) for edge_type in data.edge_types)
    indptr, indices = {}, {}
    for relation in relations:
        edge_index = data[tuple(relation)].edge_index
        if edge_index is None or edge_index.dim() != 2 or edge_index.shape[0] != 2:
            raise GraphValidationError(f"relation {relation} edge_index", "is missing or not [2, E]",
                                       "give every edge type an edge_index of shape [2, num_edges]")
        pairs = edge_index.detach().cpu().numpy().astype(np.int64)
        for row, role, type_name in ((0, "source", relation.src), (1, "destination", relation.dst)):
            outside = pairs[row][(pairs[row] < 0) | (pairs[row] >= counts[type_name])]
            if outside.size:
                raise GraphValidationError(f"relation {relation} edge_index", f"holds {role} id {int(outside[0])} "
                                           f"outside {type_name!r}'s [0, {counts[type_name]})",
                                           f"use local ids of the {role} type")
        indptr[relation], indices[relation] = csc_of(pairs[0], pairs[1], counts[relation.dst], counts[relation.src])
    features = {node_type: data[node_type].x.detach().cpu().contiguous() for node_type in counts
                if getattr(data[node_type], "x", None) is not None}
    target = data[target_type]
    labels_local = getattr(target, "y", None)
    if labels_local is None:
        raise GraphValidationError(f"target type {target_type!r}", "has no labels (HeteroData[target].y)",
                                   "store the target type's labels in .y, or choose a labelled target type")
    labels_local = labels_local.detach().cpu().reshape(-1).long()
    start = node_types[list(counts).index(target_type)].start
    labels = torch.full((sum(counts.values()),), -1, dtype=torch.long)
    labels[start:start + labels_local.numel()] = labels_local
    splits = {}
    for field, names in PYG_SPLITS.items():
        value = next((getattr(target, n) for n in names if getattr(target, n, None) is not None), None)
        ids = as_split_ids(value, counts[target_type], field) if value is not None else np.zeros(0, np.int64)
        splits[field] = torch.from_numpy(ids + start)
    store = HeteroGraphStore(node_types=node_types, relations=relations, indptr=indptr, indices=indices,
                             features=features, labels=labels, num_classes=num_classes or int(labels.max()) + 1,
                             target_type=target_type, name=name, source={"kind": "converted", "converter": "pyg-hetero"},
                             **splits)
    store.validate()
    return store


def from_ogb_mag(directory: str | Path, *, split_scheme: str | None = None, add_reverse: bool = True,
                 name: str | None = None) -> HeteroGraphStore:
    """A store from an OGB heterogeneous node-property-prediction directory (ogbn-mag as downloaded by ogb).

    Reads raw/num-node-dict.csv.gz (node types and counts), raw/triplet-type-list.csv.gz (relations),
    raw/relations/<src>___<name>___<dst>/edge.csv.gz, raw/node-feat/<type>/node-feat.csv.gz for the types
    that have them, raw/node-label/<type>/node-label.csv.gz (the labelled type is the target) and
    split/<scheme>/<target>/{train,valid,test}.csv.gz. `add_reverse` adds `rev_<name>` for every relation,
    as OGB's mag baselines do (ogbn-mag stores each edge once).
    """
    root = Path(directory)
    raw = root / "raw"
    if not (raw / "num-node-dict.csv.gz").is_file():
        raise FileNotFoundError(f"{raw / 'num-node-dict.csv.gz'} not found: {root} is not an OGB heterogeneous "
                                "dataset directory (expected raw/ with num-node-dict.csv.gz, and split/)")
    with gzip.open(raw / "num-node-dict.csv.gz", "rt") as handle:
        header, values = handle.read().split()[:2]
    counts = {type_name: int(count) for type_name, count in zip(header.split(","), values.split(","))}
    with gzip.open(raw / "triplet-type-list.csv.gz", "rt") as handle:
        relations = [Relation(*line.strip().split(",")) for line in handle if line.strip()]
    labelled = [t for t in counts if (raw / "node-label" / t / "node-label.csv.gz").is_file()]
    if len(labelled) != 1:
        raise GraphValidationError("target type", f"{root} labels node types {labelled}, expected exactly one",
                                   "keep one node-label/<type>/node-label.csv.gz")
    target = labelled[0]
    indptr, indices = {}, {}
    all_relations = list(relations)
    for relation in relations:
        edges = read_edge_file(raw / "relations" / f"{relation.src}___{relation.name}___{relation.dst}" / "edge.csv.gz")
        pairs = [(relation, edges[0], edges[1])]
        if add_reverse:
            backwards = Relation(relation.dst, f"rev_{relation.name}", relation.src)
            all_relations.append(backwards)
            pairs.append((backwards, edges[1], edges[0]))
        for rel, src, dst in pairs:
            indptr[rel], indices[rel] = csc_of(src, dst, counts[rel.dst], counts[rel.src])
    features = {t: torch.from_numpy(np.loadtxt(raw / "node-feat" / t / "node-feat.csv.gz", dtype=np.float32,
                                               delimiter=",", ndmin=2))
                for t in counts if (raw / "node-feat" / t / "node-feat.csv.gz").is_file()}
    node_types = type_ranges(counts)
    start = node_types[list(counts).index(target)].start
    labels = torch.full((sum(counts.values()),), -1, dtype=torch.long)
    target_labels = torch.from_numpy(_ogb_labels(raw / "node-label" / target / "node-label.csv.gz"))
    labels[start:start + target_labels.numel()] = target_labels
    scheme = _ogb_split_dir(root, split_scheme)
    splits = {field: torch.from_numpy(_read_ids(scheme / target / f"{file}.csv.gz") + start) if scheme is not None
              else torch.zeros(0, dtype=torch.long)
              for field, file in zip(SPLIT_FIELDS, ("train", "valid", "test"))}
    store = HeteroGraphStore(node_types=node_types, relations=tuple(all_relations), indptr=indptr, indices=indices,
                             features=features, labels=labels, num_classes=int(labels.max()) + 1, target_type=target,
                             name=name or root.name, source={"kind": "converted", "converter": "ogb-hetero",
                                                             "input": str(root), "add_reverse": add_reverse},
                             **splits)
    store.validate()
    return store


def from_igbh(directory: str | Path, *, target_type: str = "paper", label_file: str = "node_label_19.npy",
              split: SplitFractions | None = None, seed: int = 0, add_reverse: bool = True,
              name: str | None = None) -> HeteroGraphStore:
    """A store from an IGBH-style directory (as IGB's `processed/`): a folder per node type holding
    `node_feat.npy` [n, F] (which gives the type's node count), the target type's `label_file` [n], and a
    folder per relation `<src>__<name>__<dst>` holding `edge_index.npy` [E, 2] (source, destination local ids).
    IGBH ships no split: the target's labelled nodes are split at random (`split`, `seed`). `add_reverse` adds
    `rev_<name>` for every relation."""
    root = Path(directory)
    if not root.is_dir():
        raise FileNotFoundError(f"IGBH directory {root} does not exist")
    type_dirs = sorted(entry for entry in root.iterdir() if entry.is_dir() and "__" not in entry.name)
    relation_dirs = sorted(entry for entry in root.iterdir() if entry.is_dir() and "__" in entry.name)
    features, counts = {}, {}
    for folder in type_dirs:
        if not (folder / "node_feat.npy").is_file():
            raise GraphValidationError(f"node type {folder.name!r}", f"{folder / 'node_feat.npy'} is missing (it "
                                       "gives the type's node count)", "add the type's node_feat.npy")
        rows = load_array(folder, "node_feat", mmap=False)
        features[folder.name] = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.float32)
                                                 if rows.dtype not in (np.float32, np.float16) else rows)
        counts[folder.name] = int(rows.shape[0])
    if target_type not in counts:
        raise GraphValidationError("target_type", f"{target_type!r} has no folder in {root} (types: {list(counts)})",
                                   "name the node type whose labels to learn")
    relations, indptr, indices = [], {}, {}
    for folder in relation_dirs:
        parts = folder.name.split("__")
        if len(parts) != 3 or parts[0] not in counts or parts[2] not in counts:
            raise GraphValidationError(f"relation folder {folder.name!r}", "is not <src>__<name>__<dst> of two node "
                                       f"types ({list(counts)})", "name relation folders src__name__dst")
        relation = Relation(*parts)
        pairs = load_array(folder, "edge_index", mmap=False)
        if pairs.ndim != 2 or pairs.shape[1] != 2:
            raise GraphValidationError(f"relation {relation} edge_index", f"has shape {pairs.shape}, expected [E, 2]",
                                       "store (source, destination) local ids, one edge per row")
        edges = [(relation, pairs[:, 0], pairs[:, 1])]
        if add_reverse:
            edges.append((Relation(relation.dst, f"rev_{relation.name}", relation.src), pairs[:, 1], pairs[:, 0]))
        for rel, src, dst in edges:
            for ids, role, type_name in ((src, "source", rel.src), (dst, "destination", rel.dst)):
                if ids.size and (ids.min() < 0 or ids.max() >= counts[type_name]):
                    raise GraphValidationError(f"relation {relation} edge_index", f"holds {role} ids outside "
                                               f"{type_name!r}'s [0, {counts[type_name]})",
                                               f"use local ids of the {role} type")
            relations.append(rel)
            indptr[rel], indices[rel] = csc_of(src, dst, counts[rel.dst], counts[rel.src])
    node_types = type_ranges(counts)
    start = node_types[list(counts).index(target_type)].start
    target_labels = load_array(root / target_type, label_file.removesuffix(".npy"), mmap=False).reshape(-1)
    labels = torch.full((sum(counts.values()),), -1, dtype=torch.long)
    labels[start:start + target_labels.size] = torch.from_numpy(target_labels.astype(np.int64))
    labelled = np.flatnonzero(target_labels >= 0)
    train, val, test = random_split(labelled, split or SplitFractions(), seed)
    store = HeteroGraphStore(node_types=node_types, relations=tuple(relations), indptr=indptr, indices=indices,
                             features=features, labels=labels, num_classes=int(labels.max()) + 1,
                             target_type=target_type, train_idx=torch.from_numpy(train + start),
                             val_idx=torch.from_numpy(val + start), test_idx=torch.from_numpy(test + start),
                             name=name or root.name, source={"kind": "converted", "converter": "igbh",
                                                             "input": str(root), "seed": seed})
    store.validate()
    return store


def to_pyg_hetero(graph: HeteroGraphStore) -> Any:
    """The graph as a torch_geometric `HeteroData` (local ids per type; labels and masks on the target type)."""
    from torch_geometric.data import HeteroData

    data = HeteroData()
    for node_type in graph.node_types:
        data[node_type.name].num_nodes = node_type.count
        if node_type.name in graph.features:
            data[node_type.name].x = graph.features[node_type.name]
    for relation in graph.relations:
        indptr = graph.indptr[relation]
        dst = torch.repeat_interleave(torch.arange(indptr.numel() - 1), indptr[1:] - indptr[:-1])
        data[tuple(relation)].edge_index = torch.stack([graph.indices[relation].long(), dst])
    target = graph.node_type(graph.target_type)
    data[target.name].y = graph.labels[target.start:target.stop]
    for field in SPLIT_FIELDS:
        mask = torch.zeros(target.count, dtype=torch.bool)
        mask[getattr(graph, field) - target.start] = True
        data[target.name][f"{field.removesuffix('_idx')}_mask"] = mask
    return data


def homogeneous_view(graph: HeteroGraphStore) -> GraphStore:
    """One node and one edge type: every relation's edges in one CSC over the global ids, features zero-padded."""
    indptr, indices = graph.homogeneous_csc()
    width = max(graph.feature_dims.values(), default=1)
    features = torch.zeros(graph.num_nodes, width)
    for node_type in graph.node_types:
        if node_type.name in graph.features:
            rows = graph.features[node_type.name]
            features[node_type.start:node_type.stop, : rows.shape[1]] = rows.float()
    dtype = torch.int32 if graph.num_nodes < 2**31 else torch.int64
    return GraphStore(indptr=indptr, indices=indices.to(dtype), features=features, labels=graph.labels,
                      train_idx=graph.train_idx, val_idx=graph.val_idx, test_idx=graph.test_idx,
                      num_classes=graph.num_classes, name=f"{graph.name}-homogeneous",
                      source={"kind": "homogeneous view", "of": graph.name})
