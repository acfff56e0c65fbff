"""Re-planning while training: a co-tenant arrives after the first epoch and leaves later; --replan off vs epoch.

Real part: `morphpipe train`'s Trainer on the default preset under the plan profiled at the start
(on the quiet machine); after epoch `--arrive` a co-tenant (one busy-looping process per usable core) starts, after
epoch `--leave` it stops (`--arrive 0`: it runs while the profile is taken and from the first epoch,
the profile-on-a-busy-machine case). The same run with re-planning off and on, side by side; per-epoch times
and the plan each epoch ran. Virtual part: the real Executor on virtual devices whose phase times
change (co-tenant: CPU batching 3x slower; GPU 2x slower), measured epochs vs the best static plan.

    .venv/bin/python scripts/bench_replan.py --out bench_out/bench_replan.json
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from morphpipe import native
from morphpipe.cores import usable_cores
from morphpipe.data import load_dataset
from morphpipe.executor.replan import Replanner, describe_schedule, same_schedule
from morphpipe.executor.trainer import Trainer
from morphpipe.executor.virtual import virtual_executor
from morphpipe.nn import build_model
from morphpipe.partitioner import PhaseTimes
from morphpipe.profiler import Profile, Profiler
from morphpipe.scheduler import plan_from_profile
from morphpipe.scheduler.durations import Durations
from morphpipe.scheduler.simulate_plan import simulate_plan


class CoTenant:
    """One busy-looping process per usable core, started and stopped on demand."""

    def __init__(self) -> None:
        self.processes: list[subprocess.Popen] = []

    def start(self) -> None:
        self.processes = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(usable_cores())]

    def stop(self) -> None:
        for process in self.processes:
            process.kill()
            process.wait()
        self.processes = []


def profile_machine(graph) -> Profile:
    """This machine's profile for the benchmark's workload (SAGE, fanouts 15,10,5, batch 1024, CPU)."""
    return Profiler(graph, model="sage", fanouts=[15, 10, 5], batch_size=1024, device="cpu", progress=False).run()


def real_run(graph, profile: Profile, args: argparse.Namespace, replan: bool) -> list[dict]:
    """Trains args.epochs epochs with the co-tenant present during (arrive, leave]; per-epoch records."""
    plan = plan_from_profile(profile, seed=0)
    torch.manual_seed(0)
    model = build_model("sage", graph.feature_dim, graph.num_classes, num_layers=3)
    tenant = CoTenant()
    epochs_done = []

    def after_epoch(line: str) -> None:
        if not line.startswith("epoch "):
            return
        epochs_done.append(line)
        print(f"  [{'replan' if replan else 'off'}] {line}", flush=True)
        if len(epochs_done) == args.arrive:
            tenant.start()
        if len(epochs_done) == args.leave:
            tenant.stop()

    replanner = Replanner(profile, reprofile=lambda: profile_machine(graph)) if replan else None
    records = []
    if args.arrive == 0:
        tenant.start()
    try:
        with Trainer(graph, model, plan, fanouts=[15, 10, 5], batch_size=1024, progress=False, log=after_epoch,
                     replanner=replanner) as trainer:
            history = trainer.fit(args.epochs, validate=False)
    finally:
        tenant.stop()
    for stats in history:
        present = args.arrive <= stats.epoch < args.leave
        records.append({"epoch": stats.epoch + 1, "co_tenant": present, "epoch_s": stats.epoch_s,
                        "predicted_s": stats.predicted_epoch_s, "plan_change": stats.plan_change})
    return records


def virtual_scenarios() -> list[dict]:
    """Measured virtual epochs after a change, re-planning vs the static plan vs the best static plan."""
    base = dict(t_cb=0.050, t_gb=0.010, t_dma=0.004, t_m=0.009)
    scenarios = {"co-tenant: CPU batching 3x": {**base, "t_cb": 0.150},
                 "GPU 2x slower": {**base, "t_gb": 0.020, "t_m": 0.018}}
    rows = []
    for name, after_times in scenarios.items():
        before = Profile.synthetic(**base, cores=2, num_batches=40, cv=0.1)
        after = Profile.synthetic(**after_times, cores=2, num_batches=40, cv=0.1)
        best = plan_from_profile(after, engine="fast")
        row = {"scenario": name, "best_static_predicted_s": best.predicted_epoch_s}
        for mode in ("off", "epoch"):
            plan = plan_from_profile(before, engine="fast")
            replanner = Replanner(before)
            epochs = []
            for epoch, truth in enumerate([before, after, after, after, after]):
                times = PhaseTimes.from_profile(truth, plan.cpu_threads, plan.train_threads)
                executor, _ = virtual_executor(times, plan.split, Durations.draw(times, 100 + epoch))
                try:
                    result = executor.run_epoch(epoch)
                finally:
                    executor.close_batchers()
                epochs.append({"epoch_s": result.epoch_s, "plan": describe_schedule(plan)})
                if mode == "epoch":
                    decision = replanner.observe(result, plan)
                    if decision.switched:
                        plan = decision.candidate
            row[mode] = epochs
        row["stale_plan_predicted_s"] = simulate_plan(after, plan_from_profile(before, engine="fast"),
                                                      engine="fast").epoch_s
        row["replanned"] = not same_schedule(plan, plan_from_profile(before, engine="fast"))
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--arrive", type=int, default=1,
                        help="the co-tenant starts after this many epochs (0: it is there from the profiling on)")
    parser.add_argument("--leave", type=int, default=4, help="and stops after this many")
    parser.add_argument("--skip-real", action="store_true", help="only the virtual-device scenarios")
    parser.add_argument("--out", type=Path, default=Path("bench_out/bench_replan.json"))
    args = parser.parse_args()
    report: dict = {"virtual": virtual_scenarios()}
    for row in report["virtual"]:
        print(f"virtual {row['scenario']}: best static {row['best_static_predicted_s']:.3f} s; "
              f"off {[round(e['epoch_s'], 3) for e in row['off']]}; "
              f"epoch {[round(e['epoch_s'], 3) for e in row['epoch']]}")
    if not args.skip_real:
        native.prepare()
        graph = load_dataset("default", progress=False)
        started = time.perf_counter()
        profiling_tenant = CoTenant()
        if args.arrive == 0:
            profiling_tenant.start()
        try:
            profile = profile_machine(graph)
        finally:
            profiling_tenant.stop()
        print(f"profiled in {time.perf_counter() - started:.0f} s: {profile.contention}")
        report["real"] = {mode: real_run(graph, profile, args, replan=mode == "epoch") for mode in ("off", "epoch")}
        report["real"]["profile_contention"] = profile.contention
        for off, on in zip(report["real"]["off"], report["real"]["epoch"]):
            print(f"epoch {off['epoch']} co-tenant={off['co_tenant']}: off {off['epoch_s']:.2f} s, "
                  f"replan {on['epoch_s']:.2f} s {on['plan_change'] or ''}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
