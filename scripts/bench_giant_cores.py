"""The split of cores between I/O, batching and training with features on disk (issue 21, Build 3): profile a workload
whose features are read through the feature store, plan it (host cache, I/O threads, batching and training
threads), and train one cut epoch under that plan and under the plan the planner made before it chose the I/O
threads (the store's default I/O threads, no CPU charged for reading: the profile's `io_curve` removed), and
optionally at fixed I/O thread counts (`--also-io-threads`), all at the same cache, side by side in one run. Reports each plan's split, predicted epoch (both priced by the same profile, with
the reads' CPU) and measured epoch, and prints a table for BENCHMARKS.md.

The epoch is cut to `--batches` batches (a seeded subset of the training split) as in bench_giant_train.py. Not run
in CI: it needs a dataset on disk.

    python scripts/bench_giant_cores.py /work/bench_scratch/bench-1m --batches 20 --memory-budget-gib 0.2
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import torch
from bench_giant_train import cpu_model  # this script's folder is on sys.path when it runs

from morphpipe import native
from morphpipe.data import load_dataset
from morphpipe.data.feature_store import DEFAULT_IO_THREADS
from morphpipe.executor.trainer import Trainer
from morphpipe.nn import build_model
from morphpipe.profiler.profiler import Profiler
from morphpipe.scheduler import simulate_plan
from morphpipe.scheduler.planning import plan_from_profile

GIB = 1 << 30


def split_of(plan) -> str:
    """`io 24 / batch 1 / train 1` (or `batch+train 2 taking turns`)."""
    io = plan.tiering.io_threads if plan.tiering.io_threads is not None else f"{DEFAULT_IO_THREADS} (store default)"
    cores = (f"batch+train {plan.cpu_threads} taking turns" if plan.shares_cores else
             f"batch {plan.cpu_threads} / train {plan.train_threads}")
    return f"io {io} / {cores}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset", help="graph directory (features.npy stays on disk)")
    parser.add_argument("--batches", type=int, default=20, help="batches in each measured epoch (default 20)")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--fanouts", default="15,10,5")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--model", default="sage")
    parser.add_argument("--memory-budget-gib", type=float, default=0.2,
                        help="memory the run may hold: topology, labels, splits, the batches in flight, a training "
                             "step's peak and the cache (default 0.2)")
    parser.add_argument("--steps", type=int, default=4, help="timed steps per profiler measurement")
    parser.add_argument("--also-io-threads", default="",
                        help="also train the plan made at the chosen cache with these I/O threads, e.g. 1,4")
    parser.add_argument("--order", default=None,
                        help="the order the plans train in, a plan may come again (default: default, the "
                             "--also-io-threads ones, chosen)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    fanouts = [int(f) for f in args.fanouts.split(",")]

    graph = load_dataset(args.dataset, features_on_disk=True)
    generator = torch.Generator().manual_seed(args.seed)
    train = graph.train_idx[torch.randperm(graph.train_idx.numel(), generator=generator)]
    val = graph.val_idx[torch.randperm(graph.val_idx.numel(), generator=generator)]
    graph = dataclasses.replace(graph, train_idx=train[:args.batches * args.batch_size].clone(),
                                val_idx=val[:1024].clone(), test_idx=val[:0].clone())
    native.prepare()
    load = [os.getloadavg()[0]]
    profile = Profiler(graph, model=args.model, fanouts=fanouts, batch_size=args.batch_size, hidden=args.hidden,
                       device="cpu", steps=args.steps, seed=args.seed, progress=True,
                       memory_budget=int(args.memory_budget_gib * GIB)).run()
    chosen = plan_from_profile(profile, seed=args.seed)
    before = profile.replaced(disk=dataclasses.replace(profile.disk, io_curve=(), io_threads=None))
    default = plan_from_profile(before, seed=args.seed, cache_bytes=chosen.tiering.cache_bytes)
    plans = {"default": default}
    for count in filter(None, args.also_io_threads.split(",")):
        plans[f"io {int(count)}"] = plan_from_profile(profile, seed=args.seed, cache_bytes=chosen.tiering.cache_bytes,
                                                      io_threads=int(count))
    plans["chosen"] = chosen
    print("I/O threads timed: " + ", ".join(f"{p.io_threads}: {p.reads_per_s:,.0f} reads/s, "
                                            f"{p.cpu_s_per_read * 1e6:.1f} us CPU a read"
                                            for p in profile.disk.io_curve), flush=True)
    rows = {}
    order = args.order.split(",") if args.order else list(plans)
    for turn, name in enumerate(order):
        plan = plans[name]
        predicted = simulate_plan(profile, plan).epoch_s  # both priced by the same profile, reads' CPU included
        # A plan without I/O threads runs with the store's default, not those the plan before it left open.
        io_threads = plan.tiering.io_threads if plan.tiering.io_threads is not None else DEFAULT_IO_THREADS
        store = graph.open_feature_store(plan.tiering.cache_bytes, io_threads)
        print(f"{name}: {split_of(plan)}, {store}; predicted {predicted:.1f} s", flush=True)
        torch.manual_seed(args.seed)
        model = build_model(args.model, graph.feature_dim, graph.num_classes, num_layers=len(fanouts),
                            hidden=args.hidden)
        store.reset_counters()
        cpu0, t0 = time.process_time(), time.perf_counter()
        with Trainer(graph, model, plan, fanouts=fanouts, batch_size=args.batch_size, seed=args.seed,
                     progress=True) as trainer:
            (stats,) = trainer.fit(1, validate=False)
        counters = store.counters()
        rows[name if order.count(name) == 1 else f"{name} (turn {turn + 1})"] = {"split": split_of(plan), "io_threads": store.io_threads, "cache_mb": store.cache_bytes / 1e6,
                      "predicted_epoch_s": predicted, "planned_epoch_s": plan.predicted_epoch_s,
                      "epoch_s": stats.epoch_s, "wall_s": time.perf_counter() - t0,
                      "process_cpu_s": time.process_time() - cpu0,
                      "predicted_disk_s_per_batch": plan.tiering.disk_read_s,
                      "predicted_read_cpu_s_per_batch": profile.disk.read_cpu_s_per_batch(
                          plan.tiering.cache_bytes, plan.tiering.io_threads),
                      "store_read_s": counters.read_seconds, "store_reads_per_s": counters.reads_per_second,
                      "hit_ratio": counters.hit_ratio, "load_after": os.getloadavg()[0]}
        load.append(os.getloadavg()[0])
    result = {"dataset": args.dataset, "cpu": cpu_model(), "cores": os.cpu_count(), "batches": args.batches,
              "model": f"{args.model} {len(fanouts)}x{args.hidden}", "fanouts": fanouts,
              "memory_budget_gib": args.memory_budget_gib, "load": load,
              "io_curve": [point.to_dict() for point in profile.disk.io_curve], "runs": rows}
    print(json.dumps(result, indent=2))
    print("\n| plan | split | cache | predicted epoch | measured epoch | disk per batch predicted | measured |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name, row in rows.items():
        print(f"| {name} | {row['split']} | {row['cache_mb']:.1f} MB | {row['predicted_epoch_s']:.1f} s | "
              f"**{row['epoch_s']:.1f} s** | {row['predicted_disk_s_per_batch'] * 1e3:.0f} ms | "
              f"{row['store_read_s'] / args.batches * 1e3:.0f} ms |")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
