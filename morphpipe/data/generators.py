"""Synthetic graphs written straight to the on-disk format, deterministic for a seed.

- power-law: Chung-Lu graph whose node weights follow a power law (degree exponent `exponent`),
  endpoints drawn by an inverse-CDF sampler, node ids shuffled so hubs are spread over the id range.
- community: every node has a class; each of its edges joins a node of the same class with
  probability set by `homophily` (else any node), so structure carries the class; features are a
  class mean under heavy noise, so an MLP on a node's own features is far from perfect while
  averaging over its mostly same-class neighbours recovers the class.

Work is vectorised numpy in fixed-size chunks, each with its own random stream (so the output
does not depend on anything but the spec), and features are written to disk chunk by chunk:
10M nodes / 200M edges / 128 float16 features stay within a few GiB of memory.
"""
from __future__ import annotations

import os
import shutil
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from tqdm.auto import tqdm

from morphpipe.cores import usable_cores
from morphpipe.data.csc import KEY_NODE_LIMIT, csc_from_sorted_keys, fill_keys
from morphpipe.data.dtypes import FEATURE_DTYPES, FEATURE_STORAGE, float32_to_storage, index_dtype_for
from morphpipe.data.ondisk import GraphMeta, NpyChunkWriter, check_graph_output, save_array, write_meta
from morphpipe.data.splits import SplitFractions, random_split
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
        checks = [
            (self.kind in KINDS, "kind", f"must be one of {', '.join(KINDS)}"),
            (self.num_nodes >= 1, "num_nodes", "must be >= 1"),
            (self.avg_degree >= 0, "avg_degree", "must be >= 0"),
            (self.feature_dim >= 1, "feature_dim", "must be >= 1"),
            (self.feature_dtype in FEATURE_DTYPES, "feature_dtype", f"must be one of {', '.join(FEATURE_DTYPES)}"),
            (self.num_classes >= 1, "num_classes", "must be >= 1"),
            (self.seed >= 0, "seed", "must be >= 0"),
            (self.exponent > 2, "exponent", "must be > 2 (a finite mean degree)"),
            (self.num_classes * self.homophily >= 1 and self.homophily <= 1, "homophily",
             f"must lie in [1/num_classes, 1] = [{1 / max(self.num_classes, 1):.3g}, 1]"),
            (self.feature_noise >= 0, "feature_noise", "must be >= 0"),
        ]
        for ok, name, rule in checks:
            if not ok:
                raise ValueError(f"generator spec: {name} = {getattr(self, name)!r} {rule}")

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
) -> Path:
    """Generates the graph described by `spec` into directory `out_dir` and returns its path.

    `timings`, when given, receives the seconds spent in each stage (for benchmarks).
    """
    out = check_graph_output(out_dir, overwrite)
    check_fits_in_memory(spec, out)
    with replacing_directory(out, "output") as staging:
        _generate_into(staging, spec, name or preset or f"{spec.kind}-{spec.num_nodes}", preset, progress, timings)
    return out


def _generate_into(out: Path, spec: GeneratorSpec, name: str, preset: str | None, progress: bool,
                   timings: dict[str, float] | None) -> None:
    """Writes every file of the generated graph into the (empty) directory `out`, meta.json last."""
    clock = _StageClock(timings)
    labels = _rng(spec.seed, STREAM_LABELS).integers(0, spec.num_classes, spec.num_nodes, dtype=np.int64)
    if spec.kind == POWER_LAW:
        keys = power_law_keys(spec, progress=progress, desc=f"{name}: edges")
    else:
        keys = community_keys(spec, labels, progress=progress, desc=f"{name}: edges")
    clock.lap("edges")
    keys.sort()
    clock.lap("sort")
    indptr, indices = csc_from_sorted_keys(keys, spec.num_nodes, drop_self_loops=True, dedupe=True, progress=progress)
    del keys
    clock.lap("csc")
    save_array(out, "indptr", indptr)
    save_array(out, "indices", indices)
    num_edges, indices_dtype = int(indices.size), str(indices.dtype)
    del indptr, indices
    splits = random_split(np.arange(spec.num_nodes), spec.split, _stream_seed(spec.seed, STREAM_SPLITS))
    for split_name, ids in zip(("train_idx", "val_idx", "test_idx"), splits):
        save_array(out, split_name, ids)
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
        indices_dtype=indices_dtype,
        source=generation_record(spec, preset),
    ))


