"""A synthetic heterogeneous graph shaped like ogbn-mag, whose class is carried by the relation types.

Node types paper, author, institution, field_of_study; relations writes (author -> paper), cites
(paper -> paper), affiliated_with (author -> institution), has_topic (paper -> field_of_study) and
their reverses (`rev_<name>`, destination -> source). Only papers have features; papers are the
target type.

How the class is carried: a paper of class `c` cites papers of class `c + s` (mod C, s = C / 4),
so it is cited by papers of class `c - s`. A model that tells `cites` from `rev_cites` reads `c`
from either side; a model that merges the relations sees the mixture {c - s, c + s}, which is the
same for `c` and `c + 2s`, and can only break the tie with the paper's own (noisy) features.
Authors, institutions and topics are attached at random: noise a model must learn to ignore.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from morphpipe.data.hetero_store import HeteroGraphStore, Relation, csc_of, type_ranges
from morphpipe.data.ondisk import check_graph_output
from morphpipe.data.splits import SplitFractions, random_split
from morphpipe.numeric import check_float, check_int

MAG_SHAPED = "mag-shaped"
HETERO_GENERATOR_VERSION = 1
PAPER, AUTHOR, INSTITUTION, FIELD = "paper", "author", "institution", "field_of_study"
BASE_RELATIONS = (Relation(AUTHOR, "writes", PAPER), Relation(PAPER, "cites", PAPER),
                  Relation(AUTHOR, "affiliated_with", INSTITUTION), Relation(PAPER, "has_topic", FIELD))


def reverse(relation: Relation) -> Relation:
    """The relation read backwards, named `rev_<name>`."""
    return Relation(relation.dst, f"rev_{relation.name}", relation.src)


MAG_RELATIONS = BASE_RELATIONS + tuple(reverse(relation) for relation in BASE_RELATIONS)


@dataclass(frozen=True)
class MagSpec:
    """What to generate: node counts per type, edges per paper/author, features, classes and the seed."""

    num_papers: int
    num_authors: int
    num_institutions: int
    num_fields: int
    feature_dim: int = 64
    num_classes: int = 8  # a multiple of 4: the citation shift is num_classes / 4
    citations: int = 6  # papers each paper cites
    authors_per_paper: int = 3
    topics_per_paper: int = 3
    feature_noise: float = 1.5  # noise std per dimension; class means have norm ~1 (as the community preset's)
    seed: int = 0
    split: SplitFractions = field(default_factory=lambda: SplitFractions(0.6, 0.2, 0.2))
    kind: str = MAG_SHAPED

    def __post_init__(self) -> None:
        for name in ("num_papers", "num_authors", "num_institutions", "num_fields", "feature_dim", "citations",
                     "authors_per_paper", "topics_per_paper"):
            check_int(f"mag spec: {name}", getattr(self, name), 1)
        check_int("mag spec: seed", self.seed, 0)
        check_float("mag spec: feature_noise", self.feature_noise, 0)
        if check_int("mag spec: num_classes", self.num_classes, 4) % 4:
            raise ValueError(f"mag spec: num_classes = {self.num_classes} must be a multiple of 4 (the citation "
                             "shift is num_classes / 4)")
        if self.kind != MAG_SHAPED:
            raise ValueError(f"mag spec: kind = {self.kind!r}, expected {MAG_SHAPED!r}")

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["split"] = list(self.split.as_tuple())
        return data

    def with_overrides(self, **overrides: Any) -> "MagSpec":
        """A copy with the given fields replaced (None values are ignored; unknown ones are an error)."""
        known = set(self.to_dict())
        unknown = sorted(key for key, value in overrides.items() if value is not None and key not in known)
        if unknown:
            raise ValueError(f"options {unknown} do not apply to a {MAG_SHAPED} graph")
        return replace(self, **{key: value for key, value in overrides.items() if value is not None})


def hetero_generation_record(spec: MagSpec, preset: str | None = None) -> dict[str, Any]:
    """The meta.json `source` of a generated heterogeneous graph; a cached preset is reused only if it matches."""
    return {"kind": "generated", "generator_version": HETERO_GENERATOR_VERSION, "preset": preset,
            "spec": spec.to_dict()}


def mag_shaped(spec: MagSpec, name: str = MAG_SHAPED, preset: str | None = None) -> HeteroGraphStore:
    """The graph `spec` describes, in memory (deterministic for the spec)."""
    rng = np.random.default_rng(np.random.SeedSequence([spec.seed, 0xC1A55]))
    counts = {PAPER: spec.num_papers, AUTHOR: spec.num_authors, INSTITUTION: spec.num_institutions,
              FIELD: spec.num_fields}
    labels = rng.integers(0, spec.num_classes, spec.num_papers, dtype=np.int64)
    edges = {
        BASE_RELATIONS[0]: _attach(rng, spec.num_papers, spec.authors_per_paper, spec.num_authors, members_first=False),
        BASE_RELATIONS[1]: _citations(rng, labels, spec.num_classes, spec.citations),
        BASE_RELATIONS[2]: (np.arange(spec.num_authors), rng.integers(0, spec.num_institutions, spec.num_authors)),
        BASE_RELATIONS[3]: _attach(rng, spec.num_papers, spec.topics_per_paper, spec.num_fields, members_first=True),
    }
    indptr, indices = {}, {}
    for relation, (src, dst) in edges.items():
        src, dst = _dedupe(src, dst, counts[relation.src])
        for rel, s, d in ((relation, src, dst), (reverse(relation), dst, src)):
            indptr[rel], indices[rel] = csc_of(s, d, counts[rel.dst], counts[rel.src])
    means = rng.standard_normal((spec.num_classes, spec.feature_dim)) / np.sqrt(spec.feature_dim)
    noise = rng.standard_normal((spec.num_papers, spec.feature_dim)) * spec.feature_noise
    features = (means[labels] + noise).astype(np.float32)
    train, val, test = random_split(np.arange(spec.num_papers), spec.split, spec.seed)
    node_types = type_ranges(counts)
    all_labels = np.full(sum(counts.values()), -1, dtype=np.int64)
    all_labels[: spec.num_papers] = labels  # papers come first: their local ids are global ids
    return HeteroGraphStore(
        node_types=node_types, relations=MAG_RELATIONS, indptr=indptr, indices=indices,
        features={PAPER: torch.from_numpy(features)}, labels=torch.from_numpy(all_labels),
        train_idx=torch.from_numpy(train), val_idx=torch.from_numpy(val), test_idx=torch.from_numpy(test),
        num_classes=spec.num_classes, target_type=PAPER, name=name,
        source=hetero_generation_record(spec, preset))


def generate_hetero(spec: MagSpec, out_dir: str | os.PathLike, *, name: str | None = None, preset: str | None = None,
                    overwrite: bool = False) -> Path:
    """Generates the graph into directory `out_dir` (swapped in whole) and returns its path."""
    out = check_graph_output(out_dir, overwrite)
    mag_shaped(spec, name or preset or MAG_SHAPED, preset).save(out)
    return out


def _attach(rng: np.random.Generator, num_papers: int, per_paper: int, num_members: int,
            members_first: bool) -> tuple[np.ndarray, np.ndarray]:
    """Each paper joined to 1..2*per_paper-1 random members (authors or topics): (src, dst) local ids, with the
    paper as destination (authors write papers) or source (papers have topics)."""
    degree = rng.integers(1, 2 * per_paper, num_papers)
    papers = np.repeat(np.arange(num_papers), degree)
    members = rng.integers(0, num_members, papers.size)
    return (papers, members) if members_first else (members, papers)


def _citations(rng: np.random.Generator, labels: np.ndarray, num_classes: int,
               per_paper: int) -> tuple[np.ndarray, np.ndarray]:
    """Each paper of class c cites `per_paper` random papers of class c + num_classes/4 (citing -> cited)."""
    by_class = np.argsort(labels, kind="stable")
    starts = np.searchsorted(labels[by_class], np.arange(num_classes + 1))
    citing = np.repeat(np.arange(labels.size), per_paper)
    target = (labels[citing] + num_classes // 4) % num_classes
    sizes = starts[target + 1] - starts[target]
    keep = sizes > 0
    citing, target, sizes = citing[keep], target[keep], sizes[keep]
    cited = by_class[starts[target] + (rng.random(citing.size) * sizes).astype(np.int64)]
    return citing, cited


def _dedupe(src: np.ndarray, dst: np.ndarray, num_src: int) -> tuple[np.ndarray, np.ndarray]:
    """Distinct (src, dst) pairs, self pairs kept (types may differ)."""
    keys = np.unique(np.asarray(dst, dtype=np.int64) * num_src + np.asarray(src, dtype=np.int64))
    return keys % num_src, keys // num_src
