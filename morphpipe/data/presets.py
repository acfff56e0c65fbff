"""Named synthetic datasets: a generator spec plus what the dataset is for."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from morphpipe.data.generators import COMMUNITY, POWER_LAW, GeneratorSpec, generate, generation_record
from morphpipe.data.hetero_generator import MagSpec, generate_hetero, hetero_generation_record
from morphpipe.data.link_generator import EdgeSplitSpec, generate_link, link_generation_record
from morphpipe.data.splits import SplitFractions


@dataclass(frozen=True)
class Preset:
    """A named dataset that `load_dataset(name)` generates into the cache on first use."""

    name: str
    description: str
    spec: GeneratorSpec | MagSpec  # a MagSpec makes a heterogeneous graph (morphpipe.data.hetero_generator)
    edge_split: EdgeSplitSpec | None = None  # link presets: how the generated edges are split

    def record(self) -> dict[str, Any]:
        """The meta.json `source` this preset's generation writes (a cached copy is current when it matches)."""
        if isinstance(self.spec, MagSpec):
            return hetero_generation_record(self.spec, self.name)
        if self.edge_split is None:
            return generation_record(self.spec, self.name)
        return link_generation_record(self.spec, self.edge_split, self.name)

    def generate(self, out_dir: str | os.PathLike, *, progress: bool = True, overwrite: bool = False,
                 memory_budget: int | None = None) -> Path:
        """Generates the preset (a heterogeneous graph, or a graph with its edge split for a link preset) into
        `out_dir`; `memory_budget` bounds the out-of-core CSC build of a homogeneous or heterogeneous graph."""
        if isinstance(self.spec, MagSpec):
            return generate_hetero(self.spec, out_dir, preset=self.name, overwrite=overwrite, progress=progress,
                                   memory_budget=memory_budget)
        if self.edge_split is None:
            return generate(self.spec, out_dir, preset=self.name, progress=progress, overwrite=overwrite,
                            memory_budget=memory_budget)
        return generate_link(self.spec, self.edge_split, out_dir, preset=self.name, progress=progress,
                             overwrite=overwrite)


# Feature noise of the community presets, chosen so that the nearest class mean of a node's own
# features (what an MLP can reach) is right for ~50-60% of the nodes, and the nearest class mean of
# the average over the node and its neighbours (homophily 0.85) for > 90% (tests/data/test_generators.py).
BENCH_SPLIT = SplitFractions(0.1, 0.05, 0.05)
# ogbn-papers100M: 111,059,956 nodes, 1,615,685,872 directed citation edges, 128 features, 172 classes,
# 1,207,179 / 125,265 / 214,338 train / val / test nodes.
PAPERS100M_NODES = 111_059_956
PAPERS100M_SPLIT = SplitFractions(0.011, 0.0011, 0.0019)

PRESETS: dict[str, Preset] = {
    preset.name: preset
    for preset in (
        Preset("tiny", "3k-node community graph for fast tests",
               GeneratorSpec(COMMUNITY, num_nodes=3_000, avg_degree=12, feature_dim=32, num_classes=4,
                             feature_noise=1.0)),
        Preset("default", "150k-node community graph (structure and features carry the class) for the README "
               "and `morphpipe tune`; GraphSAGE clearly beats an MLP on it",
               GeneratorSpec(COMMUNITY, num_nodes=150_000, avg_degree=16, feature_dim=128, num_classes=12,
                             feature_noise=0.7)),
        Preset("bench-1m", "power-law graph, 1M nodes, average degree 20, 128 float16 features: the sampler "
               "benchmark's graph",
               GeneratorSpec(POWER_LAW, num_nodes=1_000_000, avg_degree=20, feature_dim=128, feature_dtype="float16",
                             num_classes=16, split=BENCH_SPLIT)),
        Preset("bench-10m", "power-law graph, 10M nodes, ~200M edges, 128 float16 features (2.56 GB)",
               GeneratorSpec(POWER_LAW, num_nodes=10_000_000, avg_degree=20, feature_dim=128,
                             feature_dtype="float16", num_classes=16, split=BENCH_SPLIT)),
        Preset("papers100m-like", "shaped like ogbn-papers100M: 111M nodes, ~1.6B directed edges with power-law "
               "in-degree, 128 float16 features (28 GB), 172 classes, 1.1% of nodes in the train split; larger than "
               "this machine's RAM, so edges are sorted on disk within --memory-budget",
               GeneratorSpec(POWER_LAW, num_nodes=PAPERS100M_NODES, avg_degree=14.55, feature_dim=128,
                             feature_dtype="float16", num_classes=172, split=PAPERS100M_SPLIT, undirected=False)),
        Preset("mag-tiny", "heterogeneous graph shaped like ogbn-mag (4 node types, 4 relations and their reverses, "
               "features on papers only; the relation types carry the class), 3k papers, for fast tests",
               MagSpec(num_papers=3_000, num_authors=2_500, num_institutions=60, num_fields=150, feature_dim=32)),
        Preset("mag", "heterogeneous graph shaped like ogbn-mag at 1/4 of its node counts: 184k papers, 283k "
               "authors, 2.2k institutions, 15k topics, 5M edges (reverses included), 128 float32 paper features: "
               "the heterogeneous benchmark's graph",
               MagSpec(num_papers=184_000, num_authors=283_000, num_institutions=2_200, num_fields=15_000,
                       feature_dim=128, num_classes=16, split=BENCH_SPLIT)),
        Preset("link", "50k-node graph of 40 large communities with an edge split (5% validation, 5% test edges, "
               "100 negatives each) for link prediction: a GNN clearly beats common neighbours on it",
               GeneratorSpec(COMMUNITY, num_nodes=50_000, avg_degree=12, feature_dim=64, num_classes=40,
                             homophily=0.9, feature_noise=1.0),
               EdgeSplitSpec()),
    )
}


def get_preset(name: str) -> Preset:
    """The preset called `name`, or an error listing the presets."""
    if name not in PRESETS:
        raise ValueError(f"unknown dataset preset {name!r}; presets: {', '.join(PRESETS)}")
    return PRESETS[name]
