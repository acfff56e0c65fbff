"""The Profile: measured phase timings of one workload on one machine, saved as versioned JSON.

A Profile holds what the planner needs (DESIGN.md, "The planning problem"): the hardware
facts, the per-batch time of CPU batching at several thread counts (so its throughput at any
thread count can be extrapolated), the GPU (UVA) batching time T_GB, the DMA time T_DMA, the
training step time T_M, the batch size in bytes and the number of batches per epoch. GPU
phases are None on a machine without CUDA; there, training is measured on the CPU at several
thread counts instead, because batching and training then share the cores. With features on disk
(or features larger than the memory budget) `disk` holds the disk's read rate and the feature
cache's hit ratio by size, and CPU batching is timed with every row the timed batches gather
served from RAM: the disk is a resource of its own in the plan (scheduler/model.py).
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

from morphpipe.documents import FieldReader, JsonDocument
from morphpipe.nn.train_step import PRECISIONS
from morphpipe.profiler.disk import DiskProfile
from morphpipe.profiler.hardware import HardwareFacts

SCHEMA_VERSION = 1
PROFILE_KIND = "morphpipe.profile"
DEVICES = ("cuda", "cpu")


@dataclass(frozen=True)
class PhaseTiming:
    """Mean, spread and sample count of one phase's per-batch time, in seconds."""

    mean_s: float
    std_s: float = 0.0
    cv: float = 0.0
    samples: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.mean_s, bool) or not math.isfinite(self.mean_s) or self.mean_s <= 0:
            raise ValueError(f"PhaseTiming.mean_s must be a finite number > 0 seconds, got {self.mean_s!r}")
        if not math.isfinite(self.std_s) or self.std_s < 0:
            raise ValueError(f"PhaseTiming.std_s must be a finite number >= 0, got {self.std_s!r}")
        if not math.isfinite(self.cv) or self.cv < 0:
            raise ValueError(f"PhaseTiming.cv must be a finite number >= 0, got {self.cv!r}")
        if not math.isclose(self.cv * self.mean_s, self.std_s, rel_tol=1e-6, abs_tol=1e-12):
            raise ValueError(
                f"PhaseTiming.cv ({self.cv!r}) must equal std_s / mean_s ({self.std_s!r} / {self.mean_s!r}); "
                "build it with PhaseTiming.from_mean or PhaseTiming.from_samples"
            )
        if isinstance(self.samples, bool) or not isinstance(self.samples, int) or self.samples < 0:
            raise ValueError(f"PhaseTiming.samples must be an integer >= 0, got {self.samples!r}")

    @classmethod
    def from_mean(cls, mean_s: float, cv: float = 0.0, samples: int = 0) -> PhaseTiming:
        """A timing from its mean and coefficient of variation (synthetic profiles, what-if scaling)."""
        return cls(float(mean_s), float(mean_s) * float(cv), float(cv), samples)

    @classmethod
    def from_samples(cls, seconds: Iterable[float]) -> PhaseTiming:
        """A timing summarising measured per-batch times (sample standard deviation)."""
        values = [float(s) for s in seconds]
        if not values:
            raise ValueError("PhaseTiming.from_samples needs at least one measured time")
        mean = statistics.fmean(values)
        std = statistics.stdev(values) if len(values) > 1 else 0.0
        return cls(mean, std, std / mean if mean > 0 else 0.0, len(values))

    def scaled(self, factor: float) -> PhaseTiming:
        """The same phase taking `factor` times as long, with the same coefficient of variation."""
        return PhaseTiming(self.mean_s * factor, self.std_s * factor, self.cv, self.samples)

    def to_dict(self) -> dict[str, float | int]:
        return {"mean_s": self.mean_s, "std_s": self.std_s, "cv": self.cv, "samples": self.samples}

    @classmethod
    def from_fields(cls, reader: FieldReader) -> PhaseTiming:
        """Reads and validates a timing from JSON."""
        mean = reader.number("mean_s", positive=True)
        std = reader.number("std_s", minimum=0.0)
        cv = reader.number("cv", minimum=0.0)
        samples = reader.integer("samples", minimum=0)
        if not math.isclose(cv * mean, std, rel_tol=1e-6, abs_tol=1e-12):
            raise reader.error("cv", f"must equal std_s / mean_s = {std / mean!r}", cv)
        return cls(mean, std, cv, samples)


