"""Synthetic graphs written straight to the on-disk format, deterministic for a seed.

- power-law: Chung-Lu graph whose node weights follow a power law (degree exponent `exponent`),
  endpoints drawn by an inverse-CDF sampler, node ids shuffled so hubs are spread over the id range.
- community: every node has a class; each of its edges joins a node of the same class with
  probability set by `homophily` (else any node), so structure carries the class; features are a
  class mean under heavy noise, so an MLP on a node's own features is far from perfect while
  averaging over its mostly same-class neighbours recovers the class.

Work is vectorised numpy in fixed-size chunks, each with its own random stream (so the output
does not depend on anything but the spec, the memory budget included); edges are sorted into the
CSC by `external_csc` (in memory when they fit the budget, else in runs spilled to disk) and
features are written to disk chunk by chunk, so memory holds per-node arrays and buffers only.
"""
from __future__ import annotations

import os
import shutil
import sys
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from tqdm.auto import tqdm

from morphpipe.cores import usable_cores
from morphpipe.data.csc import KEY_NODE_LIMIT, fill_keys
from morphpipe.data.dtypes import FEATURE_DTYPES, FEATURE_STORAGE, float32_to_storage, index_dtype_for
from morphpipe.data.external_csc import SortPlan, build_csc_on_disk, default_memory_budget
from morphpipe.data.ondisk import (GraphMeta, NpyChunkWriter, check_graph_output, nearest_existing_dir, save_array,
                                   write_meta)
from morphpipe.data.splits import SplitFractions, random_split
from morphpipe.numeric import check_float, check_int, format_bytes
from morphpipe.outputs import replacing_directory

POWER_LAW = "power-law"
COMMUNITY = "community"
KINDS = (POWER_LAW, COMMUNITY)
# Bump when the output for a given spec changes: cached presets made by another version are remade.
GENERATOR_VERSION = 1
CHUNK_EDGES = 1 << 24
CHUNK_FEATURE_VALUES = 1 << 24
MAX_FEATURE_THREADS = 4
# Independent random streams, one per part of the graph.
STREAM_LABELS, STREAM_WEIGHTS, STREAM_EDGES, STREAM_CLASS_MEANS, STREAM_FEATURES, STREAM_SPLITS = range(1, 7)


