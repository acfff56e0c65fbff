"""Re-planning between epochs, on the real Executor over virtual devices whose phase times change mid-run.

The phases sleep for durations drawn from the *true* phase times of each epoch; the re-planner
only sees the executor's trace. A scenario is only meaningful when the plan made for the old
times is clearly worse under the new ones, so each test first checks that with the simulator.
"""
from __future__ import annotations

import pytest

from morphpipe.executor.executor import EpochResult
from morphpipe.executor.replan import Replanner, measure_phases, rescaled_profile, same_schedule
from morphpipe.executor.virtual import virtual_executor
from morphpipe.partitioner import PhaseTimes
from morphpipe.profiler import Profile
from morphpipe.scheduler import Plan, plan_from_profile
from morphpipe.scheduler.durations import Durations
from morphpipe.scheduler.simulate_plan import simulate_plan

CV = 0.1
BATCHES = 40
# A GPU machine: CPU batching 25 ms per batch per thread (2 threads), UVA 10 ms, DMA 4 ms, training 9 ms.
BEFORE = dict(t_cb=0.050, t_gb=0.010, t_dma=0.004, t_m=0.009)


def profile_of(t_cb: float, t_gb: float, t_dma: float, t_m: float, cv: float = CV) -> Profile:
    return Profile.synthetic(t_cb=t_cb, t_gb=t_gb, t_dma=t_dma, t_m=t_m, cores=2, num_batches=BATCHES, cv=cv)


def run_epoch(truth: Profile, plan: Plan, epoch: int) -> EpochResult:
    """One epoch of `plan` on virtual devices whose phases take `truth`'s times."""
    times = PhaseTimes.from_profile(truth, plan.cpu_threads, plan.train_threads)
    executor, _ = virtual_executor(times, plan.split, Durations.draw(times, 100 + epoch))
    try:
        return executor.run_epoch(epoch)
    finally:
        executor.close_batchers()


def train(truths: list[Profile], replan: bool, threshold: float = 0.05) -> tuple[list[EpochResult], list[Plan]]:
    """Epochs under the plan made from the first epoch's profile, re-planned after each epoch when `replan`."""
    plan = plan_from_profile(truths[0], engine="fast")
    replanner = Replanner(truths[0], threshold=threshold)
    results, plans = [], []
    for epoch, truth in enumerate(truths):
        plans.append(plan)
        results.append(run_epoch(truth, plan, epoch))
        if replan:
            decision = replanner.observe(results[-1], plan)
            if decision.switched:
                plan = decision.candidate
    return results, plans


@pytest.mark.parametrize("change", ["co-tenant slows CPU batching 3x", "GPU slows 2x"])
def test_replanning_follows_a_change_within_two_epochs_and_static_plans_do_not(change: str) -> None:
    before = profile_of(**BEFORE)
    if change.startswith("co-tenant"):
        after = profile_of(**{**BEFORE, "t_cb": 3 * BEFORE["t_cb"]})
    else:
        after = profile_of(**{**BEFORE, "t_gb": 2 * BEFORE["t_gb"], "t_m": 2 * BEFORE["t_m"]})
    old_plan = plan_from_profile(before, engine="fast")
    best_new = plan_from_profile(after, engine="fast")
    stale_s = simulate_plan(after, old_plan, engine="fast").epoch_s
    assert stale_s > 1.15 * best_new.predicted_epoch_s, "scenario: the old plan must be clearly worse after the change"

    truths = [before, after, after, after, after]
    adaptive, adaptive_plans = train(truths, replan=True)
    static, static_plans = train(truths, replan=False)
    # the best static plan for the new times, measured the same way (late wake-ups on a loaded machine
    # lengthen every virtual epoch alike, so measured epochs are compared with measured epochs)
    best_s = min(run_epoch(after, best_new, 10 + k).epoch_s for k in range(2))

    assert same_schedule(adaptive_plans[1], old_plan), "the change is only seen after an epoch under it"
    changed_at = next(e for e, plan in enumerate(adaptive_plans) if not same_schedule(plan, old_plan))
    assert changed_at <= 3, "the plan changes within 2 epochs of the change"
    for result in adaptive[changed_at:]:
        assert result.epoch_s <= 1.10 * best_s
    assert all(same_schedule(plan, old_plan) for plan in static_plans)
    for result in static[1:]:
        assert result.epoch_s > 1.10 * best_s


def test_a_change_that_recovers_is_followed_back() -> None:
    before = profile_of(**BEFORE)
    slow = profile_of(**{**BEFORE, "t_cb": 3 * BEFORE["t_cb"]})
    # the co-tenant is there in epochs 1-3 and gone from epoch 4
    _, plans = train([before, slow, slow, slow, before, before, before, before], replan=True)
    assert any(not same_schedule(plan, plans[0]) for plan in plans[2:4]), "re-planned for the co-tenant"
    best_s = plan_from_profile(before, engine="fast").predicted_epoch_s
    assert simulate_plan(before, plans[3], engine="fast").epoch_s > 1.10 * best_s, "its plan is wrong without it"
    assert simulate_plan(before, plans[-1], engine="fast").epoch_s <= 1.10 * best_s, "and is re-planned back"