@dataclass(frozen=True)
class ThreadScaling:
    """Per-batch time of a phase measured at several thread counts, and T(P) at any thread count.

    `points[P]` is the wall time per delivered batch with P threads working (1 / throughput),
    and its `cv` the spread of those times. Between measured thread counts the throughput
    is interpolated linearly; below the smallest it falls linearly to zero; beyond the largest
    it keeps growing by the *marginal* per-thread gain of the last measured step (the measured
    efficiency; with a single measurement, linear speedup is assumed). Threads beyond `cores`
    add nothing, so T(P) never improves past the core count.
    """

    points: Mapping[int, PhaseTiming]

    def __post_init__(self) -> None:
        if not self.points:
            raise ValueError("ThreadScaling.points needs at least one thread count; measure the phase at 1 thread")
        for threads in self.points:
            if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
                raise ValueError(f"ThreadScaling.points keys must be thread counts >= 1, got {threads!r}")
        object.__setattr__(self, "points", dict(sorted(self.points.items())))

    @classmethod
    def linear(cls, single_thread_s: float, threads: int, efficiency: float = 1.0, cv: float = 0.0) -> ThreadScaling:
        """A synthetic scaling: speedup(P) = 1 + (P - 1) * efficiency, given at 1 and max(2, `threads`) threads.

        Two points always, so the efficiency carries over when a what-if machine has more cores.
        """
        if not 0.0 <= efficiency <= 1.0:
            raise ValueError(f"efficiency must be in [0, 1], got {efficiency!r}")
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads!r}")
        top = max(2, threads)
        return cls({1: PhaseTiming.from_mean(single_thread_s, cv),
                    top: PhaseTiming.from_mean(single_thread_s / (1.0 + (top - 1) * efficiency), cv)})

    def throughput(self, threads: int, cores: int | None = None) -> float:
        """Batches per second with `threads` threads on a machine with `cores` cores."""
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads!r}")
        p = min(threads, cores) if cores is not None else threads
        counts = list(self.points)
        rates = [1.0 / self.points[c].mean_s for c in counts]
        if p in self.points:
            return rates[counts.index(p)]
        if p < counts[0]:
            return rates[0] * p / counts[0]
        for (c0, r0), (c1, r1) in zip(zip(counts, rates), zip(counts[1:], rates[1:])):
            if c0 < p < c1:
                return r0 + (r1 - r0) * (p - c0) / (c1 - c0)
        return rates[-1] + (p - counts[-1]) * self.marginal_rate()

    def marginal_rate(self) -> float:
        """Throughput each thread adds beyond the largest measured count (>= 0, <= the mean per thread)."""
        counts = list(self.points)
        last = 1.0 / self.points[counts[-1]].mean_s
        mean_per_thread = last / counts[-1]
        if len(counts) == 1:
            return mean_per_thread
        before = 1.0 / self.points[counts[-2]].mean_s
        step = (last - before) / (counts[-1] - counts[-2])
        return min(max(step, 0.0), mean_per_thread)

    def efficiency(self, threads: int, cores: int | None = None) -> float:
        """Parallel efficiency speedup(P) / P relative to the single-thread throughput."""
        return self.throughput(threads, cores) / (threads * self.throughput(1))

    def per_batch_time(self, threads: int, cores: int | None = None) -> float:
        """T(P): wall time per delivered batch with `threads` threads, 1 / throughput."""
        return 1.0 / self.throughput(threads, cores)

    def timing(self, threads: int, cores: int | None = None) -> PhaseTiming:
        """T(P) as a PhaseTiming, with the coefficient of variation of the nearest measured count."""
        p = min(threads, cores) if cores is not None else threads
        nearest = min(self.points, key=lambda c: (abs(c - p), c))
        return PhaseTiming.from_mean(self.per_batch_time(threads, cores), self.points[nearest].cv,
                                     self.points[nearest].samples)

    def fewest_threads_cv(self) -> float:
        """The spread measured at the fewest threads: at one thread, that of a single batch's build time.

        With several batching threads deliveries interleave, so their spread says little about
        how long one thread takes for one batch, which is what the simulator draws.
        """
        return next(iter(self.points.values())).cv

    def to_dict(self) -> list[dict[str, float | int]]:
        return [{"threads": threads, **timing.to_dict()} for threads, timing in self.points.items()]

    @classmethod
    def from_fields(cls, reader: FieldReader, name: str) -> ThreadScaling:
        """Reads `name`, a list of {threads, mean_s, std_s, cv, samples}, from JSON."""
        items = reader.sections(name)
        if not items:
            raise reader.error(name, "must list at least one thread count", [])
        points: dict[int, PhaseTiming] = {}
        for item in items:
            threads = item.integer("threads", minimum=1)
            if threads in points:
                raise item.error("threads", "is listed twice", threads)
            points[threads] = PhaseTiming.from_fields(item)
        return cls(points)


