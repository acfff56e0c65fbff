"""Re-planning between epochs: phase times measured from each epoch's trace, a running estimate, a hysteresis switch.

After every epoch the executor's trace says how long each phase really took per batch under the
plan that ran (CPU batching at its thread count, UVA batching, DMA, the training step). Each
phase's ratio to what the profile predicted for the same thread count is smoothed (exponentially
weighted; a ratio more than `shift` away from the estimate is a level shift, such as a co-tenant
arriving, and replaces it at once), the profile is rescaled by those ratios, and the planner plans again from it (well
under a second). The new plan replaces the current one only when, under the same estimate, it
is predicted to be faster by more than `threshold`, so noise of the size the profiler reports
does not flip plans back and forth. The rescaling keeps each phase's measured thread scaling and
only changes its level: a co-tenant that slows every thread count alike is modelled exactly, one
that changes the shape of the scaling only approximately. A profile taken on a busy machine has
the worst such shape (more threads looked useless while others held the cores), so when its run
turns out clearly faster than it predicted (by `reprofile_gain`: the co-tenant has gone), the
re-planner profiles the machine again, once, given a way to (`reprofile`), and plans from the new
profile.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from morphpipe.data.feature_store import FeatureStoreCounters
from morphpipe.executor.executor import EpochResult
from morphpipe.partitioner.times import cpu_beyond_the_wait
from morphpipe.profiler.disk import MIN_TIMED_READS, DiskProfile
from morphpipe.profiler.profile import PhaseTiming, Profile, ThreadScaling
from morphpipe.scheduler.plan import Plan
from morphpipe.scheduler.planning import plan_from_profile
from morphpipe.scheduler.simulate_plan import simulate_plan

PHASES = ("cpu_batch", "gpu_batch", "dma", "train")
REPLAN_MODES = ("off", "epoch")


@dataclass(frozen=True)
class MeasuredPhases:
    """Per-batch phase times of one epoch, as the planner counts them (None: the plan did not run that phase).

    `cpu_batch` is the time per delivered batch with the plan's batching threads (one thread's
    build time over the thread count when they run side by side), `train` the training step.
    """

    cpu_batch: PhaseTiming | None = None
    gpu_batch: PhaseTiming | None = None
    dma: PhaseTiming | None = None
    train: PhaseTiming | None = None

    def get(self, phase: str) -> PhaseTiming | None:
        return getattr(self, phase)


def measure_phases(result: EpochResult, plan: Plan) -> MeasuredPhases:
    """The phase times of `result`, an epoch trained under `plan`, from its trace and its batchers' own timings."""
    durations: dict[str, list[float]] = {"batch": [], "uva": [], "dma": [], "train": []}
    route_1_reads: dict[int, float] = {}  # traced apart (virtual devices), a Route-1 batch's reads count in its time
    for record in result.trace:
        if record.phase == "read" and record.route == 1:
            route_1_reads[record.batch] = record.end - record.start
    for record in result.trace:
        if record.phase in durations and not (record.phase == "uva" and record.device != "gpu"):
            extra = route_1_reads.get(record.batch, 0.0) if record.phase == "uva" else 0.0
            durations[record.phase].append(record.end - record.start + extra)
    batch_seconds = durations["batch"] or list(result.build_s)
    cpu_batch = None
    if batch_seconds:
        side_by_side = 1 if plan.shares_cores else plan.cpu_threads
        cpu_batch = PhaseTiming.from_samples(s / side_by_side for s in batch_seconds)
    timing = {phase: PhaseTiming.from_samples(values) if values else None for phase, values in durations.items()}
    return MeasuredPhases(cpu_batch=cpu_batch, gpu_batch=timing["uva"], dma=timing["dma"], train=timing["train"])


