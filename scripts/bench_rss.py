"""Resident memory of a long `morphpipe train` run, epoch by epoch: does it stay flat after the first epoch?

Starts `python -m morphpipe train DATASET --epochs N ...` as a child, samples the child's RSS every
`--interval` seconds, and reads its epoch lines ("epoch k/N: ...") to cut the samples into epochs.
Prints, per epoch, the RSS at its end and its peak, and the spread of the end-of-epoch RSS over
epochs 2..N (issue 25's bar: within 5%). Extra arguments after `--` go to `morphpipe train`.

  python scripts/bench_rss.py bench-1m --epochs 20 --json bench_out/rss.json -- --auto --no-progress
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

EPOCH_LINE = re.compile(r"^epoch (\d+)/(\d+):")


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
    process = psutil.Process(child.pid)
    samples: list[tuple[float, int]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            try:
                samples.append((time.monotonic(), process.memory_info().rss))
            except psutil.Error:
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
    if code != 0:
        print(f"morphpipe train exited with {code}", file=sys.stderr)
        return code
    rows, start = [], samples[0][0] if samples else 0.0
    for epoch, end in enumerate(epoch_ends, 1):
        inside = [rss for t, rss in samples if start <= t <= end]
        at_end = [rss for t, rss in samples if t <= end]
        rows.append({"epoch": epoch, "rss_end_gib": at_end[-1] / 2**30 if at_end else None,
                     "rss_peak_gib": max(inside) / 2**30 if inside else None})
        start = end
    print("\nepoch  RSS at end (GiB)  peak in epoch (GiB)")
    for row in rows:
        print(f"{row['epoch']:5d}  {row['rss_end_gib']:16.3f}  {row['rss_peak_gib']:19.3f}")
    later = [row["rss_end_gib"] for row in rows[1:] if row["rss_end_gib"] is not None]
    spread = (max(later) - min(later)) / min(later) if later else float("nan")
    print(f"end-of-epoch RSS over epochs 2..{len(rows)}: {min(later):.3f}..{max(later):.3f} GiB, "
          f"spread {spread:.1%} (bar: 5%)" if later else "fewer than 2 epochs: no spread")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"command": command, "epochs": rows, "spread_after_first": spread}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
