"""Heterogeneous graphs in and out: from PyG's `HeteroData`, back to `HeteroData`, and the homogeneous view.

The homogeneous view drops the relation and node types (one CSC of every relation's edges, each type's
features zero-padded to the widest, zeros for types without features): what a model that ignores
types trains on, for comparisons.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from morphpipe.data.hetero_store import HeteroGraphStore, Relation, csc_of, type_ranges
from morphpipe.data.splits import as_split_ids
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
