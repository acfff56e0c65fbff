"""Where the GCN training step's time goes, and what removing each candidate cost could save (issue 23, the
remaining step costs).

Two tables on a preset (`--dataset`, default `default`; batch 1024, fanouts 15,10,5, GCN 128 -> 16 -> 16 -> classes,
features cast to float32):
- whole steps, the configurations taking turns step by step (so a changing machine load falls on all alike):
  the legacy step (`LEGACY_STEP`) and the fused step, each with the layers' order as the cost model chooses it and
  with `gcn.order=project_first` forced (the first layer then projects its 128-wide input before aggregating), the
  fused step with `gcn.order=aggregate_first` forced (every layer aggregates first, projecting in the pass), and
  the fused step with its projection apart from the aggregation (`fused_projection=False`: the fused step before
  `spmm_sum_project`);
- the first layer's parts, taking turns call by call: the 128-wide fused aggregation it runs today, the same
  aggregation with the sources sorted (the same bytes read in order: what perfect locality would leave), the
  projection and its weight gradient, the aggregation and projection in one pass (the fused step's; and without
  writing the aggregate, as in eval), the normalisation (`gcn_scales`), and the parts of the project-first order
  (projection of every source, 16-wide aggregation, the transposed structure, the backward over it).
Median milliseconds; the load is printed beside each table.

Usage: python scripts/bench_gcn_step.py [--dataset default] [--threads 1,2] [--steps 20] [--repeats 15]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

from bench_train_step import FUSED_STEP, LEGACY_STEP, new_step, sample_batches  # this script's folder is on sys.path
import torch

from morphpipe import native
from morphpipe.data import load_dataset
from morphpipe.ops import choice, gcn_scales
from morphpipe.ops.step_variant import StepVariant, use_step_variant
from morphpipe.profiler.hardware import HardwareFacts

STEP_CONFIGURATIONS = {
    "legacy": (LEGACY_STEP, {}),
    "fused": (FUSED_STEP, {}),
    "fused, projection apart": (StepVariant(fused_projection=False), {}),
    "legacy, project first": (LEGACY_STEP, {"gcn.order": "project_first"}),
    "fused, project first": (FUSED_STEP, {"gcn.order": "project_first"}),
    "fused, aggregate first": (FUSED_STEP, {"gcn.order": "aggregate_first"}),
}


def load() -> str:
    return f"{os.getloadavg()[0]:.1f}"


def time_steps(graph, batches: list, steps: int) -> dict[str, float]:
    """Median seconds per step of each configuration, taking turns; the first round warms each up."""
    trainers = {}
    for name, (variant, forced) in STEP_CONFIGURATIONS.items():
        with use_step_variant(variant), choice.force_choices(forced):
            trainers[name] = new_step("gcn", graph)
    seconds: dict[str, list[float]] = {name: [] for name in STEP_CONFIGURATIONS}
    for i in range(steps + 1):
        batch = batches[i % len(batches)]
        for name, (variant, forced) in STEP_CONFIGURATIONS.items():
            with use_step_variant(variant), choice.force_choices(forced):
                start = time.perf_counter()
                trainers[name](batch)
                if i:
                    seconds[name].append(time.perf_counter() - start)
    return {name: statistics.median(times) for name, times in seconds.items()}


def layer_parts(batch, width: int) -> dict[str, Callable[[], object]]:
    """The first layer's parts in both orders, as the fused step runs them (scales from `gcn_scales`)."""
    ops = native.ops()
    block, x = batch.blocks[0], batch.x.float().contiguous()
    src_scale, dst_scale = gcn_scales(block)
    weight = torch.randn(width, x.shape[1])
    aggregated = ops.spmm_sum(block.indptr, block.indices, x, None, src_scale, dst_scale, True, None)
    projected = x @ weight.t()
    grad_dst = torch.randn(block.num_dst, width)
    grad_src = torch.randn(block.num_src, width)
    transposed = ops.csr_transpose(block.indptr, block.indices, block.num_src)
    sorted_sources = torch.sort(block.indices).values
    return {
        "aggregate 128 wide (today's order)":
            lambda: ops.spmm_sum(block.indptr, block.indices, x, None, src_scale, dst_scale, True, None),
        "  same, sources sorted (locality floor)":
            lambda: ops.spmm_sum(block.indptr, sorted_sources, x, None, src_scale, dst_scale, True, None),
        "project destinations (mm)": lambda: aggregated @ weight.t(),
        "aggregate 128 wide and project in one pass (spmm_sum_project)":
            lambda: ops.spmm_sum_project(block.indptr, block.indices, x, None, src_scale, dst_scale, True, weight, None),
        "  same, aggregate not written (no weight gradient: eval)":
            lambda: ops.spmm_sum_project(block.indptr, block.indices, x, None, src_scale, dst_scale, True, weight, None,
                                         False),
        "weight gradient over destinations (mm)": lambda: grad_dst.t() @ aggregated,
        "gcn_scales": lambda: gcn_scales(block),
        "project every source (mm, project first)": lambda: x @ weight.t(),
        "weight gradient over sources (mm, project first)": lambda: grad_src.t() @ x,
        "aggregate 16 wide (project first)":
            lambda: ops.spmm_sum(block.indptr, block.indices, projected, None, src_scale, dst_scale, True, None),
        "csr_transpose (project first's backward)": lambda: ops.csr_transpose(block.indptr, block.indices,
                                                                             block.num_src),
        "backward over the transpose, 16 wide (project first)":
            lambda: ops.spmm_sum(transposed[0], transposed[1], grad_dst, None, dst_scale, src_scale, True, None),
    }


