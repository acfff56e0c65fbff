"""Benchmark: the C++ CPU batcher versus a plain PyTorch reference sampler, 1..N threads.

Default graph: the `bench-1m` preset (power law, 1M nodes, average degree 20, 128 float16
features); fanouts 15,10,5; batch 1024. Prints a table and writes JSON. Not a test. Each row's feature rows
gathered per second is shown as a share of the random row-gather ceiling of the features' row size measured here
with all threads (`morphpipe.profiler.ceiling`).
Usage: python scripts/bench_sampler.py [--dataset bench-1m] [--batches 40] [--out bench_sampler.json]
"""
from __future__ import annotations

import argparse
import json
import platform
from datetime import date

import torch

from morphpipe.cores import usable_cores
from morphpipe.data import load_dataset
from morphpipe.profiler.ceiling import measure_memory_ceiling, share
from morphpipe.sampling import MiniBatch
from morphpipe.sampling.cpu_batcher import blocks_from_native
from morphpipe.sampling.throughput import cpu_batcher_by_threads, measure_throughput, measurement_seeds


def reference_sample(graph, seeds: torch.Tensor, fanouts: list[int], generator: torch.Generator,
                     node_to_local: torch.Tensor) -> MiniBatch:
    """Uniform sampling without replacement with vectorised PyTorch ops (random keys, sort per segment)."""
    indptr, indices = graph.indptr, graph.indices
    nodes = seeds
    node_to_local[seeds] = torch.arange(seeds.numel())
    indptrs, block_indices = [], []
    for fanout in fanouts:
        start = indptr[nodes]
        degree = indptr[nodes + 1] - start
        taken = degree if fanout < 0 else degree.clamp(max=fanout)
        segment = torch.repeat_interleave(torch.arange(nodes.numel()), degree)
        segment_start = torch.cumsum(degree, 0) - degree
        offset = torch.arange(segment.numel()) - segment_start[segment]
        order = torch.argsort(segment.double() + torch.rand(segment.numel(), generator=generator, dtype=torch.float64))
        rank = torch.empty_like(order)
        rank[order] = torch.arange(order.numel())
        keep = (rank - segment_start[segment]) < taken[segment]
        kept = keep.nonzero().squeeze(1)
        neighbours = indices[start[segment[kept]] + offset[kept]].long()
        unseen = neighbours[node_to_local[neighbours] < 0]
        fresh = torch.unique(unseen)
        node_to_local[fresh] = torch.arange(nodes.numel(), nodes.numel() + fresh.numel())
        nodes = torch.cat([nodes, fresh])
        block_indptr = torch.zeros(taken.numel() + 1, dtype=torch.int64)
        block_indptr[1:] = torch.cumsum(taken, 0)
        indptrs.append(block_indptr)
        block_indices.append(node_to_local[neighbours])
    node_to_local[nodes] = -1
    return MiniBatch(
        seeds=seeds,
        input_nodes=nodes,
        blocks=blocks_from_native(nodes.numel(), indptrs[::-1], block_indices[::-1]),
        x=graph.features[nodes],
        y=graph.labels[seeds],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="bench-1m")
    parser.add_argument("--fanouts", default="15,10,5")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--batches", type=int, default=40, help="batches per measurement")
    parser.add_argument("--max-threads", type=int, default=usable_cores())
    parser.add_argument("--out", default="bench_sampler.json")
    args = parser.parse_args()

    graph = load_dataset(args.dataset)
    fanouts = [int(f) for f in args.fanouts.split(",")]
    try:
        seeds = measurement_seeds(graph.train_idx, args.batches, args.batch_size)
    except ValueError as error:
        raise SystemExit(f"--batches: {error}") from None
    torch.ones(1 << 20).sum()

    torch.set_num_threads(1)
    node_to_local = torch.full((graph.num_nodes,), -1, dtype=torch.int64)
    chunks = seeds.split(args.batch_size)
    generator = torch.Generator().manual_seed(0)
    list(reference_sample(graph, c, fanouts, generator, node_to_local) for c in chunks[:2])
    reference = measure_throughput(reference_sample(graph, c, fanouts, generator, node_to_local) for c in chunks)

    results = cpu_batcher_by_threads(graph, fanouts, args.batch_size, seeds, args.max_threads, pin_memory=False)
    row_bytes = graph.features.shape[1] * graph.features.element_size()
    torch.set_num_threads(args.max_threads)
    ceiling = measure_memory_ceiling(row_bytes=(row_bytes,))
    for row in results:
        row["speedup_vs_reference_1_thread"] = row["batches_per_s"] / reference.batches_per_s
        row["scaling_vs_1_thread"] = row["batches_per_s"] / results[0]["batches_per_s"]
        row["rows_per_s"] = row["input_nodes_per_batch"] * row["batches_per_s"]

    print(f"graph {args.dataset}: {graph.num_nodes:,} nodes, {graph.num_edges:,} edges, "
          f"{graph.features.shape[1]} x {graph.features.dtype}; fanouts {fanouts}, batch {args.batch_size}, "
          f"{args.batches} batches per row")
    gather_ceiling = ceiling.gather_rows_per_s[row_bytes]
    print(f"ceiling ({args.max_threads} threads): random {row_bytes}-byte row gather "
          f"{gather_ceiling / 1e6:.1f} M rows/s, copy {ceiling.copy_gb_per_s:.1f} GB/s (morphpipe.profiler.ceiling)")
    print(f"{'sampler':<22}{'batches/s':>11}{'Medges/s':>10}{'GB/s feat':>11}{'Mrows/s':>9}{'of ceil':>9}"
          f"{'vs ref':>8}{'vs 1 thr':>10}")
    reference_rows = reference.input_nodes_per_batch * reference.batches_per_s
    print(f"{'pytorch reference, 1':<22}{reference.batches_per_s:>11.2f}{reference.edges_per_s / 1e6:>10.2f}"
          f"{reference.feature_bytes_per_s / 1e9:>11.3f}{reference_rows / 1e6:>9.2f}"
          f"{share(reference_rows, gather_ceiling):>9}{1.0:>8.2f}{'':>10}")
    for row in results:
        print(f"{'morphpipe C++, ' + str(row['threads']):<22}{row['batches_per_s']:>11.2f}"
              f"{row['edges_per_s'] / 1e6:>10.2f}{row['feature_bytes_per_s'] / 1e9:>11.3f}"
              f"{row['rows_per_s'] / 1e6:>9.2f}{share(row['rows_per_s'], gather_ceiling):>9}"
              f"{row['speedup_vs_reference_1_thread']:>8.2f}{row['scaling_vs_1_thread']:>10.2f}")
    report = {
        "date": date.today().isoformat(),
        "machine": {"cpu": platform.processor() or platform.machine(), "usable_cores": usable_cores(),
                    "torch": torch.__version__},
        "dataset": args.dataset, "fanouts": fanouts, "batch_size": args.batch_size,
        "reference_1_thread": reference.to_dict(), "morphpipe": results, "ceiling": ceiling.to_dict(),
    }
    with open(args.out, "w") as handle:
        json.dump(report, handle, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