def generation_needs(spec: GeneratorSpec) -> tuple[int, int]:
    """(peak bytes of memory, bytes on disk) that generating `spec` takes, estimated from its sizes.

    Memory peaks while the sorted edge keys (int64 per edge) and the CSC indices coexist, beside
    indptr, labels and the node shuffle; features are written in chunks and never held whole.
    """
    num_edges = 2 * _num_pairs(spec) if spec.undirected else _num_pairs(spec)
    index_bytes = index_dtype_for(spec.num_nodes).itemsize
    memory = num_edges * (8 + index_bytes) + spec.num_nodes * (8 * 3 + index_bytes)
    feature_bytes = spec.num_nodes * spec.feature_dim * FEATURE_STORAGE[spec.feature_dtype].itemsize
    disk = feature_bytes + num_edges * index_bytes + spec.num_nodes * 8 * 3
    return memory, disk


def check_fits_in_memory(spec: GeneratorSpec, directory: str | os.PathLike = ".") -> None:
    """Refuses, before any work, a spec whose generation needs more memory than is available (or more disk than
    the nearest existing ancestor of `directory` has free), saying how much it needs."""
    if spec.num_nodes > KEY_NODE_LIMIT:
        raise ValueError(f"generator spec: num_nodes = {spec.num_nodes:,} is more than the generator supports "
                         f"({KEY_NODE_LIMIT:,}); fix: ask for fewer nodes")
    memory, disk = generation_needs(spec)
    available = psutil.virtual_memory().available
    if memory > available:
        raise ValueError(f"generator spec: {spec.num_nodes:,} nodes with average degree {spec.avg_degree:g} need "
                         f"about {memory / 2**30:.1f} GiB of memory to generate, {available / 2**30:.1f} GiB is "
                         "available; fix: fewer nodes (--nodes) or a smaller --avg-degree")
    existing = Path(directory).expanduser().absolute()
    while not existing.exists():
        existing = existing.parent
    free = shutil.disk_usage(existing).free
    if disk > free:
        raise ValueError(f"generator spec: the graph takes about {disk / 2**30:.1f} GiB on disk, {existing} has "
                         f"{free / 2**30:.1f} GiB free; fix: fewer nodes, a smaller --feature-dim or "
                         "--feature-dtype float16, or another output directory")


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


def power_law_keys(spec: GeneratorSpec, *, progress: bool = False, desc: str = "edges") -> np.ndarray:
    """Packed CSC keys of a Chung-Lu graph: both endpoints of each edge drawn from the power-law weights."""
    num_nodes = spec.num_nodes
    num_pairs = _num_pairs(spec)
    keys = np.empty(2 * num_pairs if spec.undirected else num_pairs, dtype=np.int64)
    id_dtype = index_dtype_for(num_nodes)
    shuffle = _rng(spec.seed, STREAM_WEIGHTS).permutation(num_nodes).astype(id_dtype)
    sampler = PowerLawSampler(num_nodes, spec.exponent)
    size = min(CHUNK_EDGES, num_pairs)
    values = np.empty(size, dtype=np.float64)
    ranks, src, dst = (np.empty(size, dtype=id_dtype) for _ in range(3))
    starts = range(0, num_pairs, CHUNK_EDGES)
    for chunk, start in enumerate(tqdm(starts, desc=desc, unit="chunk", disable=not progress, leave=False)):
        stop = min(start + CHUNK_EDGES, num_pairs)
        count = stop - start
        rng = _rng(spec.seed, STREAM_EDGES, chunk)
        np.take(shuffle, sampler.sample(rng, values[:count], ranks[:count]), out=src[:count])
        np.take(shuffle, sampler.sample(rng, values[:count], ranks[:count]), out=dst[:count])
        fill_keys(keys[start:stop], src[:count], dst[:count], num_nodes)
        if spec.undirected:
            fill_keys(keys[num_pairs + start:num_pairs + stop], dst[:count], src[:count], num_nodes)
    return keys


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


