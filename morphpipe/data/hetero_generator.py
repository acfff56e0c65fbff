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

Generation is chunked like the homogeneous generator's (`morphpipe.data.generators`): each base
relation's pairs are drawn CHUNK_PAPERS papers (authors) at a time, each chunk from its own random
stream, so `generate_hetero` can sort every relation and its reverse out of core
(`external_csc.build_csc_on_disk`, within a memory budget) and write features in chunks, while
`mag_shaped` builds the very same graph in memory for tests and small graphs.
"""
from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from morphpipe.data.csc import KEY_NODE_LIMIT, fill_keys
from morphpipe.data.dtypes import index_dtype_for
from morphpipe.data.external_csc import SortPlan, build_csc_on_disk, default_memory_budget
from morphpipe.data.generators import (MAX_FEATURE_THREADS, STREAM_LABELS, STREAM_SPLITS, ClassFeatures,
                                       SortedBuildNeeds, stream_rng, stream_seed, write_failure)
from morphpipe.data.hetero_store import HeteroGraphStore, Relation, csc_of, type_ranges, write_hetero_meta
from morphpipe.data.ondisk import NpyChunkWriter, check_graph_output, nearest_existing_dir, save_array
from morphpipe.data.splits import SplitFractions, random_split
from morphpipe.data.validation import SPLIT_FIELDS, UNLABELLED
from morphpipe.numeric import check_float, check_int, format_bytes
from morphpipe.outputs import replacing_directory

MAG_SHAPED = "mag-shaped"
# Bump when the output for a given spec changes: cached presets made by another version are remade.
HETERO_GENERATOR_VERSION = 2
CHUNK_PAPERS = 1 << 15  # papers (authors for affiliated_with) per chunk of drawn pairs, each chunk its own stream
FEATURE_CHUNK_VALUES = 1 << 18  # feature values per chunk (1 MiB of float32)
STREAM_RELATIONS = 16  # streams 16..19: the base relations' pairs (the generators' streams are below)
# Memory per drawn pair of a chunk: ids, classes, sizes and random draws of the citations with their filtered copies,
# and the packed key.
PAIR_BYTES = 96
FEATURE_VALUE_BYTES = 8  # a feature value being made: the noise and the class mean added to it (float32 each)
SPLIT_BYTES_PER_PAPER = 32  # the splits: the paper ids, their permutation and the three parts
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

    def scaled_to(self, num_papers: int) -> "MagSpec":
        """The same shape with `num_papers` papers: every other node type scaled in proportion (at least 1 node)."""
        check_int("mag spec: num_papers", num_papers, 1)
        ratio = num_papers / self.num_papers
        return replace(self, num_papers=num_papers, **{name: max(1, round(getattr(self, name) * ratio))
                                                       for name in ("num_authors", "num_institutions", "num_fields")})


def hetero_generation_record(spec: MagSpec, preset: str | None = None) -> dict[str, Any]:
    """The meta.json `source` of a generated heterogeneous graph; a cached preset is reused only if it matches."""
    return {"kind": "generated", "generator_version": HETERO_GENERATOR_VERSION, "preset": preset,
            "spec": spec.to_dict()}


def mag_shaped(spec: MagSpec, name: str = MAG_SHAPED, preset: str | None = None) -> HeteroGraphStore:
    """The graph `spec` describes, in memory: the same graph `generate_hetero` writes out of core."""
    labels = paper_labels(spec)
    classes = _ClassIndex(labels, spec.num_classes)
    counts = type_counts(spec)
    indptr, indices = {}, {}
    for relation in BASE_RELATIONS:
        pairs = list(relation_pairs(spec, relation, classes))
        src = np.concatenate([chunk_src for chunk_src, _ in pairs])
        dst = np.concatenate([chunk_dst for _, chunk_dst in pairs])
        src, dst = _dedupe(src, dst, counts[relation.src])
        for rel, s, d in ((relation, src, dst), (reverse(relation), dst, src)):
            indptr[rel], indices[rel] = csc_of(s, d, counts[rel.dst], counts[rel.src])
    features = paper_features(spec, labels)
    means = features.means()
    node_types = type_ranges(counts)
    all_labels = np.full(node_types[-1].stop, UNLABELLED, dtype=np.int64)
    all_labels[: spec.num_papers] = labels  # papers come first: their local ids are global ids
    train, val, test = paper_splits(spec)
    return HeteroGraphStore(
        node_types=node_types, relations=MAG_RELATIONS, indptr=indptr, indices=indices,
        features={PAPER: torch.from_numpy(np.concatenate([features.chunk(chunk, means)
                                                          for chunk in range(features.num_chunks)]))},
        labels=torch.from_numpy(all_labels), train_idx=torch.from_numpy(train), val_idx=torch.from_numpy(val),
        test_idx=torch.from_numpy(test), num_classes=spec.num_classes, target_type=PAPER, name=name,
        source=hetero_generation_record(spec, preset))


def generate_hetero(spec: MagSpec, out_dir: str | os.PathLike, *, name: str | None = None, preset: str | None = None,
                    overwrite: bool = False, progress: bool = True, memory_budget: int | None = None) -> Path:
    """Generates the graph into directory `out_dir` (swapped in whole) and returns its path.

    Out of core: each relation's CSC is sorted within `memory_budget` (bytes, default: half the
    available memory; beyond it in runs spilled to disk) and features are written in chunks, so
    memory holds per-node arrays and buffers only. What it needs is checked (and, with `progress`,
    stated) before any work; the graph is the one `mag_shaped(spec)` builds, whatever the budget.
    """
    out = check_graph_output(out_dir, overwrite)
    needs = check_mag_fits(spec, out, memory_budget)
    name = name or preset or MAG_SHAPED
    if progress:
        print(f"{name}: {needs.describe()}", file=sys.stderr, flush=True)
    try:
        with replacing_directory(out, "output") as staging:
            _generate_into(staging, spec, name, preset, progress, needs.sort_budget)
    except OSError as error:
        raise write_failure(error, out, needs.disk_path, needs.peak_disk_bytes) from error
    return out


def _generate_into(out: Path, spec: MagSpec, name: str, preset: str | None, progress: bool, sort_budget: int) -> None:
    """Writes every file of the graph into the (empty) directory `out`, meta.json last."""
    labels = paper_labels(spec)
    classes = _ClassIndex(labels, spec.num_classes)
    counts = type_counts(spec)
    edges: dict[Relation, tuple[int, str]] = {}
    for relation in BASE_RELATIONS:
        width = max(counts[relation.src], counts[relation.dst])  # keys dst * width + src of both directions
        num_keys = pair_count(spec, relation, classes)
        for rel, backwards in ((relation, False), (reverse(relation), True)):
            indptr, num_edges = build_csc_on_disk(
                _relation_keys(spec, relation, classes, width, backwards), num_keys, width, out,
                memory_budget=sort_budget, dedupe=True, progress=progress, desc=f"{name}: {rel.name}",
                name=f"indices.{rel.key}")
            save_array(out, f"indptr.{rel.key}", indptr[:counts[rel.dst] + 1])
            edges[rel] = (num_edges, str(index_dtype_for(width)))
    del classes
    paper_features(spec, labels).write(out, f"features.{PAPER}", progress=progress, desc=f"{name}: features")
    num_nodes = sum(counts.values())
    with NpyChunkWriter(out, "labels", (num_nodes,), np.dtype(np.int64)) as writer:
        writer.write(labels)  # papers come first: their local ids are global ids
        unlabelled = np.full(min(CHUNK_PAPERS, num_nodes), UNLABELLED, dtype=np.int64)
        for start in range(spec.num_papers, num_nodes, unlabelled.size):
            writer.write(unlabelled[:min(unlabelled.size, num_nodes - start)])
    del labels
    for split_name, ids in zip(SPLIT_FIELDS, paper_splits(spec)):
        save_array(out, split_name, ids)
    write_hetero_meta(out, name=name, node_types=type_ranges(counts),
                      relations={relation: edges[relation] for relation in MAG_RELATIONS},
                      features={PAPER: (spec.feature_dim, "float32")}, target_type=PAPER,
                      num_classes=spec.num_classes, source=hetero_generation_record(spec, preset))


def type_counts(spec: MagSpec) -> dict[str, int]:
    """Node count per type, in id order (papers first)."""
    return {PAPER: spec.num_papers, AUTHOR: spec.num_authors, INSTITUTION: spec.num_institutions,
            FIELD: spec.num_fields}


def paper_labels(spec: MagSpec) -> np.ndarray:
    """Each paper's class, uniform (int64, held in memory: citations are drawn by class)."""
    return stream_rng(spec.seed, STREAM_LABELS).integers(0, spec.num_classes, spec.num_papers, dtype=np.int64)


