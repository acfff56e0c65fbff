"""SAGE's training step with the activation's backward fused into the next layer's mean (`morphpipe.ops.relu_mean`)
beside the same step with the separate ops (`BlockModel.forward`, the step as on main before it), in one process.

Two `TrainStep`s from the same seed train on the same pre-sampled batches of a preset, steps alternating (the
order flipping each round, so a changing machine load falls on both alike); per variant the median wall and
process-CPU seconds of a step (CPU time is not inflated by descheduling on a loaded machine).

Usage: python scripts/bench_sage_relu_mean.py [--preset default] [--threads 1,2] [--steps 20]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import morphpipe  # noqa: E402,F401  (sets the OpenMP wait policy before torch loads)
import torch  # noqa: E402

from bench_train_step import new_step, sample_batches  # noqa: E402
from morphpipe.data import load_dataset  # noqa: E402
from morphpipe.nn.base import BlockModel  # noqa: E402
from morphpipe.profiler.ceiling import isa_flags  # noqa: E402
from morphpipe.profiler.hardware import HardwareFacts  # noqa: E402

BATCHES = 6


def time_variants(graph, batches: list, steps: int) -> dict[str, dict[str, float]]:
    """Median wall and CPU seconds a step of each variant, after two warm-up rounds."""
    trainers = {"separate": new_step("sage", graph), "fused": new_step("sage", graph)}
    separate = trainers["separate"].model
    separate.forward = lambda blocks, x: BlockModel.forward(separate, blocks, x)
    seconds = {name: {"wall": [], "cpu": []} for name in trainers}
    for i in range(steps + 2):
        order = list(trainers) if i % 2 else list(reversed(trainers))
        for name in order:
            cpu, wall = time.process_time(), time.perf_counter()
            trainers[name](batches[i % len(batches)])
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            if i >= 2:
                seconds[name]["wall"].append(wall)
                seconds[name]["cpu"].append(cpu)
    return {name: {kind: statistics.median(values) for kind, values in by_kind.items()}
            for name, by_kind in seconds.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="default")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per variant and thread count")
    args = parser.parse_args()
    graph = load_dataset(args.preset)
    batches = sample_batches(graph, BATCHES)
    print(f"# {HardwareFacts.detect().cpu_model} ({' '.join(isa_flags())}), torch {torch.__version__}, "
          f"{args.preset}, SAGE 3x256, batch 1024, fanouts 15,10,5, {args.steps} steps each")
    print("| threads | load | separate CPU ms (wall ms) | fused CPU ms (wall ms) | CPU saved | wall ratio |")
    print("|---|---|---|---|---|---|")
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        load = os.getloadavg()[0]
        result = time_variants(graph, batches, args.steps)
        separate, fused = result["separate"], result["fused"]
        print(f"| {threads} | {load:.1f} | {separate['cpu'] * 1e3:.1f} ({separate['wall'] * 1e3:.1f}) | "
              f"{fused['cpu'] * 1e3:.1f} ({fused['wall'] * 1e3:.1f}) | {1 - fused['cpu'] / separate['cpu']:.1%} | "
              f"{separate['wall'] / fused['wall']:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
