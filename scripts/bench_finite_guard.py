"""What the non-finite guard costs a training step: the step with and without its checks, on the same batches.

The guard (`morphpipe.nn.finite_guard`) adds per step one min/max and clamp of the labels, one fused
norm over the gradients and one host sync. "without" runs the same TrainStep with a guard whose
checks are no-ops. The two alternate step by step (ABAB...) so that a busy machine's drift hits both
alike; the median per-step time of each and their difference are printed.

Usage: python scripts/bench_finite_guard.py [--preset default] [--model sage] [--steps 40] [--threads 2]
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import morphpipe  # noqa: F401  (sets the OpenMP wait policy before torch loads)
import torch

from morphpipe.data import load_dataset
from morphpipe.nn.train_step import TrainStep, make_optimizer
from morphpipe.nn import build_model
from morphpipe.nn.finite_guard import FiniteGuard
from morphpipe.sampling import CpuBatcher

FANOUTS = [15, 10, 5]
BATCH_SIZE = 1024


class NoChecks(FiniteGuard):
    """The guard with its checks taken out: the step as it was before the guard."""

    @staticmethod
    def safe_labels(labels: torch.Tensor, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
        return labels, torch.tensor(True)

    def allows_update(self, **_: object) -> bool:
        return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="default")
    parser.add_argument("--model", default="sage")
    parser.add_argument("--steps", type=int, default=40, help="timed steps of each variant")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    graph = load_dataset(args.preset)
    batches = []
    with CpuBatcher(graph, FANOUTS, BATCH_SIZE, num_threads=2, seed=0) as batcher:
        for batch in batcher:
            batches.append(batch)
            if len(batches) == 8:
                break
    steps = {}
    for name, guard in (("with", FiniteGuard()), ("without", NoChecks())):
        torch.manual_seed(0)
        model = build_model(args.model, graph.feature_dim, graph.num_classes)
        steps[name] = TrainStep(model, make_optimizer(model.parameters(), 3e-3, "cpu"), guard=guard)
        steps[name](batches[0])  # warm-up
    seconds: dict[str, list[float]] = {name: [] for name in steps}
    for i in range(args.steps):
        batch = batches[1 + i % (len(batches) - 1)]
        for name in (("with", "without") if i % 2 == 0 else ("without", "with")):
            start = time.perf_counter()
            steps[name](batch)
            seconds[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    load = os.getloadavg()
    print(f"{platform.node()}, {os.cpu_count()} cpus, load average {load[0]:.1f}, torch {torch.__version__}, "
          f"{args.threads} threads; {args.preset} preset, {args.model}, batch {BATCH_SIZE}, fanouts {FANOUTS}, "
          f"{args.steps} steps each, alternating")
    for name, median in medians.items():
        print(f"  {name:>7} the guard: {median * 1000:8.1f} ms per step (median)")
    difference = medians["with"] - medians["without"]
    print(f"  difference: {difference * 1000:+.1f} ms ({difference / medians['without']:+.1%})")


if __name__ == "__main__":
    main()
