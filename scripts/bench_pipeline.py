"""Pipeline benchmark: epoch times measured by the executor beside the planner's predictions (the paper's Figure 9).

Three parts; each machine runs the ones it can:

(cpu)     CPU-only machine, the real workload. The phases are profiled once on this machine; then,
          for each thread count T (default 2, 4, 8, 16), the planner plans a T-core machine
          (what-if, from the same profile) and the executor trains epochs with that plan's thread
          counts: the planner's choice (batching and training on disjoint cores, or taking turns on
          all of them) and the even split. Thread counts above this machine's usable cores are
          oversubscribed here, so their measurements cannot match a T-core prediction; they are
          marked.
(gpu)     CUDA machine: all-CPU, all-GPU and adaptive plans for batching thread counts 2..16, each
          measured by the executor with the UVA GpuBatcher for Route 1.
(virtual) Any machine: the same three plans for 2..16 batching threads on virtual devices (phases
          sleep for the simulator's drawn durations; morphpipe.executor.virtual), from a synthetic
          GPU profile scaled to milliseconds: does the executor realise the predicted epochs and
          the adaptive plan's speedup?

libgomp's threads spin while they wait for work; on a shared 2-core VM that made a 2-thread
training step 10-70x slower than a 1-thread one (measured), so this script sets
OMP_WAIT_POLICY=PASSIVE before torch loads unless it is already set (--keep-omp-env keeps the
environment as it is).

Usage: python scripts/bench_pipeline.py [--parts cpu,virtual] [--threads 2,4,8,16] [--dataset default]
         [--train-batches 24] [--epochs 2] [--json out.json]
"""
from __future__ import annotations

import argparse
import os
import sys

KEEP_OMP = "--keep-omp-env" in sys.argv
OMP_NOTE = (f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']} (from the environment)" if "OMP_WAIT_POLICY" in os.environ
            else "OMP_WAIT_POLICY unset (--keep-omp-env)" if KEEP_OMP else "OMP_WAIT_POLICY=PASSIVE (set by this script)")
if not KEEP_OMP:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import dataclasses  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
from datetime import datetime, timezone  # noqa: E402

import torch  # noqa: E402

from morphpipe.data import load_dataset  # noqa: E402
from morphpipe.executor import Trainer  # noqa: E402
from morphpipe.executor.virtual import virtual_executor  # noqa: E402
from morphpipe.nn import build_model  # noqa: E402
from morphpipe.partitioner import PhaseTimes, buffer_sizes, even_core_split  # noqa: E402
from morphpipe.profiler import Profile  # noqa: E402
from morphpipe.profiler.profiler import Profiler  # noqa: E402
from morphpipe.scheduler import Plan, Scheduler, plan_from_profile  # noqa: E402
from morphpipe.sampling import GpuBatcher  # noqa: E402
from morphpipe.commands.workload import parse_int_list  # noqa: E402
from morphpipe.scheduler.whatif import what_if  # noqa: E402

PARTS = ("cpu", "gpu", "virtual")


def parse_ints(text: str, name: str) -> list[int]:
    """`parse_int_list`, with every value >= 1, and a SystemExit naming the option otherwise."""
    try:
        values = parse_int_list(text, name)
    except ValueError as error:
        raise SystemExit(str(error)) from None
    if not values or min(values) < 1:
        raise SystemExit(f"{name}: expected integers >= 1, got {text!r}")
    return values


def baseline(plan: Plan, name: str, gbs: int) -> Plan:
    """The all-CPU or all-GPU plan the planner compared `plan` with, as a runnable Plan."""
    n = plan.num_batches
    n_cpu = n if name == "all-cpu" else 0
    cbs, gbs = buffer_sizes(n_cpu, n - n_cpu, gbs)
    return dataclasses.replace(plan, kind=name, n_cpu=n_cpu, n_gpu=n - n_cpu, cbs=cbs, gbs=gbs,
                               predicted_epoch_s=plan.baselines_s[name])


def even_split(plan: Plan, cores: int) -> Plan:
    """The CPU-only baseline: half the cores batch while the other half train, as a runnable Plan."""
    split = even_core_split(cores)
    return dataclasses.replace(plan, cpu_threads=split.batch_threads, train_threads=split.train_threads,
                               shares_cores=split.shared_core, predicted_epoch_s=plan.baselines_s["even-split"])


