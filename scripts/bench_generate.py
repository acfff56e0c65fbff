"""Benchmark: generate a preset (default bench-10m) and report wall time per stage and peak memory.

Peak memory is the process's peak resident set size (resource.getrusage ru_maxrss) at the end of
generation; features go to disk chunk by chunk, so the page cache holding them is not counted.
Usage: python scripts/bench_generate.py [PRESET] [--out DIR] [--json FILE] [--keep]
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
import time
from pathlib import Path

import numpy as np
import psutil
import torch

from morphpipe.data import PRESETS, GraphStore, generate, get_preset


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("preset", nargs="?", default="bench-10m", choices=list(PRESETS))
    parser.add_argument("--out", help="output directory (default: a temporary directory, removed afterwards)")
    parser.add_argument("--json", dest="json_path", default="bench_out/bench_generate.json",
                        help="where to write the results (default bench_out/bench_generate.json)")
    parser.add_argument("--keep", action="store_true", help="keep the generated graph")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    args = parser.parse_args()

    preset = get_preset(args.preset)
    workdir = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix=f"morphpipe-{preset.name}-"))
    rss_before = peak_rss_gib()
    stages: dict[str, float] = {}
    started = time.perf_counter()
    generate(preset.spec, workdir, preset=preset.name, progress=not args.quiet, overwrite=True, timings=stages)
    seconds = time.perf_counter() - started
    peak = peak_rss_gib()

    loaded = time.perf_counter()
    store = GraphStore.load(workdir, validate=True)
    load_seconds = time.perf_counter() - loaded
    disk_bytes = sum(path.stat().st_size for path in workdir.iterdir())
    result = {
        "benchmark": "generate",
        "preset": preset.name,
        "spec": preset.spec.to_dict(),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": machine(),
        "num_nodes": store.num_nodes,
        "num_edges": store.num_edges,
        "generate_seconds": round(seconds, 2),
        "stage_seconds": {stage: round(value, 2) for stage, value in stages.items()},
        "peak_rss_gib": round(peak, 2),
        "peak_rss_before_gib": round(rss_before, 2),
        "load_and_validate_seconds": round(load_seconds, 2),
        "disk_gib": round(disk_bytes / 2**30, 2),
    }
    del store
    if not args.keep and not args.out:
        shutil.rmtree(workdir)
    Path(args.json_path).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json_path).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
