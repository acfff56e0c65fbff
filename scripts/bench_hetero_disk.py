"""Benchmark: typed batches per second with the features on disk (HeteroGraphStore.load(features_on_disk=True))
against the same features in RAM, at several sizes of the shared host cache.

Each row loads the graph afresh (in RAM: read whole, mmap=False; on disk: one FeatureStore per featured type with
the default reader and O_DIRECT where the file system allows it, the cache `--cache-shares` of all feature bytes
shared by hotness per byte), then times the second of two passes of `--batches` batches of training seeds with
HeteroCpuBatcher (bench_hetero.our_batching). Prints a table to paste into BENCHMARKS.md. Not a test.

Usage: python scripts/bench_hetero_disk.py [--dataset mag] [--fanouts 10,10] [--batch-size 1024] [--batches 18]
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from bench_hetero import our_batching  # this script's folder is on sys.path when it runs

from dgl_peer import int_list
from morphpipe.commands.arguments import integer, number
from morphpipe.cores import usable_cores
from morphpipe.data.hetero_store import HeteroGraphStore
from morphpipe.data.presets import PRESETS
from morphpipe.data.store import ensure_preset


def share_list(text: str) -> list[float]:
    """An argparse `type=`: comma-separated shares, each a finite number in [0, 1]."""
    return [number(0.0, 1.0)(part) for part in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="mag", help="a heterogeneous preset or dataset directory (default mag)")
    parser.add_argument("--fanouts", type=int_list, default="10,10",
                        help="neighbours per hop for every relation (default 10,10)")
    parser.add_argument("--batch-size", type=integer(1), default=1024)
    parser.add_argument("--batches", type=integer(1), default=18, help="batches timed, on a second pass (default 18)")
    parser.add_argument("--threads", type=integer(1), default=usable_cores())
    parser.add_argument("--cache-shares", type=share_list, default="0,0.1,0.5,1",
                        help="host cache sizes as shares of all feature bytes, each in [0, 1] (default 0,0.1,0.5,1)")
    args = parser.parse_args()
    fanouts = args.fanouts
    directory = Path(args.dataset) if Path(args.dataset).is_dir() else ensure_preset(PRESETS[args.dataset])
    in_ram = HeteroGraphStore.load(directory, mmap=False)
    feature_bytes = sum(rows.numel() * rows.element_size() for rows in in_ram.features.values())
    load = os.getloadavg()[0]
    rows = [("RAM", None, our_batching(in_ram, fanouts, args.batch_size, args.batches, args.threads))]
    del in_ram
    for share in args.cache_shares:
        graph = HeteroGraphStore.load(directory, features_on_disk=True, feature_cache_bytes=int(share * feature_bytes))
        measured = our_batching(graph, fanouts, args.batch_size, args.batches, args.threads)
        counters = [store.counters() for store in graph.feature_stores.values()]
        hits, misses = sum(c.hits for c in counters), sum(c.misses for c in counters)
        measured["hit_ratio"] = hits / max(hits + misses, 1)
        # both passes read through the stores: the bytes per batch are over both
        measured["mb_read_per_batch"] = sum(c.bytes_read for c in counters) / 1e6 / (2 * args.batches)
        rows.append((f"disk, cache {share:.0%}", graph.feature_stores, measured))
    load = max(load, os.getloadavg()[0])
    print(f"{directory.name}: features {feature_bytes / 1e6:,.1f} MB over {len(rows[1][1] or {})} typed store(s); "
          f"fanouts {fanouts} (every relation), batch {args.batch_size}, {args.threads} threads, {args.batches} "
          f"batches timed; load average up to {load:.1f}")
    print("| features | rows cached by type | hit ratio | MB read / batch | batches/s | vs RAM | CPU ms / batch |")
    print("|---|---|---|---|---|---|---|")
    base = rows[0][2]["batches_per_s"]
    for name, stores, measured in rows:
        cached = "-" if stores is None else ", ".join(f"{t} {s.num_cached:,}" for t, s in stores.items())
        hit = "-" if stores is None else f"{measured['hit_ratio']:.1%}"
        read = "-" if stores is None else f"{measured['mb_read_per_batch']:.2f}"
        print(f"| {name} | {cached} | {hit} | {read} | {measured['batches_per_s']:.2f} | "
              f"{measured['batches_per_s'] / base:.2f}x | {1e3 * measured['cpu_s_per_batch']:.1f} |")


if __name__ == "__main__":
    main()
