"""Invariants of every simulated epoch, on random profiles and splits (hypothesis)."""
from __future__ import annotations

from collections import Counter, defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st

from morphpipe.partitioner import Partitioner, PhaseTimes, lower_bound
from morphpipe.scheduler import Scheduler, SimulationResult

EPS = 1e-9
phase = st.floats(min_value=0.05, max_value=5.0, allow_nan=False, allow_infinity=False)


@st.composite
def configurations(draw: st.DrawFn) -> tuple[PhaseTimes, int, int, int]:
    cv = draw(st.sampled_from([0.0, 0.0, 0.2, 0.8]))
    n = draw(st.integers(1, 60))
    times = PhaseTimes(n, draw(phase), draw(st.integers(1, 8)), draw(phase), draw(phase), draw(phase), cv, cv, cv, cv)
    return times, draw(st.integers(0, n)), draw(st.integers(1, 6)), draw(st.integers(0, 2**16))


def check_invariants(times: PhaseTimes, result: SimulationResult) -> None:
    n = times.num_batches
    trace = result.trace
    trained = Counter(r.batch for r in trace if r.phase == "train")
    assert trained == Counter(range(n)), "every batch is trained exactly once"
    assert result.trained == n
    assert result.max_cpu_buffer <= max(1, result.cbs), "CPU buffer over capacity"
    assert result.max_gpu_buffer <= result.gbs, "GPU buffer over capacity"
    lanes = defaultdict(list)
    for record in trace:
        assert record.end >= record.start
        lanes[(record.device, record.lane)].append((record.start, record.end))
    for spans in lanes.values():
        spans.sort()
        assert all(b[0] >= a[1] - EPS for a, b in zip(spans, spans[1:])), "a device did two phases at once"
    uva_gpu = {(r.batch, r.start, r.end) for r in trace if r.phase == "uva" and r.device == "gpu"}
    uva_pcie = {(r.batch, r.start, r.end) for r in trace if r.phase == "uva" and r.device == "pcie"}
    assert uva_gpu == uva_pcie and len(uva_gpu) == result.n_gpu, "UVA batching holds GPU and PCIe together"
    done = {}
    for record in trace:
        if record.phase in ("batch", "uva", "dma"):
            done[(record.batch, record.phase)] = record.end
    for record in trace:
        if record.phase == "dma":
            assert record.start >= done[(record.batch, "batch")] - EPS, "DMA before the batch was made"
        if record.phase == "train":
            ready = done[(record.batch, "dma")] if record.route == 0 else done[(record.batch, "uva")]
            assert record.start >= ready - EPS, "training before the batch reached the GPU"
    assert result.epoch_s == max(r.end for r in trace if r.phase == "train")
    assert all(0.0 <= value <= 1.0 + EPS for value in result.busy.values())
    assert all(block.end > block.start and 0 < block.weight <= 1 for block in result.blocks)


@settings(max_examples=60, deadline=None)
@given(configurations())
def test_simulated_epochs_respect_the_model(configuration) -> None:
    times, n_cpu, gbs, seed = configuration
    scheduler = Scheduler(times, seed)
    split = Partitioner(times, gbs).split(n_cpu)
    result = scheduler.simulate(split, trace=True)
    check_invariants(times, result)
    realised_bound = scheduler.lower_bounds()[n_cpu]
    assert result.epoch_s >= realised_bound * (1 - EPS), "no schedule beats the lower bound of its own durations"
    if times.cpu_batch_cv == 0.0:
        assert result.epoch_s >= lower_bound(times, n_cpu) * (1 - EPS)


@settings(max_examples=25, deadline=None)
@given(configurations())
def test_baselines_respect_the_model(configuration) -> None:
    times, _, gbs, seed = configuration
    scheduler = Scheduler(times, seed)
    for result in (scheduler.all_cpu(gbs, trace=True), scheduler.all_gpu(gbs, trace=True)):
        check_invariants(times, result)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 40), st.integers(1, 6), st.integers(1, 6), phase, phase, st.sampled_from([0.0, 0.3]),
       st.integers(1, 5))
def test_cpu_only_epochs_respect_the_model(n, batch_threads, train_threads, t_cb, t_m, cv, cbs) -> None:
    times = PhaseTimes(n, t_cb, batch_threads, t_m, cpu_batch_cv=cv, train_cv=cv, train_threads=train_threads,
                       device="cpu")
    result = Scheduler(times, seed=n).simulate_cpu_only(cbs, trace=True)
    assert Counter(r.batch for r in result.trace if r.phase == "train") == Counter(range(n))
    assert result.max_cpu_buffer <= cbs
    trainings = sorted((r.start, r.end) for r in result.trace if r.phase == "train")
    assert all(b[0] >= a[1] - EPS for a, b in zip(trainings, trainings[1:]))
    assert all(0.0 <= value <= 1.0 + EPS for value in result.busy.values())
    if cv == 0.0:
        assert result.epoch_s >= n * max(t_cb, t_m) * (1 - EPS)
