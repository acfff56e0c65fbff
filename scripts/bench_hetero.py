"""Benchmark: typed batches per second and RGAT / R-GCN training epochs on the mag-shaped graph, beside DGL 2.1.

morphpipe: the C++ typed batcher (HeteroCpuBatcher: --threads workers for batches/s; for epochs each batch
built on demand on the training thread) and its relation-aware models (nn.hetero) trained by TrainStep. DGL: its
heterogeneous NeighborSampler (DataLoader, num_workers=0) and HeteroGraphConv models (GATConv per
relation; GraphConv(norm="right") per relation plus a self linear per type for R-GCN), run as a
subprocess of DGL's own interpreter (scripts/bench_hetero_dgl.py) on the same dataset files, seeds
split, fanouts (every relation), batch size, widths, learning rate and torch threads. Training and test
accuracy run once per seed (`--seeds N`: seeds 0..N-1 draw the initialisation, the epoch order and the
neighbour samples on each side), so the accuracies are compared as mean +- standard deviation over seeds,
not one draw against another. Prints a table and writes JSON. Not a test.

Usage: python scripts/bench_hetero.py [--dataset mag] [--fanouts 10,10] [--batch-size 1024] [--epochs 1] [--seeds 3]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import time
from datetime import date
from pathlib import Path

import torch

from morphpipe.cores import usable_cores
from morphpipe.data.hetero_store import HeteroGraphStore
from morphpipe.data.presets import PRESETS
from morphpipe.data.store import ensure_preset
from morphpipe.nn.task import EvalSettings, NodeClassification, cast_features
from morphpipe.nn.train_step import TrainStep, make_optimizer
from morphpipe.sampling.hetero_batcher import HeteroCpuBatcher

DGL_PYTHON = "/work/dglvenv/bin/python"


def our_batching(graph, fanouts, batch_size, batches, threads) -> dict:
    """Typed batches per second, and CPU seconds per batch (every thread of the process: load-robust), over the
    second of two passes of `batches` batches of training seeds: the first warms the pages, pool and workers."""
    seeds = graph.train_idx[: batches * batch_size]
    with HeteroCpuBatcher(graph, fanouts, batch_size, seeds=seeds, num_threads=threads, pin_memory=False) as batcher:
        sum(1 for _ in batcher.epoch(99))
        start, cpu = time.perf_counter(), time.process_time()
        count = sum(1 for _ in batcher.epoch(0))
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    return {"batches_per_s": count / wall, "cpu_s_per_batch": cpu / count}


def our_training(graph, kind, args, seed: int) -> dict:
    """`args.epochs` epochs of `kind` from seed `seed` (initialisation, epoch order, samples): epoch times and test
    accuracy (sampled inference with the training fanouts)."""
    task = NodeClassification()
    torch.manual_seed(seed)
    model = task.build_model(kind, graph, num_layers=len(args.fanouts), hidden=args.hidden, dropout=0.0,
                             **({"heads": args.heads} if kind == "rgat" else {}))
    step = TrainStep(model, make_optimizer(model.parameters(), args.lr, "cpu"), task)
    epochs = []
    # Batches built on demand on the training thread, as DGL's DataLoader with num_workers=0 builds them.
    with HeteroCpuBatcher(graph, args.fanouts, args.batch_size, serial=True, pin_memory=False, seed=seed) as batcher:
        for epoch in range(args.epochs):
            start = time.perf_counter()
            for batch in batcher.epoch(epoch):
                step(batch)
            epochs.append(time.perf_counter() - start)
    settings = EvalSettings(args.fanouts, batch_size=4096, seed=seed, progress=False)
    accuracy = task.evaluate(model, graph, graph.test_idx, settings, device=torch.device("cpu"))
    return {"epoch_s": epochs, "test_accuracy": accuracy}


def over_seeds(runs: list[dict]) -> dict:
    """One model's runs (one per seed) as every epoch time and the test accuracy of each seed."""
    return {"epoch_s": [s for run in runs for s in run["epoch_s"]],
            "test_accuracy": [run["test_accuracy"] for run in runs]}