def test_noise_of_the_profiled_size_does_not_flip_the_plan() -> None:
    truth = profile_of(**BEFORE, cv=0.15)
    _, plans = train([truth] * 6, replan=True)
    assert all(same_schedule(plan, plans[0]) for plan in plans)


def test_measured_phases_recover_the_true_phase_times() -> None:
    truth = profile_of(t_cb=0.040, t_gb=0.012, t_dma=0.005, t_m=0.008, cv=0.0)
    plan = plan_from_profile(truth, engine="fast")
    assert plan.n_cpu and plan.n_gpu, "the scenario exercises both routes"
    measured = measure_phases(run_epoch(truth, plan, 0), plan)
    times = PhaseTimes.from_profile(truth, plan.cpu_threads)
    # sleeping phases only overshoot, by the thread wake-up latency: ~0.1 ms on a quiet machine, up to
    # ~1 ms on a loaded one (per batch; the batching time is one thread's over two threads)
    for timing, truth in ((measured.cpu_batch, times.cpu_batch_s), (measured.gpu_batch, 0.012),
                          (measured.dma, 0.005), (measured.train, 0.008)):
        assert truth * 0.99 <= timing.mean_s <= truth + 0.002
    assert measured.cpu_batch.samples == plan.n_cpu and measured.gpu_batch.samples == plan.n_gpu


def test_rescaled_profile_scales_every_phase_and_keeps_thread_scaling() -> None:
    profile = Profile.synthetic(t_cb=0.04, t_gb=0.01, t_dma=0.004, t_m=0.008, cores=4, cpu_efficiency=0.5,
                                num_batches=10)
    scaled = rescaled_profile(profile, {"cpu_batch": 2.0, "gpu_batch": 3.0, "dma": 1.5, "train": 0.5})
    for threads in (1, 2, 4):
        assert scaled.cpu_batch_time(threads) == pytest.approx(2.0 * profile.cpu_batch_time(threads))
    assert scaled.gpu_batching.mean_s == pytest.approx(0.03)
    assert scaled.dma.mean_s == pytest.approx(0.006)
    assert scaled.training.mean_s == pytest.approx(0.004)
    assert scaled.gpu_batching.cv == profile.gpu_batching.cv


def test_replanner_rejects_meaningless_settings() -> None:
    with pytest.raises(ValueError, match="smoothing"):
        Replanner(profile_of(**BEFORE), smoothing=0.0)
    with pytest.raises(ValueError, match="shift"):
        Replanner(profile_of(**BEFORE), shift=0.0)
    with pytest.raises(ValueError, match="threshold"):
        Replanner(profile_of(**BEFORE), threshold=1.5)
    with pytest.raises(ValueError, match="reprofile_gain"):
        Replanner(profile_of(**BEFORE), reprofile_gain=0.0)


def busy_and_quiet_profiles() -> tuple[Profile, Profile]:
    """A CPU machine profiled while a co-tenant held a core (a second thread looked useless, every phase slow),
    and the same machine quiet (batching and training both scale to 2 threads)."""
    busy = Profile.synthetic(t_cb=0.010, t_m=0.080, cores=2, device="cpu", cpu_efficiency=0.0, training_efficiency=0.0,
                             num_batches=BATCHES, cv=CV)
    quiet = Profile.synthetic(t_cb=0.005, t_m=0.040, cores=2, device="cpu", cpu_efficiency=0.9, training_efficiency=0.9,
                              num_batches=BATCHES, cv=CV)
    return busy.replaced(contention={"busy": True}), quiet


@pytest.mark.parametrize("reprofile", [True, False])
def test_a_profile_from_a_busy_machine_is_taken_again_once_the_machine_is_quiet(reprofile: bool) -> None:
    busy, quiet = busy_and_quiet_profiles()
    calls = []

    def profile_again() -> Profile:
        calls.append(1)
        return quiet

    plan = plan_from_profile(busy, engine="fast")
    replanner = Replanner(busy, reprofile=profile_again if reprofile else None)
    plans = []
    for epoch in range(4):
        plans.append(plan)
        decision = replanner.observe(run_epoch(quiet, plan, epoch), plan)
        if decision.switched:
            plan = decision.candidate
    best = plan_from_profile(quiet, engine="fast")
    if reprofile:
        assert calls == [1]  # once, after the first quiet epoch, never again
        assert replanner.decisions[0].reprofiled and "busy machine" in replanner.decisions[0].reason
        assert replanner.profile is quiet
        assert same_schedule(plans[1], best)
        assert run_epoch(quiet, plans[-1], 9).epoch_s < 1.1 * best.predicted_epoch_s
    else:
        assert not any(decision.reprofiled for decision in replanner.decisions)
        assert not same_schedule(plans[-1], best)


