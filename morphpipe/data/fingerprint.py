"""A short hash that tells datasets apart, so a profile or plan records which dataset it was made for."""
from __future__ import annotations

import hashlib

import torch

SAMPLED_ENTRIES = 4096


def dataset_fingerprint(graph) -> str:
    """A short hash of a dataset's sizes and of evenly spaced entries of its topology, labels and splits (O(1) reads)."""
    digest = hashlib.sha256()
    sizes = (graph.num_nodes, graph.num_edges, graph.feature_dim, str(graph.feature_dtype), graph.num_classes)
    digest.update(repr(sizes).encode())
    if getattr(graph, "is_hetero", False):  # a heterogeneous store: its types and every relation's CSC
        digest.update(repr((graph.node_types, graph.relations, graph.feature_dims)).encode())
        topology = [tensor for relation in graph.relations for tensor in (graph.indptr[relation],
                                                                          graph.indices[relation])]
    else:
        topology = [graph.indptr, graph.indices]
    for tensor in (*topology, graph.labels, graph.train_idx, graph.val_idx, graph.test_idx):
        digest.update(repr(tuple(tensor.shape)).encode())
        if tensor.numel():
            positions = sampled_positions(tensor.numel())
            digest.update(tensor.reshape(-1)[positions].to(torch.int64).numpy().tobytes())
    return digest.hexdigest()[:16]


def sampled_positions(numel: int) -> torch.Tensor:
    """Up to SAMPLED_ENTRIES evenly spaced positions in [0, numel), computed in float64: float32 rounds the last
    position of a 20M-entry tensor past its end."""
    return torch.linspace(0, numel - 1, min(SAMPLED_ENTRIES, numel), dtype=torch.float64).long()
