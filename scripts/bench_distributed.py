"""Distributed training benchmark: 1 rank vs 2 ranks measured, heterogeneous virtual ranks, a simulated cluster.

(a) `morphpipe train --nproc N --auto` on the default preset, N = 1 (pinned to one core with
    taskset) and N = 2 (the two cores split, one per rank): each rank profiles its own core
    and plans; measured epochs beside the predicted ones.
(b) Two virtual ranks, rank 1's phases twice as long, the real Executor on virtual devices with
    steps synchronised: even vs weighted split, measured vs predicted (median of repeats).
(c) A simulated cluster from a profile of this machine, re-read for 16 cores: 4 nodes, two of
    them with 8 cores; even vs weighted split (`morphpipe simulate --node`).

usage: python scripts/bench_distributed.py [--epochs 2] [--fanouts 10,5] [--repeats 3] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from morphpipe.data import load_dataset
from morphpipe.commands.simulate import format_cluster
from morphpipe.distributed.cluster import NodeType, predict_cluster
from morphpipe.distributed.virtual import run_virtual_cluster
from morphpipe.profiler import Profile
from morphpipe.profiler.profiler import Profiler
from morphpipe.scheduler.whatif import what_if


def train_ranks(nproc: int, args: argparse.Namespace, out: Path) -> dict:
    """One `morphpipe train --nproc` run; its stats JSON."""
    stats = out / f"train_{nproc}.json"
    command = [sys.executable, "-m", "morphpipe", "train", "default", "--auto", "--nproc", str(nproc),
               "--fanouts", args.fanouts, "--threads", "1", "--steps", str(args.steps), "--epochs", str(args.epochs),
               "--no-progress", "--stats-json", str(stats)]
    if nproc == 1 and shutil.which("taskset"):
        command = ["taskset", "-c", "0", *command]
    print("$ " + " ".join(command), flush=True)
    subprocess.run(command, check=True)
    return json.loads(stats.read_text())


def part_a(args: argparse.Namespace, out: Path) -> dict:
    results = {n: train_ranks(n, args, out) for n in (1, 2)}
    print("\n[a] default preset, GraphSAGE fanouts " + args.fanouts + ", global batch 1024, 1 core per rank")
    print(f"{'ranks':>5}  {'local batches':>13}  {'predicted s':>11}  {'epoch 1 s':>9}  {'epoch 2+ s':>10}  "
          f"{'test acc':>8}")
    for n, result in results.items():
        epochs = [e["epoch_s"] for e in result["epochs"]]
        later = statistics.mean(epochs[1:]) if len(epochs) > 1 else epochs[0]
        print(f"{n:>5}  {'/'.join(map(str, result['local_batches'])):>13}  {result['predicted_epoch_s']:>11.2f}  "
              f"{epochs[0]:>9.2f}  {later:>10.2f}  {result['test_acc']:>8.4f}")
    one = results[1]["epochs"][-1]["epoch_s"]
    two = results[2]["epochs"][-1]["epoch_s"]
    print(f"last epoch: 1 rank {one:.2f} s, 2 ranks {two:.2f} s -> {one / two:.2f}x")
    return {str(n): r for n, r in results.items()}


def part_b(repeats: int) -> dict:
    def synthetic(factor: float) -> Profile:
        return Profile.synthetic(t_cb=0.24 * factor, t_m=0.08 * factor, t_gb=0.096 * factor, t_dma=0.032 * factor,
                                 num_batches=24, cores=2, workload={"batch_size": 64})

    profiles = [synthetic(1.0), synthetic(2.0)]
    print("\n[b] virtual GPU ranks (rank 1's phases 2x as long), 24 steps of 64 seeds, steps synchronised")
    print(f"{'split':>8}  {'local batches':>13}  {'predicted s':>11}  {'measured s (median)':>19}  {'meas/pred':>9}")
    rows = {}
    for mode in ("even", "weighted"):
        prediction = predict_cluster(profiles, 24 * 64, 64, mode)
        measured = statistics.median(run_virtual_cluster(profiles, prediction).epoch_s for _ in range(repeats))
        rows[mode] = {"predicted_s": prediction.epoch_s, "measured_s": measured,
                      "local_batches": list(prediction.split.local_batches)}
        print(f"{mode:>8}  {'/'.join(map(str, prediction.split.local_batches)):>13}  {prediction.epoch_s:>11.3f}  "
              f"{measured:>19.3f}  {measured / prediction.epoch_s:>9.3f}")
    print(f"weighted over even: predicted {rows['even']['predicted_s'] / rows['weighted']['predicted_s']:.3f}x, "
          f"measured {rows['even']['measured_s'] / rows['weighted']['measured_s']:.3f}x")
    return rows


def part_c(args: argparse.Namespace, out: Path) -> dict:
    graph = load_dataset("default", progress=False)
    fanouts = [int(f) for f in args.fanouts.split(",")]
    profile = Profiler(graph, model="sage", fanouts=fanouts, batch_size=1024, device="cpu", thread_counts=[1, 2],
                       steps=args.steps, progress=False).run()
    path = out / "default_profile.json"
    profile.save(path)
    nodes = [NodeType(path, 2, 16), NodeType(path, 2, 8)]
    profiles = [what_if(profile, 16).profile] * 2 + [what_if(profile, 8).profile] * 2
    seeds = len(graph.train_idx)
    even = predict_cluster(profiles, seeds, 1024, "even")
    weighted = predict_cluster(profiles, seeds, 1024, "weighted", throughputs=even.throughputs)
    print(f"\n[c] simulated cluster from this machine's profile (default preset, fanouts {args.fanouts}, CPU-only), "
          "re-read for 16 and 8 cores")
    print(format_cluster(nodes, even, weighted))
    return {"even_s": even.epoch_s, "weighted_s": weighted.epoch_s, "even_batches": list(even.split.local_batches),
            "weighted_batches": list(weighted.split.local_batches)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--fanouts", default="10,5")
    parser.add_argument("--steps", type=int, default=4, help="timed steps per profiling measurement")
    parser.add_argument("--repeats", type=int, default=3, help="virtual epochs per split in part (b)")
    parser.add_argument("--parts", default="a,b,c")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    out = Path(tempfile.mkdtemp(prefix="bench_distributed_"))
    parts = set(args.parts.split(","))
    report = {}
    if "a" in parts:
        report["a"] = part_a(args, out)
    if "b" in parts:
        report["b"] = part_b(args.repeats)
    if "c" in parts:
        report["c"] = part_c(args, out)
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
