"""Features larger than RAM: the feature store against the memory-mapped arrays, under the same memory limit.

Side by side in one run, on the same graph, seeds, fanouts, batch size and threads, each configuration in a
child process inside a cgroup-v1 memory group (/sys/fs/cgroup/memory; needs root):

- `mmap`: GraphStore.load memory-maps indices and features and the CPU batcher gathers from the map, the
  page cache doing the work (what DGL and PyG users do, and what morphpipe did before the store);
- `pread-direct`: the batcher gathers through the FeatureStore (hot rows by in-degree cached in RAM, the misses
  read with O_DIRECT by the pool of pread threads: GraphStore.load(features_on_disk=True)'s default);
  `uring-direct` the same through an io_uring per gathering thread; `uring` and `pread` the same reading through
  the page cache.

The pread pool keeps `--io-threads` + `--threads` reads in flight in all (its threads and the batcher threads
calling it); io_uring keeps `--uring-depths` reads in flight per gathering thread, each depth a configuration of
its own: by default the store's (io_threads + 1) and the pool's total shared among the batcher threads
((io_threads + threads) / threads: the same reads in flight in all as the pool).

Each child first builds 6 batches unlimited, takes the peak anonymous memory it held besides the arrays (its
working memory W: interpreter, torch, batch buffers), and sets its group's limit to 1.15 W + share x the dataset's
arrays; the store's cache gets that room minus the topology (indptr, labels and splits in RAM, indices in the page
cache) and minus `--page-cache-shares` of it left to the page cache, a configuration each: by default none (what
`train` and `tune` leave) and a tenth (1.1-1.6x slower than none at 80% on bench-10m, 2026-11-26; at 50% one run
each way, and none thrashed at 50% on 2026-11-25's machine). With `--limit-gib` every child runs under that one limit
from its first batch instead (no unlimited batches: on papers100m-like the memory map would take hours for them),
keeping `--working-gib` for its own working memory. A preset is copied out of the shared dataset cache first, so
that no other process's map of the same files holds their pages. The page cache is dropped before each child when
the kernel allows it. Beside them: the disk's random 4 KiB read rate at the store's queue depth and its sequential
rate (O_DIRECT loops of ours, morphpipe.profiler.disk: the random reads kept in flight by threads and by one
io_uring, the higher rate counting as the disk's), and the share of them the store's misses reach.

And, after the runs, the physical bound at each limit (`physical_bounds`): the largest cache the limit's room holds
beside the topology (nothing left to the page cache), the hit ratio there of the better ranking (in-degree or
expected access) over `--bound-batches` batches sampled like the runs' (the expected-access model's prediction
beside it), the rows those batches then miss, and the least time the disk takes to read them (`least_read_seconds`:
each read costs the larger of one slot of the fastest random-read rate measured in the run, probes' or store's, and
its bytes at the highest random-read bytes/s measured, 4 KiB to 256 KiB blocks; reads may span the gaps between
misses), so no reader of this disk can deliver more batches/s at that limit, whatever its reader or threads. The
table states it and its multiple of the memory map's measured rate.

  python scripts/bench_giant.py /work/bench_scratch/bench-10m --shares 0.8 --json bench_out/giant_store.json
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup/memory")
ARRAYS = ("indptr", "indices", "features", "labels", "train_idx", "val_idx", "test_idx")
IN_RAM = ("indptr", "labels", "train_idx", "val_idx", "test_idx")  # loaded into anonymous memory by GraphStore.load
MODES = ("mmap", "uring-direct", "pread-direct", "uring", "pread")
DEFAULT_MODES = ("mmap", "uring-direct", "pread-direct")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset", help="graph directory or preset name (generated into the cache if missing)")
    parser.add_argument("--shares", default="1,0.8,0.5",
                        help="memory limits as shares of the dataset's arrays (1: everything fits; default 1,0.8,0.5)")
    parser.add_argument("--limit-gib", type=float, default=None,
                        help="one fixed memory limit in GiB for every mode instead of --shares, set before the first "
                             "batch (for graphs whose memory map cannot build batches unlimited in reasonable time, "
                             "e.g. papers100m-like); the store's cache gets it less --working-gib, the topology and "
                             "the --page-cache-shares left to the page cache")
    parser.add_argument("--working-gib", type=float, default=1.0,
                        help="with --limit-gib: the room kept for the process's own working memory (default 1.0)")
    parser.add_argument("--modes", default=",".join(DEFAULT_MODES),
                        help=f"any of {','.join(MODES)} (default {','.join(DEFAULT_MODES)})")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--fanouts", default="15,10,5")
    parser.add_argument("--threads", type=int, default=2, help="batcher worker threads (default 2)")
    parser.add_argument("--io-threads", type=int, default=48,
                        help="the pread pool's I/O threads (default 48, the store's)")
    parser.add_argument("--uring-depths", default=None,
                        help="reads in flight per gathering thread with io_uring, one configuration each (default: "
                             "the store's io_threads + 1, and (io_threads + threads) / threads, the pool's total)")
    parser.add_argument("--uring-depth", type=int, default=None, help=argparse.SUPPRESS)  # a child's one depth
    parser.add_argument("--seconds", type=float, default=20.0, help="measuring time per configuration (default 20)")
    parser.add_argument("--max-batches", type=int, default=200)
    parser.add_argument("--max-seconds", type=float, default=150.0,
                        help="hard cap per configuration after the limit is set: a thrashing one reports the batches "
                             "it finished by then (default 150)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--scratch", type=Path, default=Path("/work/bench_scratch"),
                        help="where a preset is copied to, away from other processes' maps "
                             "(default /work/bench_scratch)")
    parser.add_argument("--ranking", choices=("in-degree", "expected-access"), default="in-degree",
                        help="what the store's cache ranks rows by: in-degree (default), or the expected reads of "
                             "morphpipe.sampling.access_hotness for these seeds, fanouts and batch size")
    parser.add_argument("--page-cache-shares", default="0,0.1",
                        help="shares of the limit's room for the arrays left to the page cache (the memory-mapped "
                             "indices) rather than given to the store's cache, one store configuration each "
                             "(default 0,0.1)")
    parser.add_argument("--page-cache-share", type=float, default=0.1, help=argparse.SUPPRESS)  # a child's one
    parser.add_argument("--bound-batches", type=int, default=8,
                        help="batches sampled to measure the physical bound's hit ratio and misses (0: no bound; "
                             "default 8)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    for name in ("limit_gib", "working_gib"):
        value = getattr(args, name)
        if value is not None and not (0 < value < float("inf")):
            parser.error(f"--{name.replace('_', '-')} {value}: give a positive number of GiB")
    try:
        page_cache_shares = [float(value) for value in args.page_cache_shares.split(",")]
    except ValueError:
        page_cache_shares = [-1.0]
    if not all(0 <= value < 1 for value in page_cache_shares):
        parser.error(f"--page-cache-shares {args.page_cache_shares}: give shares in [0, 1), comma-separated")
    if args.bound_batches < 0:
        parser.error(f"--bound-batches {args.bound_batches}: give 0 (no bound) or more batches")
    unknown = set(args.modes.split(",")) - set(MODES)
    if unknown:
        parser.error(f"--modes: {', '.join(sorted(unknown))} unknown; choose from {', '.join(MODES)}")
    if args.uring_depths is None:
        args.uring_depths = f"{args.io_threads + 1},{max(1, (args.io_threads + args.threads) // args.threads)}"
    if args.child is not None:
        return child(args)
    return parent(args)


def dataset_dir(name: str, scratch: Path) -> Path:
    """A graph directory as given, or a preset copied out of the shared cache into `scratch`: another process
    mapping the cached files would hold their pages in the page cache, charged to it, not to our memory group."""
    from morphpipe.data import PRESETS, ensure_preset

    path = Path(name).expanduser()
    if path.is_dir():
        return path
    cached = ensure_preset(PRESETS[name], progress=True)
    private = scratch / name
    if not private.is_dir() or any(not (private / f.name).exists() or (private / f.name).stat().st_size !=
                                   f.stat().st_size for f in cached.iterdir()):
        if private.exists():
            shutil.rmtree(private)
        shutil.copytree(cached, private)
    return private


def array_bytes(directory: Path, names) -> int:
    return sum((directory / f"{name}.npy").stat().st_size for name in names)


def cache_room(directory: Path, share: float, args) -> float:
    """Bytes a feature cache could take under the limit for `share` of the arrays: that share less the topology
    (indptr, labels and splits in RAM, the indices in the page cache, the cache's [N] int32 slot map) and, with
    --limit-gib (no unlimited batches to measure the working memory by), the --working-gib asked for."""
    num_nodes = (directory / "indptr.npy").stat().st_size // 8
    room = share * array_bytes(directory, ARRAYS) - array_bytes(directory, IN_RAM + ("indices",)) - 4 * num_nodes
    return room - args.working_gib * 2**30 if args.limit_gib else room


def drop_page_cache() -> bool:
    """Drops clean page cache (root only); False when the kernel refuses."""
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
        return True
    except OSError:
        return False


def parent(args) -> int:
    import signal

    import torch

    from morphpipe import native
    from morphpipe.profiler.disk import measure_disk_reads

    if os.geteuid() != 0 or not (CGROUP_ROOT / "memory.limit_in_bytes").exists():
        print(f"bench_giant: needs root and the cgroup v1 memory controller at {CGROUP_ROOT}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that a killed run still removes its memory group
    directory = dataset_dir(args.dataset, args.scratch)
    total = array_bytes(directory, ARRAYS)
    features = directory / "features.npy"
    cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    print(f"dataset {directory}: arrays {total / 1e6:,.0f} MB (features {features.stat().st_size / 1e6:,.0f} MB); "
          f"cpu {cpu}, {os.cpu_count()} cores; torch {torch.__version__}; load {os.getloadavg()[0]:.1f}", flush=True)
    queue_depth = args.io_threads + args.threads  # the store's I/O threads and the batcher threads calling it
    drop_page_cache()
    block = min(4 << 20, features.stat().st_size // 4096 * 4096)
    uring = not native.load().io_uring_unavailable_reason()
    # The disk's random 4 KiB rate at every total of reads in flight a configuration keeps: with threads at the
    # pool's, with one ring at each (the higher rate counting as the disk's).
    depths = sorted({queue_depth} | ({int(d) * args.threads for d in args.uring_depths.split(",")} if uring else set()))
    by_depth, sequential = {}, []
    for depth in depths:
        rates = {}
        for reader in (["pread"] if depth == queue_depth else []) + (["io_uring"] if uring else []):
            facts = measure_disk_reads(features, depth, seconds=3.0, sequential_block=block, reader=reader)
            rates[reader] = facts.random_reads_per_s
            sequential.append(facts.sequential_bytes_per_s)
        by_depth[depth] = rates
    single = measure_disk_reads(features, 1, seconds=1.0, sequential_block=block, reader="pread")
    # Random reads of larger blocks at the store's depth: their bytes/s, not the sequential rate, cap what reading
    # the gaps between misses can bring (the physical bound's).
    by_block = {size: measure_disk_reads(features, queue_depth, seconds=1.5, block=size, sequential_block=block,
                                         reader="pread").random_reads_per_s for size in BOUND_PROBE_BLOCKS}
    disk = {"random_4k_iops_by_depth": {depth: max(rates.values()) for depth, rates in by_depth.items()},
            "random_4k_iops_by_depth_and_reader": by_depth, "random_4k_iops_qd1": single.random_reads_per_s,
            "sequential_mb_s": max(sequential + [single.sequential_bytes_per_s]) / 1e6,
            "random_reads_by_block": by_block,
            "io_uring": native.load().io_uring_unavailable_reason() or "available"}
    measured = "; ".join(f"QD {depth}: " + ", ".join(f"{rate:,.0f} with {'threads' if reader == 'pread' else 'one io_uring'}"
                                                    for reader, rate in rates.items())
                         for depth, rates in by_depth.items())
    print(f"disk (O_DIRECT on {features.name}), random 4 KiB reads/s at {measured}; at QD 1: "
          f"{disk['random_4k_iops_qd1']:,.0f}; sequential {block >> 10} KiB: {disk['sequential_mb_s']:,.0f} MB/s; "
          f"random reads at QD {queue_depth}: " + ", ".join(f"{size >> 10} KiB {rate:,.0f}/s "
                                                           f"({rate * size / 1e6:,.0f} MB/s)"
                                                           for size, rate in by_block.items())
          + ("" if uring else f"; io_uring unavailable ({disk['io_uring']})"), flush=True)
    miss_path = [measure_miss_path(features, args, reader, depth)
                 for reader, depth in [("pread", 0)] + ([("io_uring", int(d)) for d in args.uring_depths.split(",")]
                                                        if uring else [])]
    for line in miss_path:
        print(f"miss path, {line['reader']} ({line['in_flight']} in flight): {line['rows_per_s']:,.0f} rows/s, "
              f"{line['reads_per_s']:,.0f} reads/s, {line['mb_per_s']:,.0f} MB/s, {line['cpu_us_per_read']:.1f} CPU us "
              "per read", flush=True)
    # With --limit-gib, one share: the fixed limit's, which the child sets before its first batch.
    shares = [args.limit_gib * 2**30 / total] if args.limit_gib else [float(s) for s in args.shares.split(",")]
    results = []
    configurations = [(mode, int(depth), float(kept)) for mode in args.modes.split(",")
                      for depth in (args.uring_depths.split(",") if mode.startswith("uring") else [0])
                      for kept in (args.page_cache_shares.split(",") if mode != "mmap" else [0])]
    for share in shares:
        for mode, depth, kept in configurations:
            dropped = drop_page_cache()
            group = CGROUP_ROOT / f"morphpipe-bench-giant-{os.getpid()}-{mode}-{depth}-{kept}-{share}"
            group.mkdir()
            process = None
            try:
                command = [sys.executable, __file__, str(directory), "--child", f"{mode}:{share}:{group}",
                           "--batch-size", str(args.batch_size), "--fanouts", args.fanouts, "--threads",
                           str(args.threads), "--io-threads", str(args.io_threads), "--uring-depth",
                           str(depth), "--seconds", str(args.seconds),
                           "--max-batches", str(args.max_batches), "--max-seconds", str(args.max_seconds),
                           "--working-gib", str(args.working_gib), "--ranking", args.ranking,
                           "--page-cache-share", str(kept)] + \
                    (["--limit-gib", str(args.limit_gib)] if args.limit_gib else [])
                process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                stdout, stderr = process.communicate()
            finally:
                if process is not None and process.poll() is None:  # interrupted: the group goes once it is empty
                    process.kill()
                    process.wait()
                group.rmdir()
            if process.returncode != 0:
                print(f"{mode} at share {share}: child failed ({process.returncode}):\n{stderr[-2000:]}", flush=True)
                results.append({"mode": mode, "share": share, "page_cache_share": kept if mode != "mmap" else None,
                                "failed": process.returncode, "stderr": stderr[-2000:]})
                continue
            result = json.loads(stdout.strip().splitlines()[-1])
            result["page_cache_dropped"] = dropped
            results.append(result)
            print(row(result, disk), flush=True)
    # The disk's highest random-read rate measured in this run (the 4 KiB probes', the miss path's and the store's
    # own reads'), and its highest random-read bytes/s (4 KiB reads or larger blocks'): no read comes faster than
    # either allows, so the bound's model of a read's cost lies above every rate measured.
    fastest = max([*disk["random_4k_iops_by_depth"].values(), *(line["reads_per_s"] for line in miss_path),
                   *(r["store_reads"] / r["seconds"] for r in results if r.get("store_reads"))])
    widest = max([fastest * 4096, *(rate * size for size, rate in disk["random_reads_by_block"].items())])
    bounds = physical_bounds(directory, args, shares, fastest, widest) if args.bound_batches else {}
    print()
    print(table(results, disk))
    for share, bound in bounds.items():
        print(bound_line(bound, next((r["batches_per_s"] for r in results if r.get("mode") == "mmap" and
                                      r["share"] == share and "failed" not in r and not r["capped"]), None)))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"dataset": str(directory), "arrays_bytes": total, "cpu": cpu,
                                         "load": os.getloadavg(), "disk": disk, "miss_path": miss_path,
                                         "results": results, "bounds": list(bounds.values()),
                                         "settings": vars(args)}, indent=2, default=str))
    return 0


# Block sizes of the random-read probe that measures the disk's random bytes/s for the physical bound.
BOUND_PROBE_BLOCKS = (16384, 65536, 262144)


def least_read_seconds(starts, ends, random_reads_per_s: float, bytes_per_s: float) -> tuple[float, int]:
    """The least time a disk takes to read the byte ranges [starts[k], ends[k]) (sorted, not overlapping), and the
    reads it takes then, when one read of s bytes costs max(1 / random_reads_per_s, s / bytes_per_s) of the
    disk's time (its random reads/s and random-read bytes/s): a read covers consecutive ranges and the gaps between
    them, so a reader trades reads for bytes. Exact over every way of grouping consecutive ranges into reads (one pass: a read no longer than the random
    rate's slot costs one slot, a longer one its bytes)."""
    slot = 1.0 / random_reads_per_s
    window = bytes_per_s * slot  # the bytes a read may span for the cost of one slot
    count = len(starts)
    best, reads = [0.0] * (count + 1), [0] * (count + 1)  # over the first i ranges
    first = 0  # the first range a read ending at the current one spans within the window
    longer = (float("inf"), 0)  # min over reads starting before `first`: best[j] - starts[j] / rate, reads[j]
    for i in range(1, count + 1):
        end = ends[i - 1]
        while first < i - 1 and end - starts[first] > window:
            value = best[first] - starts[first] / bytes_per_s
            if value < longer[0]:
                longer = (value, reads[first])
            first += 1
        best[i] = best[first] + max(slot, (end - starts[first]) / bytes_per_s)
        reads[i] = reads[first] + 1
        if longer[0] + end / bytes_per_s < best[i]:
            best[i], reads[i] = longer[0] + end / bytes_per_s, longer[1] + 1
    return best[count], reads[count]


def physical_bounds(directory: Path, args, shares: list[float], random_reads_per_s: float,
                    bytes_per_s: float) -> dict[float, dict]:
    """For each share: the largest cache the limit leaves room for (`cache_room`, nothing to the page cache), the
    hit ratio of each ranking there over `--bound-batches` sampled batches (and the expected-access model's), and,
    with the better ranking's misses, the most batches/s any reader of the disk could deliver: one over the least
    disk time a batch's misses take (`least_read_seconds`)."""
    import torch

    from morphpipe.data import GraphStore
    from morphpipe.data.feature_store import FeatureStore, hotness_order, npy_layout
    from morphpipe.data.store import UnvalidatedGraphWarning
    from morphpipe.data.ondisk import read_meta
    from morphpipe.profiler.disk import hit_ratio_by_cache_size, hotness_rank
    from morphpipe.sampling.access_hotness import expected_batch_reads
    from morphpipe.sampling.cpu_batcher import sample_blocks
    from morphpipe.sampling.epochs import epoch_order

    began = time.perf_counter()
    graph = GraphStore.load(directory, validate=False)  # the features stay memory-mapped and untouched
    fanouts = [int(f) for f in args.fanouts.split(",")]
    layout = npy_layout(directory / "features.npy")
    row_bytes = layout.shape[1] * layout.dtype.itemsize
    expected = expected_batch_reads(graph.indptr, graph.indices, graph.train_idx, fanouts, args.batch_size)
    rankings = {"in-degree": graph.in_degrees(), "expected-access": expected}
    order = epoch_order(graph.train_idx, 0, 0)
    with warnings.catch_warnings():  # the runs' children load it unvalidated too: a generated graph, checked once
        warnings.simplefilter("ignore", UnvalidatedGraphWarning)
        gathered = [sample_blocks(graph, order[start:start + args.batch_size], fanouts, seed=index).input_nodes
                    for index, start in enumerate(range(0, min(order.numel(), args.bound_batches * args.batch_size),
                                                        args.batch_size))]
    # Counts reads as the store coalesces them, reading nothing.
    store = FeatureStore(directory / "features.npy", read_meta(directory).feature_dtype, io_threads=1, direct=True)
    bounds = {}
    for share in shares:
        room = max(0.0, cache_room(directory, share, args))
        rows = min(layout.shape[0], int(room) // row_bytes)
        hits = {name: hit_ratio_by_cache_size(hotness, gathered, [rows])[0] for name, hotness in rankings.items()}
        modelled = {name: float(expected[hotness_order(hotness)[:rows]].sum() / expected.sum())
                    for name, hotness in rankings.items()}
        best = max(hits, key=hits.get)
        rank = hotness_rank(rankings[best])
        misses = [torch.sort(ids[rank[ids] >= rows]).values for ids in gathered]
        plans = [least_read_seconds((layout.data_offset + ids * row_bytes).tolist(),
                                    (layout.data_offset + (ids + 1) * row_bytes).tolist(),
                                    random_reads_per_s, bytes_per_s) for ids in misses]
        seconds = sum(plan[0] for plan in plans) / len(plans)
        bounds[share] = {
            "share": share, "cache_room_bytes": int(room), "cache_rows": rows, "rows": layout.shape[0],
            "rows_per_batch": sum(ids.numel() for ids in gathered) / len(gathered),
            "hit_ratio_sampled": hits, "hit_ratio_modelled": modelled, "best_ranking": best,
            "missed_rows_per_batch": sum(ids.numel() for ids in misses) / len(misses),
            "store_reads_per_batch": sum(store.count_reads(ids)[0] for ids in misses if ids.numel()) / len(misses),
            "least_reads_per_batch": sum(plan[1] for plan in plans) / len(plans),
            "least_disk_seconds_per_batch": seconds,
            "random_reads_per_s": random_reads_per_s, "bytes_per_s": bytes_per_s,
            "batches_per_s": 1.0 / seconds if seconds else float("inf"),
            "batches": len(gathered), "seconds": time.perf_counter() - began}
    return bounds


def bound_line(bound: dict, mmap_rate: float | None = None) -> str:
    """The physical bound at one limit in words, and its multiple of the memory map's measured rate if given."""
    if not bound["missed_rows_per_batch"]:
        return (f"physical bound at {bound['share']:.0%}: room for a cache of {bound['cache_room_bytes'] / 1e6:,.0f} "
                f"MB holds every row the {bound['batches']} sampled batches read: no reads, no bound from the disk")
    hits = ", ".join(f"{name} {ratio:.1%} (model {bound['hit_ratio_modelled'][name]:.1%})"
                     for name, ratio in bound["hit_ratio_sampled"].items())
    missed = bound["missed_rows_per_batch"]
    line = (f"physical bound at {bound['share']:.0%}: room for a cache of {bound['cache_room_bytes'] / 1e6:,.0f} MB "
            f"({bound['cache_rows'] / bound['rows']:.1%} of the rows, nothing left to the page cache); hit ratio over "
            f"{bound['batches']} sampled batches of {bound['rows_per_batch']:,.0f} rows: {hits}; with "
            f"{bound['best_ranking']}: {missed:,.0f} missed rows a batch, in {bound['store_reads_per_batch']:,.0f} "
            f"reads as the store coalesces them ({missed / max(bound['store_reads_per_batch'], 1):.2f} rows a read), "
            f"in {bound['least_reads_per_batch']:,.0f} at the least disk time ({missed / bound['least_reads_per_batch']:.2f} "
            f"rows a read, {bound['least_disk_seconds_per_batch'] * 1e3:,.0f} ms a batch) on a disk of "
            f"{bound['random_reads_per_s']:,.0f} random reads/s and {bound['bytes_per_s'] / 1e6:,.0f} MB/s "
            f"of random reads (the fastest of each measured in this run) => at most {bound['batches_per_s']:.2f} "
            "batches/s for any reader of this disk")
    if mmap_rate:
        line += (f", {bound['batches_per_s'] / mmap_rate:.1f}x the memory map's {mmap_rate:.3f}: the goal of 10x is "
                 + ("within" if bound["batches_per_s"] >= 10 * mmap_rate else "out of") + " reach on this disk")
    return line


def measure_miss_path(features: Path, args, reader: str, depth: int, seconds: float = 4.0) -> dict:
    """The store's misses alone, no batcher, no memory limit: `--threads` threads gather random rows (a batch's
    worth of misses each call) through a cache-less O_DIRECT store with `reader` (io_uring rings `depth` deep) for
    about `seconds`; rows, reads and bytes per second, and the process's CPU time per read."""
    import torch

    from morphpipe.data.feature_store import FeatureStore
    from morphpipe.data.ondisk import read_meta

    io_threads = depth - 1 if reader == "io_uring" else args.io_threads
    store = FeatureStore(features, read_meta(features.parent).feature_dtype, io_threads=io_threads, direct=True,
                         reader=reader)
    generator = torch.Generator().manual_seed(0)
    calls = [torch.randint(0, store.shape[0], (40_000,), generator=generator) for _ in range(8)]
    store.gather(calls[0])
    store.reset_counters()
    began, cpu_before = time.perf_counter(), cpu_seconds()

    def gather(lane: int) -> None:
        index = lane
        while time.perf_counter() - began < seconds:
            store.gather(calls[index % len(calls)])
            index += args.threads

    threads = [threading.Thread(target=gather, args=(lane,)) for lane in range(args.threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed, cpu = time.perf_counter() - began, cpu_seconds() - cpu_before
    counted = store.counters()
    return {"reader": reader, "in_flight": depth * args.threads if reader == "io_uring" else io_threads + args.threads,
            "rows_per_s": counted.misses / elapsed, "reads_per_s": counted.reads / elapsed,
            "mb_per_s": counted.bytes_read / elapsed / 1e6, "cpu_us_per_read": cpu / max(counted.reads, 1) * 1e6}


def label(result: dict) -> str:
    """A configuration's mode, and for the store the share of the room it left to the page cache."""
    kept = result.get("page_cache_share")
    return result["mode"] if kept is None else f"{result['mode']} ({kept:.0%} to the page cache)"


def row(result: dict, disk: dict) -> str:
    if "failed" in result:
        return f"| {label(result)} | {result['share']:.0%} | failed (exit {result['failed']}) |"
    seconds = result["seconds"]
    batches, rate = str(result["batches"]), f"{result['batches_per_s']:.3f}"
    if result.get("capped"):  # stopped at --max-seconds: at most one more batch would have come in that time
        batches += f" in {seconds:.0f} s (capped)"
        rate = f"< {(result['batches'] + 1) / seconds:.3f}"
    read_mb_s = result["read_bytes"] / seconds / 1e6
    on_disk = result.get("store_reads") is not None
    hit = f"{result['hit_ratio']:.1%}" if on_disk else "-"
    # The misses' rates over the measured wall time (not just the time reads were in flight).
    store_iops = result["store_reads"] / seconds if on_disk else None
    ceiling = disk["random_4k_iops_by_depth"].get(result.get("in_flight"))  # the disk at the store's depth
    iops = (f"{store_iops:,.0f} ({store_iops / ceiling:.0%} of {ceiling:,.0f})" if ceiling else f"{store_iops:,.0f}") \
        if on_disk else "-"
    miss_rows = f"{result['store_misses'] / seconds:,.0f}" if on_disk else "-"
    store_mb_s = f"{result['store_bytes'] / seconds / 1e6:,.0f}" if on_disk else "-"
    request = f"{result['store_bytes'] / result['store_reads'] / 1024:,.1f}" if result.get("store_reads") else "-"
    return (f"| {label(result)} | {result['share']:.0%} | {result['limit_bytes'] / 1e6:,.0f} | "
            f"{result['cache_bytes'] / 1e6:,.0f} | {result.get('in_flight') or '-'} | {batches} | {rate} | {hit} | "
            f"{miss_rows} | {iops} | {store_mb_s} | {request} | "
            f"{read_mb_s:,.0f} ({read_mb_s / disk['sequential_mb_s']:.0%}) | "
            f"{result['cpu_seconds'] / max(result['batches'], 1) * 1e3:,.0f} | {result['peak_bytes'] / 1e6:,.0f} |")


def table(results: list[dict], disk: dict) -> str:
    header = ("| mode | limit (share of arrays) | limit MB | cache MB | reads in flight | batches | batches/s | "
              "hit ratio | missed rows/s | store reads/s (share of the disk's random 4 KiB reads/s at that depth) | store read MB/s | "
              "KiB per read | disk read MB/s (share of sequential) | CPU ms per batch | group peak MB |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    lines = [header] + [row(result, disk) for result in results]
    baseline = {r["share"]: r for r in results if r.get("mode") == "mmap" and "failed" not in r}
    for result in results:
        mmap_run = baseline.get(result["share"])
        if result.get("mode") != "mmap" and "failed" not in result and mmap_run:
            if mmap_run.get("capped"):  # the baseline's rate is only bounded from above
                bound = (mmap_run["batches"] + 1) / mmap_run["seconds"]
                lines.append(f"{label(result)} / mmap at {result['share']:.0%}: > "
                             f"{result['batches_per_s'] / bound:.1f}x")
            elif mmap_run["batches_per_s"] > 0:
                lines.append(f"{label(result)} / mmap at {result['share']:.0%}: "
                             f"{result['batches_per_s'] / mmap_run['batches_per_s']:.1f}x")
    return "\n".join(lines)


def cgroup_stat(group: Path) -> dict[str, int]:
    lines = (group / "memory.stat").read_text().splitlines()
    return {key: int(value) for key, value in (line.split() for line in lines)}


def child(args) -> int:
    mode, share, group = args.child.split(":", 2)
    share, group = float(share), Path(group)
    (group / "cgroup.procs").write_text(f"{os.getpid()}\n")
    fixed_limit = int(args.limit_gib * 2**30) if args.limit_gib else None
    if fixed_limit is not None:
        (group / "memory.limit_in_bytes").write_text(f"{fixed_limit}\n")
    import torch

    from morphpipe import native
    from morphpipe.data import GraphStore
    from morphpipe.data.feature_store import FeatureStore
    from morphpipe.data.ondisk import read_meta
    from morphpipe.sampling import CpuBatcher
    from morphpipe.sampling.access_hotness import expected_batch_reads

    native.load()
    directory = Path(args.dataset)
    total = array_bytes(directory, ARRAYS)
    in_ram = array_bytes(directory, IN_RAM)
    on_disk = mode != "mmap"
    reader, _, reads = mode.partition("-")
    io_threads = args.uring_depth - 1 if reader == "uring" else args.io_threads
    in_flight = (args.uring_depth * args.threads if reader == "uring" else args.io_threads + args.threads) \
        if on_disk else None
    cache_bytes = 0
    if on_disk:
        # A share of the room left to the page cache: a cache that squeezes the memory-mapped indices makes the
        # sampler fault them in with readahead (at 50% on bench-10m none left ran 0.007 batches/s on 2026-11-25's
        # machine; on 2026-11-26's 0.73x and 1.40x a tenth's, and 1.09-1.63x in 5 runs at 80%).
        cache_bytes = max(0, int(cache_room(directory, share, args) - args.page_cache_share * share * total))
    graph = GraphStore.load(directory, validate=False)
    fanouts = [int(f) for f in args.fanouts.split(",")]
    if on_disk:
        hotness = graph.in_degrees() if args.ranking == "in-degree" else \
            expected_batch_reads(graph.indptr, graph.indices, graph.train_idx, fanouts, args.batch_size)
        graph.feature_store = FeatureStore(directory / "features.npy", read_meta(directory).feature_dtype,
                                           cache_bytes=cache_bytes, hotness=hotness,
                                           io_threads=io_threads, direct=reads == "direct",
                                           reader="io_uring" if reader == "uring" else "pread")
        del hotness
    store = graph.feature_store
    batcher = CpuBatcher(graph, fanouts, args.batch_size, num_threads=args.threads, queue_size=args.threads, seed=0,
                         pin_memory=False)

    def batches():
        epoch = 0
        while True:
            yield from batcher.epoch(epoch)
            epoch += 1

    stream = batches()
    if fixed_limit is None:
        peak_anon = 0
        for _ in range(6):  # unlimited: the working memory (batch buffers, recycled) reaches its steady size
            next(stream)
            peak_anon = max(peak_anon, cgroup_stat(group)["rss"])
        anon_arrays = in_ram + (store.cache_bytes + 4 * graph.num_nodes if store is not None else 0)
        working = max(0, peak_anon - anon_arrays)
        limit = int(1.15 * working + share * total)
        (group / "memory.limit_in_bytes").write_text(f"{limit}\n")
    else:
        working, limit = int(args.working_gib * 2**30), fixed_limit
    (group / "memory.max_usage_in_bytes").write_text("0\n")
    limited = time.perf_counter()
    progress = {"count": 0, "started": None, "io_before": None}

    def consume() -> None:
        next(stream)  # under the limit: what the kernel keeps settles
        if store is not None:
            store.reset_counters()
        progress["io_before"] = read_bytes()
        progress["started"] = time.perf_counter()
        progress["cpu_before"] = cpu_seconds()
        while progress["count"] < args.max_batches and (
                time.perf_counter() - progress["started"] < args.seconds or progress["count"] < 2):
            next(stream)
            progress["count"] += 1

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    consumer.join(timeout=args.max_seconds)  # a thrashing configuration reports what it managed by then
    capped = consumer.is_alive()
    count = progress["count"]
    started = progress["started"] if progress["started"] is not None else limited
    elapsed = time.perf_counter() - started
    cpu = cpu_seconds() - progress.get("cpu_before", cpu_seconds())
    counters = store.counters() if store is not None else None
    if not capped:
        batcher.close()
    print(json.dumps({
        "mode": mode, "share": share, "page_cache_share": args.page_cache_share if on_disk else None,
        "limit_bytes": limit, "working_bytes": working, "cache_bytes": cache_bytes,
        "batches": count, "seconds": elapsed, "batches_per_s": count / elapsed, "capped": capped, "cpu_seconds": cpu,
        "read_bytes": read_bytes() - (progress["io_before"] or read_bytes()),
        "peak_bytes": int((group / "memory.max_usage_in_bytes").read_text()),
        "hit_ratio": counters.hit_ratio if counters else None, "store_reads": counters.reads if counters else None,
        "store_bytes": counters.bytes_read if counters else None,
        "store_misses": counters.misses if counters else None, "in_flight": in_flight,
        "store_read_seconds": counters.read_seconds if counters else None, "torch_threads": torch.get_num_threads(),
    }), flush=True)
    if capped:
        os._exit(0)  # the consumer still waits in the native batcher; nothing else is left to do
    return 0


def cpu_seconds() -> float:
    """User and system CPU time this process (all its threads) has used."""
    times = os.times()
    return times.user + times.system


def read_bytes() -> int:
    """Bytes this process (all its threads) had read from storage."""
    for line in open("/proc/self/io"):
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
    raise RuntimeError("/proc/self/io has no read_bytes")


if __name__ == "__main__":
    sys.exit(main())
