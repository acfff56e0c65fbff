"""Benchmark: the C++ CPU batcher versus a plain PyTorch reference sampler and DGL 2.1, 1..N threads.

Default graph: the `bench-1m` preset (power law, 1M nodes, average degree 20, 128 float16
features); fanouts 15,10,5; batch 1024. Prints a table and writes JSON. Not a test. Each row's feature rows
gathered per second is shown as a share of the random row-gather ceiling of the features' row size measured here
with all threads (`morphpipe.profiler.ceiling`). Our rows also give the CPU time spent per batch (all threads), the
figure to compare on a loaded machine.
DGL's side (`--dgl-python`, skipped with `--no-dgl`) runs as a subprocess of DGL's own interpreter on the same
graph directory's .npy arrays and the same seeds: `NeighborSampler` (single-process `DataLoader`, OMP and torch
threads = `--max-threads`) plus the feature and label gather of each batch. DGL is never imported here.
The ceiling and our rows are measured in turns, `--rounds` times: each round's share is against the ceiling timed
just before it, so a host whose memory speed drifts between the two (a shared VM) moves both. The table is the round
of median share at the most threads; every round's share is printed under it and kept in the JSON.
Usage: python scripts/bench_sampler.py [--dataset bench-1m] [--batches 40] [--rounds 3] [--no-dgl]
       [--out bench_sampler.json]
"""
from __future__ import annotations

import argparse
import json
import platform
import tempfile
from datetime import date
from pathlib import Path

import morphpipe  # noqa: F401  first, before torch: the OpenMP wait policy and huge pages, as `morphpipe train` sets them
import numpy as np
import torch

from dgl_peer import DGL_PRELUDE, DGL_PYTHON, dataset_directory, positive_int, run_dgl_script, writable_file
from morphpipe.cores import usable_cores
from morphpipe.data import load_dataset
from morphpipe.profiler.ceiling import measure_memory_ceiling, share
from morphpipe.sampling import MiniBatch
from morphpipe.sampling.cpu_batcher import blocks_from_native
from morphpipe.sampling.throughput import cpu_batcher_by_threads, measure_throughput, measurement_seeds

# DGL's side (after the shared prelude): reads the seeds file, times one epoch of batches after a warm-up epoch
# (sampling plus the feature and label gather), prints one JSON line.
DGL_SCRIPT = DGL_PRELUDE + r'''
seeds = torch.from_numpy(np.load(args["seeds"]))
sampler = dgl.dataloading.NeighborSampler(list(reversed(args["fanouts"])))  # DGL lists the input layer first
loader = dgl.dataloading.DataLoader(graph, seeds, sampler, batch_size=args["batch_size"], shuffle=False,
                                    drop_last=False, num_workers=0)

def epoch():
    count = rows = edges = 0
    for input_nodes, output_nodes, blocks in loader:
        features[input_nodes], labels[output_nodes]
        count += 1
        rows += input_nodes.numel()
        edges += sum(block.num_edges() for block in blocks)
    return count, rows, edges

epoch()
start = time.perf_counter()
count, rows, edges = epoch()
seconds = time.perf_counter() - start
print(json.dumps({"dgl": dgl.__version__, "torch": torch.__version__, "batches": count, "seconds": seconds,
                  "batches_per_s": count / seconds, "edges_per_s": edges / seconds,
                  "input_nodes_per_batch": rows / count, "edges_per_batch": edges / count}))
'''