def predicted_phases(profile: Profile, plan: Plan) -> dict[str, float | None]:
    """What `profile` says each phase takes per batch under `plan`'s thread counts (CPU batching, and UVA batching
    when Route 1's reads were profiled apart: with its batch's disk reads when the features are on disk, as the
    executor's trace times them)."""
    cores = profile.cores
    cpu_batch = profile.cpu_batch_time(plan.cpu_threads, cores)
    gpu_batch = profile.gpu_batching.mean_s if profile.gpu_batching else None
    if profile.disk is not None and plan.tiering is not None:
        readers = 1 if plan.shares_cores else plan.cpu_threads  # batching threads waiting on reads side by side
        tiering = plan.tiering
        read_s = profile.disk.read_s_per_batch(tiering.cache_bytes, tiering.io_threads)
        read_cpu_s = profile.disk.read_cpu_s_per_batch(tiering.cache_bytes, tiering.io_threads)
        cpu_batch += (read_s + cpu_beyond_the_wait(read_s, read_cpu_s)) / readers
        if gpu_batch is not None:
            read_s = profile.disk.read_s_per_batch(tiering.cache_bytes, tiering.io_threads, route=1)
            read_cpu_s = profile.disk.read_cpu_s_per_batch(tiering.cache_bytes, tiering.io_threads, route=1)
            gpu_batch += read_s + cpu_beyond_the_wait(read_s, read_cpu_s)
    if plan.kind == "cpu-only":
        assert profile.cpu_training is not None and plan.train_threads is not None
        return {"cpu_batch": cpu_batch, "gpu_batch": None, "dma": None,
                "train": profile.cpu_training.per_batch_time(plan.train_threads, cores)}
    return {"cpu_batch": cpu_batch, "gpu_batch": gpu_batch,
            "dma": profile.dma.mean_s if profile.dma else None,
            "train": profile.training.mean_s if profile.training else None}


def rescaled_profile(profile: Profile, factors: dict[str, float]) -> Profile:
    """`profile` with each phase's times multiplied by its factor (thread scaling shapes kept)."""
    def scaling(value: ThreadScaling | None, factor: float) -> ThreadScaling | None:
        if value is None:
            return None
        return ThreadScaling({threads: timing.scaled(factor) for threads, timing in value.points.items()})

    def timing(value: PhaseTiming | None, factor: float) -> PhaseTiming | None:
        return value.scaled(factor) if value is not None else None

    gpu_factor = factors.get("gpu_batch", 1.0)
    train_factor = factors.get("train", 1.0)
    return profile.replaced(
        cpu_batching=scaling(profile.cpu_batching, factors.get("cpu_batch", 1.0)),
        cpu_training=scaling(profile.cpu_training, train_factor),
        gpu_batching=timing(profile.gpu_batching, gpu_factor),
        dma=timing(profile.dma, factors.get("dma", 1.0)),
        training=timing(profile.training, train_factor),
        uva_transfer_s=profile.uva_transfer_s * gpu_factor if profile.uva_transfer_s is not None else None,
    )


def measured_disk(disk: DiskProfile, reads: FeatureStoreCounters, plan: Plan, batches: int,
                  gpu_batches: int = 0) -> DiskProfile:
    """`disk` as the epoch's feature store counters say, for an epoch of `batches` Route-0 and `gpu_batches` Route-1
    batches that both gathered through the store: rows per batch of each route scaled by counted / predicted (a
    profile that did not measure Route 1's rows apart counts its batches as Route 0's), the hit curve's miss ratios and
    the preads per missed row scaled by measured / predicted at the cache that ran (hits clipped to [0, 1]), and
    the read rates scaled by the rate the store's read timer measured (preads per second of reading) over the
    profile's at that cache, when it timed enough reads."""
    rows = reads.hits + reads.misses
    gpu_rows = disk.rows_per_batch if disk.gpu_rows_per_batch is None else disk.gpu_rows_per_batch
    predicted_rows = disk.rows_per_batch * batches + gpu_rows * gpu_batches
    if rows == 0 or predicted_rows == 0 or plan.tiering is None:
        return disk
    counted_rows = rows / predicted_rows
    cache_bytes = plan.tiering.cache_bytes
    predicted_miss = 1.0 - disk.hit_ratio(cache_bytes)
    factor = (1.0 - reads.hit_ratio) / predicted_miss if predicted_miss > 0 else 1.0
    curve = [(size, min(1.0, max(0.0, 1.0 - (1.0 - ratio) * factor))) for size, ratio in disk.hit_curve]
    monotone = []
    for size, ratio in curve:
        monotone.append((size, max(ratio, monotone[-1][1] if monotone else 0.0)))
    reads_per_miss, per_size = disk.reads_per_miss, disk.reads_per_miss_curve
    if reads.misses:
        counted = reads.reads / reads.misses / disk.reads_per_miss_at(cache_bytes)
        reads_per_miss, per_size = reads_per_miss * counted, tuple(value * counted for value in per_size)
    rates, store_rate = disk.reads_per_s_curve, disk.store_reads_per_s
    if reads.reads >= MIN_TIMED_READS and reads.reads_per_second is not None:
        # Timed with the plan's I/O threads; the profile's rates are at those it was profiled with.
        depth = disk.reads_per_s_at(cache_bytes, plan.tiering.io_threads) / disk.reads_per_s_at(cache_bytes)
        timed = reads.reads_per_second / depth / disk.reads_per_s_at(cache_bytes)
        rates = tuple(rate * timed for rate in rates)
        store_rate = store_rate * timed if store_rate is not None else reads.reads_per_second / depth
    return replace(disk, rows_per_batch=disk.rows_per_batch * counted_rows, hit_curve=tuple(monotone),
                   reads_per_miss=reads_per_miss, reads_per_miss_curve=per_size, store_reads_per_s=store_rate,
                   reads_per_s_curve=rates,
                   gpu_rows_per_batch=None if disk.gpu_rows_per_batch is None else gpu_rows * counted_rows)


