"""A measured training run on a graph whose features do not fit in RAM (issue 21): profile and plan the workload,
then train one epoch of N batches with the features read through the feature store behind the host cache the plan
chose (or `--cache-mb`), and report batches/s, the cache's hit ratio, the disk's read rate and IOPS (the device's
and the store's own, from its read timer, with the per-read latency), peak RSS, and the predicted against the
measured epoch.

The epoch is cut to `--batches` batches by training on that many batches' worth of the training split (a seeded
random subset), so that a run on a papers100M-shaped graph (1,193 batches per full epoch) takes minutes; validation
uses a seeded subset of `--eval-nodes` validation nodes. Not run in CI: it needs a giant dataset on disk.

    python scripts/bench_giant_train.py /work/bench_scratch/papers100m-like --batches 200
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import resource
import sys
import time
from pathlib import Path

import torch

from morphpipe import native
from morphpipe.data import load_dataset
from morphpipe.executor.trainer import Trainer
from morphpipe.nn import build_model
from morphpipe.profiler.profiler import Profiler
from morphpipe.profiler.resident import PeakResident
from morphpipe.scheduler.planning import plan_from_profile

GIB = 1 << 30


def process_read_bytes() -> int:
    """Bytes this process caused to be read from storage (/proc/self/io), page-cache hits excluded."""
    with open("/proc/self/io", encoding="ascii") as io:
        return next(int(line.split()[1]) for line in io if line.startswith("read_bytes:"))


def device_reads(path: Path) -> tuple[int, int]:
    """(read requests completed, sectors read) of the block device holding `path`, from /proc/diskstats."""
    device = os.stat(path).st_dev
    major, minor = os.major(device), os.minor(device)
    with open("/proc/diskstats", encoding="ascii") as stats:
        rows = [line.split() for line in stats]
    exact = [row for row in rows if int(row[0]) == major and int(row[1]) == minor]
    if not exact:  # a partition of a whole disk, or a virtual filesystem: the first whole disk of that major
        exact = [row for row in rows if int(row[0]) == major]
    row = exact[0]
    return int(row[3]), int(row[5])


def cpu_model() -> str:
    with open("/proc/cpuinfo", encoding="ascii", errors="replace") as info:
        return next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), "unknown")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset", help="graph directory (features.npy stays on disk)")
    parser.add_argument("--batches", type=int, default=200, help="batches in the measured epoch (default 200)")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--fanouts", default="15,10,5")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--model", default="sage")
    parser.add_argument("--cache-mb", type=float, default=None,
                        help="host cache of hot feature rows (MB; default: the size the plan chooses)")
    parser.add_argument("--memory-budget-gib", type=float, default=16.0,
                        help="memory the run may hold: topology, labels, splits, the batches in flight, a training "
                             "step's peak and the cache (default 16)")
    parser.add_argument("--eval-nodes", type=int, default=8192, help="validation nodes evaluated after the epoch")
    parser.add_argument("--steps", type=int, default=4, help="timed steps per profiler measurement")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    fanouts = [int(f) for f in args.fanouts.split(",")]

    started = time.perf_counter()
    with PeakResident() as rss:
        graph = load_dataset(args.dataset, features_on_disk=True)
        loaded_s = time.perf_counter() - started
        generator = torch.Generator().manual_seed(args.seed)
        train = graph.train_idx[torch.randperm(graph.train_idx.numel(), generator=generator)]
        val = graph.val_idx[torch.randperm(graph.val_idx.numel(), generator=generator)]
        graph = dataclasses.replace(graph, train_idx=train[:args.batches * args.batch_size].clone(),
                                    val_idx=val[:args.eval_nodes].clone(), test_idx=val[:0].clone())
        native.prepare()
        t0 = time.perf_counter()
        profiler = Profiler(graph, model=args.model, fanouts=fanouts, batch_size=args.batch_size, hidden=args.hidden,
                            device="cpu", steps=args.steps, seed=args.seed, progress=True,
                            memory_budget=int(args.memory_budget_gib * GIB))
        profile = profiler.run()
        fixed_cache = None if args.cache_mb is None else int(args.cache_mb * 1e6)
        plan = plan_from_profile(profile, seed=args.seed, cache_bytes=fixed_cache)
        store = graph.open_feature_store(plan.tiering.cache_bytes if plan.tiering is not None else fixed_cache or 0)
        profile_s = time.perf_counter() - t0
        print("plan:\n  " + plan.describe().replace("\n", "\n  "), flush=True)
        torch.manual_seed(args.seed)
        model = build_model(args.model, graph.feature_dim, graph.num_classes, num_layers=len(fanouts), hidden=args.hidden)
        store.reset_counters()
        read_bytes0, (reads0, sectors0) = process_read_bytes(), device_reads(Path(args.dataset))
        with Trainer(graph, model, plan, fanouts=fanouts, batch_size=args.batch_size, seed=args.seed,
                     progress=True) as trainer:
            t0 = time.perf_counter()
            (stats,) = trainer.fit(1)
            trained_s = time.perf_counter() - t0
        counters = store.counters()
        read_bytes, (reads, sectors) = process_read_bytes() - read_bytes0, device_reads(Path(args.dataset))
        reads, sectors = reads - reads0, sectors - sectors0
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    latency = counters.read_latency_s(store.io_threads)
    result = {
        "dataset": str(args.dataset), "nodes": graph.num_nodes, "edges": graph.num_edges,
        "features_gib": graph.num_nodes * graph.feature_dim * graph.features.element_size() / GIB
        if graph.features is not None else None,
        "cpu": cpu_model(), "cores": os.cpu_count(), "torch": torch.__version__, "python": platform.python_version(),
        "load_average": os.getloadavg(), "batches": stats.batches, "batch_size": args.batch_size,
        "fanouts": fanouts, "model": f"{args.model} {len(fanouts)}x{args.hidden}", "cache_mb": store.cache_bytes / 1e6,
        "predicted_hit_ratio": plan.tiering.hit_ratio if plan.tiering is not None else None,
        "load_s": loaded_s, "profile_and_plan_s": profile_s, "epoch_s": stats.epoch_s, "fit_s": trained_s,
        "batches_per_s": stats.batches / stats.epoch_s, "predicted_epoch_s": plan.predicted_epoch_s,
        "loss": stats.loss, "val_acc": stats.val_acc, "eval_nodes": int(graph.val_idx.numel()),
        "hit_ratio": counters.hit_ratio, "store_counters": dataclasses.asdict(counters),
        "process_read_gib": read_bytes / GIB, "process_read_gb_per_s": read_bytes / stats.epoch_s / 1e9,
        "device_reads": reads, "device_read_gib": sectors * 512 / GIB, "device_iops": reads / stats.epoch_s,
        # The store's read timer: preads per second while its reads were in flight, and each pread's latency.
        "store_read_s": counters.read_seconds, "store_read_share_of_epoch": counters.read_seconds / stats.epoch_s,
        "store_iops": counters.reads_per_second, "store_read_latency_ms": latency * 1e3 if latency else None,
        "profiled_reads_per_s": profile.disk.reads_per_s_at(store.cache_bytes) if profile.disk else None,
        "profiled_reads_per_s_by_cache_mb": {f"{size / 1e6:.1f}": profile.disk.reads_per_s_at(size)
                                             for size, _ in profile.disk.hit_curve} if profile.disk else None,
        "profiled_reads_per_miss": profile.disk.reads_per_miss_at(store.cache_bytes) if profile.disk else None,
        "reads_per_miss": counters.reads / counters.misses if counters.misses else None,
        "profiled_reads_per_miss_by_cache_mb": {f"{size / 1e6:.1f}": profile.disk.reads_per_miss_at(size)
                                                for size, _ in profile.disk.hit_curve} if profile.disk else None,
        "cpu_batching_timed_reads": dataclasses.asdict(profiler.timed_batching_reads)
        if profiler.timed_batching_reads is not None else None,
        "peak_rss_gib": peak_rss / GIB, "peak_rss_anon_gib": rss.peak["anon"] / GIB,
        "peak_rss_file_gib": rss.peak["file"] / GIB,
    }
    print(json.dumps(result, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
