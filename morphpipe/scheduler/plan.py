"""The Plan: what the executor runs with, and what the planner predicted for it (versioned JSON)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from morphpipe.data.feature_store import MAX_IO_THREADS
from morphpipe.documents import FieldReader, JsonDocument
from morphpipe.numeric import format_bytes
from morphpipe.partitioner.partitioner import Split
from morphpipe.profiler.profile import read_workload

PLAN_KIND = "morphpipe.plan"
PLAN_SCHEMA_VERSION = 1
SCHEDULE_KINDS = ("adaptive", "all-cpu", "all-gpu", "cpu-only")


@dataclass(frozen=True)
class FeatureTiering:
    """Where the feature rows live under a plan: on disk behind a host cache of `cache_bytes` of the hottest rows
    (of `cache_budget_bytes` the memory budget allows), which serves `hit_ratio` of the rows batches gather; the
    misses hold the disk `disk_read_s` per batch. `candidates_s`: the predicted epoch at each cache size tried.
    `io_threads`: the feature store's I/O threads the plan runs with, its misses' reads taking `read_cpu_s` of CPU
    per batch on the batching side's cores (None: the store keeps its own, as plans made before the planner chose
    them; `read_cpu_s` is then 0, not predicted). `gpu_read_s`: the time a Route-1 batch's misses hold the same disk
    (0: none on Route 1, or a profile whose T_GB holds its reads)."""

    cache_bytes: int
    cache_budget_bytes: int
    hit_ratio: float
    disk_read_s: float
    candidates_s: dict[int, float]
    io_threads: int | None = None
    read_cpu_s: float = 0.0
    gpu_read_s: float = 0.0

    def __post_init__(self) -> None:
        if self.io_threads is not None and (isinstance(self.io_threads, bool) or not isinstance(self.io_threads, int)
                                            or not 0 <= self.io_threads <= MAX_IO_THREADS):
            raise ValueError(f"FeatureTiering.io_threads must be an integer in [0, {MAX_IO_THREADS}] (or None: the "
                             f"store's own), got {self.io_threads!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"features": "disk", "cache_bytes": self.cache_bytes, "cache_budget_bytes": self.cache_budget_bytes,
                "hit_ratio": self.hit_ratio, "disk_read_s": self.disk_read_s,
                "candidates": [{"cache_bytes": size, "epoch_s": epoch} for size, epoch in self.candidates_s.items()],
                "io_threads": self.io_threads, "read_cpu_s": self.read_cpu_s, "gpu_read_s": self.gpu_read_s}

    @classmethod
    def from_fields(cls, reader: FieldReader) -> FeatureTiering:
        reader.string("features", choices=("disk",))
        candidates = {item.integer("cache_bytes", minimum=0): item.number("epoch_s", positive=True)
                      for item in reader.sections("candidates")}
        read_cpu_s = reader.number("read_cpu_s", minimum=0.0, optional=True)
        gpu_read_s = reader.number("gpu_read_s", minimum=0.0, optional=True)
        io_threads = reader.integer("io_threads", minimum=0, optional=True)
        if io_threads is not None and io_threads > MAX_IO_THREADS:
            raise reader.error("io_threads", f"must be at most {MAX_IO_THREADS}", io_threads)
        return cls(reader.integer("cache_bytes", minimum=0), reader.integer("cache_budget_bytes", minimum=0),
                   reader.number("hit_ratio", minimum=0.0), reader.number("disk_read_s", minimum=0.0), candidates,
                   io_threads, read_cpu_s or 0.0, gpu_read_s or 0.0)

    def matches(self, store) -> bool:
        """True when FeatureStore `store` already caches the rows the planned cache holds and has its I/O threads
        (None: any)."""
        return (store.num_cached == store.rows_cached_by(self.cache_bytes)
                and self.io_threads in (None, store.io_threads))

    def describe(self) -> str:
        reads = "" if self.io_threads is None else (
            f"; read by {count_of(self.io_threads, 'I/O thread')}, taking {self.read_cpu_s * 1e3:.3g} ms of CPU per "
            "batch")
        return (f"features on disk behind a host cache of {format_bytes(self.cache_bytes)} of hot rows (budget "
                f"{format_bytes(self.cache_budget_bytes)}, {len(self.candidates_s)} sizes simulated): predicted hit "
                f"ratio {self.hit_ratio:.1%}, the misses hold the disk {self.disk_read_s * 1e3:.3g} ms per batch"
                + (f" ({self.gpu_read_s * 1e3:.3g} ms per GPU batch)" if self.gpu_read_s else "") + reads)


def count_of(count: int, noun: str) -> str:
    """`1 training thread`, `2 training threads`."""
    return f"{count} {noun}" + ("" if count == 1 else "s")


@dataclass
class Plan(JsonDocument):
    """A CPU:GPU split with buffer sizes and thread counts, plus the predictions behind it.

    `shares_cores` (CPU-only plans) means batching and training take turns on the same cores
    instead of running side by side on disjoint ones.
    `baselines_s` holds the predicted epochs of the plans it was compared with: 'all-cpu' and
    'all-gpu' on a GPU machine, 'even-split' (half the cores batch) on a CPU-only one.
    `eq6_x` is None when Eq. 6 is minimised in the limit x -> infinity (everything on the GPU).
    `optimality_gap` bounds how much faster an unvisited split could be (0: certified within the
    planner's tolerance). `lower_bound_s` uses mean phase times, so a stochastic epoch can land
    slightly below it.
    """

    DOCUMENT_KIND = PLAN_KIND
    DOCUMENT_SCHEMA_VERSION = PLAN_SCHEMA_VERSION
    DOCUMENT_FIX = "re-create it with `morphpipe tune` (or plan_from_profile)"
    DOCUMENT_SOURCE = "<plan>"

    kind: str
    num_batches: int
    n_cpu: int
    n_gpu: int
    cbs: int
    gbs: int
    cpu_threads: int
    train_threads: int | None
    predicted_epoch_s: float
    baselines_s: dict[str, float]
    lower_bound_s: float
    lower_bound_n_cpu: int | None
    eq6_s: float | None
    eq6_x: float | None
    eq6_cpu_fraction: float | None
    busy: dict[str, float]
    idle_s: dict[str, float]
    evaluations: int
    optimality_gap: float
    notes: list[str]
    seed: int
    engine: str
    profile: dict[str, Any]
    shares_cores: bool = False
    tiering: FeatureTiering | None = None  # features on disk: the host cache chosen; None: features in RAM
    created: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))

    def __post_init__(self) -> None:
        if self.kind not in SCHEDULE_KINDS:
            raise ValueError(f"Plan.kind must be one of {SCHEDULE_KINDS}, got {self.kind!r}")
        if self.n_cpu < 0 or self.n_gpu < 0 or self.n_cpu + self.n_gpu != self.num_batches:
            raise ValueError(
                f"Plan.n_cpu ({self.n_cpu}) + Plan.n_gpu ({self.n_gpu}) must equal num_batches ({self.num_batches})"
            )
        if self.n_cpu > 0 and self.cbs < 1:
            raise ValueError(f"Plan.cbs must be >= 1 when n_cpu > 0, got {self.cbs!r}")
        if self.n_gpu > 0 and self.gbs < 1:
            raise ValueError(f"Plan.gbs must be >= 1 when n_gpu > 0, got {self.gbs!r}")
        if self.cpu_threads < 1:
            raise ValueError(f"Plan.cpu_threads must be >= 1, got {self.cpu_threads!r}")
        if self.kind == "cpu-only" and (self.train_threads is None or self.train_threads < 1):
            raise ValueError(f"a cpu-only Plan needs train_threads >= 1, got {self.train_threads!r}")

    @property
    def cpu_share(self) -> float:
        """Fraction of the epoch's batches made by the CPU batcher (Route 0)."""
        return self.n_cpu / self.num_batches

    @property
    def split(self) -> Split:
        """Batches per route and buffer sizes: what the simulator and the executor run."""
        return Split(self.n_cpu, self.n_gpu, self.cbs, self.gbs)

    @property
    def best_baseline_s(self) -> float:
        """The predicted epoch of the better baseline."""
        return min(self.baselines_s.values())

    @property
    def speedup(self) -> float:
        """Predicted speedup of this plan over the better baseline."""
        return self.best_baseline_s / self.predicted_epoch_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": PLAN_KIND,
            "schema_version": PLAN_SCHEMA_VERSION,
            "created": self.created,
            "schedule": self.kind,
            "num_batches": self.num_batches,
            "n_cpu": self.n_cpu,
            "n_gpu": self.n_gpu,
            "cbs": self.cbs,
            "gbs": self.gbs,
            "cpu_threads": self.cpu_threads,
            "train_threads": self.train_threads,
            "shares_cores": self.shares_cores,
            "predicted_epoch_s": self.predicted_epoch_s,
            "baselines_s": dict(self.baselines_s),
            "lower_bound_s": self.lower_bound_s,
            "lower_bound_n_cpu": self.lower_bound_n_cpu,
            "eq6_s": self.eq6_s,
            "eq6_x": self.eq6_x,
            "eq6_cpu_fraction": self.eq6_cpu_fraction,
            "busy": dict(self.busy),
            "idle_s": dict(self.idle_s),
            "evaluations": self.evaluations,
            "optimality_gap": self.optimality_gap,
            "notes": list(self.notes),
            "seed": self.seed,
            "engine": self.engine,
            "profile": self.profile,
            "tiering": self.tiering.to_dict() if self.tiering is not None else None,
        }

    @classmethod
    def from_fields(cls, reader: FieldReader) -> Plan:
        def numbers(name: str, **bounds: float | bool) -> dict[str, float]:
            section = reader.section(name)
            values = {key: section.number(key, **bounds) for key in section.data}
            if name == "busy" and any(value > 1.0 for value in values.values()):
                key, value = next((k, v) for k, v in values.items() if v > 1.0)
                raise section.error(key, "must be a busy fraction in [0, 1]", value)
            return values

        notes = reader.data.get("notes")
        if not isinstance(notes, list) or not all(isinstance(note, str) for note in notes):
            raise reader.error("notes", "must be a list of strings", notes)
        profile_section = reader.section("profile")
        read_workload(profile_section)
        profile = profile_section.data
        if not reader.data.get("baselines_s"):
            raise reader.error("baselines_s", "must name at least one baseline plan's predicted epoch",
                               reader.data.get("baselines_s"))
        eq6_x = reader.number("eq6_x", minimum=0.0, optional=True)
        tiering_section = reader.section("tiering", optional=True)
        tiering = FeatureTiering.from_fields(tiering_section) if tiering_section is not None else None
        with reader.as_document_errors():
            return cls(
                kind=reader.string("schedule", choices=SCHEDULE_KINDS),
                num_batches=reader.integer("num_batches", minimum=1),
                n_cpu=reader.integer("n_cpu", minimum=0),
                n_gpu=reader.integer("n_gpu", minimum=0),
                cbs=reader.integer("cbs", minimum=0),
                gbs=reader.integer("gbs", minimum=0),
                cpu_threads=reader.integer("cpu_threads", minimum=1),
                train_threads=reader.integer("train_threads", minimum=1, optional=True),
                shares_cores=reader.boolean("shares_cores"),
                predicted_epoch_s=reader.number("predicted_epoch_s", positive=True),
                baselines_s=numbers("baselines_s", positive=True),
                lower_bound_s=reader.number("lower_bound_s", minimum=0.0),
                lower_bound_n_cpu=reader.integer("lower_bound_n_cpu", minimum=0, optional=True),
                eq6_s=reader.number("eq6_s", minimum=0.0, optional=True),
                eq6_x=eq6_x,
                eq6_cpu_fraction=reader.number("eq6_cpu_fraction", minimum=0.0, optional=True),
                busy=numbers("busy", minimum=0.0),
                idle_s=numbers("idle_s", minimum=0.0),
                evaluations=reader.integer("evaluations", minimum=0),
                optimality_gap=reader.number("optimality_gap", minimum=0.0),
                notes=notes,
                seed=reader.integer("seed"),
                engine=reader.string("engine"),
                profile=profile,
                tiering=tiering,
                created=reader.string("created"),
            )

    def describe(self) -> str:
        """A few human-readable lines."""
        lines = [
            f"schedule {self.kind}: {self.n_cpu} CPU-batched + {self.n_gpu} GPU-batched of {self.num_batches} "
            f"batches (CPU share {self.cpu_share:.1%}), cbs={self.cbs} gbs={self.gbs}, "
            f"{count_of(self.cpu_threads, 'batching thread')}"
            + (f", {count_of(self.train_threads, 'training thread')}" if self.train_threads else "")
            + (", taking turns on the same cores" if self.shares_cores else ""),
            f"predicted epoch {self.predicted_epoch_s:.4g} s; lower bound {self.lower_bound_s:.4g} s"
            + (f"; Eq. 6 {self.eq6_s:.4g} s" if self.eq6_s is not None else ""),
            "baselines: " + ", ".join(f"{k} {v:.4g} s" for k, v in self.baselines_s.items())
            + f" -> speedup {self.speedup:.2f}x over the better one",
            "busy: " + ", ".join(f"{k} {v:.0%}" for k, v in self.busy.items()),
            *([self.tiering.describe()] if self.tiering is not None else []),
            *self.notes,
        ]
        return "\n".join(lines)


def finite_or_none(value: float) -> float | None:
    """JSON has no infinity: an infinite Eq. 6 ratio is stored as None."""
    return None if math.isinf(value) else value
