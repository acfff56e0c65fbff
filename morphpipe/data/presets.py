"""Named synthetic datasets: a generator spec plus what the dataset is for."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from morphpipe.data.generators import COMMUNITY, POWER_LAW, GeneratorSpec, generate, generation_record
from morphpipe.data.link_generator import EdgeSplitSpec, generate_link, link_generation_record
from morphpipe.data.splits import SplitFractions


@dataclass(frozen=True)
class Preset:
    """A named dataset that `load_dataset(name)` generates into the cache on first use."""

    name: str
    description: str
    spec: GeneratorSpec
    edge_split: EdgeSplitSpec | None = None  # link presets: how the generated edges are split

    def record(self) -> dict[str, Any]:
        """The meta.json `source` this preset's generation writes (a cached copy is current when it matches)."""
        if self.edge_split is None:
            return generation_record(self.spec, self.name)
        return link_generation_record(self.spec, self.edge_split, self.name)

    def generate(self, out_dir: str | os.PathLike, *, progress: bool = True, overwrite: bool = False) -> Path:
        """Generates the preset (and its edge split, for a link preset) into `out_dir`."""
        if self.edge_split is None:
            return generate(self.spec, out_dir, preset=self.name, progress=progress, overwrite=overwrite)
        return generate_link(self.spec, self.edge_split, out_dir, preset=self.name, progress=progress,
                             overwrite=overwrite)


# Feature noise of the community presets, chosen so that the nearest class mean of a node's own
# features (what an MLP can reach) is right for ~50-60% of the nodes, and the nearest class mean of
# the average over the node and its neighbours (homophily 0.85) for > 90% (tests/data/test_generators.py).
BENCH_SPLIT = SplitFractions(0.1, 0.05, 0.05)

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