def plan_label(plan: Plan) -> str:
    if plan.kind == "cpu-only":
        how = "turns" if plan.shares_cores else "disjoint"
        return f"P={plan.cpu_threads} Q={plan.train_threads} {how}"
    return f"{plan.kind} {plan.n_cpu}+{plan.n_gpu}"


def measure_plan(graph, plan: Plan, args: argparse.Namespace, gpu_batcher=None) -> list[float]:
    """Epoch times of `plan` on the real workload: one warm-up epoch, then `args.epochs` measured ones."""
    torch.manual_seed(0)
    model = build_model(args.model, graph.feature_dim, graph.num_classes, num_layers=len(args.fanouts))
    with Trainer(graph, model, plan, fanouts=args.fanouts, batch_size=args.batch_size, gpu_batcher=gpu_batcher,
                 progress=False, log=lambda line: None) as trainer:
        history = trainer.fit(1 + args.epochs, validate=False)
    return [stats.epoch_s for stats in history[1:]]


def workload_graph(args: argparse.Namespace):
    """The dataset with its training seeds cut to `train_batches` batches (an epoch that fits the benchmark)."""
    graph = load_dataset(args.dataset, progress=False)
    seeds = graph.train_idx[: args.train_batches * args.batch_size]
    return dataclasses.replace(graph, train_idx=seeds)


def profile_here(graph, args: argparse.Namespace, device: str) -> Profile:
    profiler = Profiler(graph, model=args.model, fanouts=args.fanouts, batch_size=args.batch_size, device=device,
                        steps=args.profile_steps, progress=False)
    return profiler.run()


def run_cpu(args: argparse.Namespace) -> list[dict]:
    graph = workload_graph(args)
    profile = profile_here(graph, args, "cpu")
    cores = profile.cores
    print(f"\n[cpu] {graph.name}: {len(graph.train_idx):,} training seeds = {profile.num_batches} batches of "
          f"{args.batch_size}; {args.model}, fanouts {args.fanouts}; {cores} usable cores")
    for threads, timing in profile.cpu_batching.points.items():
        training = profile.cpu_training.points[threads]
        print(f"  measured at {threads} thread(s): batching {timing.mean_s * 1e3:.1f} ms/batch, "
              f"training {training.mean_s * 1e3:.1f} ms/step")
    print(f"{'T':>3}  {'plan':<10}  {'threads':<18}  {'predicted s':>11}  {'measured s':>10}  {'meas/pred':>9}  note")
    rows = []
    for count in args.threads:
        chosen = plan_from_profile(what_if(profile, count).profile, seed=0)
        for name, plan in (("adaptive", chosen), ("even-split", even_split(chosen, count))):
            epochs = measure_plan(graph, plan, args)
            measured = statistics.median(epochs)
            note = f"oversubscribed: {count} threads on {cores} cores" if count > cores else ""
            rows.append({"part": "cpu", "threads": count, "plan": name, "config": plan_label(plan),
                         "predicted_s": plan.predicted_epoch_s, "measured_s": measured, "epochs_s": epochs,
                         "note": note})
            print(f"{count:>3}  {name:<10}  {plan_label(plan):<18}  {plan.predicted_epoch_s:>11.3f}  {measured:>10.3f}"
                  f"  {measured / plan.predicted_epoch_s:>9.2f}  {note}")
    return rows


def run_gpu(args: argparse.Namespace) -> list[dict]:
    if not torch.cuda.is_available():
        raise SystemExit("--parts gpu needs a CUDA device; torch sees none (run --parts cpu,virtual here)")
    graph = workload_graph(args)
    profile = profile_here(graph, args, "cuda")
    print(f"\n[gpu] {graph.name}: {profile.num_batches} batches; {profile.hardware.gpu.name if profile.hardware.gpu else ''}")
    print(f"{'P':>3}  {'plan':<9}  {'split':<16}  {'predicted s':>11}  {'measured s':>10}  {'meas/pred':>9}")
    rows = []
    for count in args.threads:
        adaptive = plan_from_profile(what_if(profile, count).profile, gbs=args.gbs, seed=0)
        for name, plan in (("all-cpu", baseline(adaptive, "all-cpu", args.gbs)),
                           ("all-gpu", baseline(adaptive, "all-gpu", args.gbs)), ("adaptive", adaptive)):
            measured = statistics.median(measure_plan(graph, plan, args, GpuBatcher))
            rows.append({"part": "gpu", "threads": count, "plan": name, "config": plan_label(plan),
                         "predicted_s": plan.predicted_epoch_s, "measured_s": measured})
            print(f"{count:>3}  {name:<9}  {plan_label(plan):<16}  {plan.predicted_epoch_s:>11.3f}  {measured:>10.3f}"
                  f"  {measured / plan.predicted_epoch_s:>9.2f}")
    return rows


