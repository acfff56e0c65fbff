"""Helpers shared by the data tests."""
from __future__ import annotations

import torch

from morphpipe.data.hetero_store import HeteroGraphStore


def assert_same_graph(left: HeteroGraphStore, right: HeteroGraphStore) -> None:
    assert left.node_types == right.node_types and left.relations == right.relations
    for relation in left.relations:
        assert torch.equal(left.indptr[relation], right.indptr[relation])
        assert torch.equal(left.indices[relation].long(), right.indices[relation].long())
    assert left.features.keys() == right.features.keys()
    for name in left.features:
        assert torch.equal(left.features[name], right.features[name])
    for name in ("labels", "train_idx", "val_idx", "test_idx"):
        assert torch.equal(getattr(left, name), getattr(right, name))
    assert (left.num_classes, left.target_type) == (right.num_classes, right.target_type)
