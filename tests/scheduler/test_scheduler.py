"""Scheduler: hand-computed epochs of the baselines, the dual-buffer states, plans, charts and the CLI."""
from __future__ import annotations

import json

import pytest

from morphpipe.commands.cli import main
from morphpipe.partitioner import Partitioner, PhaseTimes, Split
from morphpipe.profiler import Profile
from morphpipe.scheduler import PLAN_SCHEMA_VERSION, Plan, Scheduler, draw_plan, plan_from_profile, simulate_plan
from morphpipe.commands.simulate import parse_cores
from morphpipe.scheduler.plots import plot_cores_sweep, plot_gantt
from morphpipe.scheduler.whatif import sweep, what_if

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def times(n: int = 50, *, t_cb: float, threads: int = 1, t_gb: float = 0.5, t_dma: float, t_m: float,
          cv: float = 0.0) -> PhaseTimes:
    return PhaseTimes(n, t_cb, threads, t_m, t_gb, t_dma, cv, cv, cv, cv)


@pytest.mark.parametrize("gbs", [1, 3, 10])
@pytest.mark.parametrize("threads", [1, 4])
def test_all_gpu_is_uva_then_training_with_no_overlap(gbs: int, threads: int) -> None:
    config = times(t_cb=0.3, threads=threads, t_gb=0.7, t_dma=0.2, t_m=0.4)
    result = Scheduler(config).all_gpu(gbs, trace=True)
    assert result.epoch_s == pytest.approx(50 * (0.7 + 0.4))
    assert result.busy["gpu"] == pytest.approx(1.0)
    assert result.busy["cpu"] == 0.0
    gpu = sorted((r.start, r.end) for r in result.trace if r.device == "gpu")
    assert all(later[0] >= earlier[1] - 1e-12 for earlier, later in zip(gpu, gpu[1:]))


@pytest.mark.parametrize("t_cb, threads, t_dma, t_m, expected", [
    (1.0, 1, 0.3, 0.4, 1.0 * 50 + 0.3 + 0.4),  # CPU-bound: last batch made at 50 s, then DMA and training
    (0.2, 2, 0.3, 1.0, 0.4 + 0.3 + 50 * 1.0),  # training-bound: first batch after one latency (2 x 0.2) + DMA
    (0.2, 1, 1.0, 0.5, 0.2 + 50 * 1.0 + 0.5),  # DMA-bound
])
def test_all_cpu_pipeline_runs_at_its_slowest_stage_plus_fill(t_cb, threads, t_dma, t_m, expected) -> None:
    result = Scheduler(times(t_cb=t_cb, threads=threads, t_dma=t_dma, t_m=t_m)).all_cpu()
    assert result.epoch_s == pytest.approx(expected)


@pytest.mark.parametrize("threads", [1, 3, 8])
def test_all_cpu_pipeline_is_bounded_by_its_slowest_stage_and_fill(threads: int) -> None:
    for t_cb, t_dma, t_m in [(0.25, 0.3, 0.4), (0.5, 0.1, 0.2), (0.1, 0.45, 0.3)]:
        config = times(t_cb=t_cb, threads=threads, t_dma=t_dma, t_m=t_m)
        epoch = Scheduler(config).all_cpu().epoch_s
        slowest = 50 * max(t_cb, t_dma, t_m)
        fill = config.cpu_batch_latency_s + t_dma + t_m
        assert slowest <= epoch <= slowest + fill + 1e-9


def test_when_training_dominates_the_naive_pipeline_is_optimal() -> None:
    # T_M dominates T_CB and T_DMA; UVA batching (2 s) costs more than the pipeline's fill (0.9 s)
    config = times(40, t_cb=0.5, threads=1, t_gb=2.0, t_dma=0.4, t_m=1.0)
    scheduler = Scheduler(config)
    partitioner = Partitioner(config)
    epochs = {n_cpu: scheduler.simulate(partitioner.split(n_cpu)).epoch_s for n_cpu in range(41)}
    assert min(epochs, key=epochs.get) == 40
    assert epochs[40] == pytest.approx(0.5 + 0.4 + 40 * 1.0)
    profile = Profile.synthetic(t_cb=0.5, t_gb=2.0, t_dma=0.4, t_m=1.0, num_batches=40, cores=1)
    plan = plan_from_profile(profile)
    assert plan.kind == "all-cpu" and plan.n_cpu == 40
    assert plan.predicted_epoch_s == pytest.approx(epochs[40])


