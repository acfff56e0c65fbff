"""Which feature rows a static host cache should hold: the hit ratio of a cache of the k hottest rows ranked by
in-degree (the store's fallback), by occurrences in neighbour lists (the GPU cache's "degree"), and by expected
access (morphpipe.sampling.access_hotness: the expected number of an epoch's batches that read a row under our
sampler, from the CSC, the training seeds and the fanouts), measured over the batches of an epoch that no ranking
saw, at several cache sizes; beside it, the time each ranking takes and the hit ratio the expected-access model
predicts for itself (its cached share of the expected reads). `--task link` does it for link prediction's edge
batches (a graph with an edge split: `morphpipe data split-edges`), whose seeds are the training edges' endpoints
and their negatives, ranked by `expected_link_batch_reads`. A typed graph's directory measures its shared cache,
split between the featured types by source degree per byte or by expected access per byte.

  python scripts/bench_hotness.py /work/bench_scratch/bench-10m --batches 100 --json bench_out/hotness.json
  python scripts/bench_hotness.py SPLIT_GRAPH --task link --negatives 1 --batches 100
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
    parser.add_argument("--task", choices=("node", "link"), default="node",
                        help="node classification's seed batches, or link prediction's edge batches")
    parser.add_argument("--negatives", type=int, default=1, help="--task link: negatives per positive (default 1)")
    parser.add_argument("--negative-kind", choices=("uniform", "degree"), default="uniform",
                        help="--task link: how negatives are drawn (default uniform)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    fanouts = args.fanouts
    shares = [float(s) for s in args.shares.split(",")]
    if args.batches < 1 or args.batch_size < 1 or args.negatives < 0 or not all(0.0 <= s <= 1.0 for s in shares):
        parser.error("--batches and --batch-size must be at least 1, --negatives at least 0, --shares each in [0, 1]")

    from morphpipe.data.hetero_store import is_hetero_dir

    if is_hetero_dir(Path(args.dataset)):
        if args.task != "node":
            parser.error("a typed graph is measured for node classification: drop --task link")
        return typed(args, shares)
    from morphpipe import native
    from morphpipe.data.store import GraphStore
    from morphpipe.profiler.disk import hit_ratio_by_cache_size, hotness_rank
    from morphpipe.sampling.access_hotness import expected_batch_reads, expected_link_batch_reads
    from morphpipe.sampling.edge_batcher import NegativeSampling
    from morphpipe.sampling.epochs import batch_seeds, epoch_order, epoch_seed
    from morphpipe.sampling.gpu_cache import degree_hotness

    graph = GraphStore.load(args.dataset, validate=False)
    num_rows = graph.num_nodes
    started = time.perf_counter()
    degree = graph.in_degrees()
    degree_s = time.perf_counter() - started
    occurrences = degree_hotness(graph.indices, num_rows)
    if args.task == "link":
        split = graph.require_edge_split()
        src, dst = split.train[0].contiguous(), split.train[1].contiguous()
        negatives = NegativeSampling(args.negatives, args.negative_kind)
        cdf = negatives.cdf(graph)
        units = torch.arange(src.numel())
    else:
        units = graph.train_idx
    started = time.perf_counter()
    if args.task == "link":
        access = expected_link_batch_reads(graph.indptr, graph.indices, src, dst, fanouts, args.batch_size,
                                           negatives.k, negatives.draw_probability(graph), progress=True)
    else:
        access = expected_batch_reads(graph.indptr, graph.indices, units, fanouts, args.batch_size, progress=True)
    access_s = time.perf_counter() - started

    order = epoch_order(units, args.seed, args.epoch)
    gathered = []
    started = time.perf_counter()
    for index in range(min(args.batches, -(-order.numel() // args.batch_size))):
        seeds = batch_seeds(order, index, args.batch_size)
        sampling_seed = epoch_seed(args.seed, args.epoch) + index
        if args.task == "link":  # the edge batcher's batch: endpoints, negatives, their sampled neighbourhood
            input_nodes = native.ops().sample_edge_batch(
                graph.indptr, graph.indices, src, dst, seeds, fanouts, negatives.k, cdf, True, split.undirected,
                False, sampling_seed)[4]
        else:
            input_nodes, _, _ = native.ops().sample_neighbors(graph.indptr, graph.indices, seeds, fanouts,
                                                              sampling_seed)
        gathered.append(input_nodes)
    sample_s = time.perf_counter() - started
    cache_rows = [int(share * num_rows) for share in shares]
    by_degree = hit_ratio_by_cache_size(degree, gathered, cache_rows)
    by_occurrences = hit_ratio_by_cache_size(occurrences, gathered, cache_rows)
    by_access = hit_ratio_by_cache_size(access, gathered, cache_rows)
    cumulative = torch.cumsum(access[torch.argsort(hotness_rank(access))], 0)
    predicted = [float(cumulative[k - 1] / cumulative[-1]) if k else 0.0 for k in cache_rows]
    rows_per_batch = sum(ids.numel() for ids in gathered) / len(gathered)

    workload = (f"link batches of {args.batch_size} training edges ({units.numel():,}), {args.negatives} "
                f"{args.negative_kind} negatives each" if args.task == "link" else f"batch {args.batch_size}")
    print(f"{graph.name}: {num_rows:,} rows, {graph.num_edges:,} edges, fanouts {args.fanouts}, {workload}; "
          f"{len(gathered)} batches of epoch {args.epoch} ({rows_per_batch:,.0f} rows each, sampled in {sample_s:.1f} "
          f"s); in-degree ranking {degree_s:.2f} s, expected access {access_s:.1f} s")
    print("| cache (share of rows) | hit ratio, in-degree | occurrences | expected access | misses saved vs "
          "in-degree | predicted by the model |")
    print("|---|---|---|---|---|---|")
    for share, deg, occ, acc, pred in zip(shares, by_degree, by_occurrences, by_access, predicted):
        saved = 1 - (1 - acc) / (1 - deg) if deg < 1 else 0.0
        print(f"| {share:.0%} | {deg:.1%} | {occ:.1%} | {acc:.1%} | {saved:+.1%} | {pred:.1%} |")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "dataset": graph.name, "task": args.task, "negatives": args.negatives if args.task == "link" else None,
            "negative_kind": args.negative_kind if args.task == "link" else None,
            "fanouts": fanouts, "batch_size": args.batch_size, "batches": len(gathered),
            "epoch": args.epoch, "rows_per_batch": rows_per_batch, "degree_s": degree_s, "access_s": access_s,
            "shares": shares, "hit_ratio_degree": by_degree, "hit_ratio_occurrences": by_occurrences,
            "hit_ratio_access": by_access,
            "predicted_access": predicted}, indent=1))
    return 0


def typed(args: argparse.Namespace, shares: list[float]) -> int:
    """A typed graph (node classification, `--fanouts` for every relation): the hit ratio, over the featured rows
    the typed batches of the measured epoch read, of a shared cache of each share of the feature bytes, split between
    the types by source degree per byte (the stores' fallback) and by expected access per byte
    (`expected_typed_batch_reads`); the model's own prediction beside it."""
    from morphpipe.data.hetero_store import HeteroGraphStore, share_feature_cache
    from morphpipe.profiler.disk import hotness_rank
    from morphpipe.sampling.access_hotness import expected_typed_batch_reads
    from morphpipe.sampling.hetero_batcher import HeteroCpuBatcher

    graph = HeteroGraphStore.load(args.dataset, validate=False)
    row_bytes = {name: rows.shape[1] * rows.element_size() for name, rows in graph.features.items()}
    features_bytes = sum(row_bytes[name] * graph.features[name].shape[0] for name in row_bytes)
    started = time.perf_counter()
    degree = {name: graph.source_degrees(name) for name in row_bytes}
    degree_s = time.perf_counter() - started
    started = time.perf_counter()
    access = expected_typed_batch_reads(graph, graph.train_idx, args.fanouts, args.batch_size, progress=True)
    access_s = time.perf_counter() - started
    gathered = {name: [] for name in row_bytes}  # per type: the local ids each batch reads
    started = time.perf_counter()
    with HeteroCpuBatcher(graph, args.fanouts, args.batch_size, num_threads=1, serial=True, seed=args.seed) as batcher:
        for index, batch in zip(range(args.batches), batcher.epoch(args.epoch)):
            for name in row_bytes:
                node_type = graph.node_type(name)
                nodes = batch.input_nodes
                gathered[name].append(nodes[(nodes >= node_type.start) & (nodes < node_type.stop)] - node_type.start)
    sample_s = time.perf_counter() - started
    batches = len(next(iter(gathered.values())))
    read = {name: torch.cat(parts) for name, parts in gathered.items()}
    total = sum(ids.numel() for ids in read.values())
    cache_sizes = [int(share * features_bytes) for share in shares]

    def hit_ratios(hotness: dict[str, torch.Tensor]) -> list[float]:
        ranks = {name: torch.sort(hotness_rank(hotness[name])[read[name]]).values for name in read}
        return [sum(int(torch.searchsorted(ranks[name], torch.tensor(rows))) for name, rows in
                    share_feature_cache(hotness, row_bytes, size).items()) / max(total, 1) for size in cache_sizes]

    def predicted(hotness: dict[str, torch.Tensor]) -> list[float]:
        whole = sum(float(part.sum()) for part in hotness.values())
        return [sum(float(hotness[name][hotness_rank(hotness[name]) < rows].sum()) for name, rows in
                    share_feature_cache(hotness, row_bytes, size).items()) / whole for size in cache_sizes]

    by_degree, by_access, model = hit_ratios(degree), hit_ratios(access), predicted(access)
    featured = ", ".join(f"{name} {graph.features[name].shape[0]:,} rows of {row_bytes[name]} B" for name in row_bytes)
    print(f"{graph.name} (typed): featured types {featured}, "
          f"{graph.num_edges:,} edges, fanouts {args.fanouts} for every relation, batch {args.batch_size}; {batches} "
          f"batches of epoch {args.epoch} ({total / max(batches, 1):,.0f} featured rows each, sampled in "
          f"{sample_s:.1f} s); source degrees {degree_s:.2f} s, expected access {access_s:.1f} s")
    print("| cache (share of feature bytes) | hit ratio, source degree per byte | expected access per byte | misses "
          "saved vs source degree | predicted by the model |")
    print("|---|---|---|---|---|")
    for share, deg, acc, pred in zip(shares, by_degree, by_access, model):
        saved = 1 - (1 - acc) / (1 - deg) if deg < 1 else 0.0
        print(f"| {share:.0%} | {deg:.1%} | {acc:.1%} | {saved:+.1%} | {pred:.1%} |")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "dataset": graph.name, "task": "node (typed)", "fanouts": args.fanouts, "batch_size": args.batch_size,
            "batches": batches, "epoch": args.epoch, "degree_s": degree_s, "access_s": access_s, "shares": shares,
            "hit_ratio_source_degree": by_degree, "hit_ratio_access": by_access, "predicted_access": model},
            indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
