"""Resident memory of a long `morphpipe train` run, epoch by epoch: does it stay flat after the first epoch?

Starts `python -m morphpipe train DATASET --epochs N ...` as a child, samples the child's RSS every
`--interval` seconds, and reads its epoch lines ("epoch k/N: ...") to cut the samples into epochs.
Prints, per epoch, the RSS at its end and its peak, split as /proc/PID/status does into anonymous memory
(RssAnon: the heap, torch's tensors, thread stacks), file-backed pages (RssFile: the memory-mapped dataset's
pages the epoch touched, shared libraries) and shared memory (RssShmem), and the spread of each measure's
end-of-epoch value over epochs 2..N (issue 25's bar: within 5%). Extra arguments after `--` go to
`morphpipe train`; the child inherits the environment (e.g. MALLOC_ARENA_MAX to compare allocator settings).

  python scripts/bench_rss.py bench-1m --epochs 20 --json bench_out/rss.json -- --auto --no-progress
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

from morphpipe.profiler.resident import resident


EPOCH_LINE = re.compile(r"^epoch (\d+)/(\d+):")
MEASURES = ("rss", "anon", "file", "shmem")  # VmRSS and its three parts in /proc/PID/status


def spread(values: list[float]) -> float:
    """(max - min) / min of `values`: how far from flat."""
    return (max(values) - min(values)) / min(values) if values and min(values) > 0 else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--interval", type=float, default=0.2, help="seconds between RSS samples (default 0.2)")
    parser.add_argument("--json", type=Path, default=None, help="also write the per-epoch figures here")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:cut])
    extra = argv[cut + 1:]  # after --: more `morphpipe train` arguments
    command = [sys.executable, "-m", "morphpipe", "train", args.dataset, "--epochs", str(args.epochs), *extra]
    print("running:", " ".join(command), flush=True)
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    samples: list[tuple[float, dict[str, int]]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            try:
                samples.append((time.monotonic(), resident(child.pid)))
            except (OSError, ValueError):  # the child has ended (its status is gone or already empty)
                return
            done.wait(args.interval)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    epoch_ends: list[float] = []
    for line in child.stdout:
        print(line, end="", flush=True)
        if EPOCH_LINE.match(line):
            epoch_ends.append(time.monotonic())
    code = child.wait()
    done.set()
    sampler.join()
    if code != 0:  # stopped early (e.g. SIGTERM at a deadline): the epochs it completed are still reported
        print(f"morphpipe train exited with {code}; figures for the {len(epoch_ends)} epochs it completed",
              file=sys.stderr)
    rows, start = [], samples[0][0] if samples else 0.0
    for epoch, end in enumerate(epoch_ends, 1):
        inside = [sizes for t, sizes in samples if start <= t <= end]
        at_end = [sizes for t, sizes in samples if t <= end]
        row: dict[str, float | int | None] = {"epoch": epoch}
        for measure in MEASURES:
            row[f"{measure}_end_gib"] = at_end[-1].get(measure, 0) / 2**30 if at_end else None
            row[f"{measure}_peak_gib"] = max(s.get(measure, 0) for s in inside) / 2**30 if inside else None
        rows.append(row)
        start = end
    print("\nepoch  " + "  ".join(f"{m + ' end':>9} {m + ' peak':>10}" for m in MEASURES) + "   (GiB)")
    for row in rows:
        print(f"{row['epoch']:5d}  " + "  ".join(f"{row[m + '_end_gib'] or 0:9.3f} {row[m + '_peak_gib'] or 0:10.3f}"
                                             for m in MEASURES))
    spreads = {}
    for measure in MEASURES:
        later = [row[f"{measure}_end_gib"] for row in rows[1:] if row[f"{measure}_end_gib"] is not None]
        peaks = [row[f"{measure}_peak_gib"] for row in rows[1:] if row[f"{measure}_peak_gib"] is not None]
        spreads[measure] = {"end": spread(later), "peak": spread(peaks)}
        if later:
            print(f"{measure:>5} over epochs 2..{len(rows)}: at end {min(later):.3f}..{max(later):.3f} GiB "
                  f"(spread {spreads[measure]['end']:.1%}), peak {min(peaks):.3f}..{max(peaks):.3f} GiB "
                  f"(spread {spreads[measure]['peak']:.1%}); bar: 5%")
    if len(rows) < 2:
        print("fewer than 2 epochs: no spread")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"command": command, "environment": {
            name: os.environ[name] for name in sorted(os.environ) if name.startswith(("MALLOC_", "MORPHPIPE_"))},
            "epochs": rows, "spread_after_first": spreads}, indent=2))
    return code


if __name__ == "__main__":
    sys.exit(main())