@dataclass
class Profile(JsonDocument):
    """Everything the planner knows about one workload on one machine (DESIGN.md, planning problem)."""

    DOCUMENT_KIND = PROFILE_KIND
    DOCUMENT_SCHEMA_VERSION = SCHEMA_VERSION
    DOCUMENT_FIX = "re-run `morphpipe tune` to write a fresh profile"
    DOCUMENT_SOURCE = "<profile>"

    hardware: HardwareFacts
    device: str
    num_batches: int
    batch_bytes: int
    cpu_batching: ThreadScaling
    gpu_batching: PhaseTiming | None = None
    dma: PhaseTiming | None = None
    training: PhaseTiming | None = None
    cpu_training: ThreadScaling | None = None
    uva_transfer_s: float | None = None
    workload: dict[str, str | int | float | bool | None] = field(default_factory=dict)
    created: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    contention: dict[str, str | int | float | bool | None] = field(default_factory=dict)  # Contention.to_dict()
    disk: DiskProfile | None = None

    @property
    def taken_on_busy_machine(self) -> bool:
        """True when the profiler saw other processes (or the hypervisor) take our cores and could not avoid it."""
        return bool(self.contention.get("busy", False))

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise ValueError(f"Profile.device must be one of {DEVICES}, got {self.device!r}")
        if isinstance(self.num_batches, bool) or not isinstance(self.num_batches, int) or self.num_batches < 1:
            raise ValueError(f"Profile.num_batches must be an integer >= 1, got {self.num_batches!r}")
        if isinstance(self.batch_bytes, bool) or not isinstance(self.batch_bytes, int) or self.batch_bytes < 0:
            raise ValueError(f"Profile.batch_bytes must be an integer >= 0, got {self.batch_bytes!r}")
        gpu_phases = {"gpu_batching": self.gpu_batching, "dma": self.dma, "training": self.training}
        if self.device == "cuda":
            missing = [name for name, timing in gpu_phases.items() if timing is None]
            if missing:
                raise ValueError(
                    f"Profile on device 'cuda' needs {', '.join(missing)}; measure them, or use device 'cpu'"
                )
        else:
            present = [name for name, timing in gpu_phases.items() if timing is not None]
            if present:
                raise ValueError(f"Profile on device 'cpu' must not have GPU phases, got {', '.join(present)}")
            if self.cpu_training is None:
                raise ValueError("Profile on device 'cpu' needs cpu_training (training step time per thread count)")
        if self.uva_transfer_s is not None and (
            self.gpu_batching is None or not 0.0 <= self.uva_transfer_s <= self.gpu_batching.mean_s
        ):
            raise ValueError(
                f"Profile.uva_transfer_s must lie in [0, gpu_batching.mean_s], got {self.uva_transfer_s!r}"
            )

    @property
    def cores(self) -> int:
        """Cores the planner may use: the usable (affinity-allowed) cores of the machine."""
        return self.hardware.usable_cores

    def cpu_batch_time(self, threads: int | None = None, cores: int | None = None) -> float:
        """T_CB(P): effective CPU batching time per batch with P threads (default: all usable cores)."""
        cores = self.cores if cores is None else cores
        return self.cpu_batching.per_batch_time(cores if threads is None else threads, cores)

    def summary(self) -> dict[str, Any]:
        """A short, JSON-ready description (for plans and reports)."""
        gpu = self.hardware.gpus[0].name if self.hardware.gpus else None
        return {
            "device": self.device,
            "num_batches": self.num_batches,
            "batch_bytes": self.batch_bytes,
            "cores": self.cores,
            "cpu_model": self.hardware.cpu_model,
            "gpu": gpu,
            "t_cb_s": self.cpu_batch_time(),
            "t_gb_s": self.gpu_batching.mean_s if self.gpu_batching else None,
            "t_dma_s": self.dma.mean_s if self.dma else None,
            "t_m_s": self.training.mean_s if self.training else None,
            "created": self.created,
            "workload": dict(self.workload),
            "busy_machine": self.taken_on_busy_machine,
            "features_on_disk": self.disk is not None,
        }

    def to_dict(self) -> dict[str, Any]:
        def timing(value: PhaseTiming | None) -> dict[str, float | int] | None:
            return value.to_dict() if value is not None else None

        return {
            "kind": PROFILE_KIND,
            "schema_version": SCHEMA_VERSION,
            "created": self.created,
            "device": self.device,
            "num_batches": self.num_batches,
            "batch_bytes": self.batch_bytes,
            "hardware": self.hardware.to_dict(),
            "cpu_batching": self.cpu_batching.to_dict(),
            "gpu_batching": timing(self.gpu_batching),
            "uva_transfer_s": self.uva_transfer_s,
            "dma": timing(self.dma),
            "training": timing(self.training),
            "cpu_training": self.cpu_training.to_dict() if self.cpu_training is not None else None,
            "workload": dict(self.workload),
            "contention": dict(self.contention),
            "disk": self.disk.to_dict() if self.disk is not None else None,
        }

    @classmethod
    def from_fields(cls, reader: FieldReader) -> Profile:
        def timing(name: str) -> PhaseTiming | None:
            section = reader.section(name, optional=True)
            return PhaseTiming.from_fields(section) if section is not None else None

        device = reader.string("device", choices=DEVICES)
        cpu_training = (
            ThreadScaling.from_fields(reader, "cpu_training") if reader.data.get("cpu_training") is not None else None
        )
        hardware_section = reader.section("hardware")
        disk_section = reader.section("disk", optional=True)
        disk = DiskProfile.from_fields(disk_section) if disk_section is not None else None
        with reader.as_document_errors():
            return cls(
                hardware=HardwareFacts.from_fields(hardware_section),
                device=device,
                num_batches=reader.integer("num_batches", minimum=1),
                batch_bytes=reader.integer("batch_bytes", minimum=0),
                cpu_batching=ThreadScaling.from_fields(reader, "cpu_batching"),
                gpu_batching=timing("gpu_batching"),
                dma=timing("dma"),
                training=timing("training"),
                cpu_training=cpu_training,
                uva_transfer_s=reader.number("uva_transfer_s", minimum=0.0, optional=True),
                workload=read_workload(reader),
                created=reader.string("created"),
                contention=reader.scalars("contention", optional=True),
                disk=disk,
            )

    @classmethod
    def synthetic(
        cls,
        *,
        t_cb: float,
        t_m: float,
        t_gb: float | None = None,
        t_dma: float | None = None,
        num_batches: int = 1000,
        cores: int = 1,
        cpu_efficiency: float = 1.0,
        cv: float = 0.0,
        batch_bytes: int = 0,
        device: str | None = None,
        training_efficiency: float = 1.0,
        workload: dict[str, str | int | float | bool | None] | None = None,
    ) -> Profile:
        """A profile built from numbers (tests, benchmarks, what-if studies).

        `t_cb` is the single-thread CPU batching time per batch; with `cores` threads it becomes
        t_cb / (1 + (cores - 1) * cpu_efficiency). On device 'cuda' (the default when t_gb and
        t_dma are given) `t_m` is the GPU training step; on device 'cpu' it is the single-thread
        CPU training step, scaling with `training_efficiency` the same way.
        """
        device = device or ("cuda" if t_gb is not None and t_dma is not None else "cpu")
        hardware = HardwareFacts.synthetic(cores=cores, gpu=device == "cuda")
        cpu_batching = ThreadScaling.linear(t_cb, cores, cpu_efficiency, cv)
        if device == "cuda":
            if t_gb is None or t_dma is None:
                raise ValueError("Profile.synthetic on device 'cuda' needs t_gb and t_dma")
            return cls(hardware, device, num_batches, batch_bytes, cpu_batching,
                       gpu_batching=PhaseTiming.from_mean(t_gb, cv), dma=PhaseTiming.from_mean(t_dma, cv),
                       training=PhaseTiming.from_mean(t_m, cv), workload=dict(workload or {"synthetic": True}))
        return cls(hardware, device, num_batches, batch_bytes, cpu_batching,
                   cpu_training=ThreadScaling.linear(t_m, cores, training_efficiency, cv),
                   workload=dict(workload or {"synthetic": True}))

    def replaced(self, **changes: Any) -> Profile:
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)