def community_keys(spec: GeneratorSpec, labels: np.ndarray, *, progress: bool = False,
                   desc: str = "edges") -> np.ndarray:
    """Packed CSC keys of a homophilous graph: each node picks its neighbours, same-class with high probability.

    Node v picks 1 + Poisson(d - 1) neighbours (d = avg_degree / 2 when undirected), so every node
    has edges; a pick is a node of v's class with probability p, else any node, in both cases in
    proportion to a power-law popularity, which gives the graph hubs. p is set so that the
    expected fraction of same-class edges equals `homophily`.
    """
    num_nodes, num_classes = spec.num_nodes, spec.num_classes
    picks_per_node = spec.avg_degree / 2 if spec.undirected else spec.avg_degree
    rng = _rng(spec.seed, STREAM_WEIGHTS)
    popularity = rng.pareto(spec.exponent - 1.0, num_nodes) + 1.0
    picks = 1 + rng.poisson(max(picks_per_node - 1.0, 0.0), num_nodes) if picks_per_node > 0 else \
        np.zeros(num_nodes, dtype=np.int64)
    same_class = (spec.homophily - 1 / num_classes) / (1 - 1 / num_classes) if num_classes > 1 else 1.0
    by_class = np.argsort(labels, kind="stable")
    cumulative = np.cumsum(popularity[by_class])
    class_ends = np.cumsum(np.bincount(labels, minlength=num_classes))
    class_starts = class_ends - np.bincount(labels, minlength=num_classes)
    weight_before = np.concatenate([[0.0], cumulative])[class_starts]
    class_weight = np.concatenate([[0.0], cumulative])[class_ends] - weight_before

    num_pairs = int(picks.sum())
    keys = np.empty(2 * num_pairs if spec.undirected else num_pairs, dtype=np.int64)
    node_bounds = _chunk_bounds(picks, CHUNK_EDGES)
    written = 0
    for chunk, (first, last) in enumerate(tqdm(node_bounds, desc=desc, unit="chunk", disable=not progress,
                                               leave=False)):
        rng = _rng(spec.seed, STREAM_EDGES, chunk)
        dst = np.repeat(np.arange(first, last, dtype=np.int64), picks[first:last])
        classes = labels[dst]
        inside = rng.random(dst.size) < same_class
        target = rng.random(dst.size)
        target = np.where(inside, weight_before[classes] + target * class_weight[classes], target * cumulative[-1])
        position = np.searchsorted(cumulative, target, side="right")
        low = np.where(inside, class_starts[classes], 0)
        high = np.where(inside, class_ends[classes], num_nodes) - 1
        src = by_class[np.clip(position, low, high)]
        stop = written + dst.size
        fill_keys(keys[written:stop], src, dst, num_nodes)
        if spec.undirected:
            fill_keys(keys[num_pairs + written:num_pairs + stop], dst, src, num_nodes)
        written = stop
    return keys


def write_features(out: Path, spec: GeneratorSpec, labels: np.ndarray, *, progress: bool = False,
                   desc: str = "features") -> None:
    """features = class_mean[label] + feature_noise * N(0, 1), written to features.npy chunk by chunk.

    Chunks are computed by a few threads (numpy's generators release the GIL) and written in order,
    with at most one chunk per thread waiting, so memory stays bounded.
    """
    dim = spec.feature_dim
    means = _rng(spec.seed, STREAM_CLASS_MEANS).standard_normal((spec.num_classes, dim), dtype=np.float32)
    means /= np.float32(np.sqrt(dim))
    rows_per_chunk = max(1, CHUNK_FEATURE_VALUES // dim)
    num_chunks = -(-spec.num_nodes // rows_per_chunk)

    def make_chunk(chunk: int) -> np.ndarray:
        start = chunk * rows_per_chunk
        rows = min(rows_per_chunk, spec.num_nodes - start)
        values = _rng(spec.seed, STREAM_FEATURES, chunk).standard_normal((rows, dim), dtype=np.float32)
        values *= np.float32(spec.feature_noise)
        values += means[labels[start:start + rows]]
        return float32_to_storage(values, spec.feature_dtype)

    workers = min(MAX_FEATURE_THREADS, usable_cores())
    shape = (spec.num_nodes, dim)
    with NpyChunkWriter(out, "features", shape, FEATURE_STORAGE[spec.feature_dtype]) as writer, \
            ThreadPoolExecutor(workers) as pool, \
            tqdm(total=num_chunks, desc=desc, unit="chunk", disable=not progress, leave=False) as bar:
        pending: deque[Future] = deque()
        for chunk in range(num_chunks):
            pending.append(pool.submit(make_chunk, chunk))
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


def _stream_seed(seed: int, stream: int) -> int:
    """A seed for helpers that take an int, distinct per stream."""
    return int(np.random.SeedSequence([seed, stream]).generate_state(1)[0])


def _rng(seed: int, stream: int, chunk: int = 0) -> np.random.Generator:
    """The random generator of one stream and chunk."""
    return np.random.default_rng(np.random.SeedSequence([seed, stream, chunk]))
