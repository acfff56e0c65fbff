"""Planning: Partitioner and Scheduler iterate to a converged split, which becomes a Plan.

The loop (DESIGN.md, "Dual-buffer scheduling", feedback):
1. start at the exact minimiser of the lower bound LB;
2. simulate; if the idle time of one side exceeds the other's by at least one Route-1 batch
   (T_GB, after its disk reads with features on disk), move batches towards the idle side: as
   many as should close the gap (each moved batch shifts about that + T_CB), halving the move
   whenever it fails to shorten the epoch, down to the paper's single batch; stop when the
   mismatch is below one Route-1 batch or a one-batch move stops improving the predicted epoch;
3. certify: the simulated epoch of a split can never beat that split's lower bound computed
   from the same drawn durations (Scheduler.lower_bounds), so the splits are visited in
   order of that bound until it reaches the best epoch found, within `tolerance`: then no
   unvisited split can be better by more than `tolerance` (a branch and bound). The epoch
   landscape is saw-toothed at small n (buffer-size rounding, fill and drain), which a local
   search alone can miss; the feedback result makes the pruning start tight;
4. keep the fastest split found (ties go to the one nearest the LB optimum), unless a baseline
   (all-CPU, all-GPU) predicts a shorter epoch; the reported gap is the true bound: how much
   shorter than the chosen epoch the best unvisited split's lower bound still is.
The search and the baselines run on the fast engine, within a budget of simulated batches; the
chosen plan is then simulated again with the reporting engine (SimPy by default), which gives
the same numbers (tests/scheduler/test_engines.py).

With features on disk (Profile.disk) the host cache of hot rows is chosen too: a larger cache
never makes the simulated epoch longer (fewer misses of either route hold the disk: Route 1's
reads, those of the rows its GPU cache lacks, queue on it with Route 0's), so the planner looks, by
bisection over the candidate sizes within the memory budget, for the smallest cache whose best
plan is within CACHE_TOLERANCE of the best plan at the largest cache: RAM that buys less than
that is left to the rest of the machine. At each cache size the feature store's I/O threads are chosen as well:
every count the profile timed (its `io_curve`) is planned, and the fewest threads whose epoch is within TOLERANCE of
the fastest kept (more would hold CPU and memory for nothing). More
I/O threads read faster (a deeper queue) but may cost more CPU per read, which the batching side's cores pay
(partitioner/times.py); the batching and training threads are chosen inside each plan (CPU-only: the core split;
with a GPU every core batches, as without features on disk: training's host threads are not profiled).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from morphpipe.partitioner.cores import CoreSplit, even_core_split, split_cores
from morphpipe.partitioner.partitioner import Partitioner, Split, buffer_sizes, pinned_buffer_limit
from morphpipe.partitioner.times import PhaseTimes
from morphpipe.profiler.profile import Profile
from morphpipe.scheduler.plan import FeatureTiering, Plan, finite_or_none
from morphpipe.scheduler.result import CPU_ONLY_DEVICES, SimulationResult
from morphpipe.scheduler.scheduler import Scheduler

TOLERANCE = 0.005
BUDGET_BATCHES = 150_000
MIN_EVALUATIONS = 8
CACHE_TOLERANCE = 0.01


@dataclass(frozen=True)
class Convergence:
    """Outcome of the search: the chosen split, its simulated epoch, every split tried, the certified gap.

    `gap` bounds how much shorter an unvisited split's epoch could be, relative to the chosen
    one: chosen epoch / smallest lower bound of any unvisited split - 1 (0 when none could be shorter).
    Pruning stops within `tolerance`, so the gap is at most `tolerance` unless the budget ran out.
    """

    split: Split
    result: SimulationResult
    evaluated: dict[int, float]
    feedback_steps: int
    gap: float


def converge(partitioner: Partitioner, scheduler: Scheduler, tolerance: float = TOLERANCE,
             budget_batches: int = BUDGET_BATCHES) -> Convergence:
    """Feedback search, then branch and bound, for the split with the shortest simulated epoch (fast engine)."""
    n = partitioner.num_batches
    max_evaluations = max(MIN_EVALUATIONS, budget_batches // n)
    results: dict[int, SimulationResult] = {}

    def evaluate(n_cpu: int) -> SimulationResult:
        if n_cpu not in results:
            results[n_cpu] = scheduler.simulate(partitioner.split(n_cpu), engine="fast")
        return results[n_cpu]

    current = partitioner.initial_split()
    best = evaluate(current.n_cpu)
    largest_step = n
    steps = 0
    while len(results) < max_evaluations:
        feedback = best.feedback()
        if partitioner.is_balanced(feedback):
            break
        step = min(partitioner.step_size(feedback), largest_step)
        candidate = partitioner.adjust(current, feedback, step)
        if candidate.n_cpu == current.n_cpu:
            break
        steps += 1
        result = evaluate(candidate.n_cpu)
        if result.epoch_s < best.epoch_s:
            current, best = candidate, result
        elif step > 1:
            largest_step = step // 2
        else:
            break

    bounds = scheduler.lower_bounds()
    for n_cpu in np.argsort(bounds, kind="stable").tolist():
        if bounds[n_cpu] * (1.0 + tolerance) >= best.epoch_s or len(results) >= max_evaluations:
            break
        if n_cpu not in results and evaluate(n_cpu).epoch_s < best.epoch_s:
            best = results[n_cpu]

    anchor = partitioner.best_lower_bound().n_cpu
    chosen = min(results, key=lambda k: (results[k].epoch_s, abs(k - anchor), k))
    unvisited = [float(bounds[k]) for k in range(n + 1) if k not in results]
    gap = max(0.0, results[chosen].epoch_s / min(unvisited) - 1.0) if unvisited else 0.0
    return Convergence(partitioner.split(chosen), results[chosen],
                       {k: r.epoch_s for k, r in sorted(results.items())}, steps, gap)


def plan_from_profile(profile: Profile, gbs: int = 10, seed: int = 0, *, cpu_threads: int | None = None,
                      engine: str = "simpy", cache_bytes: int | None = None, io_threads: int | None = None) -> Plan:
    """Plans an epoch for a profile: the converged split, or a baseline if that is predicted faster. With features
    on disk, at the host cache of `cache_bytes` when given, else at the cache size `choose_cache` finds, and with
    `io_threads` I/O threads when given, else the count the profile's timed counts predict fastest."""
    disk = profile.disk
    if disk is None:
        return _plan_at(profile, gbs, seed, cpu_threads, engine, None, None)
    counts: list[int | None] = [io_threads] if io_threads is not None else [*disk.io_thread_counts()] or [None]
    best: dict[int, tuple[int | None, Plan]] = {}
    evaluations = 0

    def best_at(size: int) -> tuple[int | None, Plan]:
        """The fewest I/O threads whose planned epoch at a cache of `size` is within TOLERANCE of the shortest, and
        that plan (fast engine)."""
        nonlocal evaluations
        if size not in best:
            plans = [(count, _plan_at(profile, gbs, seed, cpu_threads, "fast", size, count)) for count in counts]
            evaluations += sum(plan.evaluations for _, plan in plans)
            fastest = min(plan.predicted_epoch_s for _, plan in plans)
            best[size] = next(item for item in plans if item[1].predicted_epoch_s <= fastest * (1.0 + TOLERANCE))
        return best[size]

    if cache_bytes is None:
        cache_bytes = choose_cache(disk.cache_candidates(), lambda size: best_at(size)[1].predicted_epoch_s)
    count = best_at(cache_bytes)[0]
    plan = _plan_at(profile, gbs, seed, cpu_threads, engine, cache_bytes, count)
    tried = {size: chosen.predicted_epoch_s for size, (_, chosen) in best.items()}
    tried[cache_bytes] = plan.predicted_epoch_s
    tiering = FeatureTiering(cache_bytes, disk.cache_budget_bytes, disk.hit_ratio(cache_bytes),
                             disk.read_s_per_batch(cache_bytes, count), dict(sorted(tried.items())), count,
                             disk.read_cpu_s_per_batch(cache_bytes, count),
                             disk.read_s_per_batch(cache_bytes, count, route=1) if profile.device == "cuda" else 0.0)
    return replace(plan, tiering=tiering, evaluations=evaluations + plan.evaluations)