def time_parts(parts: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median seconds of each part, taking turns call by call after one warm-up round."""
    seconds: dict[str, list[float]] = {name: [] for name in parts}
    for i in range(repeats + 1):
        for name, part in parts.items():
            start = time.perf_counter()
            part()
            if i:
                seconds[name].append(time.perf_counter() - start)
    return {name: statistics.median(times) for name, times in seconds.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="default", help="preset or dataset path (e.g. bench-1m)")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per configuration")
    parser.add_argument("--repeats", type=int, default=15, help="timed calls per layer part")
    args = parser.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    graph = load_dataset(args.dataset)
    batches = sample_batches(graph, 8)
    block = batches[0].blocks[0]
    print(f"# {HardwareFacts.detect().cpu_model}, {os.cpu_count()} cpus, torch {torch.__version__}; CPU kernels "
          f"{native.cpu_capability_info()}; {args.dataset}, first block: {block.num_src} sources, {block.num_dst} destinations, "
          f"{block.nnz} edges")
    print("| threads | load | " + " | ".join(f"{name} ms" for name in STEP_CONFIGURATIONS)
          + " | legacy / fused | legacy / fused (projection apart) | legacy / fused (project first) |")
    print("|---" * (len(STEP_CONFIGURATIONS) + 5) + "|")
    for count in threads:
        torch.set_num_threads(count)
        before = load()
        step = time_steps(graph, batches, args.steps)
        print(f"| {count} | {before}-{load()} | " + " | ".join(f"{s * 1e3:.1f}" for s in step.values())
              + f" | {step['legacy'] / step['fused']:.2f}x"
              + f" | {step['legacy'] / step['fused, projection apart']:.2f}x"
              + f" | {step['legacy, project first'] / step['fused, project first']:.2f}x |")
    parts = layer_parts(batches[0], width=16)
    print()
    print("| first layer part | " + " | ".join(f"{count} thread{'s' if count > 1 else ''} ms" for count in threads)
          + " |")
    print("|---" * (len(threads) + 1) + "|")
    columns, loads = [], []
    for count in threads:
        torch.set_num_threads(count)
        before = load()
        columns.append(time_parts(parts, args.repeats))
        loads.append(f"{before}-{load()}")
    for name in parts:
        print(f"| {name} | " + " | ".join(f"{column[name] * 1e3:.2f}" for column in columns) + " |")
    print("| (load) | " + " | ".join(loads) + " |")


if __name__ == "__main__":
    main()
