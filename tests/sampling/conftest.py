"""Fixtures and helpers shared by the sampling tests: the fanouts, the graph, and the checks of a sampled batch."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from morphpipe.sampling import MiniBatch
from tests.conftest import make_graph

FANOUTS = [4, 3, 2]


@pytest.fixture(scope="module", params=[torch.int32, torch.int64], ids=["int32", "int64"])
def graph(request):
    return make_graph(500, index_dtype=request.param)


def neighbours_of(graph, node: int) -> np.ndarray:
    return graph.indices[graph.indptr[node]:graph.indptr[node + 1]].numpy().astype(np.int64)


def check_batch(graph, batch: MiniBatch, fanouts: list[int]) -> None:
    """Every structural property a sampled batch must have."""
    num_seeds = batch.seeds.numel()
    assert torch.equal(batch.input_nodes[:num_seeds], batch.seeds), "seeds are the prefix of input_nodes"
    assert torch.unique(batch.input_nodes).numel() == batch.input_nodes.numel()
    assert len(batch.blocks) == len(fanouts)
    assert batch.blocks[0].num_src == batch.input_nodes.numel()
    assert batch.blocks[-1].num_dst == num_seeds
    for layer, block in enumerate(batch.blocks):
        fanout = fanouts[len(fanouts) - 1 - layer]
        if layer > 0:
            assert block.num_src == batch.blocks[layer - 1].num_dst
        assert block.indptr.numel() == block.num_dst + 1 and block.indptr[0] == 0
        assert int(block.indptr[-1]) == block.nnz
        assert block.nnz == 0 or (0 <= int(block.indices.min()) and int(block.indices.max()) < block.num_src)
        for dst in range(block.num_dst):
            dst_global = int(batch.input_nodes[dst])
            sampled = batch.input_nodes[block.indices[block.indptr[dst]:block.indptr[dst + 1]]].numpy()
            true = neighbours_of(graph, dst_global)
            assert np.isin(sampled, true).all(), "every sampled edge exists in the graph"
            assert len(np.unique(sampled)) == len(sampled), "no repeated neighbour per destination"
            expected = len(true) if fanout == -1 else min(fanout, len(true))
            assert len(sampled) == expected, "fanout respected, low-degree nodes take all"
    assert torch.equal(batch.x, graph.features[batch.input_nodes])
    assert torch.equal(batch.y, graph.labels[batch.seeds])