def disk_reads_note(reads: FeatureStoreCounters, io_threads: int) -> str:
    """What the store's read timer measured this epoch, for a re-planning decision ("" when it read nothing)."""
    rate, latency = reads.reads_per_second, reads.read_latency_s(io_threads)
    if rate is None or latency is None:
        return ""
    return f"; the disk served {rate:,.0f} reads/s, {latency * 1e3:.2f} ms each"


@dataclass(frozen=True)
class ReplanDecision:
    """What the re-planner concluded after one epoch."""

    epoch: int
    factors: dict[str, float]  # running estimate: measured / profiled, per phase
    current_s: float  # the running plan's predicted epoch under the estimate
    candidate: Plan  # the planner's plan under the estimate
    switched: bool
    reason: str
    reprofiled: bool = False  # the profile was taken again before planning

    @property
    def gain(self) -> float:
        """Predicted fraction of the epoch the candidate saves over the running plan."""
        return 1.0 - self.candidate.predicted_epoch_s / self.current_s


@dataclass
class Replanner:
    """Keeps a running estimate of the phase times and re-plans from it after every epoch.

    `smoothing` is the weight of the newest epoch in the estimate (1: only the last epoch
    counts); a newest ratio more than `shift` (relative) away from the estimate replaces it (the
    machine changed: waiting for the average to catch up would run epochs under a stale plan);
    `threshold` is the predicted gain a new plan needs to replace the running one. `reprofile`
    takes a new profile of this machine and workload; it is called at most once, when the profile
    was taken on a busy machine and a CPU phase then ran more than `reprofile_gain` faster than it said.
    """

    profile: Profile
    gbs: int = 10
    seed: int = 0
    threshold: float = 0.05
    smoothing: float = 0.5
    shift: float = 0.25
    reprofile_gain: float = 0.15
    factors: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 1.0))
    decisions: list[ReplanDecision] = field(default_factory=list)
    reprofile: Callable[[], Profile] | None = None
    reprofiled: bool = False
    cache_bytes: int | None = None  # features on disk: a host cache the user fixed (None: the planner sizes it)

    def __post_init__(self) -> None:
        if not 0.0 < self.smoothing <= 1.0:
            raise ValueError(f"smoothing must be in (0, 1], got {self.smoothing!r}")
        if not self.shift > 0.0:
            raise ValueError(f"shift must be > 0, got {self.shift!r} (0.25: a 25% change is a level shift)")
        if not 0.0 < self.reprofile_gain < 1.0:
            raise ValueError(f"reprofile_gain must be in (0, 1), got {self.reprofile_gain!r} (0.15: 15% faster)")
        if not 0.0 <= self.threshold < 1.0:
            raise ValueError(f"threshold must be in [0, 1), got {self.threshold!r} (0.05: a 5% predicted gain)")

    def observe(self, result: EpochResult, plan: Plan) -> ReplanDecision:
        """Folds epoch `result` (run under `plan`) into the estimate and decides whether the next epoch re-plans."""
        measured = measure_phases(result, plan)
        expected = predicted_phases(self.profile, plan)
        for phase in PHASES:
            timing, predicted = measured.get(phase), expected[phase]
            if timing is None or not predicted:
                continue
            ratio = timing.mean_s / predicted
            if not (math.isfinite(ratio) and ratio > 0):
                continue
            if abs(ratio / self.factors[phase] - 1.0) > self.shift:
                self.factors[phase] = ratio
            else:
                self.factors[phase] += self.smoothing * (ratio - self.factors[phase])
        note = self._reprofile_if_contention_left()
        if self.profile.disk is not None and result.feature_reads is not None:
            self.profile = self.profile.replaced(disk=measured_disk(self.profile.disk, result.feature_reads, plan,
                                                                    result.n_cpu, result.n_gpu))
        estimate = rescaled_profile(self.profile, self.factors)
        current_s = simulate_plan(estimate, plan, engine="fast").epoch_s
        candidate = plan_from_profile(estimate, gbs=self.gbs, seed=self.seed, cache_bytes=self.cache_bytes)
        switched = candidate.predicted_epoch_s < current_s * (1.0 - self.threshold) and not same_schedule(candidate, plan)
        changed = note or ", ".join(f"{phase} x{factor:.2f}" for phase, factor in self.factors.items()
                                    if abs(factor - 1.0) >= 0.05) or "phases as profiled"
        if self.profile.disk is not None and result.feature_reads is not None:
            planned = plan.tiering.io_threads if plan.tiering is not None else None
            changed += disk_reads_note(result.feature_reads,
                                       planned if planned is not None else self.profile.disk.facts.queue_depth)
        if switched:
            reason = (f"re-planned ({changed}): {describe_schedule(plan)} -> {describe_schedule(candidate)}, "
                      f"predicted {current_s:.2f} s -> {candidate.predicted_epoch_s:.2f} s")
        else:
            reason = f"plan kept ({changed}; best alternative {1.0 - candidate.predicted_epoch_s / current_s:+.1%})"
        decision = ReplanDecision(result.epoch, dict(self.factors), current_s, candidate, switched, reason,
                                  reprofiled=bool(note))
        self.decisions.append(decision)
        return decision

    def _reprofile_if_contention_left(self) -> str:
        """Profiles again (once) when the profile saw a busy machine and the CPU phases now run clearly faster;
        then the new profile is the reference and the estimate starts afresh. Returns what was done, or ""."""
        faster = [phase for phase in ("cpu_batch", "train") if self.factors[phase] < 1.0 - self.reprofile_gain]
        if self.reprofile is None or self.reprofiled or not self.profile.taken_on_busy_machine or not faster:
            return ""
        started = time.perf_counter()
        speedups = ", ".join(f"{phase} x{self.factors[phase]:.2f}" for phase in faster)
        with torch.random.fork_rng():  # profiling draws random numbers; the training run's stream stays as it was
            self.profile = self.reprofile()
        self.reprofiled = True
        self.factors = dict.fromkeys(PHASES, 1.0)
        return (f"the profile was taken on a busy machine and this epoch ran faster ({speedups}): "
                f"profiled again in {time.perf_counter() - started:.0f} s")


