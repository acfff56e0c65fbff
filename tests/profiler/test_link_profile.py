"""The profiler measures the link task's phases on its edge batches: units are training edges, and the batch grows
with the negatives per positive (more endpoints to sample and gather)."""
from __future__ import annotations

import math

import pytest

from morphpipe.data import GraphStore
from morphpipe.data.generators import COMMUNITY, GeneratorSpec
from morphpipe.data.link_generator import EdgeSplitSpec, generate_link
from morphpipe.data.splits import SplitFractions
from morphpipe.nn import LinkPrediction
from morphpipe.profiler.profiler import Profiler


@pytest.fixture(scope="module")
def graph(tmp_path_factory) -> GraphStore:
    spec = GeneratorSpec(COMMUNITY, num_nodes=600, avg_degree=8, feature_dim=8, num_classes=4, homophily=0.9)
    return GraphStore.load(generate_link(spec, EdgeSplitSpec(SplitFractions(0.8, 0.1, 0.1), negatives=5),
                                         tmp_path_factory.mktemp("link") / "g", progress=False))


def test_link_profiles_count_edges_and_grow_with_negatives(graph, community_cache):
    profiles = {}
    for negatives in (1, 20):
        profiler = Profiler(graph, model="sage", fanouts=[3, 3], batch_size=64, hidden=8, device="cpu",
                            thread_counts=[1], warmup=1, steps=2, progress=False, attempts=1, log=lambda _: None,
                            task=LinkPrediction(negatives))
        profiles[negatives] = profiler.run()
    for negatives, profile in profiles.items():
        assert profile.num_batches == math.ceil(graph.edge_split.train.shape[1] / 64)
        assert profile.workload["task"] == "link" and profile.workload["negatives"] == negatives
        assert profile.cpu_batching.points[1].mean_s > 0 and profile.cpu_training.points[1].mean_s > 0
    assert profiles[20].batch_bytes > 1.5 * profiles[1].batch_bytes  # 20 negatives: many more endpoints