def paper_features(spec: MagSpec, labels: np.ndarray) -> ClassFeatures:
    """Papers' features: their class mean under noise, made FEATURE_CHUNK_VALUES values at a time."""
    return ClassFeatures(labels, spec.num_classes, spec.feature_dim, spec.feature_noise, spec.seed,
                         max(1, FEATURE_CHUNK_VALUES // spec.feature_dim))


def paper_splits(spec: MagSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Train, validation and test papers (their local ids are global ids)."""
    return random_split(np.arange(spec.num_papers), spec.split, stream_seed(spec.seed, STREAM_SPLITS))


class _ClassIndex:
    """Papers grouped by class: `by_class[starts[c]:starts[c + 1]]` are the papers of class c."""

    def __init__(self, labels: np.ndarray, num_classes: int):
        self.labels = labels
        self.num_classes = num_classes
        self.by_class = np.argsort(labels, kind="stable")
        self.starts = np.searchsorted(labels[self.by_class], np.arange(num_classes + 1))

    def cited_class(self, classes: np.ndarray) -> np.ndarray:
        """The class papers of class c cite: c + num_classes / 4 (mod num_classes)."""
        return (classes + self.num_classes // 4) % self.num_classes

    def citing_papers(self) -> int:
        """Papers whose cited class is not empty (the others cite nothing)."""
        sizes = np.diff(self.starts)
        return int(sizes[sizes[self.cited_class(np.arange(self.num_classes))] > 0].sum())


def relation_pairs(spec: MagSpec, relation: Relation, classes: _ClassIndex) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The (source, destination) local-id pairs of base `relation`, duplicates included, chunk after chunk.

    Chunk k covers CHUNK_PAPERS papers (authors for affiliated_with) and draws from its own random
    stream (the spec's seed, the relation, k): any chunk can be made alone, so the graph does not
    depend on how it is built.
    """
    stream = STREAM_RELATIONS + BASE_RELATIONS.index(relation)
    owners = spec.num_authors if relation.name == "affiliated_with" else spec.num_papers
    for chunk, first in enumerate(range(0, owners, CHUNK_PAPERS)):
        last = min(first + CHUNK_PAPERS, owners)
        rng = stream_rng(spec.seed, stream, chunk)
        if relation.name == "writes":
            papers, authors = _attach(rng, first, last, spec.authors_per_paper, spec.num_authors)
            yield authors, papers
        elif relation.name == "cites":
            yield _citations(rng, first, last, classes, spec.citations)
        elif relation.name == "affiliated_with":
            yield np.arange(first, last), rng.integers(0, spec.num_institutions, last - first)
        else:
            yield _attach(rng, first, last, spec.topics_per_paper, spec.num_fields)


def pair_count(spec: MagSpec, relation: Relation, classes: _ClassIndex) -> int:
    """How many pairs `relation_pairs` yields (duplicates included), without drawing them."""
    if relation.name == "cites":
        return spec.citations * classes.citing_papers()
    if relation.name == "affiliated_with":
        return spec.num_authors
    per_paper = spec.authors_per_paper if relation.name == "writes" else spec.topics_per_paper
    stream = STREAM_RELATIONS + BASE_RELATIONS.index(relation)
    return sum(int(_degrees(stream_rng(spec.seed, stream, chunk), min(CHUNK_PAPERS, spec.num_papers - first),
                            per_paper).sum())
               for chunk, first in enumerate(range(0, spec.num_papers, CHUNK_PAPERS)))


def _relation_keys(spec: MagSpec, relation: Relation, classes: _ClassIndex, width: int,
                   backwards: bool) -> Iterator[np.ndarray]:
    """Packed keys dst * width + src of `relation`'s pairs (of its reverse when `backwards`), chunk after chunk."""
    for src, dst in relation_pairs(spec, relation, classes):
        keys = np.empty(src.size, dtype=np.int64)
        if backwards:
            src, dst = dst, src
        fill_keys(keys, src, dst, width)
        yield keys


def _degrees(rng: np.random.Generator, num_papers: int, per_paper: int) -> np.ndarray:
    """Members per paper: uniform in 1..2*per_paper-1 (mean per_paper); the first draw of a chunk's stream."""
    return rng.integers(1, 2 * per_paper, num_papers)


def _attach(rng: np.random.Generator, first: int, last: int, per_paper: int,
            num_members: int) -> tuple[np.ndarray, np.ndarray]:
    """Papers [first, last) each joined to `_degrees` random members (authors or topics): (papers, members)."""
    papers = np.repeat(np.arange(first, last), _degrees(rng, last - first, per_paper))
    return papers, rng.integers(0, num_members, papers.size)


def _citations(rng: np.random.Generator, first: int, last: int, classes: _ClassIndex,
               per_paper: int) -> tuple[np.ndarray, np.ndarray]:
    """Each paper of [first, last), of class c, cites `per_paper` random papers of class c + C/4: (citing, cited)."""
    citing = np.repeat(np.arange(first, last), per_paper)
    target = classes.cited_class(classes.labels[citing])
    sizes = classes.starts[target + 1] - classes.starts[target]
    keep = sizes > 0
    citing, target, sizes = citing[keep], target[keep], sizes[keep]
    cited = classes.by_class[classes.starts[target] + (rng.random(citing.size) * sizes).astype(np.int64)]
    return citing, cited


def _dedupe(src: np.ndarray, dst: np.ndarray, num_src: int) -> tuple[np.ndarray, np.ndarray]:
    """Distinct (src, dst) pairs, self pairs kept (types may differ)."""
    keys = np.unique(np.asarray(dst, dtype=np.int64) * num_src + np.asarray(src, dtype=np.int64))
    return keys % num_src, keys // num_src


@dataclass(frozen=True)
class MagGenerationNeeds(SortedBuildNeeds):
    """Memory and disk generating a mag-shaped graph takes, estimated from the spec before any work (the graph's
    bytes at most: duplicates are dropped; the sort is the largest relation's)."""

    num_keys: dict[str, int]  # base relation name -> pairs drawn (each sorted twice: forward and reverse)
    minimum: int  # the least budget accepted

    @property
    def peak_disk_bytes(self) -> int:
        """The graph, with the spilled runs of one relation beside it (each relation's are deleted when it is done)."""
        return self.graph_bytes + self.sort.spill_bytes

    def describe(self) -> str:
        """One line: memory and disk needed against what there is."""
        size = format_bytes
        runs = "in memory (one run)" if self.sort.num_runs == 1 else \
            f"on disk in up to {self.sort.num_runs} sorted runs of {self.sort.run_keys:,} keys"
        return (f"{sum(self.num_keys.values()):,} pairs drawn in 4 relations, each sorted with its reverse {runs}; "
                f"memory budget {size(self.budget)} ({size(self.held_bytes)} held for per-node arrays and buffers); "
                f"disk {size(self.peak_disk_bytes)} at peak ({size(self.graph_bytes)} for the graph, "
                f"{size(self.sort.spill_bytes)} of sort runs), {size(self.free_bytes)} free on {self.disk_path}")


def mag_generation_needs(spec: MagSpec, memory_budget: int | None = None,
                         directory: str | os.PathLike = ".") -> MagGenerationNeeds:
    """What generating `spec` under `memory_budget` (default: half the available memory) into `directory` takes.

    Held while a relation is sorted: the papers' labels and class index (int64 each), the relation's
    indptr, and one chunk of drawn pairs with its temporaries; the sort gets the rest. Features are
    made a few chunks at a time afterwards, the splits permute the papers last.
    """
    labels = paper_labels(spec)
    classes = _ClassIndex(labels, spec.num_classes)
    counts = type_counts(spec)
    num_keys = {relation.name: pair_count(spec, relation, classes) for relation in BASE_RELATIONS}
    widths = {relation.name: max(counts[relation.src], counts[relation.dst]) for relation in BASE_RELATIONS}
    chunk_pairs = min(CHUNK_PAPERS, max(spec.num_papers, spec.num_authors)) * \
        max(spec.citations, 2 * spec.authors_per_paper - 1, 2 * spec.topics_per_paper - 1)
    held = {"labels and class index": 3 * 8 * spec.num_papers, "indptr": 8 * (max(widths.values()) + 1),
            "chunk buffers": chunk_pairs * PAIR_BYTES}
    budget = default_memory_budget() if memory_budget is None else int(memory_budget)
    largest = max(num_keys.values())
    sort = SortPlan.for_budget(largest, max(1, budget - sum(held.values())))
    features = paper_features(spec, labels)
    feature_bytes = (2 * MAX_FEATURE_THREADS + 1) * features.rows_per_chunk * spec.feature_dim * FEATURE_VALUE_BYTES
    minimum = max(sum(held.values()) + SortPlan.minimum_bytes(largest), 8 * spec.num_papers + feature_bytes,
                  SPLIT_BYTES_PER_PAPER * spec.num_papers)
    num_nodes = sum(counts.values())
    graph_bytes = (spec.num_papers * spec.feature_dim * 4 + num_nodes * 8 + spec.num_papers * 8
                   + sum(2 * keys * index_dtype_for(widths[name]).itemsize for name, keys in num_keys.items())
                   + sum(8 * (counts[r.dst] + 1) for r in MAG_RELATIONS))
    existing = nearest_existing_dir(directory)
    return MagGenerationNeeds(budget=budget, held=held, sort=sort, graph_bytes=graph_bytes,
                              free_bytes=shutil.disk_usage(existing).free, disk_path=existing, num_keys=num_keys,
                              minimum=minimum)


def check_mag_fits(spec: MagSpec, directory: str | os.PathLike = ".",
                   memory_budget: int | None = None) -> MagGenerationNeeds:
    """Refuses, before any work, a spec whose generation needs more memory than the budget allows or more disk than
    the output's file system has free, saying how much it needs; returns the needs otherwise."""
    counts = type_counts(spec)
    widest = max(max(counts[r.src], counts[r.dst]) for r in BASE_RELATIONS)
    if widest > KEY_NODE_LIMIT:
        raise ValueError(f"mag spec: a node type of {widest:,} nodes is more than the generator supports "
                         f"({KEY_NODE_LIMIT:,}); fix: fewer papers (--papers)")
    needs = mag_generation_needs(spec, memory_budget, directory)
    if needs.budget < needs.minimum:
        parts = ", ".join(f"{part} {format_bytes(size)}" for part, size in needs.held.items())
        whose = "the default memory budget (half the available memory)" if memory_budget is None else \
            "--memory-budget"
        raise ValueError(f"mag spec: {spec.num_papers:,} papers need about {format_bytes(needs.minimum)} of memory "
                         f"to generate ({parts}, and at least "
                         f"{format_bytes(SortPlan.minimum_bytes(max(needs.num_keys.values())))} for the edge sort); "
                         f"{whose} is {format_bytes(needs.budget)}; fix: --memory-budget "
                         f"{-(-needs.minimum // 2**20)}M or more (free memory first), or fewer papers (--papers)")
    if needs.peak_disk_bytes > needs.free_bytes:
        raise ValueError(f"mag spec: the graph takes about {format_bytes(needs.peak_disk_bytes)} on disk at peak "
                         f"({format_bytes(needs.graph_bytes)} for the graph, {format_bytes(needs.sort.spill_bytes)} "
                         f"of sort runs), {needs.disk_path} has {format_bytes(needs.free_bytes)} free; fix: fewer "
                         "papers (--papers), a smaller --feature-dim, a larger --memory-budget (fewer spilled runs), "
                         "or another output directory")
    return needs
