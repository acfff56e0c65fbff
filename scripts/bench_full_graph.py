"""Benchmark: full-graph layers on plain CSR vs the community decomposition (AdaptGear), and exact layer-wise
inference against sampled inference.

Part 1, kernels (float32, whole-graph blocks, width 128): per graph, the time to partition (METIS at
16 nodes and paired up for 32/64, or breadth-first growth), the share of edges inside communities,
the mean aggregation forward on CSR and on each decomposition, one SAGEConv 128->256 forward +
backward on each, and what the selector (`graph.kernel`) keeps for the aggregation. Graphs: the
`default` community preset; a planted-partition graph with dense communities of 32 nodes (the case
AdaptGear is made for); a 200k-node power-law graph.
Part 2, inference (GraphSAGE 3 x 256, fanouts 15,10,5): on `default` after one training epoch and on
`bench-1m` untrained: exact layer-wise inference of every node (whole graph, selector on) against
sampled inference of the test split (batch 4096, seed 0): wall time and peak resident-set growth
(high-water mark reset through /proc/self/clear_refs before each), and on `default` the test
accuracy of both and of sampled inference with other sampling seeds.
Time: best of `--repeats` runs after a warm-up. Prints markdown and writes JSON. Not a test.
Usage: python scripts/bench_full_graph.py [--parts kernels inference] [--repeats 3] [--out bench_full_graph.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from morphpipe import ops
from morphpipe.data import GraphStore, load_dataset
from morphpipe.data.generators import POWER_LAW, GeneratorSpec, generate
from morphpipe.nn.evaluate import accuracy, full_accuracy
from morphpipe.nn.layerwise import layerwise_inference
from morphpipe.nn import SAGEConv, build_model
from morphpipe.ops import community, graph_kernel
from morphpipe.ops.community import GraphBlock
from morphpipe.sampling.minibatch import Block

WIDTH, OUT = 128, 256
FANOUTS = [15, 10, 5]
POWER_SPEC = GeneratorSpec(POWER_LAW, num_nodes=200_000, avg_degree=20, feature_dim=WIDTH, num_classes=8)


def best_of(fn: Callable[[], object], repeats: int) -> float:
    """Best wall seconds of `repeats` runs after one warm-up."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def planted_graph(num_nodes: int, size: int, p_in: float, inter_degree: int, seed: int) -> tuple[torch.Tensor, ...]:
    """Shuffled communities of `size` nodes, each pair inside joined with probability `p_in` (both directions),
    plus `inter_degree` random in-edges per node; CSC."""
    rng = np.random.default_rng(seed)
    members = rng.permutation(num_nodes).reshape(-1, size)
    a = np.repeat(members, size, axis=1).ravel()
    b = np.tile(members, (1, size)).ravel()
    keep = (a < b) & (rng.random(a.size) < p_in)
    src = np.concatenate([a[keep], b[keep], rng.integers(0, num_nodes, num_nodes * inter_degree)])
    dst = np.concatenate([b[keep], a[keep], np.repeat(np.arange(num_nodes), inter_degree)])
    order = np.lexsort((src, dst))
    indptr = np.zeros(num_nodes + 1, dtype=np.int64)
    indptr[1:] = np.cumsum(np.bincount(dst, minlength=num_nodes))
    return torch.from_numpy(indptr), torch.from_numpy(src[order].astype(np.int64))


def kernel_rows(name: str, indptr: torch.Tensor, indices: torch.Tensor, method: str, repeats: int) -> dict:
    """Partition, aggregation and SAGE-layer timings of one graph, CSR vs each decomposition, and the selector's pick."""
    num_nodes = indptr.numel() - 1
    block = GraphBlock.of(indptr, indices, method=method)
    plain = Block(block.indptr, block.indices, num_nodes, num_nodes)
    x = torch.randn(num_nodes, WIDTH)
    row: dict = {"graph": name, "nodes": num_nodes, "edges": block.nnz, "method": method, "options": {}}
    for size in graph_kernel.COMMUNITY_SIZES:
        start = time.perf_counter()
        decomposition = block.decomposition(size)
        row["options"][graph_kernel.option_name(size)] = {
            "partition_s": time.perf_counter() - start, "communities": decomposition.num_communities,
            "intra_fraction": decomposition.intra_fraction()}
    row["options"]["csr"] = {}
    torch.manual_seed(0)
    conv = SAGEConv(WIDTH, OUT)
    upstream = torch.randn(num_nodes, OUT)
    h = x.clone().requires_grad_(True)
    for option in graph_kernel.OPTIONS:
        with ops.force_choices({"graph.kernel": option}):
            with torch.no_grad():
                row["options"][option]["aggregate_s"] = best_of(lambda: ops.aggregate(block, x, "mean"), repeats)

            def layer() -> None:
                conv(block, h).backward(upstream)

            row["options"][option]["sage_fwd_bwd_s"] = best_of(layer, repeats)
    with torch.no_grad():
        reference = ops.aggregate(plain, x, "mean")
    ops.clear_choices()
    chosen = ops.aggregate(block, x, "mean")
    record = [r for r in ops.recorded_choices() if r.decision == "graph.kernel"][-1]
    row["selector"] = {"chosen": record.chosen, "timed_s": dict(record.costs)}
    row["max_abs_diff_vs_csr"] = float((chosen - reference).abs().max())
    return row


