"""Benchmark: generate a preset (default bench-10m) and report wall time per stage, peak memory and disk.

Peak memory is the process's peak resident set size (resource.getrusage ru_maxrss) at the end of
generation; features go to disk chunk by chunk, so the page cache holding them is not counted.
Peak disk is the largest size of the directory being built (sort runs included), sampled every 0.2 s.
--scale S generates the preset with S times its nodes (same degree; a mag preset with S times the nodes of every
type), --nodes / --avg-degree override them, --memory-budget bounds the generation (edges beyond it are sorted on disk
in runs).
Usage: python scripts/bench_generate.py [PRESET] [--scale S] [--memory-budget 6G] [--out DIR] [--json FILE] [--keep]
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import resource
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import torch

from morphpipe.commands.arguments import byte_size, positive_float, positive_int
from morphpipe.data import PRESETS, GraphStore, generate, get_preset
from morphpipe.data.generators import generation_needs
from morphpipe.data.hetero_generator import MagSpec, generate_hetero, mag_generation_needs
from morphpipe.data.hetero_store import HeteroGraphStore
from morphpipe.data.ondisk import read_meta


def machine() -> dict:
    """Where the numbers were taken."""
    cpu = platform.processor()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {
        "cpu": cpu,
        "logical_cores": psutil.cpu_count(logical=True),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "torch": torch.__version__,
        "os": platform.platform(),
    }


def peak_rss_gib() -> float:
    """Peak resident set size of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


class DirectorySizeSampler(threading.Thread):
    """Samples the bytes on disk under the hidden directories `generate` builds the graph in beside `target`."""

    def __init__(self, target: Path, period: float = 0.2):
        super().__init__(daemon=True)
        self.target, self.period = target, period
        self.peak = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(self.period):
            size = 0
            for staging in self.target.parent.glob(f".{self.target.name}.partial-*"):
                for entry in staging.iterdir():
                    try:
                        size += entry.stat().st_blocks * 512
                    except FileNotFoundError:
                        pass
            self.peak = max(self.peak, size)

    def stop(self) -> int:
        self.done.set()
        self.join()
        return self.peak


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("preset", nargs="?", default="bench-10m", choices=list(PRESETS))
    parser.add_argument("--out", help="output directory (default: a temporary directory, removed afterwards)")
    parser.add_argument("--json", dest="json_path", default="bench_out/bench_generate.json",
                        help="where to write the results (default bench_out/bench_generate.json)")
    parser.add_argument("--keep", action="store_true", help="keep the generated graph")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.add_argument("--scale", type=positive_float, default=1.0, help="fraction of the preset's nodes (1)")
    parser.add_argument("--nodes", type=positive_int, help="number of nodes (overrides --scale)")
    parser.add_argument("--avg-degree", type=positive_float, help="average degree (default: the preset's)")
    parser.add_argument("--memory-budget", type=byte_size, help="default: half the available memory")
    parser.add_argument("--no-load", action="store_true", help="skip loading and validating the result (needed where "
                        "the features exceed RAM + swap: they are mapped copy-on-write)")
    args = parser.parse_args()

    preset = get_preset(args.preset)
    hetero = isinstance(preset.spec, MagSpec)
    if hetero and (args.nodes or args.avg_degree or args.no_load):
        parser.error("a mag preset is sized by --scale only, and is always loaded")
    if hetero:
        spec = preset.spec.scaled_to(max(1, round(preset.spec.num_papers * args.scale)))
    else:
        spec = preset.spec.with_overrides(num_nodes=args.nodes or max(1, round(preset.spec.num_nodes * args.scale)),
                                          avg_degree=args.avg_degree)
    scaled = spec != preset.spec
    workdir = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix=f"morphpipe-{preset.name}-"))
    needs = (mag_generation_needs if hetero else generation_needs)(spec, args.memory_budget, workdir)
    rss_before = peak_rss_gib()
    stages: dict[str, float] = {}
    disk = DirectorySizeSampler(workdir)
    disk.start()
    started = time.perf_counter()
    if hetero:  # no per-stage timings: one progress bar per relation pass says where the time goes
        generate_hetero(spec, workdir, preset=None if scaled else preset.name, progress=not args.quiet,
                        overwrite=True, memory_budget=args.memory_budget)
    else:
        generate(spec, workdir, preset=None if scaled else preset.name, progress=not args.quiet, overwrite=True,
                 timings=stages, memory_budget=args.memory_budget)
    seconds = time.perf_counter() - started
    peak_disk = disk.stop()
    peak = peak_rss_gib()

    load_seconds = None
    if args.no_load:  # GraphStore.load maps features copy-on-write, which the kernel refuses beyond RAM + swap
        meta = read_meta(workdir)
        num_nodes, num_edges = meta.num_nodes, meta.num_edges
    else:
        loaded = time.perf_counter()
        store = (HeteroGraphStore if hetero else GraphStore).load(workdir, validate=True)
        load_seconds = round(time.perf_counter() - loaded, 2)
        num_nodes, num_edges = store.num_nodes, store.num_edges
        del store
    disk_bytes = sum(path.stat().st_size for path in workdir.iterdir())
    result = {
        "benchmark": "generate",
        "preset": preset.name,
        "scaled": scaled,
        "spec": spec.to_dict(),
        "memory_budget_gib": round(needs.budget / 2**30, 2),
        "sorted_runs": needs.sort.num_runs,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": machine(),
        "num_nodes": num_nodes,
        "num_edges": num_edges,
        "generate_seconds": round(seconds, 2),
        "stage_seconds": {stage: round(value, 2) for stage, value in stages.items()},
        "peak_rss_gib": round(peak, 2),
        "peak_rss_before_gib": round(rss_before, 2),
        "load_and_validate_seconds": load_seconds,
        "disk_gib": round(disk_bytes / 2**30, 2),
        "peak_disk_gib": round(peak_disk / 2**30, 2),
        "estimated_peak_disk_gib": round(needs.peak_disk_bytes / 2**30, 2),
    }
    if not args.keep and not args.out:
        shutil.rmtree(workdir)
    Path(args.json_path).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json_path).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
