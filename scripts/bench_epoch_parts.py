"""Benchmark: where a CPU training epoch's time goes, phase by phase, beside the step alone (issue 23).

Runs the SAGE 3x256 epoch as `scripts/bench_sage_epoch.py` does (the `Profiler` on the workload, `plan_from_profile`,
the `Trainer`'s executor; `--batches` batches of `--batch-size`, fanouts 15,10,5, float32) and splits each measured
epoch into its batching phases (the batches built on the executor's thread when the plan takes turns, or taken
from the CPU buffer), its training steps and the rest (the executor's own work between them), each with its wall
time, the process's CPU time (user and system) and minor page faults (`getrusage`); then it trains the same
batches again, the step alone, so a step slower inside the epoch than alone shows. System time and faults are
what fresh memory costs (first touches); the reusing CPU allocator (`morphpipe.ops.cpu_memory`) is on unless
MORPHPIPE_CPU_MEMORY_REUSE=0: `--compare-reuse` runs this script in fresh processes without and with it, in
turns, and prints both rows of each dataset. When the plan takes turns, `--turn-threads N` builds each batching
turn's batches N at a time (default: the plan's batching threads, as `morphpipe train` does; 1: one batch on one
thread, as before turns of several), and `--compare-turns` runs fresh processes at 1 and at the plan's threads, in
turns. `--turns-alone` times the batching turns alone (the epoch's batches built by the on-demand batcher, nothing
trained), one batch at a time against `--threads` at a time, alternating epoch by epoch in one process (`--rounds`
each; the fastest and the median epoch shown: under load the fastest is the least disturbed).

Prints one table (seconds per epoch, the mean over the measured epochs) and the load. Not a test. Usage:
  python scripts/bench_epoch_parts.py [--datasets default,bench-1m] [--batches 20] [--epochs 2] [--seed 0]
         [--threads 2] [--turn-threads N] [--compare-reuse | --compare-turns | --turns-alone [--rounds 1]]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import morphpipe  # noqa: F401  (the OpenMP wait policy and huge pages, as `morphpipe train` sets them)
import torch

from bench_sage_epoch import DROPOUT, HIDDEN, LR, RecordedSubset
from dgl_peer import int_list
from morphpipe.commands.arguments import integer
from morphpipe.data import load_dataset
from morphpipe.executor import Trainer
from morphpipe.executor.trainer import torch_threads, training_threads
from morphpipe.ops.cpu_memory import REUSE_ENV, cpu_memory_reuse
from morphpipe.openmp_env import wait_policy
from morphpipe.profiler.profiler import Profiler
from morphpipe.sampling.throughput import measurement_seeds
from morphpipe.sampling.serial_batcher import SerialBatcher
from morphpipe.scheduler import plan_from_profile

FIELDS = ("wall", "user", "sys", "faults")


def usage() -> tuple[float, float, float, int]:
    """Now: wall clock, the process's user and system CPU seconds, minor page faults."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return time.perf_counter(), r.ru_utime, r.ru_stime, r.ru_minflt


class Phases:
    """Sums of wall, user, sys and faults per phase name."""

    def __init__(self) -> None:
        self.sums: dict[str, list[float]] = {}

    def add(self, name: str, before: tuple, after: tuple) -> None:
        row = self.sums.setdefault(name, [0.0] * len(FIELDS))
        for i, (a, b) in enumerate(zip(before, after)):
            row[i] += b - a


class TimedBatcher:
    """The executor's Route 0 batcher, each `next()` booked as the batching phase; keeps the batches it gave."""

    def __init__(self, inner, phases: Phases) -> None:
        self.inner, self.phases, self.kept = inner, phases, []

    def __len__(self) -> int:
        return len(self.inner)

    def close(self) -> None:
        self.inner.close()

    def epoch(self, epoch: int):
        batches = iter(self.inner.epoch(epoch))
        while True:
            before = usage()
            batch = next(batches, None)
            self.phases.add("batch", before, usage())
            if batch is None:
                return
            self.kept.append(batch)
            yield batch