def run_dgl(dataset: Path, seeds: torch.Tensor, fanouts: list[int], batch_size: int, threads: int,
            dgl_python: str) -> dict:
    """DGL's batches per second on `dataset`'s arrays over `seeds` (in this order), from its own interpreter."""
    with tempfile.TemporaryDirectory() as scratch:
        seeds_path = Path(scratch) / "seeds.npy"
        np.save(seeds_path, seeds.numpy())
        settings = {"dataset": str(dataset), "seeds": str(seeds_path), "fanouts": fanouts, "batch_size": batch_size,
                    "threads": threads}
        return run_dgl_script(DGL_SCRIPT, settings, threads, dgl_python)


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
    parser.add_argument("--dgl-python", default=DGL_PYTHON)
    parser.add_argument("--no-dgl", action="store_true", help="skip DGL's side")
    parser.add_argument("--rounds", type=positive_int, default=3,
                        help="times the ceiling and our rows are measured in turns (the table shows the median round)")
    parser.add_argument("--out", type=writable_file, default="bench_sampler.json")
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

    directory = dataset_directory(args.dataset)
    dgl = None if args.no_dgl else run_dgl(directory, seeds, fanouts, args.batch_size, args.max_threads,
                                           args.dgl_python)
    row_bytes = graph.features.shape[1] * graph.features.element_size()
    rounds = []
    for _ in range(args.rounds):
        torch.set_num_threads(args.max_threads)
        ceiling = measure_memory_ceiling(row_bytes=(row_bytes,))
        torch.set_num_threads(1)
        results = cpu_batcher_by_threads(graph, fanouts, args.batch_size, seeds, args.max_threads, pin_memory=False)
        for row in results:
            row["speedup_vs_reference_1_thread"] = row["batches_per_s"] / reference.batches_per_s
            row["scaling_vs_1_thread"] = row["batches_per_s"] / results[0]["batches_per_s"]
            row["rows_per_s"] = row["input_nodes_per_batch"] * row["batches_per_s"]
            row["share_of_gather_ceiling"] = row["rows_per_s"] / ceiling.gather_rows_per_s[row_bytes]
            if dgl is not None:
                row["speedup_vs_dgl"] = row["batches_per_s"] / dgl["batches_per_s"]
        rounds.append({"ceiling": ceiling.to_dict(), "morphpipe": results})
    by_share = sorted(rounds, key=lambda measured: measured["morphpipe"][-1]["share_of_gather_ceiling"])
    median = by_share[(len(by_share) - 1) // 2]
    results = median["morphpipe"]

    print(f"graph {args.dataset}: {graph.num_nodes:,} nodes, {graph.num_edges:,} edges, "
          f"{graph.features.shape[1]} x {graph.features.dtype}; fanouts {fanouts}, batch {args.batch_size}, "
          f"{args.batches} batches per row")
    ceiling = median["ceiling"]
    gather_ceiling = ceiling["gather_rows_per_s"][row_bytes]
    print(f"ceiling ({args.max_threads} threads, the median round's): random {row_bytes}-byte row gather "
          f"{gather_ceiling / 1e6:.1f} M rows/s, copy {ceiling['copy_gb_per_s']:.1f} GB/s (morphpipe.profiler.ceiling)")
    print(f"{'sampler':<22}{'batches/s':>11}{'Medges/s':>10}{'GB/s feat':>11}{'Mrows/s':>9}{'of ceil':>9}"
          f"{'vs ref':>8}{'vs 1 thr':>10}{'vs DGL':>8}{'CPU ms/batch':>14}")
    reference_rows = reference.input_nodes_per_batch * reference.batches_per_s
    print(f"{'pytorch reference, 1':<22}{reference.batches_per_s:>11.2f}{reference.edges_per_s / 1e6:>10.2f}"
          f"{reference.feature_bytes_per_s / 1e9:>11.3f}{reference_rows / 1e6:>9.2f}"
          f"{share(reference_rows, gather_ceiling):>9}{1.0:>8.2f}{'':>10}")
    if dgl is not None:
        dgl_rows = dgl["input_nodes_per_batch"] * dgl["batches_per_s"]
        print(f"{'DGL ' + dgl['dgl'] + ', ' + str(args.max_threads):<22}{dgl['batches_per_s']:>11.2f}"
              f"{dgl['edges_per_s'] / 1e6:>10.2f}{dgl_rows * row_bytes / 1e9:>11.3f}{dgl_rows / 1e6:>9.2f}"
              f"{share(dgl_rows, gather_ceiling):>9}{dgl['batches_per_s'] / reference.batches_per_s:>8.2f}{'':>10}"
              f"{1.0:>8.2f}")
    for row in results:
        print(f"{'morphpipe C++, ' + str(row['threads']):<22}{row['batches_per_s']:>11.2f}"
              f"{row['edges_per_s'] / 1e6:>10.2f}{row['feature_bytes_per_s'] / 1e9:>11.3f}"
              f"{row['rows_per_s'] / 1e6:>9.2f}{share(row['rows_per_s'], gather_ceiling):>9}"
              f"{row['speedup_vs_reference_1_thread']:>8.2f}{row['scaling_vs_1_thread']:>10.2f}"
              + (f"{row['speedup_vs_dgl']:>8.2f}" if dgl is not None else f"{'-':>8}")
              + f"{row['cpu_seconds_per_batch'] * 1e3:>14.1f}")
    print(f"{args.max_threads} threads, each round's share of the ceiling timed before it: "
          + ", ".join(f"{measured['morphpipe'][-1]['share_of_gather_ceiling']:.0%} of "
                      f"{measured['ceiling']['gather_rows_per_s'][row_bytes] / 1e6:.1f} M rows/s" for measured in rounds))
    report = {
        "date": date.today().isoformat(),
        "machine": {"cpu": platform.processor() or platform.machine(), "usable_cores": usable_cores(),
                    "torch": torch.__version__},
        "dataset": args.dataset, "fanouts": fanouts, "batch_size": args.batch_size,
        "reference_1_thread": reference.to_dict(), "morphpipe": results, "dgl": dgl, "ceiling": ceiling,
        "rounds": rounds,
    }
    with open(args.out, "w") as handle:
        json.dump(report, handle, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