def rss_bytes(field: str) -> int:
    """VmRSS or VmHWM of this process in bytes (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def peak_growth(fn: Callable[[], object]) -> tuple[object, float, int]:
    """`fn()`'s result, wall seconds and resident-set high-water growth over the RSS before it."""
    Path("/proc/self/clear_refs").write_text("5")
    before = rss_bytes("VmRSS")
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start, rss_bytes("VmHWM") - before


def inference_rows(dataset: str, train_epochs: int) -> dict:
    """Exact layer-wise inference vs sampled inference (time, peak memory, test accuracy) on one preset."""
    from morphpipe.executor import Trainer
    from morphpipe.profiler import Profile
    from morphpipe.sampling import batches_per_epoch
    from morphpipe.scheduler import plan_from_profile

    graph = load_dataset(dataset, progress=False)
    torch.manual_seed(0)
    model = build_model("sage", graph.feature_dim, graph.num_classes, num_layers=len(FANOUTS))
    row: dict = {"dataset": dataset, "nodes": graph.num_nodes, "edges": graph.num_edges, "trained_epochs": 0}
    if train_epochs:
        batches = batches_per_epoch(len(graph.train_idx), 1024)
        plan = plan_from_profile(Profile.synthetic(t_cb=0.004, t_m=0.006, num_batches=batches, cores=2), gbs=4)
        with Trainer(graph, model, plan, fanouts=FANOUTS, batch_size=1024, progress=False,
                     log=lambda line: None) as trainer:
            start = time.perf_counter()
            trainer.fit(train_epochs, validate=False)
            row["train_s"] = time.perf_counter() - start
        row["trained_epochs"] = train_epochs
    block = GraphBlock.of(graph.indptr, graph.indices, method="bfs" if graph.num_nodes > 500_000 else "auto")
    messages: list[str] = []
    ops.clear_choices()
    logits, row["full_s"], row["full_peak_bytes"] = peak_growth(
        lambda: layerwise_inference(model, graph, graph_block=block, progress=False, log=messages.append))
    row["full_log"] = messages
    row["full_choices"] = [r.as_dict() for r in ops.recorded_choices() if r.decision == "graph.kernel"]
    test = graph.test_idx
    row["full_test_acc"] = float((logits[test].argmax(1) == graph.labels[test]).float().mean())
    start = time.perf_counter()
    again = full_accuracy(model, graph, test, graph_block=block, progress=False)
    row["full_again_s"] = time.perf_counter() - start
    assert abs(again - row["full_test_acc"]) < 1e-6, "exact inference is deterministic"
    sampled, row["sampled_s"], row["sampled_peak_bytes"] = peak_growth(
        lambda: accuracy(model, graph, test, FANOUTS, batch_size=4096, seed=0))
    row["sampled_test_acc"] = sampled
    row["sampled_test_acc_other_seeds"] = [accuracy(model, graph, test, FANOUTS, batch_size=4096, seed=seed)
                                           for seed in (1, 2)] if train_epochs else []
    return row


def fmt_ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}"