def choose_cache(candidates: list[int], epoch_at, tolerance: float = CACHE_TOLERANCE) -> int:
    """The smallest of `candidates` (increasing cache sizes) whose predicted epoch `epoch_at(size)` is within
    `tolerance` of the largest's, by bisection: the epoch never grows with the cache."""
    target = epoch_at(candidates[-1]) * (1.0 + tolerance)
    low, high = 0, len(candidates) - 1  # candidates[high] meets the target
    while low < high:
        middle = (low + high) // 2
        if epoch_at(candidates[middle]) <= target:
            high = middle
        else:
            low = middle + 1
    return candidates[high]


def _plan_at(profile: Profile, gbs: int, seed: int, cpu_threads: int | None, engine: str,
             cache_bytes: int | None, io_threads: int | None) -> Plan:
    """The plan for a profile with a given host cache of feature rows (None: features in RAM) and feature store I/O
    threads (None: those it was profiled with)."""
    if profile.device == "cpu":
        return _plan_cpu_only(profile, gbs, seed, engine, cache_bytes, io_threads)
    times = PhaseTimes.from_profile(profile, cpu_threads, cache_bytes=cache_bytes, io_threads=io_threads)
    max_cbs = pinned_buffer_limit(profile.batch_bytes, profile.hardware.memory_available_bytes)
    partitioner = Partitioner(times, gbs, max_cbs)
    scheduler = Scheduler(times, seed)
    search = converge(partitioner, scheduler)
    baselines = {"all-cpu": scheduler.all_cpu(gbs, engine="fast"), "all-gpu": scheduler.all_gpu(gbs, engine="fast")}
    chosen = min([search.result, *baselines.values()], key=lambda r: (r.epoch_s, r.n_gpu))
    chosen = scheduler.simulate(Split(chosen.n_cpu, chosen.n_gpu, chosen.cbs, chosen.gbs), engine=engine)
    bound = partitioner.best_lower_bound()
    relaxed = partitioner.best_eq6()
    feedback = chosen.feedback()
    kind = "all-gpu" if chosen.n_cpu == 0 else "all-cpu" if chosen.n_gpu == 0 else "adaptive"
    notes = []
    if buffer_sizes(chosen.n_cpu, chosen.n_gpu, gbs)[0] > chosen.cbs:
        notes.append(f"cbs capped at {max_cbs} batches of {profile.batch_bytes} bytes: a quarter of the "
                     "available host memory may be pinned")
    return Plan(
        kind=kind, num_batches=times.num_batches, n_cpu=chosen.n_cpu, n_gpu=chosen.n_gpu, cbs=chosen.cbs,
        gbs=chosen.gbs, cpu_threads=times.cpu_threads, train_threads=None, predicted_epoch_s=chosen.epoch_s,
        baselines_s={name: result.epoch_s for name, result in baselines.items()},
        lower_bound_s=bound.value_s, lower_bound_n_cpu=bound.n_cpu, eq6_s=relaxed.value_s,
        eq6_x=finite_or_none(relaxed.x), eq6_cpu_fraction=relaxed.cpu_fraction, busy=chosen.busy,
        idle_s={"cpu": feedback.cpu_idle_s, "gpu": feedback.gpu_idle_s}, evaluations=len(search.evaluated),
        optimality_gap=search.gap, notes=notes, seed=seed, engine=engine,
        profile={**profile.summary(), **times.summary()},
    )


