"""Benchmark: typed batches per second with the features on disk (HeteroGraphStore.load(features_on_disk=True))
against the same features in RAM, at several sizes of the shared host cache.

Each row loads the graph afresh (in RAM: read whole, mmap=False; on disk: one FeatureStore per featured type with
the default reader and O_DIRECT where the file system allows it, the cache `--cache-shares` of all feature bytes
shared by hotness per byte), then times the second of two passes of `--batches` batches of training seeds with
HeteroCpuBatcher (bench_hetero.our_batching). Then the automatic tiering: the graph on disk is profiled once as
`tune` profiles it (Profiler: disk read rates, the hit curve of the shared cache, training's working set; one thread
count, few steps), and for each of `--memory-budgets` (the share of the feature bytes a budget leaves to the cache
beside the topology and the working set) the planner picks the cache and I/O threads (plan_from_profile) and
batching is timed with that plan's stores (on the profiled graph, and on a freshly loaded one with the same settings,
in alternating turns): its predicted hit ratio beside the measured one. Prints a table to paste into BENCHMARKS.md.
Not a test.

Usage: PYTHONPATH=. python scripts/bench_hetero_disk.py [--dataset mag] [--fanouts 10,10] [--batch-size 1024]
                                                        [--batches 18] [--memory-budgets 0.1,0.5,1]
"""
from __future__ import annotations

import argparse
import os
from dataclasses import replace
from pathlib import Path

from bench_hetero import our_batching  # this script's folder is on sys.path when it runs

from dgl_peer import int_list
from morphpipe.commands.arguments import integer, number
from morphpipe.cores import usable_cores
from morphpipe.data.hetero_store import HeteroGraphStore
from morphpipe.data.presets import PRESETS
from morphpipe.data.store import ensure_preset
from morphpipe.profiler import Profiler
from morphpipe.profiler.disk import resident_bytes
from morphpipe.scheduler import plan_from_profile
from morphpipe.scheduler.plan import count_of


def share_list(text: str) -> list[float]:
    """An argparse `type=`: comma-separated shares, each a finite number in [0, 1]."""
    return [number(0.0, 1.0)(part) for part in text.split(",")]


def thread_counts(text: str) -> list[int]:
    """An argparse `type=`: comma-separated I/O thread counts, each at least 0 (0: the gathering thread reads alone)."""
    counts = int_list(text)
    if any(count < 0 for count in counts):
        raise argparse.ArgumentTypeError(f"{text!r}: an I/O thread count cannot be negative (e.g. 24,48,96)")
    return counts


def planned_rows(directory: Path, shares: list[float], feature_bytes: int, args) -> list[tuple[str, dict, dict]]:
    """Profiles the graph with its features on disk once (the hit curve up to every row cached), then for each share
    plans the cache within a memory budget that leaves that share of the feature bytes to it beside the topology and
    training's working set, and times batching with the plan's cache and I/O threads on the profiled graph, and
    with the same settings on a freshly loaded graph, in two turns (the second in reverse order): (row name, stores,
    figures)."""
    graph = HeteroGraphStore.load(directory, features_on_disk=True)
    budget = resident_bytes(graph) + 2 * feature_bytes + (16 << 30)  # beyond the working set: the whole curve
    profile = Profiler(graph, model="rgcn", fanouts=args.fanouts, batch_size=args.batch_size, device="cpu",
                       thread_counts=[args.threads], warmup=1, steps=3, progress=False, memory_budget=budget,
                       log=lambda line: None).run()
    working = profile.disk.resident_bytes - resident_bytes(graph)
    disk = profile.disk
    curves = ["reads of " + (f"{size / 1e3:,.1f} kB: " if size is not None else "one size: ")
              + ", ".join(f"{point.io_threads} {point.reads_per_s:,.0f}" for point in disk.io_curve
                          if point.read_bytes == size) for size in disk.io_read_sizes()]
    print("profiled I/O curve (reads/s by I/O threads): " + "; ".join(curves)
          + f"; bytes per read without a cache {(disk.read_bytes_at(0) or 0) / 1e3:,.1f} kB")
    rows = []
    for share in shares:
        cache_budget = int(share * feature_bytes)
        plan = plan_from_profile(profile.replaced(disk=replace(profile.disk, cache_budget_bytes=cache_budget)),
                                 engine="fast")
        settings = (f"cache {plan.tiering.cache_bytes / 1e6:,.1f} MB, "
                    f"{count_of(plan.tiering.io_threads or graph.feature_store.io_threads, 'I/O thread')}")
        for turn, order in enumerate(((graph, None), (None, graph)), 1):
            for timed in order:
                fresh = timed is None
                if fresh:  # the same settings on a graph that was not profiled
                    timed = HeteroGraphStore.load(directory, features_on_disk=True)
                timed.open_feature_store(plan.tiering.cache_bytes, plan.tiering.io_threads)
                measured = measured_batching(timed, args)
                measured["predicted_hit_ratio"] = plan.tiering.hit_ratio
                name = (f"disk, {settings}, on a freshly loaded graph" if fresh else
                        f"disk, planned (budget: topology {resident_bytes(graph) / 1e6:,.0f} MB + working set "
                        f"{working / 1e6:,.0f} MB + {share:.0%} of the features): {settings}")
                rows.append((f"{name} (turn {turn})", timed.feature_stores, measured))
    return rows