def measure(dataset: str, args: argparse.Namespace) -> dict:
    """One dataset: per measured epoch, the phases of the epoch and of the step alone on its batches."""
    graph = load_dataset(dataset)
    units = measurement_seeds(graph.train_idx, args.batches, args.batch_size, args.seed)
    task = RecordedSubset(units)
    profile = Profiler(graph, model="sage", fanouts=args.fanouts, batch_size=args.batch_size, hidden=HIDDEN,
                       device="cpu", thread_counts=[args.threads], seed=args.seed, progress=False, task=task,
                       precision="float32", log=lambda line: None).run()
    plan = plan_from_profile(profile, seed=args.seed)
    torch.manual_seed(args.seed)
    model = task.build_model("sage", graph, num_layers=len(args.fanouts), hidden=HIDDEN, dropout=DROPOUT)
    epochs = []
    with Trainer(graph, model, plan, fanouts=args.fanouts, batch_size=args.batch_size, task=task, lr=LR,
                 seed=args.seed, progress=False, log=lambda line: None) as trainer:
        executor = trainer.executor
        turn_threads = None
        if isinstance(executor.cpu_batcher, SerialBatcher):
            if args.turn_threads:
                executor.cpu_batcher.num_threads = args.turn_threads
            turn_threads = executor.cpu_batcher.num_threads
        phases = Phases()
        batcher = executor.cpu_batcher = TimedBatcher(executor.cpu_batcher, phases)
        step = executor.step

        def timed_step(batch):
            before = usage()
            loss = step(batch)
            phases.add("step", before, usage())
            return loss

        executor.step = timed_step
        for epoch in range(1 + args.epochs):
            phases.sums.clear()
            batcher.kept.clear()
            before = usage()
            with torch_threads(training_threads(trainer.plan)):
                result = executor.run_epoch(epoch)
                after = usage()
                alone = Phases()
                for batch in batcher.kept:  # the same batches again, nothing else running
                    start = usage()
                    step(batch)
                    alone.add("step alone", start, usage())
            epoch_row = [b - a for a, b in zip(before, after)]
            parts = {"epoch": epoch_row, **phases.sums, **alone.sums}
            parts["rest"] = [e - parts["batch"][i] - parts["step"][i] for i, e in enumerate(epoch_row)]
            parts["input_nodes"] = statistics.fmean(b.input_nodes.numel() for b in batcher.kept)
            parts["epoch_s"] = result.epoch_s
            epochs.append(parts)
    measured = epochs[1:]
    mean = {name: [statistics.fmean(e[name][i] for e in measured) for i in range(len(FIELDS))]
            for name in ("epoch", "batch", "step", "rest", "step alone")}
    return {"dataset": dataset, "plan": plan.describe().splitlines()[0], "parts": mean, "turn_threads": turn_threads,
            "input_nodes": statistics.fmean(e["input_nodes"] for e in measured),
            "reuse": dataclasses.asdict(cpu_memory_reuse()),
            "wait_policy": wait_policy().line(), "load": os.getloadavg()[0]}


def turns_alone(dataset: str, args: argparse.Namespace) -> list[str]:
    """The epoch's batches built by SerialBatcher alone, one at a time against `args.threads` at a time, alternating;
    a table row per width: ms a batch (fastest and median epoch), CPU ms a batch, and the load."""
    graph = load_dataset(dataset)
    units = measurement_seeds(graph.train_idx, args.batches, args.batch_size, args.seed)
    widths = (1, args.threads)
    times: dict[int, list[tuple[float, float]]] = {width: [] for width in widths}
    loads = [os.getloadavg()[0]]
    for epoch in range(1 + args.rounds):  # the first round warms the caches and the allocator up
        for width in widths:
            batcher = SerialBatcher(graph, args.fanouts, args.batch_size, seeds=units, seed=args.seed,
                                    num_threads=width)
            before = usage()
            for _ in batcher.epoch(epoch):
                pass
            after = usage()
            if epoch:
                times[width].append(((after[0] - before[0]) / len(batcher),
                                     (after[1] + after[2] - before[1] - before[2]) / len(batcher)))
    loads.append(os.getloadavg()[0])
    rows = []
    for width in widths:
        walls = sorted(wall for wall, _ in times[width])
        cpu = statistics.median(c for _, c in times[width])
        rows.append(f"| {dataset} | {width} | {1000 * walls[0]:.1f} | {1000 * statistics.median(walls):.1f} | "
                    f"{1000 * cpu:.1f} | {min(loads):.1f}-{max(loads):.1f} |")
    return rows


def row_cells(found: dict, label: str) -> str:
    parts = found["parts"]
    cells = [found["dataset"], label, f"{parts['epoch'][0]:.2f}"]
    for name in ("batch", "step", "rest", "step alone"):
        wall, user, system, faults = parts[name]
        cells.append(f"{wall:.2f} ({user:.2f} + {system:.2f}, {faults / 1000:.0f}k)")
    cells.append(f"{found['load']:.1f}")
    return "| " + " | ".join(cells) + " |"