def same_schedule(first: Plan, second: Plan) -> bool:
    """True when two plans run the same split, buffers and threads (re-planning to it changes nothing)."""
    keys = ("kind", "n_cpu", "n_gpu", "cbs", "gbs", "cpu_threads", "train_threads", "shares_cores")
    caches = [(plan.tiering.cache_bytes, plan.tiering.io_threads) if plan.tiering is not None else None
              for plan in (first, second)]
    return all(getattr(first, key) == getattr(second, key) for key in keys) and caches[0] == caches[1]


def describe_schedule(plan: Plan) -> str:
    """A short description of how a plan runs: split, threads, turn-taking, feature cache."""
    cache = "" if plan.tiering is None else f", feature cache {plan.tiering.cache_bytes / 1e6:,.1f} MB" + (
        f" read by {plan.tiering.io_threads} I/O threads" if plan.tiering.io_threads is not None else "")
    if plan.kind == "cpu-only":
        if plan.shares_cores:
            return f"batching and training take turns on {plan.cpu_threads} threads{cache}"
        return f"{plan.cpu_threads} batching + {plan.train_threads} training threads{cache}"
    return f"{plan.n_cpu} CPU + {plan.n_gpu} GPU batches, cbs {plan.cbs} gbs {plan.gbs}{cache}"
