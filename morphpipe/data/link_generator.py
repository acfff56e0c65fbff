"""Synthetic link-prediction graphs: a community graph with an edge split, deterministic for a seed.

The planted structure: many large communities joined mostly inside (homophily), with node features a
noisy community mean. Two nodes of one community rarely share a neighbour when communities are much
larger than degrees, so common-neighbour counts are zero for most held-out edges and their
negatives alike; a GNN that averages features over neighbourhoods recovers the community and ranks
same-community pairs first. The graph is generated as `generators.generate` makes it, then its edges
are split (`edge_split.split_edges`) in place: meta.json is removed first and written last, so an
interrupted run leaves a directory that is regenerated, never a graph without its split.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from morphpipe.data.edge_split import DEFAULT_EDGE_FRACTIONS, DEFAULT_EVAL_NEGATIVES, split_edges
from morphpipe.data.generators import GeneratorSpec, generate, generation_record
from morphpipe.data.ondisk import META_FILE, load_array, read_meta, save_array, write_meta
from morphpipe.data.splits import SplitFractions


@dataclass(frozen=True)
class EdgeSplitSpec:
    """How a generated graph's edges are split: held-out shares, fixed negatives per held-out edge, seed."""

    fractions: SplitFractions = DEFAULT_EDGE_FRACTIONS
    negatives: int = DEFAULT_EVAL_NEGATIVES
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"fractions": list(self.fractions.as_tuple()), "negatives": self.negatives, "seed": self.seed}


def link_generation_record(spec: GeneratorSpec, split: EdgeSplitSpec, preset: str | None = None) -> dict[str, Any]:
    """The meta.json `source` of a generated link graph; a cached preset is reused only if it matches."""
    return {**generation_record(spec, preset), "edge_split": split.to_dict()}


def generate_link(spec: GeneratorSpec, split: EdgeSplitSpec, out_dir: str | os.PathLike, *, name: str | None = None,
                  preset: str | None = None, progress: bool = True, overwrite: bool = False) -> Path:
    """Generates the graph of `spec` into `out_dir`, then splits its edges there (`split`); returns the path."""
    out = generate(spec, out_dir, name=name, preset=preset, progress=progress, overwrite=overwrite)
    meta = read_meta(out)
    (out / META_FILE).unlink()
    result = split_edges(load_array(out, "indptr", mmap=False), load_array(out, "indices", mmap=False),
                         spec.num_nodes, fractions=split.fractions, negatives=split.negatives, seed=split.seed,
                         undirected=spec.undirected)
    save_array(out, "indptr", result.indptr)
    save_array(out, "indices", result.indices)
    result.split.save(out)
    meta.num_edges = int(result.indices.size)
    meta.indices_dtype = str(result.indices.dtype)
    meta.source = link_generation_record(spec, split, preset)
    write_meta(out, meta)
    return out