def virtual_profile(threads: int) -> Profile:
    """A GPU machine in milliseconds: CPU batching 60 ms per batch per thread (85% parallel efficiency),
    UVA batching 14 ms, DMA 6 ms, training 9 ms; every phase with a 10% spread."""
    return Profile.synthetic(t_cb=0.060, t_m=0.009, t_gb=0.014, t_dma=0.006, num_batches=60, cores=threads,
                             cpu_efficiency=0.85, cv=0.1)


def run_virtual(args: argparse.Namespace) -> list[dict]:
    print("\n[virtual] GPU machine on virtual devices (60 batches per epoch; phases sleep for the simulator's draws)")
    print(f"{'P':>3}  {'plan':<9}  {'split':<16}  {'predicted s':>11}  {'measured s':>10}  {'meas/pred':>9}")
    rows = []
    for count in args.threads:
        profile = virtual_profile(count)
        adaptive = plan_from_profile(profile, gbs=args.gbs, seed=0)
        times = PhaseTimes.from_profile(profile, count)
        scheduler = Scheduler(times, seed=0)
        for name, plan in (("all-cpu", baseline(adaptive, "all-cpu", args.gbs)),
                           ("all-gpu", baseline(adaptive, "all-gpu", args.gbs)), ("adaptive", adaptive)):
            predicted = scheduler.simulate(plan.split).epoch_s
            executor, _ = virtual_executor(times, plan.split, scheduler.durations)
            measured = executor.run_epoch(0).epoch_s
            rows.append({"part": "virtual", "threads": count, "plan": name, "config": plan_label(plan),
                         "predicted_s": predicted, "measured_s": measured})
            print(f"{count:>3}  {name:<9}  {plan_label(plan):<16}  {predicted:>11.3f}  {measured:>10.3f}"
                  f"  {measured / predicted:>9.2f}")
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default=None, help="comma-separated parts to run: cpu, gpu, virtual "
                                                      "(default: gpu,virtual with CUDA, else cpu,virtual)")
    parser.add_argument("--threads", default="2,4,8,16", help="thread counts (default 2,4,8,16)")
    parser.add_argument("--dataset", default="default")
    parser.add_argument("--model", default="sage", choices=["sage", "gcn", "gat", "mlp"])
    parser.add_argument("--fanouts", default="10,5")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--train-batches", type=int, default=24, help="training seeds used: this many batches")
    parser.add_argument("--epochs", type=int, default=2, help="measured epochs per plan, after one warm-up epoch")
    parser.add_argument("--profile-steps", type=int, default=6)
    parser.add_argument("--gbs", type=int, default=10)
    parser.add_argument("--keep-omp-env", action="store_true", help="do not set OMP_WAIT_POLICY=PASSIVE")
    parser.add_argument("--json", default=None, help="also write the rows to this JSON file")
    args = parser.parse_args()
    args.threads = parse_ints(args.threads, "--threads")
    args.fanouts = parse_ints(args.fanouts, "--fanouts")
    parts = (args.parts or ("gpu,virtual" if torch.cuda.is_available() else "cpu,virtual")).split(",")
    unknown = set(parts) - set(PARTS)
    if unknown:
        raise SystemExit(f"--parts: unknown {sorted(unknown)}; choose from {', '.join(PARTS)}")
    print(f"bench_pipeline {datetime.now(timezone.utc).isoformat(timespec='seconds')}: {platform.processor() or platform.machine()}, "
          f"torch {torch.__version__}, CUDA {'yes' if torch.cuda.is_available() else 'no'}; {OMP_NOTE}")
    runners = {"cpu": run_cpu, "gpu": run_gpu, "virtual": run_virtual}
    rows = [row for part in parts for row in runners[part](args)]
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"omp": OMP_NOTE, "args": {k: v for k, v in vars(args).items()}, "rows": rows}, handle, indent=2)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
