"""Partitioner: exact LB and Eq. 6 minimisers, buffer sizes, the feedback step, CPU-only core splits."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from morphpipe.partitioner import (
    Feedback,
    Partitioner,
    PhaseTimes,
    best_eq6,
    best_lower_bound,
    buffer_sizes,
    eq6,
    lower_bound,
    pinned_buffer_limit,
    split_cores,
)
from morphpipe.profiler import Profile

phase = st.floats(min_value=0.01, max_value=10.0, allow_nan=False, allow_infinity=False)


@st.composite
def phase_times(draw: st.DrawFn, max_batches: int = 400, disk: bool = False) -> PhaseTimes:
    reads = st.one_of(st.just(0.0), phase) if disk else st.just(0.0)
    return PhaseTimes(
        num_batches=draw(st.integers(1, max_batches)), cpu_batch_s=draw(phase), cpu_threads=draw(st.integers(1, 16)),
        train_s=draw(phase), gpu_batch_s=draw(phase), dma_s=draw(phase), disk_read_s=draw(reads),
        gpu_read_s=draw(reads),
    )


def test_lower_bound_by_hand() -> None:
    times = PhaseTimes(10, cpu_batch_s=2.0, cpu_threads=1, train_s=1.0, gpu_batch_s=1.0, dma_s=0.5)
    # n_c=4: CPU 8, PCIe 4*0.5 + 6*1 = 8, GPU 6*1 + 10*1 = 16
    assert lower_bound(times, 4) == pytest.approx(16.0)
    assert lower_bound(times, 0) == pytest.approx(20.0)
    assert lower_bound(times, 10) == pytest.approx(20.0)
    # GPU line 20 - n_c meets the CPU line 2 n_c at n_c = 20/3: n_c = 6 (GPU 14) and 7 (CPU 14) tie,
    # and ties go to the split with less CPU work
    assert lower_bound(times, 6) == lower_bound(times, 7) == pytest.approx(14.0)
    assert best_lower_bound(times).n_cpu == 6
    assert best_lower_bound(times).value_s == pytest.approx(14.0)


@settings(max_examples=60, deadline=None)
@given(phase_times(disk=True))
def test_best_lower_bound_is_the_exact_integer_minimum(times: PhaseTimes) -> None:
    best = best_lower_bound(times)
    brute = min(lower_bound(times, k) for k in range(times.num_batches + 1))
    assert best.value_s == pytest.approx(brute, rel=1e-12)
    assert lower_bound(times, best.n_cpu) == pytest.approx(best.value_s, rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(phase_times(), st.lists(st.floats(min_value=0.0, max_value=1e4, allow_nan=False), min_size=1, max_size=20))
def test_best_eq6_is_its_exact_minimum_and_relaxes_lb(times: PhaseTimes, xs: list[float]) -> None:
    best = best_eq6(times)
    for x in xs:
        assert eq6(times, x) >= best.value_s * (1 - 1e-12)
    if math.isfinite(best.x):
        assert eq6(times, best.x) == pytest.approx(best.value_s, rel=1e-9)
    else:
        assert best.value_s == pytest.approx(eq6(times, math.inf))
    assert best.cpu_fraction == pytest.approx(1.0 / (1.0 + best.x) if math.isfinite(best.x) else 0.0)
    # Eq. 6 is LB's continuous relaxation: equal at integer splits, so its minimum cannot exceed LB's
    assert best.value_s <= best_lower_bound(times).value_s * (1 + 1e-12)
    n = times.num_batches
    for n_cpu in range(1, n + 1, max(1, n // 7)):
        assert eq6(times, (n - n_cpu) / n_cpu) == pytest.approx(lower_bound(times, n_cpu), rel=1e-9)


def test_eq6_by_hand() -> None:
    times = PhaseTimes(100, cpu_batch_s=3.0, cpu_threads=1, train_s=1.0, gpu_batch_s=1.0, dma_s=1.0)
    # x = 1: 100 * (0.5 + max(0.5, 1, 1)) = 150
    assert eq6(times, 1.0) == pytest.approx(150.0)
    best = best_eq6(times)
    # y = 1/(1+x): max(1, 2 - y, 3y) is least where 2 - y = 3y: y = 1/2, x = 1
    assert best.x == pytest.approx(1.0)
    assert best.value_s == pytest.approx(150.0)


def test_a_useless_cpu_gets_no_batches_but_eq6_still_offloads_a_sliver() -> None:
    times = PhaseTimes(10, cpu_batch_s=100.0, cpu_threads=1, train_s=1.0, gpu_batch_s=0.1, dma_s=50.0)
    assert best_lower_bound(times).n_cpu == 0  # one CPU batch (100 s) costs more than the GPU's 11 s
    assert eq6(times, math.inf) == pytest.approx(11.0)
    # the relaxation gives the CPU a fraction y where 1.1 - 0.1y (GPU) = 100y (CPU): C' = n*100y < 11
    best = best_eq6(times)
    assert best.cpu_fraction == pytest.approx(1.1 / 100.1)
    assert best.value_s == pytest.approx(10 * 100 * 1.1 / 100.1)


@pytest.mark.parametrize("n_cpu, n_gpu, gbs, expected", [
    (0, 100, 10, (0, 10)),
    (50, 50, 10, (10, 10)),
    (75, 25, 10, (30, 10)),
    (1, 99, 10, (1, 10)),
    (3, 97, 10, (1, 10)),
    (100, 0, 10, (10, 0)),  # all-CPU: no Route 1 batch ever enters the GPU buffer
    (4, 0, 10, (4, 0)),
    (90, 10, 4, (36, 4)),
])
def test_buffer_sizes_follow_the_split(n_cpu: int, n_gpu: int, gbs: int, expected: tuple[int, int]) -> None:
    assert buffer_sizes(n_cpu, n_gpu, gbs) == expected


def test_buffer_sizes_respect_the_pinned_memory_cap() -> None:
    assert buffer_sizes(990, 10, 10, max_cbs=64) == (64, 10)
    assert pinned_buffer_limit(100 << 20, 16 << 30) == 40
    assert pinned_buffer_limit(0, 16 << 30) is None
    with pytest.raises(ValueError, match="gbs"):
        buffer_sizes(1, 1, 0)


def test_feedback_moves_batches_towards_the_idle_side() -> None:
    times = PhaseTimes(100, cpu_batch_s=1.0, cpu_threads=4, train_s=0.5, gpu_batch_s=0.5, dma_s=0.2)
    partitioner = Partitioner(times, gbs=10)
    split = partitioner.split(40)
    cpu_idle = Feedback(cpu_idle_s=9.0, gpu_idle_s=0.0, cpu_idle_blocks=3, gpu_idle_blocks=0)
    gpu_idle = Feedback(cpu_idle_s=0.5, gpu_idle_s=4.0, cpu_idle_blocks=1, gpu_idle_blocks=5)
    assert cpu_idle.direction == 1 and gpu_idle.direction == -1
    assert partitioner.adjust(split, cpu_idle).n_cpu == 41
    assert partitioner.adjust(split, gpu_idle).n_cpu == 39
    assert partitioner.step_size(cpu_idle) == 6  # 9 s of idle CPU / (T_GB + T_CB) per moved batch
    assert not partitioner.is_balanced(cpu_idle)
    assert partitioner.is_balanced(Feedback(1.0, 0.7, 2, 2))  # mismatch 0.3 s < one GPU batching time
    assert partitioner.adjust(partitioner.split(100), cpu_idle, step=5).n_cpu == 100
    assert partitioner.adjust(partitioner.split(0), gpu_idle, step=5).n_cpu == 0


def test_initial_split_is_the_lower_bound_optimum_with_sized_buffers() -> None:
    times = PhaseTimes(10, cpu_batch_s=2.0, cpu_threads=1, train_s=1.0, gpu_batch_s=1.0, dma_s=0.5)
    split = Partitioner(times, gbs=3).initial_split()
    assert (split.n_cpu, split.n_gpu, split.gbs) == (6, 4, 3)
    assert split.cbs == 5  # 3 * 6/4 = 4.5, rounded half up
    assert split.cpu_share == pytest.approx(0.6)


def test_cpu_only_core_split_minimises_the_bound() -> None:
    profile = Profile.synthetic(t_cb=0.8, t_m=0.2, cores=8, num_batches=100)
    splits = split_cores(profile)
    disjoint = [s for s in splits if not s.shared_core]
    shared = [s for s in splits if s.shared_core]
    assert {s.batch_threads + s.train_threads for s in disjoint} == {8}
    assert [(s.batch_threads, s.train_threads) for s in shared] == [(8, 8)]
    best = disjoint[0]
    # batching is 4x slower per thread than training: 6 batching threads (0.133 s) vs 2 training (0.1 s)
    assert (best.batch_threads, best.train_threads) == (6, 2)
    assert best.lower_bound_s == pytest.approx(100 * 0.8 / 6)
    assert all(s.lower_bound_s >= best.lower_bound_s for s in disjoint)
    # with perfectly scaling phases, taking turns on all 8 cores is bounded by 100 * (0.8 + 0.2) / 8
    assert splits[0] == shared[0] and shared[0].lower_bound_s == pytest.approx(100 * 1.0 / 8)
    single = split_cores(profile, cores=1)
    assert len(single) == 1 and single[0].shared_core
    assert single[0].lower_bound_s == pytest.approx(100 * (0.8 + 0.2))


def test_taking_turns_loses_when_training_does_not_scale() -> None:
    profile = Profile.synthetic(t_cb=0.8, t_m=0.2, cores=8, num_batches=100, training_efficiency=0.0)
    best = split_cores(profile)[0]
    assert not best.shared_core and best.lower_bound_s == pytest.approx(100 * 0.2)
    shared = next(s for s in split_cores(profile) if s.shared_core)
    assert shared.lower_bound_s == pytest.approx(100 * (0.8 / 8 + 0.2))


def test_partitioner_refuses_cpu_only_times() -> None:
    times = PhaseTimes(10, cpu_batch_s=1.0, cpu_threads=2, train_s=1.0, train_threads=2, device="cpu")
    with pytest.raises(ValueError, match="split_cores"):
        Partitioner(times)
