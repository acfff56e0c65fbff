"""Benchmark: the Route 1 GPU batcher (UVA sampling and gathering, dual cache) on a CUDA machine.

Measures, on one graph (default: the `bench-1m` preset, fanouts 15,10,5, batch 1024):
1. pinned host-to-device copy bandwidth (cudaMemcpy from pinned memory: the PCIe limit), and the
   UVA gather bandwidth of `gather_rows` from the in-place registered feature matrix, for random
   rows (what sampling asks for) and consecutive rows, as a fraction of that limit (aim: >= 80%);
2. batches per second of the GpuBatcher without a cache versus the CpuBatcher at 1..16 threads
   (up to the usable cores) on the same seeds;
3. the GpuBatcher's batches per second for several cache budgets (fractions of the graph's bytes), with
   each backend of `--backends` (the CUDA kernels, and the torch path over zero-copy views).
Prints tables and writes JSON. Not a test; exits with a message on machines without CUDA.
Usage: python scripts/bench_gpu_batcher.py [--dataset bench-1m] [--batches 40] [--out bench_gpu_batcher.json]
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
from collections.abc import Iterator
from datetime import date

import torch

from morphpipe import native
from morphpipe.cores import usable_cores
from morphpipe.data import load_dataset
from morphpipe.sampling import GpuBatcher, MiniBatch
from morphpipe.sampling.cuda_support import cuda_problem
from morphpipe.sampling.pinning import HostPinning
from morphpipe.sampling.throughput import cpu_batcher_by_threads, measure_throughput, measurement_seeds


def cuda_seconds(action, repeats: int) -> float:
    """Mean seconds of `action` on the current stream, by CUDA events, after one warm-up call."""
    action()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        action()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / repeats


def h2d_bandwidth(nbytes: int, repeats: int) -> float:
    """Bytes per second of a copy from pinned host memory to the device."""
    host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    device = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    return nbytes / cuda_seconds(lambda: device.copy_(host, non_blocking=True), repeats)


def gather_bandwidth(features: torch.Tensor, rows: torch.Tensor, repeats: int) -> float:
    """Bytes per second delivered by the UVA gather of `rows` (a CUDA index) from pinned `features`."""
    ops = native.ops()
    nbytes = rows.numel() * features.shape[1] * features.element_size()
    return nbytes / cuda_seconds(lambda: ops.gather_rows(features, rows), repeats)


def synchronized(batches: Iterator[MiniBatch]) -> Iterator[MiniBatch]:
    """Yields each batch once the device has finished it, so timings cover the GPU work."""
    for batch in batches:
        torch.cuda.synchronize()
        yield batch


def graph_bytes(graph) -> int:
    return sum(t.numel() * t.element_size() for t in (graph.indptr, graph.indices, graph.features))


def progress(stage: str) -> None:
    """Which stage runs now, on stderr: a slow or stuck stage shows where it is."""
    print(f"bench_gpu_batcher: {stage} ...", file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="bench-1m")
    parser.add_argument("--fanouts", default="15,10,5")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--batches", type=int, default=40, help="batches per measurement")
    parser.add_argument("--max-threads", type=int, default=min(16, usable_cores()))
    parser.add_argument("--gather-rows", type=int, default=200_000, help="rows per UVA gather measurement")
    parser.add_argument("--copy-mib", type=int, default=256, help="MiB per pinned host-to-device copy")
    parser.add_argument("--cache-fractions", default="0,0.05,0.1,0.25,0.5,1.0",
                        help="cache budgets as fractions of the graph's bytes (topology + features)")
    parser.add_argument("--backends", default="kernels,torch",
                        help="GpuBatcher backends to measure per cache budget: kernels (CUDA), torch (torch ops over UVA)")
    parser.add_argument("--out", default="bench_gpu_batcher.json")
    args = parser.parse_args()
    problem = cuda_problem()
    if problem is not None:
        raise SystemExit(f"bench_gpu_batcher needs a CUDA GPU, but {problem}; nothing was measured")

    graph = load_dataset(args.dataset)
    fanouts = [int(f) for f in args.fanouts.split(",")]
    try:
        seeds = measurement_seeds(graph.train_idx, args.batches, args.batch_size)
    except ValueError as error:
        raise SystemExit(f"--batches: {error}") from None
    device_name = torch.cuda.get_device_name()

    progress(f"{args.dataset} loaded; pinned host-to-device copy bandwidth")
    copy_bps = h2d_bandwidth(args.copy_mib << 20, repeats=20)
    with HostPinning({"features": graph.features}) as pinned:
        count = min(args.gather_rows, graph.num_nodes)
        generator = torch.Generator().manual_seed(0)
        progress("UVA gather bandwidth")
        random_rows = torch.randint(0, graph.num_nodes, (count,), generator=generator).cuda()
        consecutive_rows = torch.arange(count, device="cuda")
        uva = {"random_rows": gather_bandwidth(pinned["features"], random_rows, repeats=10),
               "consecutive_rows": gather_bandwidth(pinned["features"], consecutive_rows, repeats=10)}
    row_bytes = graph.features.shape[1] * graph.features.element_size()

    progress(f"CPU batcher at 1..{args.max_threads} threads")
    cpu_rows = cpu_batcher_by_threads(graph, fanouts, args.batch_size, seeds, args.max_threads, pin_memory=True)

    total = graph_bytes(graph)
    cache_rows = []
    for backend in args.backends.split(","):
        for fraction in (float(f) for f in args.cache_fractions.split(",")):
            budget = int(total * fraction)
            progress(f"GPU batcher, {backend} backend, cache {fraction:.0%}")
            with GpuBatcher(graph, fanouts, args.batch_size, seeds=seeds, seed=0, cache_bytes=budget,
                            backend=backend) as batcher:
                list(synchronized(iter(batcher)))
                row = measure_throughput(synchronized(iter(batcher))).to_dict()
                row.update(backend=backend, cache_fraction=fraction, cache_budget_bytes=budget,
                           cache_bytes_used=batcher.cache_bytes_used,
                           cached_feature_rows=int(batcher.cache_plan.feature_nodes.numel()),
                           cached_lists=int(batcher.cache_plan.adjacency_nodes.numel()))
            cache_rows.append(row)
    uncached = next((row for row in cache_rows if row["cache_budget_bytes"] == 0), None)

    print(f"device {device_name}; graph {args.dataset}: {graph.num_nodes:,} nodes, {graph.num_edges:,} edges, "
          f"{graph.features.shape[1]} x {graph.features.dtype} ({row_bytes} B rows); fanouts {fanouts}, "
          f"batch {args.batch_size}, {args.batches} batches per row")
    print(f"pinned H2D copy {copy_bps / 1e9:.2f} GB/s; UVA gather of {count:,} rows: random "
          f"{uva['random_rows'] / 1e9:.2f} GB/s ({uva['random_rows'] / copy_bps:.0%} of the copy), consecutive "
          f"{uva['consecutive_rows'] / 1e9:.2f} GB/s ({uva['consecutive_rows'] / copy_bps:.0%})")
    print(f"{'batcher':<26}{'batches/s':>11}{'Medges/s':>10}{'GB/s feat':>11}{'bytes used':>14}")
    for row in cpu_rows:
        print(f"{'CPU, ' + str(row['threads']) + ' threads':<26}{row['batches_per_s']:>11.2f}"
              f"{row['edges_per_s'] / 1e6:>10.2f}{row['feature_bytes_per_s'] / 1e9:>11.3f}{'':>14}")
    for row in cache_rows:
        label = f"GPU {row['backend']}, cache {row['cache_fraction']:.0%}"
        print(f"{label:<26}{row['batches_per_s']:>11.2f}"
              f"{row['edges_per_s'] / 1e6:>10.2f}{row['feature_bytes_per_s'] / 1e9:>11.3f}"
              f"{row['cache_bytes_used']:>14,}")
    report = {
        "date": date.today().isoformat(),
        "machine": {"cpu": platform.processor() or platform.machine(), "usable_cores": usable_cores(),
                    "gpu": device_name, "torch": torch.__version__, "cuda": torch.version.cuda},
        "dataset": args.dataset, "fanouts": fanouts, "batch_size": args.batch_size, "batches": args.batches,
        "graph_bytes": total, "pinned_h2d_bytes_per_s": copy_bps,
        "uva_gather_bytes_per_s": uva, "uva_gather_fraction_of_h2d": {k: v / copy_bps for k, v in uva.items()},
        "cpu_batcher": cpu_rows, "gpu_batcher_by_cache": cache_rows,
        "gpu_uncached_vs_cpu": ({str(row["threads"]): uncached["batches_per_s"] / row["batches_per_s"]
                                 for row in cpu_rows} if uncached else None),
    }
    with open(args.out, "w") as handle:
        json.dump(report, handle, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
