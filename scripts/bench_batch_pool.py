"""Memory of batching alone over epochs: RssAnon and the batch buffer pool's bytes after each epoch (issue 25).

Runs the C++ CpuBatcher over a dataset's training seeds for some epochs, holding the last `--window` batches as
the executor's CPU buffer does (cbs), and prints after each epoch the process's anonymous resident memory and
what the batcher's buffer pool holds, with their spread over epochs 2..N (the bar: flat within 5%). No model
trains, so an epoch takes seconds where `bench_rss.py` takes minutes; it isolates the batcher's share.

  python scripts/bench_batch_pool.py default --epochs 8
"""
from __future__ import annotations

import argparse
import collections
import time

from morphpipe.data import load_dataset
from morphpipe.profiler.resident import resident
from morphpipe.sampling import CpuBatcher


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset", help="a preset name or a dataset directory")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--fanouts", default="15,10,5")
    parser.add_argument("--threads", type=int, default=2, help="batching threads (default 2)")
    parser.add_argument("--window", type=int, default=10, help="batches held at once, as the CPU buffer (default 10)")
    args = parser.parse_args()
    graph = load_dataset(args.dataset, progress=False)
    batcher = CpuBatcher(graph, [int(f) for f in args.fanouts.split(",")], args.batch_size,
                         num_threads=args.threads, seed=0)
    print(f"{args.dataset}: {len(batcher)} batches per epoch, {args.threads} threads, window {args.window}")
    print("epoch  RssAnon (MiB)  pool (MiB)  seconds")
    rows = []
    for epoch in range(args.epochs):
        started = time.perf_counter()
        held: collections.deque = collections.deque(maxlen=args.window)
        for batch in batcher.epoch(epoch):
            held.append(batch)
        held.clear()
        del batch
        rows.append((resident()["anon"] / 2**20, batcher.pool_bytes / 2**20))
        print(f"{epoch + 1:5d}  {rows[-1][0]:13.0f}  {rows[-1][1]:10.0f}  {time.perf_counter() - started:7.1f}")
    batcher.close()
    for name, column in (("RssAnon", 0), ("pool", 1)):
        later = [row[column] for row in rows[1:]]
        if later:
            print(f"{name} over epochs 2..{len(rows)}: {min(later):.0f}..{max(later):.0f} MiB, spread "
                  f"{(max(later) - min(later)) / min(later):.1%} (bar: 5%)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
