"""Link prediction on 2 gloo ranks: every training edge exactly once per epoch over the ranks, MRR all-reduced.

Over 10 s on a loaded 2-core machine, as the other tests here: two processes each import torch and load
the native extension; the training itself is a second. It is the only test of the link task across ranks.
"""
from __future__ import annotations

import sys

import torch

from morphpipe.data import GraphStore
from morphpipe.data.generators import COMMUNITY, GeneratorSpec
from morphpipe.data.link_generator import EdgeSplitSpec, generate_link
from morphpipe.data.splits import SplitFractions
from morphpipe.distributed.launcher import launch
from tests.support import link_worker


def test_two_ranks_train_every_edge_once_per_epoch(tmp_path):
    spec = GeneratorSpec(COMMUNITY, num_nodes=400, avg_degree=8, feature_dim=8, num_classes=4, homophily=0.9)
    dataset = generate_link(spec, EdgeSplitSpec(SplitFractions(0.8, 0.1, 0.1), negatives=10), tmp_path / "g",
                            progress=False)
    assert launch([sys.executable, link_worker.__file__, str(dataset), str(tmp_path), "2"], 2) == 0
    ranks = [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(2)]
    trained = torch.cat([edges for rank in ranks for edges in rank["steps"]])
    train_edges = GraphStore.load(dataset).edge_split.train.shape[1]
    assert torch.equal(torch.sort(trained).values, torch.arange(train_edges))  # the last epoch, once each
    first, second = (sum(edges.numel() for edges in rank["steps"]) for rank in ranks)
    assert first > second  # 2:1 weights
    assert ranks[0]["mrr"] == ranks[1]["mrr"] and 0 < ranks[0]["mrr"] <= 1
