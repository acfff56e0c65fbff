"""The SimPy model and its fast twin give the same epochs, busy fractions, blocks and traces."""
from __future__ import annotations

import dataclasses
import random

import pytest

from morphpipe.partitioner import Partitioner, PhaseTimes
from morphpipe.scheduler import Scheduler, SimulationResult


def comparable(result: SimulationResult) -> tuple:
    trace = sorted((r.batch, r.route, r.phase, r.device, r.lane, r.start, r.end) for r in result.trace)
    blocks = [(b.start, b.end, b.idle, b.weight) for b in result.blocks]
    return result.epoch_s, result.busy, blocks, trace, result.trained


def random_configurations(count: int, seed: int) -> list[tuple[PhaseTimes, int, int]]:
    rng = random.Random(seed)
    configurations = []
    for _ in range(count):
        n = rng.randint(1, 120)
        cv = rng.choice([0.0, 0.0, 0.25, 1.0])
        if rng.random() < 0.5:  # round numbers make ties between events common
            values = [rng.choice([0.5, 1.0, 2.0, 3.0]) for _ in range(4)]
        else:
            values = [rng.uniform(0.05, 3.0) for _ in range(4)]
        times = PhaseTimes(n, values[0], rng.randint(1, 12), values[3], values[1], values[2], cv, cv, cv, cv)
        configurations.append((times, rng.randint(0, n), rng.randint(1, 10)))
    return configurations


@pytest.mark.parametrize("times, n_cpu, gbs", random_configurations(150, seed=11))
def test_fast_engine_matches_simpy(times: PhaseTimes, n_cpu: int, gbs: int) -> None:
    scheduler = Scheduler(times, seed=n_cpu)
    split = Partitioner(times, gbs).split(n_cpu)
    reference = scheduler.simulate(split, engine="simpy", trace=True)
    fast = scheduler.simulate(split, engine="fast", trace=True)
    assert reference.engine == "simpy" and fast.engine == "fast"
    assert comparable(fast) == comparable(reference)


@pytest.mark.parametrize("seed", range(20))
def test_fast_cpu_only_engine_matches_simpy(seed: int) -> None:
    rng = random.Random(seed)
    shared = seed % 5 == 0 or seed % 7 == 0  # shared cores: turns of `threads` batches built at once
    threads = rng.randint(1, 8)
    times = PhaseTimes(rng.randint(1, 80), rng.choice([0.5, rng.uniform(0.1, 2)]), threads,
                       rng.choice([0.5, rng.uniform(0.1, 2)]), cpu_batch_cv=rng.choice([0.0, 0.3]),
                       train_cv=rng.choice([0.0, 0.3]), train_threads=rng.randint(1, 8), device="cpu")
    scheduler = Scheduler(times, seed)
    cbs = rng.randint(1, 6)
    reference = scheduler.simulate_cpu_only(cbs, shared, engine="simpy", trace=True)
    fast = scheduler.simulate_cpu_only(cbs, shared, engine="fast", trace=True)
    assert comparable(fast) == comparable(reference)


@pytest.mark.parametrize("times, n_cpu, gbs", random_configurations(40, seed=23))
def test_fast_engine_matches_simpy_with_the_disk(times: PhaseTimes, n_cpu: int, gbs: int) -> None:
    """Features on disk: Route-0 batches queue for the disk before they are built, in both engines alike."""
    times = dataclasses.replace(times, disk_read_s=random.Random(n_cpu).choice([0.25, 1.0, times.cpu_batch_s]))
    scheduler = Scheduler(times, seed=n_cpu)
    split = Partitioner(times, gbs).split(n_cpu)
    reference = scheduler.simulate(split, engine="simpy", trace=True)
    assert comparable(scheduler.simulate(split, engine="fast", trace=True)) == comparable(reference)
    if n_cpu:
        assert reference.busy["disk"] > 0


@pytest.mark.parametrize("times, n_cpu, gbs", random_configurations(40, seed=29))
def test_fast_engine_matches_simpy_with_both_routes_on_the_disk(times: PhaseTimes, n_cpu: int, gbs: int) -> None:
    """Route-1 batches read their misses on the same disk queue as Route 0's, before UVA batching; round durations
    make a thread's claim and the executor's read ask for the disk at the same instant (the claim goes first)."""
    rng = random.Random(n_cpu)
    times = dataclasses.replace(times, disk_read_s=rng.choice([0.0, 0.5, 1.0, times.cpu_batch_s]),
                                gpu_read_s=rng.choice([0.25, 0.5, 1.0, rng.uniform(0.05, 2.0)]))
    scheduler = Scheduler(times, seed=n_cpu)
    split = Partitioner(times, gbs).split(n_cpu)
    reference = scheduler.simulate(split, engine="simpy", trace=True)
    assert comparable(scheduler.simulate(split, engine="fast", trace=True)) == comparable(reference)
    reads = [r for r in reference.trace if r.phase == "read"]
    assert sum(r.route == 1 for r in reads) == split.n_gpu
    assert sum(r.route == 0 for r in reads) == (split.n_cpu if times.disk_read_s else 0)
    for record in reads:  # one read at a time; a GPU batch's UVA batching starts after its read
        assert not any(o is not record and o.start < record.end and record.start < o.end for o in reads)
    uva = {r.batch: r for r in reference.trace if r.phase == "uva" and r.device == "gpu"}
    assert all(uva[r.batch].start >= r.end for r in reads if r.route == 1)


@pytest.mark.parametrize("seed", range(8))
def test_fast_cpu_only_engine_matches_simpy_with_the_disk(seed: int) -> None:
    rng = random.Random(seed)
    shared = seed % 4 == 0 or seed == 5
    times = PhaseTimes(rng.randint(1, 60), rng.uniform(0.1, 2), rng.randint(1, 8),
                       rng.uniform(0.1, 2), cpu_batch_cv=rng.choice([0.0, 0.3]), train_threads=rng.randint(1, 8),
                       device="cpu", disk_read_s=rng.choice([0.5, rng.uniform(0.01, 1)]))
    scheduler = Scheduler(times, seed)
    cbs = rng.randint(1, 6)
    reference = scheduler.simulate_cpu_only(cbs, shared, engine="simpy", trace=True)
    assert comparable(scheduler.simulate_cpu_only(cbs, shared, engine="fast", trace=True)) == comparable(reference)