@dataclass(frozen=True)
class GeneratorSpec:
    """What to generate; `to_dict()` is recorded in meta.json as how the graph was made."""

    kind: str
    num_nodes: int
    avg_degree: float
    feature_dim: int
    feature_dtype: str = "float32"
    num_classes: int = 10
    seed: int = 0
    split: SplitFractions = field(default_factory=SplitFractions)
    exponent: float = 2.5  # degree power-law exponent (> 2); community: of node popularity
    homophily: float = 0.85  # community: fraction of edges joining two nodes of the same class
    feature_noise: float = 1.0  # noise std per dimension; class means have norm ~1 (std 1/sqrt(F) each)
    undirected: bool = True  # add every edge in both directions (avg_degree counts both)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"generator spec: kind = {self.kind!r} must be one of {', '.join(KINDS)}")
        if self.feature_dtype not in FEATURE_DTYPES:
            raise ValueError(f"generator spec: feature_dtype = {self.feature_dtype!r} must be one of "
                             f"{', '.join(FEATURE_DTYPES)}")
        for name in ("num_nodes", "feature_dim", "num_classes"):
            check_int(f"generator spec: {name}", getattr(self, name), 1)
        check_int("generator spec: seed", self.seed, 0)
        check_float("generator spec: avg_degree", self.avg_degree, 0)
        check_float("generator spec: exponent", self.exponent, 2, above=True)
        check_float("generator spec: homophily", self.homophily, 1 / self.num_classes, 1)
        check_float("generator spec: feature_noise", self.feature_noise, 0)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (split as a [train, val, test] list)."""
        data = asdict(self)
        data["split"] = list(self.split.as_tuple())
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "GeneratorSpec":
        """Inverse of `to_dict`; unknown keys are an error naming them."""
        unknown = set(data) - {item.name for item in fields(cls)}
        if unknown:
            raise ValueError(f"generator spec: unknown keys {sorted(unknown)}")
        values = dict(data)
        if "split" in values:
            values["split"] = SplitFractions(*values["split"])
        return cls(**values)

    def with_overrides(self, **overrides: Any) -> "GeneratorSpec":
        """A copy with the given fields replaced (None values are ignored)."""
        return replace(self, **{key: value for key, value in overrides.items() if value is not None})


def generation_record(spec: GeneratorSpec, preset: str | None = None) -> dict[str, Any]:
    """The meta.json `source` of a generated graph; a cached preset is reused only if it matches."""
    return {"kind": "generated", "generator_version": GENERATOR_VERSION, "preset": preset, "spec": spec.to_dict()}


def generate(
    spec: GeneratorSpec,
    out_dir: str | os.PathLike,
    *,
    name: str | None = None,
    preset: str | None = None,
    progress: bool = True,
    overwrite: bool = False,
    timings: dict[str, float] | None = None,
    memory_budget: int | None = None,
) -> Path:
    """Generates the graph described by `spec` into directory `out_dir` and returns its path.

    `memory_budget` (bytes, default: half the available memory) bounds the arrays the generation
    holds; edges beyond it are sorted on disk. What it needs is checked (and, with `progress`,
    stated) before any work. `timings`, when given, receives the seconds spent in each stage.
    """
    out = check_graph_output(out_dir, overwrite)
    needs = check_fits_in_memory(spec, out, memory_budget)
    if progress:
        print(f"{name or preset or spec.kind}: {needs.describe()}", file=sys.stderr, flush=True)
    try:
        with replacing_directory(out, "output") as staging:
            _generate_into(staging, spec, name or preset or f"{spec.kind}-{spec.num_nodes}", preset, progress,
                           timings, needs.sort_budget)
    except OSError as error:  # numpy's writes say "N requested and M written" when the disk fills up
        raise write_failure(error, out, needs.disk_path, needs.peak_disk_bytes) from error
    return out


def write_failure(error: OSError, out: Path, disk_path: Path, peak_disk_bytes: int) -> OSError:
    """The error to raise when writing a generated graph to `out` failed: what is free now against what the graph
    needs, and that the previous contents of `out` are unchanged (the graph is staged beside it)."""
    free = shutil.disk_usage(disk_path).free
    failure = OSError(f"generating {out} failed while writing ({error}); {format_bytes(free)} is free now on "
                      f"{disk_path}, the graph needs about {format_bytes(peak_disk_bytes)} at peak; whatever was at "
                      f"{out} is unchanged; fix: free disk space or choose another output directory")
    failure.errno = error.errno
    return failure


def _generate_into(out: Path, spec: GeneratorSpec, name: str, preset: str | None, progress: bool,
                   timings: dict[str, float] | None, sort_budget: int) -> None:
    """Writes every file of the generated graph into the (empty) directory `out`, meta.json last."""
    clock = _StageClock(timings)
    labels = stream_rng(spec.seed, STREAM_LABELS).integers(0, spec.num_classes, spec.num_nodes, dtype=np.int64)
    if spec.kind == POWER_LAW:
        num_keys, chunks = power_law_key_chunks(spec)
    else:
        num_keys, chunks = community_key_chunks(spec, labels)
    passes: dict[str, float] = {}
    indptr, num_edges = build_csc_on_disk(chunks, num_keys, spec.num_nodes, out, memory_budget=sort_budget,
                                          drop_self_loops=True, dedupe=True, progress=progress,
                                          desc=f"{name}: edges", timings=passes)
    clock.lap("edges")
    if timings is not None:  # "edges": drawing and sorting them in runs; "csc": merging and decoding the runs
        timings.update(edges=passes["runs"], csc=passes["merge"])
    save_array(out, "indptr", indptr)
    del indptr
    splits = random_split(np.arange(spec.num_nodes), spec.split, stream_seed(spec.seed, STREAM_SPLITS))
    for split_name, ids in zip(("train_idx", "val_idx", "test_idx"), splits):
        save_array(out, split_name, ids)
    del splits
    save_array(out, "labels", labels)
    clock.lap("save")
    write_features(out, spec, labels, progress=progress, desc=f"{name}: features")
    clock.lap("features")
    write_meta(out, GraphMeta(
        name=name,
        num_nodes=spec.num_nodes,
        num_edges=num_edges,
        feature_dim=spec.feature_dim,
        feature_dtype=spec.feature_dtype,
        num_classes=spec.num_classes,
        indices_dtype=str(index_dtype_for(spec.num_nodes)),
        source=generation_record(spec, preset),
    ))


@dataclass(frozen=True)
class SortedBuildNeeds:
    """What a generation that sorts its edges within a memory budget holds besides the sort, and the disk it has."""

    budget: int  # memory budget, bytes
    held: dict[str, int]  # arrays held whatever the budget -> bytes, while the edges are sorted
    sort: SortPlan  # the (largest) edge sort within what the budget leaves
    graph_bytes: int  # the finished directory
    free_bytes: int  # on the output's file system
    disk_path: Path

    @property
    def held_bytes(self) -> int:
        return sum(self.held.values())

    @property
    def sort_budget(self) -> int:
        return self.budget - self.held_bytes


@dataclass(frozen=True)
class GenerationNeeds(SortedBuildNeeds):
    """Memory and disk a generation takes, estimated from the spec's sizes before any work."""

    num_nodes: int
    num_keys: int  # edges drawn (both directions when undirected), before self loops and duplicates go
    feature_bytes: int

    @property
    def peak_disk_bytes(self) -> int:
        """The finished graph, or the topology beside the spilled sort runs (deleted before features are written)."""
        return self.graph_bytes - self.feature_bytes + max(self.feature_bytes, self.sort.spill_bytes)

    def describe(self) -> str:
        """One line: memory and disk needed against what there is."""
        runs = "in memory (one run)" if self.sort.num_runs == 1 else \
            f"on disk in {self.sort.num_runs} sorted runs of {self.sort.run_keys:,} keys"
        size = format_bytes
        return (f"{self.num_keys:,} edges sorted {runs}; memory budget {size(self.budget)} "
                f"({size(self.held_bytes)} held for per-node arrays and buffers); disk {size(self.peak_disk_bytes)} "
                f"at peak ({size(self.graph_bytes)} for the graph, {size(self.sort.spill_bytes)} of sort runs while "
                f"the topology is built), {size(self.free_bytes)} free on {self.disk_path}")


