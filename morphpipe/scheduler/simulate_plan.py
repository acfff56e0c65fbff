"""Re-simulating a saved Plan on its Profile (same seed and thread counts), e.g. to draw it."""
from __future__ import annotations

from pathlib import Path

from morphpipe.profiler.profile import Profile
from morphpipe.scheduler.plan import Plan
from morphpipe.scheduler.plots import plot_gantt
from morphpipe.scheduler.result import SimulationResult
from morphpipe.scheduler.scheduler import Scheduler


def simulate_plan(profile: Profile, plan: Plan, *, engine: str = "simpy", trace: bool = False) -> SimulationResult:
    """One simulated epoch of `plan` on `profile`, with the plan's seed, threads, buffers and feature cache."""
    if plan.num_batches != profile.num_batches:
        raise ValueError(
            f"the plan is for {plan.num_batches} batches per epoch, the profile has {profile.num_batches}; "
            "re-plan with this profile"
        )
    cache_bytes, io_threads = (plan.tiering.cache_bytes, plan.tiering.io_threads) if plan.tiering else (None, None)
    scheduler = Scheduler.from_profile(profile, plan.seed, plan.cpu_threads, plan.train_threads, cache_bytes,
                                       io_threads)
    if plan.kind == "cpu-only":
        return scheduler.simulate_cpu_only(plan.cbs, plan.shares_cores, engine=engine, trace=trace)
    return scheduler.simulate(plan.split, engine=engine, trace=trace)


def draw_plan(profile: Profile, plan: Plan, path: str | Path, *, batches: int = 60) -> Path:
    """A Gantt chart PNG of the plan's first `batches` batches' worth of time."""
    result = simulate_plan(profile, plan, trace=True)
    until = result.epoch_s * min(1.0, batches / plan.num_batches)
    return plot_gantt(result, path, until=until)