def _plan_cpu_only(profile: Profile, cbs: int, seed: int, engine: str, cache_bytes: int | None,
                   io_threads: int | None) -> Plan:
    """CPU-only planning: the core split (batching vs training threads) with the shortest simulated epoch.

    Splits (disjoint, bound n * max(T_CB(P), T_M(Q)), or taking turns on all cores, bound
    n * (T_CB + T_M)) are simulated in order of their lower bound until that bound reaches the
    best epoch found (within the tolerance) or the budget runs out. With features on disk no split
    beats the disk serving every batch's misses, n * T_disk, whatever the cores do.
    """
    max_evaluations = max(MIN_EVALUATIONS, BUDGET_BATCHES // profile.num_batches)
    results: dict[CoreSplit, SimulationResult] = {}
    gap = 0.0
    disk_s = profile.num_batches * PhaseTimes.from_profile(profile, 1, 1, cache_bytes, io_threads).disk_read_s
    for core_split in split_cores(profile):
        best = min((r.epoch_s for r in results.values()), default=float("inf"))
        bound = max(core_split.lower_bound_s, disk_s)
        if bound * (1.0 + TOLERANCE) >= best or len(results) >= max_evaluations:
            gap = max(0.0, best / bound - 1.0)
            break
        times = PhaseTimes.from_profile(profile, core_split.batch_threads, core_split.train_threads, cache_bytes,
                                        io_threads)
        results[core_split] = Scheduler(times, seed).simulate_cpu_only(cbs, core_split.shared_core, engine="fast")
    even_split = even_core_split(profile.cores)
    chosen_split = min(results, key=lambda s: (results[s].epoch_s, s.lower_bound_s))
    plans = {}
    for name, core_split in (("chosen", chosen_split), ("even-split", even_split)):
        times = PhaseTimes.from_profile(profile, core_split.batch_threads, core_split.train_threads, cache_bytes,
                                        io_threads)
        plans[name] = core_split, times, Scheduler(times, seed).simulate_cpu_only(cbs, core_split.shared_core,
                                                                                  engine=engine)
    chosen_split, times, chosen = min(plans.values(), key=lambda item: item[2].epoch_s)
    return Plan(
        kind="cpu-only", num_batches=profile.num_batches, n_cpu=profile.num_batches, n_gpu=0, cbs=cbs, gbs=0,
        cpu_threads=times.cpu_threads, train_threads=times.train_threads, predicted_epoch_s=chosen.epoch_s,
        baselines_s={"even-split": plans["even-split"][2].epoch_s},
        lower_bound_s=max(disk_s, min(s.lower_bound_s for s in results)), lower_bound_n_cpu=None, eq6_s=None,
        eq6_x=None, eq6_cpu_fraction=None, busy=chosen.busy,
        idle_s={device: chosen.idle_s(device) for device in CPU_ONLY_DEVICES},
        evaluations=len(results) + 2, optimality_gap=gap, notes=[], seed=seed, engine=engine,
        profile={**profile.summary(), **times.summary()}, shares_cores=chosen_split.shared_core,
    )