def generation_needs(spec: GeneratorSpec, memory_budget: int | None = None,
                     directory: str | os.PathLike = ".") -> GenerationNeeds:
    """What generating `spec` under `memory_budget` (default: half the available memory) into `directory` takes.

    Held whatever the budget, while edges are drawn and sorted: indptr and labels (int64 per node),
    the generator's per-node arrays and its chunk buffers; the edge sort gets the rest.
    """
    num_nodes = spec.num_nodes
    index_bytes = index_dtype_for(num_nodes).itemsize
    if spec.kind == POWER_LAW:
        num_keys = 2 * _num_pairs(spec) if spec.undirected else _num_pairs(spec)
        node_arrays, chunk_buffers = num_nodes * index_bytes, min(CHUNK_EDGES, num_keys) * (8 + 3 * index_bytes + 8)
    else:
        picks_per_node = spec.avg_degree / 2 if spec.undirected else spec.avg_degree
        num_pairs = int(num_nodes * max(picks_per_node, 1.0)) if picks_per_node > 0 else 0
        num_keys = 2 * num_pairs if spec.undirected else num_pairs
        node_arrays, chunk_buffers = 6 * 8 * num_nodes, min(CHUNK_EDGES, num_keys) * 12 * 8
    held = {"indptr": (num_nodes + 1) * 8, "labels": num_nodes * 8, "generator node arrays": node_arrays,
            "generator chunk buffers": chunk_buffers}
    budget = default_memory_budget() if memory_budget is None else int(memory_budget)
    sort_budget = max(1, budget - sum(held.values()))
    feature_bytes = num_nodes * spec.feature_dim * FEATURE_STORAGE[spec.feature_dtype].itemsize
    graph_bytes = feature_bytes + num_keys * index_bytes + num_nodes * 8 * 3
    existing = nearest_existing_dir(directory)
    return GenerationNeeds(budget=budget, held=held, sort=SortPlan.for_budget(num_keys, sort_budget),
                           graph_bytes=graph_bytes, free_bytes=shutil.disk_usage(existing).free, disk_path=existing,
                           num_nodes=num_nodes, num_keys=num_keys, feature_bytes=feature_bytes)