def test_a_quiet_profile_is_never_taken_again() -> None:
    _, quiet = busy_and_quiet_profiles()
    slow = Profile.synthetic(t_cb=0.020, t_m=0.160, cores=2, device="cpu", cpu_efficiency=0.9, training_efficiency=0.9,
                             num_batches=BATCHES, cv=CV)  # profiled quiet, then it ran 4x faster: no re-profile
    replanner = Replanner(slow, reprofile=lambda: pytest.fail("a profile from a quiet machine was taken again"))
    plan = plan_from_profile(slow, engine="fast")
    assert not replanner.observe(run_epoch(quiet, plan, 0), plan).reprofiled


def observe_ratios(replanner: Replanner, plan: Plan, ratios: list[float], monkeypatch) -> list[float]:
    """Feeds epochs whose CPU batching took `ratios` times what the profile predicts; the estimate after each."""
    from types import SimpleNamespace

    from morphpipe.executor import replan
    from morphpipe.profiler.profile import PhaseTiming

    predicted = replan.predicted_phases(replanner.profile, plan)["cpu_batch"]
    factors = []
    for epoch, ratio in enumerate(ratios):
        measured = replan.MeasuredPhases(cpu_batch=PhaseTiming.from_samples([ratio * predicted]))
        monkeypatch.setattr(replan, "measure_phases", lambda result, plan, measured=measured: measured)
        replanner.observe(SimpleNamespace(epoch=epoch), plan)
        factors.append(replanner.factors["cpu_batch"])
    return factors


def test_the_estimate_smooths_small_changes_and_jumps_on_a_level_shift(monkeypatch) -> None:
    """By the definition: a ratio within `shift` of the estimate moves it by `smoothing` of the difference; one
    further away replaces it, and later small changes are measured from the new level."""
    profile = profile_of(**BEFORE)
    plan = plan_from_profile(profile, engine="fast")
    replanner = Replanner(profile, smoothing=0.2, shift=0.25)
    factors = observe_ratios(replanner, plan, [1.1, 2.0, 2.2, 2.2], monkeypatch)
    assert factors == pytest.approx([1.02, 2.0, 2.04, 2.072])


def test_a_busy_profile_is_taken_again_when_a_phase_ran_faster_by_more_than_the_gain(monkeypatch) -> None:
    busy, quiet = busy_and_quiet_profiles()
    plan = plan_from_profile(busy, engine="fast")
    calls = []
    slightly = Replanner(busy, reprofile=lambda: calls.append("slightly") or quiet, reprofile_gain=0.15)
    observe_ratios(slightly, plan, [0.9, 0.9, 0.9], monkeypatch)  # the estimate nears 0.9: within the gain
    clearly = Replanner(busy, reprofile=lambda: calls.append("clearly") or quiet, reprofile_gain=0.15)
    observe_ratios(clearly, plan, [0.7], monkeypatch)  # a level shift to 0.7: the co-tenant has gone
    assert calls == ["clearly"] and clearly.decisions[0].reprofiled and not slightly.decisions[0].reprofiled


def test_batching_time_per_batch_divides_by_the_threads_only_when_they_run_side_by_side() -> None:
    """Records of 40 ms builds: with 2 batching threads beside training, a batch is delivered every 20 ms; when
    batching and training take turns on the cores, each build is the delivered time."""
    import dataclasses
    from types import SimpleNamespace

    profile = Profile.synthetic(t_cb=0.04, t_m=0.08, cores=2, device="cpu", num_batches=4)
    plan = plan_from_profile(profile, engine="fast")
    records = [SimpleNamespace(phase="batch", device="cpu", start=k, end=k + 0.04) for k in range(4)]
    result = SimpleNamespace(trace=records, build_s=[])
    side_by_side = dataclasses.replace(plan, cpu_threads=2, shares_cores=False)
    taking_turns = dataclasses.replace(plan, cpu_threads=2, shares_cores=True)
    assert measure_phases(result, side_by_side).cpu_batch.mean_s == pytest.approx(0.02)
    assert measure_phases(result, taking_turns).cpu_batch.mean_s == pytest.approx(0.04)


def test_uva_transfer_scales_with_gpu_batching_and_schedules_differ_in_any_field() -> None:
    import dataclasses

    profile = profile_of(**BEFORE).replaced(uva_transfer_s=0.002)  # the transfer part of a UVA batch
    scaled = rescaled_profile(profile, {"gpu_batch": 3.0, "train": 0.5})
    assert scaled.uva_transfer_s == pytest.approx(3.0 * profile.uva_transfer_s)
    plan = plan_from_profile(profile, engine="fast")
    assert same_schedule(plan, dataclasses.replace(plan))
    for change in ({"cbs": plan.cbs + 1}, {"gbs": plan.gbs + 1}, {"n_cpu": plan.n_cpu + 1, "n_gpu": plan.n_gpu - 1},
                   {"cpu_threads": plan.cpu_threads + 1}, {"shares_cores": not plan.shares_cores}):
        assert not same_schedule(plan, dataclasses.replace(plan, **change)), change