def measured_batching(graph, args) -> dict:
    """Typed batches/s through the graph's stores, with their hit ratio and MB read per batch (both passes)."""
    graph.feature_store.reset_counters()
    measured = our_batching(graph, args.fanouts, args.batch_size, args.batches, args.threads)
    counted = graph.feature_store.counters()
    measured["hit_ratio"] = counted.hit_ratio
    measured["mb_read_per_batch"] = counted.bytes_read / 1e6 / (2 * args.batches)
    return measured


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
    parser.add_argument("--memory-budgets", type=share_list, default="0.1,0.5,1",
                        help="memory budgets to plan the tiering within, as what the topology and training's working "
                             "set need plus this share of the feature bytes, each in [0, 1] (default 0.1,0.5,1)")
    parser.add_argument("--io-threads", type=thread_counts, default=[],
                        help="also time the cache-less store with each of these I/O thread counts, in two turns (the "
                             "second in reverse order, so the load's drift does not favour one), e.g. 12,24,48,96")
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
        rows.append((f"disk, cache {share:.0%}", graph.feature_stores, measured_batching(graph, args)))
    if args.io_threads:
        graph = HeteroGraphStore.load(directory, features_on_disk=True)
        for turn, counts in enumerate((args.io_threads, args.io_threads[::-1]), 1):
            for count in counts:
                graph.open_feature_store(0, count)
                rows.append((f"disk, cache 0%, {count_of(count, 'I/O thread')} (turn {turn})", graph.feature_stores,
                             measured_batching(graph, args)))
    rows.extend(planned_rows(directory, args.memory_budgets, feature_bytes, args))
    load = max(load, os.getloadavg()[0])
    print(f"{directory.name}: features {feature_bytes / 1e6:,.1f} MB over {len(rows[1][1] or {})} typed store(s); "
          f"fanouts {fanouts} (every relation), batch {args.batch_size}, {args.threads} threads, {args.batches} "
          f"batches timed; load average up to {load:.1f}")
    print("| features | rows cached by type | hit ratio | MB read / batch | batches/s | vs RAM | CPU ms / batch |")
    print("|---|---|---|---|---|---|---|")
    base = rows[0][2]["batches_per_s"]
    for name, stores, measured in rows:
        cached = "-" if stores is None else ", ".join(f"{t} {s.num_cached:,}" for t, s in stores.items())
        hit = "-" if stores is None else f"{measured['hit_ratio']:.1%}" + (
            f" (predicted {measured['predicted_hit_ratio']:.1%})" if "predicted_hit_ratio" in measured else "")
        read = "-" if stores is None else f"{measured['mb_read_per_batch']:.2f}"
        print(f"| {name} | {cached} | {hit} | {read} | {measured['batches_per_s']:.2f} | "
              f"{measured['batches_per_s'] / base:.2f}x | {1e3 * measured['cpu_s_per_batch']:.1f} |")


if __name__ == "__main__":
    main()