def check_fits_in_memory(spec: GeneratorSpec, directory: str | os.PathLike = ".",
                         memory_budget: int | None = None) -> GenerationNeeds:
    """Refuses, before any work, a spec whose generation needs more memory than the budget (default: half the
    available memory) allows, or more disk than the nearest existing ancestor of `directory` has free, saying
    how much it needs; returns the needs otherwise."""
    if spec.num_nodes > KEY_NODE_LIMIT:
        raise ValueError(f"generator spec: num_nodes = {spec.num_nodes:,} is more than the generator supports "
                         f"({KEY_NODE_LIMIT:,}); fix: ask for fewer nodes")
    needs = generation_needs(spec, memory_budget, directory)
    # After the topology, drawing the split permutes all node ids (arange, permutation, the sorted parts).
    minimum = max(needs.held_bytes + SortPlan.minimum_bytes(needs.num_keys), needs.held["labels"] + 24 * spec.num_nodes)
    if needs.budget < minimum:
        parts = ", ".join(f"{part} {format_bytes(size)}" for part, size in needs.held.items())
        whose = "the default memory budget (half the available memory)" if memory_budget is None else \
            "--memory-budget"
        raise ValueError(f"generator spec: {spec.num_nodes:,} nodes with average degree {spec.avg_degree:g} need "
                         f"about {format_bytes(minimum)} of memory to generate ({parts}, and at least "
                         f"{format_bytes(SortPlan.minimum_bytes(needs.num_keys))} for the edge sort); {whose} is "
                         f"{format_bytes(needs.budget)}; fix: --memory-budget {-(-minimum // 2**20)}M or more "
                         "(free memory first), or fewer nodes (--nodes)")
    if needs.peak_disk_bytes > needs.free_bytes:
        raise ValueError(f"generator spec: the graph takes about {format_bytes(needs.peak_disk_bytes)} on disk at "
                         f"peak ({format_bytes(needs.graph_bytes)} for the graph, "
                         f"{format_bytes(needs.sort.spill_bytes)} of sort runs), {needs.disk_path} has "
                         f"{format_bytes(needs.free_bytes)} free; fix: fewer nodes, a smaller --feature-dim or "
                         "--feature-dtype float16, a larger --memory-budget (fewer spilled runs), or another output "
                         "directory")
    return needs


class _StageClock:
    """Records the seconds since the previous lap under each stage name, when given a dict."""

    def __init__(self, timings: dict[str, float] | None):
        self.timings = timings
        self.last = time.perf_counter()

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        if self.timings is not None:
            self.timings[stage] = now - self.last
        self.last = now


def power_law_key_chunks(spec: GeneratorSpec) -> tuple[int, Iterator[np.ndarray]]:
    """(number of keys, their chunks) of a Chung-Lu graph: both endpoints of each edge drawn from the power-law
    weights. Each chunk is valid until the next one is asked for (buffers are reused)."""
    num_pairs = _num_pairs(spec)
    return (2 * num_pairs if spec.undirected else num_pairs), _power_law_chunks(spec, num_pairs)


def _power_law_chunks(spec: GeneratorSpec, num_pairs: int) -> Iterator[np.ndarray]:
    num_nodes = spec.num_nodes
    id_dtype = index_dtype_for(num_nodes)
    shuffle = stream_rng(spec.seed, STREAM_WEIGHTS).permutation(num_nodes).astype(id_dtype)
    sampler = PowerLawSampler(num_nodes, spec.exponent)
    size = min(CHUNK_EDGES, num_pairs)
    values, keys = np.empty(size, dtype=np.float64), np.empty(size, dtype=np.int64)
    ranks, src, dst = (np.empty(size, dtype=id_dtype) for _ in range(3))
    for chunk, start in enumerate(range(0, num_pairs, CHUNK_EDGES)):
        count = min(start + CHUNK_EDGES, num_pairs) - start
        rng = stream_rng(spec.seed, STREAM_EDGES, chunk)
        np.take(shuffle, sampler.sample(rng, values[:count], ranks[:count]), out=src[:count])
        np.take(shuffle, sampler.sample(rng, values[:count], ranks[:count]), out=dst[:count])
        fill_keys(keys[:count], src[:count], dst[:count], num_nodes)
        yield keys[:count]
        if spec.undirected:
            fill_keys(keys[:count], dst[:count], src[:count], num_nodes)
            yield keys[:count]