def test_hybrid_beats_both_baselines_when_both_sides_can_work() -> None:
    config = times(100, t_cb=1.0, threads=1, t_gb=0.5, t_dma=0.3, t_m=0.4)
    scheduler = Scheduler(config)
    split = Partitioner(config).initial_split()
    hybrid = scheduler.simulate(split)
    assert hybrid.epoch_s < min(scheduler.all_cpu().epoch_s, scheduler.all_gpu().epoch_s)
    assert hybrid.epoch_s == pytest.approx(Partitioner(config).lower_bound(split.n_cpu), rel=0.02)


def test_blocks_record_which_side_idled() -> None:
    scheduler = Scheduler(times(100, t_cb=1.0, threads=1, t_gb=0.5, t_dma=0.3, t_m=0.4))
    partitioner = Partitioner(scheduler.times)
    too_few_cpu = scheduler.simulate(partitioner.split(20)).feedback()
    too_many_cpu = scheduler.simulate(partitioner.split(90)).feedback()
    assert too_few_cpu.direction == 1 and too_few_cpu.cpu_idle_s > 0
    assert too_many_cpu.direction == -1 and too_many_cpu.gpu_idle_s > 0


def test_footnote_3_keeps_the_gpu_training_while_the_cpu_catches_up() -> None:
    config = times(30, t_cb=5.0, threads=1, t_gb=0.5, t_dma=0.2, t_m=0.5)
    result = Scheduler(config).simulate(Split(10, 20, 1, 4), trace=True)
    first_cpu_batch = min(r.end for r in result.trace if r.phase == "batch")
    # fill 4 UVA batches (0-2 s), then train one and refill one while the CPU batch is not ready: 3 rounds
    trained_before = [r for r in result.trace if r.phase == "train" and r.end <= first_cpu_batch]
    assert [(r.start, r.end) for r in trained_before] == [(2.0, 2.5), (3.0, 3.5), (4.0, 4.5)]
    assert all(r.route == 1 for r in trained_before)


def test_stochastic_runs_are_reproducible_and_seeded() -> None:
    config = times(80, t_cb=0.8, threads=2, t_gb=0.5, t_dma=0.3, t_m=0.4, cv=0.3)
    split = Partitioner(config).initial_split()
    a = Scheduler(config, seed=1).simulate(split)
    b = Scheduler(config, seed=1).simulate(split)
    c = Scheduler(config, seed=2).simulate(split)
    assert a.epoch_s == b.epoch_s
    assert a.epoch_s != c.epoch_s


def test_simulate_rejects_a_split_of_another_epoch() -> None:
    scheduler = Scheduler(times(10, t_cb=1.0, t_dma=0.3, t_m=0.4))
    with pytest.raises(ValueError, match="Partitioner.split"):
        scheduler.simulate(Split(5, 6, 5, 10))
    with pytest.raises(ValueError, match="engine"):
        scheduler.simulate(Split(5, 5, 5, 10), engine="gpu")


def test_cpu_only_pipeline_and_shared_core() -> None:
    config = PhaseTimes(20, cpu_batch_s=0.5, cpu_threads=2, train_s=0.8, train_threads=2, device="cpu")
    result = Scheduler(config).simulate_cpu_only(cbs=4)
    assert result.epoch_s == pytest.approx(1.0 + 20 * 0.8)  # first batch after one latency, then training-bound
    assert set(result.busy) == {"cpu-batching", "cpu-training"}
    serial = PhaseTimes(20, cpu_batch_s=0.5, cpu_threads=1, train_s=0.8, train_threads=1, device="cpu")
    assert Scheduler(serial).simulate_cpu_only(cbs=4, shared_core=True).epoch_s == pytest.approx(20 * 1.3)
    # Two threads taking turns build two batches per turn (one each, 1.0 s of one thread's latency), then train both.
    turns = Scheduler(config).simulate_cpu_only(cbs=4, shared_core=True, trace=True)
    assert turns.epoch_s == pytest.approx(10 * 1.0 + 20 * 0.8)
    built = sorted((r.start, r.batch, r.lane) for r in turns.trace if r.phase == "batch")
    assert built[:4] == [(0.0, 0, 0), (0.0, 1, 1), (pytest.approx(2.6), 2, 0), (pytest.approx(2.6), 3, 1)]