def report(kernels: list[dict], inference: list[dict]) -> str:
    lines = []
    if kernels:
        lines += ["| graph | nodes / edges | kernel | partition s | communities | edges inside | mean aggr. ms | "
                  "SAGE fwd+bwd ms |", "|---|---|---|---|---|---|---|---|"]
        for row in kernels:
            for option in graph_kernel.OPTIONS:
                o = row["options"][option]
                inside = f"{o['intra_fraction']:.1%}" if "intra_fraction" in o else ""
                part = f"{o['partition_s']:.1f}" if "partition_s" in o else ""
                lines.append(f"| {row['graph']} ({row['method']}) | {row['nodes']:,} / {row['edges']:,} | {option} | "
                             f"{part} | {o.get('communities', '')} | {inside} | {fmt_ms(o['aggregate_s'])} | "
                             f"{fmt_ms(o['sage_fwd_bwd_s'])} |")
            lines.append(f"| | | selector keeps **{row['selector']['chosen']}** (max abs diff vs CSR "
                         f"{row['max_abs_diff_vs_csr']:.1e}) | | | | | |")
    if inference:
        lines += ["", "| dataset | trained | exact layer-wise: all nodes s / peak MiB / test acc | "
                  "sampled 15,10,5: test split s / peak MiB / test acc (seed 0; seeds 1, 2) | selector |",
                  "|---|---|---|---|---|"]
        for row in inference:
            choices = ", ".join(f"{c['signature'][0]} w{c['signature'][4]} -> {c['chosen']}" for c in row["full_choices"])
            lines.append(
                f"| {row['dataset']} ({row['nodes']:,} nodes) | {row['trained_epochs']} epoch(s) | "
                f"{row['full_s']:.1f} / {row['full_peak_bytes'] / 2**20:.0f} / {row['full_test_acc']:.4f} "
                f"(again, selector decided: {row['full_again_s']:.1f} s) | "
                f"{row['sampled_s']:.1f} / {row['sampled_peak_bytes'] / 2**20:.0f} / {row['sampled_test_acc']:.4f}, "
                + ", ".join(f"{a:.4f}" for a in row["sampled_test_acc_other_seeds"]) + f" | {choices} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", nargs="+", default=["kernels", "inference"], choices=["kernels", "inference"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--graphs", nargs="+", default=["default", "planted", "power-law"],
                        choices=["default", "planted", "power-law"], help="graphs of the kernel part")
    parser.add_argument("--planted-nodes", type=int, default=65_536)
    parser.add_argument("--power-law-nodes", type=int, default=POWER_SPEC.num_nodes)
    parser.add_argument("--inference", nargs="+", default=["default", "bench-1m"])
    parser.add_argument("--out", type=Path, default=Path("bench_full_graph.json"))
    args = parser.parse_args()
    os.environ.setdefault(community.CACHE_DIR_ENV, str(Path(tempfile.gettempdir()) / "morphpipe-bench-communities"))
    started = time.perf_counter()
    kernels, inference = [], []
    if "kernels" in args.parts:
        if "default" in args.graphs:
            default = load_dataset("default", progress=False)
            kernels.append(kernel_rows("default", default.indptr, default.indices, "auto", args.repeats))
            print(report(kernels[-1:], []), flush=True)
        if "planted" in args.graphs:
            indptr, indices = planted_graph(args.planted_nodes, 32, p_in=0.5, inter_degree=4, seed=0)
            kernels.append(kernel_rows(f"planted-32 ({args.planted_nodes // 1024}k)", indptr, indices, "auto",
                                       args.repeats))
            print(report(kernels[-1:], []), flush=True)
        if "power-law" in args.graphs:
            with tempfile.TemporaryDirectory() as folder:
                power = GraphStore.load(generate(POWER_SPEC.with_overrides(num_nodes=args.power_law_nodes),
                                                 Path(folder) / "power", progress=False))
                kernels.append(kernel_rows(f"power-law-{args.power_law_nodes // 1000}k", power.indptr,
                                           power.indices, "auto", args.repeats))
            print(report(kernels[-1:], []), flush=True)
    if "inference" in args.parts:
        for dataset in args.inference:
            inference.append(inference_rows(dataset, train_epochs=1 if dataset == "default" else 0))
            print(report([], inference[-1:]), flush=True)
    document = {"machine": platform.processor() or platform.machine(), "torch": torch.__version__,
                "threads": torch.get_num_threads(), "load_average": os.getloadavg(),
                "metis": community.metis_available(), "total_s": time.perf_counter() - started,
                "kernels": kernels, "inference": inference}
    args.out.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    print("\n" + report(kernels, inference))
    print(f"\ntotal {document['total_s']:.0f} s; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