class PowerLawSampler:
    """Node ranks with P(i) proportional to the integral of (x + 1)^(-beta) over [i, i + 1), beta = 1/(exponent - 1).

    Expected degrees then follow a power law with the given exponent; sampling inverts the
    closed-form CDF, a few vectorised float operations per id.
    """

    def __init__(self, num_nodes: int, exponent: float):
        self.num_nodes = num_nodes
        self.power = 1.0 - 1.0 / (exponent - 1.0)
        self.scale = (num_nodes + 1.0) ** self.power - 1.0

    def sample(self, rng: np.random.Generator, values: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Fills integer array `out` with ranks in [0, num_nodes), using float64 `values` (same length) as scratch."""
        rng.random(out=values)
        values *= self.scale
        values += 1.0
        np.power(values, 1.0 / self.power, out=values)
        values -= 1.0
        np.copyto(out, values, casting="unsafe")
        np.minimum(out, self.num_nodes - 1, out=out)
        return out


def community_key_chunks(spec: GeneratorSpec, labels: np.ndarray) -> tuple[int, Iterator[np.ndarray]]:
    """(number of keys, their chunks) of a homophilous graph: each node picks its neighbours, same-class with
    high probability. Each chunk is valid until the next one is asked for.

    Node v picks 1 + Poisson(d - 1) neighbours (d = avg_degree / 2 when undirected), so every node
    has edges; a pick is a node of v's class with probability p, else any node, in both cases in
    proportion to a power-law popularity, which gives the graph hubs. p is set so that the
    expected fraction of same-class edges equals `homophily`.
    """
    picks_per_node = spec.avg_degree / 2 if spec.undirected else spec.avg_degree
    rng = stream_rng(spec.seed, STREAM_WEIGHTS)
    popularity = rng.pareto(spec.exponent - 1.0, spec.num_nodes) + 1.0
    picks = 1 + rng.poisson(max(picks_per_node - 1.0, 0.0), spec.num_nodes) if picks_per_node > 0 else \
        np.zeros(spec.num_nodes, dtype=np.int64)
    num_pairs = int(picks.sum())
    return (2 * num_pairs if spec.undirected else num_pairs), _community_chunks(spec, labels, popularity, picks)


def _community_chunks(spec: GeneratorSpec, labels: np.ndarray, popularity: np.ndarray,
                      picks: np.ndarray) -> Iterator[np.ndarray]:
    num_nodes, num_classes = spec.num_nodes, spec.num_classes
    same_class = (spec.homophily - 1 / num_classes) / (1 - 1 / num_classes) if num_classes > 1 else 1.0
    by_class = np.argsort(labels, kind="stable")
    cumulative = np.cumsum(popularity[by_class])
    del popularity
    class_ends = np.cumsum(np.bincount(labels, minlength=num_classes))
    class_starts = class_ends - np.bincount(labels, minlength=num_classes)
    weight_before = np.concatenate([[0.0], cumulative])[class_starts]
    class_weight = np.concatenate([[0.0], cumulative])[class_ends] - weight_before
    for chunk, (first, last) in enumerate(_chunk_bounds(picks, CHUNK_EDGES)):
        rng = stream_rng(spec.seed, STREAM_EDGES, chunk)
        dst = np.repeat(np.arange(first, last, dtype=np.int64), picks[first:last])
        classes = labels[dst]
        inside = rng.random(dst.size) < same_class
        target = rng.random(dst.size)
        target = np.where(inside, weight_before[classes] + target * class_weight[classes], target * cumulative[-1])
        position = np.searchsorted(cumulative, target, side="right")
        low = np.where(inside, class_starts[classes], 0)
        high = np.where(inside, class_ends[classes], num_nodes) - 1
        src = by_class[np.clip(position, low, high)]
        keys = np.empty(dst.size, dtype=np.int64)
        fill_keys(keys, src, dst, num_nodes)
        yield keys
        if spec.undirected:
            fill_keys(keys, dst, src, num_nodes)
            yield keys


def write_features(out: Path, spec: GeneratorSpec, labels: np.ndarray, *, progress: bool = False,
                   desc: str = "features") -> None:
    """features = class_mean[label] + feature_noise * N(0, 1), written to features.npy chunk by chunk."""
    ClassFeatures(labels, spec.num_classes, spec.feature_dim, spec.feature_noise, spec.seed,
                  max(1, CHUNK_FEATURE_VALUES // spec.feature_dim), spec.feature_dtype).write(
        out, "features", progress=progress, desc=desc)


@dataclass(frozen=True)
class ClassFeatures:
    """Features class_mean[label] + noise * N(0, 1) of the nodes with `labels`, made `rows_per_chunk` rows at a time,
    each chunk from its own random stream (so any chunk can be made alone, in any order)."""

    labels: np.ndarray
    num_classes: int
    dim: int
    noise: float
    seed: int
    rows_per_chunk: int
    dtype: str = "float32"

    @property
    def num_chunks(self) -> int:
        return -(-self.labels.size // self.rows_per_chunk)

    def means(self) -> np.ndarray:
        """The class means, norm ~1 (std 1/sqrt(dim) per dimension)."""
        means = stream_rng(self.seed, STREAM_CLASS_MEANS).standard_normal((self.num_classes, self.dim),
                                                                          dtype=np.float32)
        means /= np.float32(np.sqrt(self.dim))
        return means

    def chunk(self, chunk: int, means: np.ndarray) -> np.ndarray:
        """Rows [chunk * rows_per_chunk, ...) in the storage dtype."""
        start = chunk * self.rows_per_chunk
        rows = min(self.rows_per_chunk, self.labels.size - start)
        values = stream_rng(self.seed, STREAM_FEATURES, chunk).standard_normal((rows, self.dim), dtype=np.float32)
        values *= np.float32(self.noise)
        values += means[self.labels[start:start + rows]]
        return float32_to_storage(values, self.dtype)

    def write(self, out: Path, name: str, *, progress: bool = False, desc: str = "features") -> None:
        """Writes `<name>.npy` chunk by chunk. Chunks are computed by a few threads (numpy's generators release the
        GIL) and written in order, with at most one chunk per thread waiting, so memory stays bounded."""
        means = self.means()
        workers = min(MAX_FEATURE_THREADS, usable_cores())
        shape = (self.labels.size, self.dim)
        with NpyChunkWriter(out, name, shape, FEATURE_STORAGE[self.dtype]) as writer, \
                ThreadPoolExecutor(workers) as pool, \
                tqdm(total=self.num_chunks, desc=desc, unit="chunk", disable=not progress, leave=False) as bar:
            pending: deque[Future] = deque()
            for chunk in range(self.num_chunks):
                pending.append(pool.submit(self.chunk, chunk, means))
                if len(pending) > workers:
                    writer.write(pending.popleft().result())
                    bar.update()
            while pending:
                writer.write(pending.popleft().result())
                bar.update()


def _num_pairs(spec: GeneratorSpec) -> int:
    """Edges to draw: avg_degree * N in total, half of them drawn when each is added both ways."""
    total = int(round(spec.avg_degree * spec.num_nodes))
    return total // 2 if spec.undirected else total


def _chunk_bounds(counts: np.ndarray, limit: int) -> list[tuple[int, int]]:
    """Consecutive node ranges [first, last) whose summed counts stay near `limit` (at least one node each)."""
    cumulative = np.cumsum(counts)
    bounds, first = [], 0
    while first < counts.size:
        before = int(cumulative[first - 1]) if first else 0
        last = max(first + 1, int(np.searchsorted(cumulative, before + limit, side="right")))
        bounds.append((first, min(last, counts.size)))
        first = last
    return bounds


def stream_seed(seed: int, stream: int) -> int:
    """A seed for helpers that take an int, distinct per stream."""
    return int(np.random.SeedSequence([seed, stream]).generate_state(1)[0])


def stream_rng(seed: int, stream: int, chunk: int = 0) -> np.random.Generator:
    """The random generator of one stream and chunk."""
    return np.random.default_rng(np.random.SeedSequence([seed, stream, chunk]))