HEADER = ("| dataset | variant | epoch s | batch s (user + sys CPU s, faults) | step s (user + sys, faults) | "
          "rest s (user + sys, faults) | step alone s (user + sys, faults) | load |\n|" + "---|" * 8)


def variant(found: dict) -> str:
    """The row's allocator, and its batching turn's width when the plan takes turns."""
    allocator = "reuse" if found["reuse"].get("installed") else "torch's"
    turn = found["turn_threads"]
    return allocator if turn is None else f"{allocator}, turns of {turn}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", default="default,bench-1m")
    parser.add_argument("--fanouts", type=int_list, default="15,10,5")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--epochs", type=int, default=2, help="measured epochs after the warm-up one (default 2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--compare-reuse", action="store_true",
                        help="run without and with the reusing allocator, fresh processes in turns")
    parser.add_argument("--turn-threads", type=integer(1), default=None,
                        help="batches built at once in a batching turn, when the plan takes turns (default: the "
                             "plan's batching threads)")
    parser.add_argument("--compare-turns", action="store_true",
                        help="run with --turn-threads 1 and with the plan's threads, fresh processes in turns")
    parser.add_argument("--turns-alone", action="store_true",
                        help="time the batching turns alone, one batch at a time against --threads at a time")
    parser.add_argument("--rounds", type=integer(1), default=1,
                        help="with --compare-reuse or --compare-turns: turns per variant; with --turns-alone: epochs "
                             "per width")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # a child's output
    args = parser.parse_args()
    if args.batches < 1 or args.epochs < 1:
        raise SystemExit(f"--batches and --epochs must be at least 1, got {args.batches} and {args.epochs}")
    torch.set_num_threads(args.threads)
    loads = [os.getloadavg()[0]]
    if args.compare_reuse + args.compare_turns + args.turns_alone > 1:
        raise SystemExit("give one of --compare-reuse, --compare-turns and --turns-alone")
    if args.turns_alone:
        print(f"Batching turns alone: {args.batches} batches of {args.batch_size} per epoch, fanouts {args.fanouts}, "
              f"{args.threads} threads, {args.rounds} epochs per width after a warm-up one, alternating; OpenMP wait "
              f"policy {wait_policy().line()}\n| dataset | batches a turn | fastest epoch ms a batch | median ms a batch "
              "| CPU ms a batch (median) | load |\n|---|---|---|---|---|---|")
        for dataset in args.datasets.split(","):
            print("\n".join(turns_alone(dataset, args)), flush=True)
        return
    if not (args.compare_reuse or args.compare_turns):
        found = [measure(dataset, args) for dataset in args.datasets.split(",")]
        if args.json:
            print(json.dumps(found))
            return
        rows = [(f, variant(f)) for f in found]
    else:
        rows = []
        own = [arg for arg in sys.argv[1:] if arg not in ("--compare-reuse", "--compare-turns")]
        variants = ([([], {REUSE_ENV: "0"}), ([], {REUSE_ENV: "1"})] if args.compare_reuse
                    else [(["--turn-threads", "1"], {}), ([], {})])
        for _ in range(args.rounds):
            for extra, env in variants:
                child = subprocess.run([sys.executable, __file__, *own, *extra, "--json"], capture_output=True,
                                       text=True, env={**os.environ, **env}, check=True)
                rows += [(f, variant(f)) for f in json.loads(child.stdout.strip().splitlines()[-1])]
    loads.append(os.getloadavg()[0])
    print(f"SAGE {len(args.fanouts)}x{HIDDEN} float32, fanouts {args.fanouts}, batch {args.batch_size}, "
          f"{args.batches} batches per epoch, mean of {args.epochs} measured epochs after a warm-up, "
          f"{args.threads} threads; OpenMP wait policy {rows[0][0]['wait_policy']}; load average "
          f"{min(loads):.1f}-{max(loads):.1f}")
    print(HEADER)
    for found, label in sorted(rows, key=lambda pair: pair[0]["dataset"]):
        print(row_cells(found, label))
    for found, label in rows:
        print(f"{found['dataset']} ({label}): {found['plan']}; {found['input_nodes']:,.0f} input nodes a batch; "
              f"allocator {found['reuse']}")


if __name__ == "__main__":
    main()