def mean_std(values: list[float]) -> str:
    """`mean ± std` (sample standard deviation; none from one value)."""
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="mag", help="a heterogeneous preset or dataset directory (default mag)")
    parser.add_argument("--fanouts", default="10,10", help="neighbours per hop for every relation (default 10,10)")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--batches", type=int, default=18,
                        help="batches of the batching measurement, timed on a second pass (default 18: mag's epoch)")
    parser.add_argument("--threads", type=int, default=usable_cores())
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--seeds", type=int, default=3,
                        help="train and test each model once per seed 0..N-1 on each side (default 3)")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--models", default="rgat,rgcn")
    parser.add_argument("--dgl-python", default=DGL_PYTHON)
    parser.add_argument("--out", default="bench_hetero.json")
    args = parser.parse_args()
    args.fanouts = [int(f) for f in args.fanouts.split(",")]
    if args.seeds < 1:
        raise SystemExit(f"bench_hetero: --seeds must be >= 1 (runs per model and side), got {args.seeds}")
    directory = Path(args.dataset) if Path(args.dataset).is_dir() else ensure_preset(PRESETS[args.dataset])
    graph = HeteroGraphStore.load(directory)
    torch.set_num_threads(args.threads)
    load = os.getloadavg()[0]
    ours = our_batching(graph, args.fanouts, args.batch_size, args.batches, args.threads)
    for kind in args.models.split(","):
        ours[kind] = over_seeds([our_training(graph, kind, args, seed) for seed in range(args.seeds)])
    command = [args.dgl_python, str(Path(__file__).with_name("bench_hetero_dgl.py")), str(directory),
               "--fanouts", ",".join(map(str, args.fanouts)), "--batch-size", str(args.batch_size),
               "--batches", str(args.batches), "--threads", str(args.threads), "--epochs", str(args.epochs),
               "--hidden", str(args.hidden), "--heads", str(args.heads), "--models", args.models, "--lr", str(args.lr),
               "--seeds", str(args.seeds)]
    finished = subprocess.run(command, capture_output=True, text=True, check=False)
    if finished.returncode != 0:
        raise SystemExit(f"the DGL side failed:\n{finished.stderr[-3000:]}")
    dgl = json.loads(finished.stdout.strip().splitlines()[-1])
    load = max(load, os.getloadavg()[0])

    print(f"{graph!r}\nfanouts {args.fanouts} (every relation), batch {args.batch_size}, {args.threads} threads, "
          f"hidden {args.hidden}, heads {args.heads}, {args.epochs} epoch(s), {args.seeds} seed(s); load average up "
          f"to {load:.1f}")
    print("| measure | morphpipe | DGL 2.1 | ratio |\n|---|---|---|---|")
    print(f"| typed batches/s | {ours['batches_per_s']:.2f} | {dgl['batches_per_s']:.2f} | "
          f"{ours['batches_per_s'] / dgl['batches_per_s']:.2f}x |")
    print(f"| CPU ms per typed batch (all threads) | {1e3 * ours['cpu_s_per_batch']:.1f} | "
          f"{1e3 * dgl['cpu_s_per_batch']:.1f} | {dgl['cpu_s_per_batch'] / ours['cpu_s_per_batch']:.2f}x |")
    for kind in args.models.split(","):
        mine, theirs = min(ours[kind]["epoch_s"]), min(dgl[kind]["epoch_s"])
        print(f"| {kind} epoch s | {mine:.2f} | {theirs:.2f} | {theirs / mine:.2f}x |")
        print(f"| {kind} test accuracy ({args.seeds} seed{'s' if args.seeds > 1 else ''}) | "
              f"{mean_std(ours[kind]['test_accuracy'])} | {mean_std(dgl[kind]['test_accuracy'])} | |")
    document = {"date": str(date.today()), "machine": platform.processor() or platform.machine(), "load": load,
                "dataset": graph.name, "settings": {k: v for k, v in vars(args).items() if k != "dgl_python"},
                "morphpipe": ours, "dgl": dgl}
    Path(args.out).write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