def test_plan_json_round_trip_and_errors(tmp_path) -> None:
    profile = Profile.synthetic(t_cb=0.8, t_gb=0.1, t_dma=0.04, t_m=0.06, cores=8, num_batches=300, cv=0.1,
                                batch_bytes=10_000_000)
    plan = plan_from_profile(profile)
    path = tmp_path / "plan.json"
    plan.save(path)
    assert Plan.load(path) == plan
    document = json.loads(path.read_text())
    assert document["kind"] == "morphpipe.plan" and document["schema_version"] == PLAN_SCHEMA_VERSION
    path.write_text(json.dumps({**document, "schema_version": PLAN_SCHEMA_VERSION + 1}))
    with pytest.raises(ValueError, match="upgrade morphpipe"):
        Plan.load(path)
    path.write_text(json.dumps({**document, "n_cpu": document["n_cpu"] + 1}))
    with pytest.raises(ValueError, match=r"n_cpu .* must equal num_batches"):
        Plan.load(path)
    path.write_text(json.dumps({**document, "schedule": "magic"}))
    with pytest.raises(ValueError, match="field 'schedule' must be one of"):
        Plan.load(path)
    path.write_text(json.dumps({**document, "busy": {"gpu": "high"}}))
    with pytest.raises(ValueError, match=r"field 'busy.gpu' must be a finite number"):
        Plan.load(path)
    path.write_text("not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        Plan.load(path)
    profile.save(path)
    with pytest.raises(ValueError, match="must be 'morphpipe.plan'"):
        Plan.load(path)


def test_plan_reports_bounds_baselines_and_busy_fractions() -> None:
    profile = Profile.synthetic(t_cb=0.8, t_gb=0.1, t_dma=0.04, t_m=0.06, cores=8, num_batches=300)
    plan = plan_from_profile(profile)
    assert plan.kind == "adaptive" and plan.n_cpu + plan.n_gpu == 300
    assert plan.cbs >= 1 and plan.gbs == 10 and plan.cpu_threads == 8
    assert plan.predicted_epoch_s >= plan.lower_bound_s >= plan.eq6_s
    assert plan.predicted_epoch_s <= min(plan.baselines_s.values())
    assert set(plan.baselines_s) == {"all-cpu", "all-gpu"}
    assert plan.baselines_s["all-gpu"] == pytest.approx(300 * (0.1 + 0.06))
    assert all(0.0 <= value <= 1.0 for value in plan.busy.values())
    assert plan.profile["t_cb_s"] == pytest.approx(0.1)
    assert "speedup" in plan.describe()


def test_cpu_only_plan_splits_the_cores() -> None:
    # A step that gains half a thread per added thread: taking turns on all 8 cores (0.1 + 0.044 s a batch) loses to
    # 6 batching and 2 training threads side by side (0.133 s); with perfect scaling of both, turns would win.
    profile = Profile.synthetic(t_cb=0.8, t_m=0.2, cores=8, num_batches=200, training_efficiency=0.5)
    plan = plan_from_profile(profile)
    assert plan.kind == "cpu-only" and not plan.shares_cores
    assert (plan.cpu_threads, plan.train_threads) == (6, 2)
    perfect = plan_from_profile(Profile.synthetic(t_cb=0.8, t_m=0.2, cores=8, num_batches=200))
    assert perfect.shares_cores and perfect.cpu_threads == perfect.train_threads == 8
    assert plan.predicted_epoch_s <= plan.baselines_s["even-split"]
    assert plan.predicted_epoch_s >= plan.lower_bound_s


def test_gantt_and_figure_9_pngs(tmp_path) -> None:
    config = times(30, t_cb=1.0, threads=2, t_gb=0.5, t_dma=0.3, t_m=0.4)
    result = Scheduler(config).simulate(Partitioner(config).initial_split(), trace=True)
    out = plot_gantt(result, tmp_path / "gantt.png", until=5.0)
    assert out.read_bytes()[:8] == PNG_MAGIC
    with pytest.raises(ValueError, match="trace=True"):
        plot_gantt(Scheduler(config).all_gpu(), tmp_path / "none.png")
    profile = Profile.synthetic(t_cb=0.8, t_gb=0.1, t_dma=0.04, t_m=0.06, cores=2, num_batches=100)
    plans = sweep(profile, [2, 4])
    assert plot_cores_sweep([2, 4], plans, tmp_path / "fig9.png").read_bytes()[:8] == PNG_MAGIC


def test_a_saved_plan_re_simulates_to_its_prediction_and_draws(tmp_path) -> None:
    for profile in (Profile.synthetic(t_cb=0.8, t_gb=0.1, t_dma=0.04, t_m=0.06, cores=4, num_batches=120, cv=0.2),
                    Profile.synthetic(t_cb=0.8, t_m=0.2, cores=4, num_batches=60, cv=0.2)):
        plan = plan_from_profile(profile, seed=7)
        plan.save(tmp_path / "plan.json")
        again = simulate_plan(profile, Plan.load(tmp_path / "plan.json"))
        assert again.epoch_s == plan.predicted_epoch_s
        assert draw_plan(profile, plan, tmp_path / "plan.png").read_bytes()[:8] == PNG_MAGIC
    other = Profile.synthetic(t_cb=0.8, t_m=0.2, cores=4, num_batches=61)
    with pytest.raises(ValueError, match="re-plan"):
        simulate_plan(other, plan)


def test_what_if_pcie_scales_dma_and_the_transfer_share_of_uva() -> None:
    profile = Profile.synthetic(t_cb=0.8, t_gb=0.01, t_dma=0.004, t_m=0.006, cores=4, num_batches=100)
    link = profile.hardware.gpu.pcie_gbps
    slower = what_if(profile, pcie_gbps=link / 2).profile
    assert slower.dma.mean_s == pytest.approx(0.008)
    assert slower.gpu_batching.mean_s == pytest.approx(0.01 - 0.004 + 0.008)
    assert slower.gpu_batching.cv == profile.gpu_batching.cv
    assert slower.training == profile.training
    more_cores = what_if(profile, cores=16).profile
    assert more_cores.cores == 16
    assert more_cores.cpu_batch_time() == pytest.approx(profile.cpu_batching.per_batch_time(16))
    with pytest.raises(ValueError, match="CPU-only"):
        what_if(Profile.synthetic(t_cb=0.1, t_m=0.1), pcie_gbps=16)


def test_parse_cores() -> None:
    assert parse_cores("2,4,...,16") == [2, 4, 6, 8, 10, 12, 14, 16]
    assert parse_cores("1, 2, 4,...,8") == [1, 2, 4, 6, 8]
    assert parse_cores("3") == [3]
    for bad in ("", "0,2", "2,...", "a,b", "4,2,...,8"):
        with pytest.raises(Exception, match="--cores"):
            parse_cores(bad)


def test_simulate_command(tmp_path, capsys) -> None:
    profile = Profile.synthetic(t_cb=0.8, t_gb=0.1, t_dma=0.04, t_m=0.06, cores=2, num_batches=200,
                                workload={"dataset": "toy"})
    path = tmp_path / "profile.json"
    profile.save(path)
    code = main(["simulate", str(path), "--cores", "2,4,...,8", "--pcie-gbps", "16", "--plot",
                 str(tmp_path / "fig9.png"), "--gantt", str(tmp_path / "gantt.png"), "--json",
                 str(tmp_path / "plans.json")])
    out = capsys.readouterr().out
    assert code == 0
    lines = out.splitlines()
    header = next(line for line in lines if line.strip().startswith("cores"))
    assert "all-CPU" in header and "all-GPU" in header and "adaptive" in header and "CPU share" in header
    rows = [line.split() for line in lines if line.strip()[:1].isdigit()]
    assert [int(row[0]) for row in rows] == [2, 4, 6, 8]
    assert "what-if: PCIe 16 GB/s" in out
    assert (tmp_path / "fig9.png").read_bytes()[:8] == PNG_MAGIC
    assert (tmp_path / "gantt.png").read_bytes()[:8] == PNG_MAGIC
    plans = [Plan.from_dict(d) for d in json.loads((tmp_path / "plans.json").read_text())]
    assert [plan.cpu_threads for plan in plans] == [2, 4, 6, 8]


def test_simulate_command_reports_bad_input(tmp_path, capsys) -> None:
    assert main(["simulate", str(tmp_path / "missing.json")]) == 2
    assert "no such file" in capsys.readouterr().err
    cpu = tmp_path / "cpu.json"
    Profile.synthetic(t_cb=0.1, t_m=0.1, cores=2, num_batches=20).save(cpu)
    assert main(["simulate", str(cpu), "--pcie-gbps", "8"]) == 2
    assert "CPU-only" in capsys.readouterr().err
    assert main(["simulate", str(cpu), "--cores", "1,2"]) == 0
    assert "batch/train threads" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["simulate", str(cpu), "--gbs", "0"])
