"""Which feature rows a static host cache should hold: the hit ratio of a cache of the k hottest rows ranked by
in-degree (the store's fallback), by occurrences in neighbour lists (the GPU cache's "degree"), and by expected
access (morphpipe.sampling.access_hotness: the expected number of an epoch's batches that read a row under our
sampler, from the CSC, the training seeds and the fanouts), measured over the batches of an epoch that no ranking
saw, at several cache sizes; beside it, the time each ranking takes and the hit ratio the expected-access model
predicts for itself (its cached share of the expected reads).

  python scripts/bench_hotness.py /work/bench_scratch/bench-10m --batches 100 --json bench_out/hotness.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from dgl_peer import int_list  # this script's folder is on sys.path when it runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset", help="graph directory (read only)")
    parser.add_argument("--fanouts", type=int_list, default="15,10,5")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--batches", type=int, default=100, help="batches of the measured epoch (default 100)")
    parser.add_argument("--epoch", type=int, default=7, help="the measured epoch (default 7)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shares", default="0.1,0.22,0.3,0.6", help="cache sizes as shares of the rows")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    fanouts = args.fanouts
    shares = [float(s) for s in args.shares.split(",")]
    if args.batches < 1 or args.batch_size < 1 or not all(0.0 <= s <= 1.0 for s in shares):
        parser.error("--batches and --batch-size must be at least 1, --shares each in [0, 1]")

    from morphpipe import native
    from morphpipe.data.store import GraphStore
    from morphpipe.profiler.disk import hit_ratio_by_cache_size, hotness_rank
    from morphpipe.sampling.access_hotness import expected_batch_reads
    from morphpipe.sampling.epochs import batch_seeds, epoch_order, epoch_seed
    from morphpipe.sampling.gpu_cache import degree_hotness

    graph = GraphStore.load(args.dataset, validate=False)
    num_rows = graph.num_nodes
    started = time.perf_counter()
    degree = graph.in_degrees()
    degree_s = time.perf_counter() - started
    occurrences = degree_hotness(graph.indices, num_rows)
    started = time.perf_counter()
    access = expected_batch_reads(graph.indptr, graph.indices, graph.train_idx, fanouts, args.batch_size,
                                  progress=True)
    access_s = time.perf_counter() - started

    order = epoch_order(graph.train_idx, args.seed, args.epoch)
    gathered = []
    started = time.perf_counter()
    for index in range(min(args.batches, -(-order.numel() // args.batch_size))):
        seeds = batch_seeds(order, index, args.batch_size)
        input_nodes, _, _ = native.ops().sample_neighbors(graph.indptr, graph.indices, seeds, fanouts,
                                                          epoch_seed(args.seed, args.epoch) + index)
        gathered.append(input_nodes)
    sample_s = time.perf_counter() - started
    cache_rows = [int(share * num_rows) for share in shares]
    by_degree = hit_ratio_by_cache_size(degree, gathered, cache_rows)
    by_occurrences = hit_ratio_by_cache_size(occurrences, gathered, cache_rows)
    by_access = hit_ratio_by_cache_size(access, gathered, cache_rows)
    cumulative = torch.cumsum(access[torch.argsort(hotness_rank(access))], 0)
    predicted = [float(cumulative[k - 1] / cumulative[-1]) if k else 0.0 for k in cache_rows]
    rows_per_batch = sum(ids.numel() for ids in gathered) / len(gathered)

    print(f"{graph.name}: {num_rows:,} rows, {graph.num_edges:,} edges, fanouts {args.fanouts}, batch "
          f"{args.batch_size}; {len(gathered)} batches of epoch {args.epoch} ({rows_per_batch:,.0f} rows each, "
          f"sampled in {sample_s:.1f} s); in-degree ranking {degree_s:.2f} s, expected access {access_s:.1f} s")
    print("| cache (share of rows) | hit ratio, in-degree | occurrences | expected access | misses saved vs "
          "in-degree | predicted by the model |")
    print("|---|---|---|---|---|---|")
    for share, deg, occ, acc, pred in zip(shares, by_degree, by_occurrences, by_access, predicted):
        saved = 1 - (1 - acc) / (1 - deg) if deg < 1 else 0.0
        print(f"| {share:.0%} | {deg:.1%} | {occ:.1%} | {acc:.1%} | {saved:+.1%} | {pred:.1%} |")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "dataset": graph.name, "fanouts": fanouts, "batch_size": args.batch_size, "batches": len(gathered),
            "epoch": args.epoch, "rows_per_batch": rows_per_batch, "degree_s": degree_s, "access_s": access_s,
            "shares": shares, "hit_ratio_degree": by_degree, "hit_ratio_occurrences": by_occurrences,
            "hit_ratio_access": by_access,
            "predicted_access": predicted}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