# The workload fields that planning and `morphpipe train` read back, and their checks; other keys are free-form.
WORKLOAD_INTEGERS = {"batch_size": 1, "hidden": 1, "num_nodes": 0, "num_edges": 0, "seed": None}
WORKLOAD_STRINGS = ("dataset", "dataset_fingerprint", "model", "fanouts")


def read_workload(reader: FieldReader) -> dict[str, str | int | float | bool | None]:
    """The optional `workload` object of a profile (or of a plan's profile summary): what was measured, as the
    Profiler records it, with the fields that are read back checked (integer sizes, text names, fanouts as 15,10,5)."""
    workload = reader.scalars("workload", optional=True)
    if not workload:
        return workload
    section = reader.section("workload")
    for name, minimum in WORKLOAD_INTEGERS.items():
        if workload.get(name) is not None:
            section.integer(name, minimum=minimum)
    for name in WORKLOAD_STRINGS:
        if workload.get(name) is not None:
            section.string(name)
    if workload.get("precision") is not None:
        section.string("precision", choices=PRECISIONS)
    fanouts = workload.get("fanouts")
    if fanouts is not None and not all(part.strip().lstrip("-").isdigit() for part in str(fanouts).split(",")):
        raise section.error("fanouts", "must be comma-separated integers such as '15,10,5'", fanouts)
    return workload
