"""Benchmark: one aggregation call per relation against one call over all relations into a destination type.

On typed batches of a heterogeneous dataset (HeteroCpuBatcher, the training fanouts and batch size), for
each layer and each destination type with two or more relations into it, times forward + backward of the
per-relation mean (what R-GCN and HeteroSAGE do: `aggregate(block_r, h_src, "mean")` once per relation)
against one call: the relations' blocks stacked into one block whose destinations are (relation,
destination) pairs and whose sources are the distinct source types' rows concatenated into one table
(source ids offset by their type's place in it), then one `aggregate(..., "mean")` and a view as
`[relations, destinations, width]`. The stacked block's construction is timed apart (a batcher could emit
it). Both give the same means (checked). Rows are random `--width`-wide float32. Times are CPU seconds of
the process (every thread: robust to other jobs' load, unlike wall time), best of `--repeats` per batch,
summed over `--batches` batches; one torch thread by default. Not a test.

Usage: python scripts/bench_hetero_relations.py [--dataset mag] [--fanouts 10,10] [--batch-size 1024] [--width 64]
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch

from morphpipe.data.hetero_store import HeteroGraphStore
from morphpipe.data.presets import PRESETS
from morphpipe.data.store import ensure_preset
from morphpipe.ops import aggregate
from morphpipe.sampling.hetero_batcher import HeteroCpuBatcher
from morphpipe.sampling.minibatch import Block


def stacked(layer, relations) -> tuple[Block, list[str]]:
    """One block for `relations` (all into one type): destination `k * num_dst + i` is relation k's destination i;
    sources are the distinct source types' rows, concatenated in the returned order."""
    types = list(dict.fromkeys(relation.src for relation in relations))
    offsets, start = {}, 0
    for name in types:
        offsets[name], start = start, start + layer.num_src[name]
    num_dst = layer.num_dst[relations[0].dst]
    indptrs, indices, base = [layer.blocks[relations[0]].indptr[:1]], [], 0
    for relation in relations:
        block = layer.blocks[relation]
        indptrs.append(block.indptr[1:] + base)
        indices.append(block.indices + offsets[relation.src])
        base += block.nnz
    return Block(torch.cat(indptrs), torch.cat(indices), start, num_dst * len(relations)), types


def best_of(repeats: int, fn) -> float:
    """The least CPU time (all threads of the process) of `repeats` calls of `fn`."""
    times = []
    for _ in range(repeats):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return min(times)


def measure(layer, relations, width: int, repeats: int) -> dict[str, float]:
    """Seconds of the per-relation calls, the one stacked call (with its concatenation of the source rows) and the
    stacked block's construction, forward + backward."""
    h = {name: torch.randn(count, width, requires_grad=True) for name, count in layer.num_src.items()}
    num_dst = layer.num_dst[relations[0].dst]
    grad = torch.randn(len(relations), num_dst, width)

    def per_relation():
        outs = [aggregate(layer.blocks[relation], h[relation.src], "mean") for relation in relations]
        torch.autograd.backward(outs, list(grad))
        return outs

    block, types = stacked(layer, relations)

    def one_call():
        out = aggregate(block, torch.cat([h[name] for name in types]), "mean").view(len(relations), num_dst, width)
        out.backward(grad)
        return out

    torch.testing.assert_close(torch.stack(per_relation()).detach(), one_call().detach(), rtol=1e-5, atol=1e-5)
    return {"per_relation": best_of(repeats, per_relation), "one_call": best_of(repeats, one_call),
            "build": best_of(repeats, lambda: stacked(layer, relations))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="mag")
    parser.add_argument("--fanouts", default="10,10")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    directory = Path(args.dataset) if Path(args.dataset).is_dir() else ensure_preset(PRESETS[args.dataset])
    graph = HeteroGraphStore.load(directory)
    torch.set_num_threads(args.threads)
    fanouts = [int(f) for f in args.fanouts.split(",")]
    load = os.getloadavg()[0]
    totals: dict[tuple[int, str], dict[str, float]] = {}
    with HeteroCpuBatcher(graph, fanouts, args.batch_size, num_threads=1, pin_memory=False) as batcher:
        for index, batch in enumerate(batcher.epoch(0)):
            if index == args.batches:
                break
            for depth, layer in enumerate(batch.blocks):
                for name in graph.type_names:
                    relations = [r for r in graph.relations if r.dst == name]
                    if len(relations) < 2 or not layer.num_dst[name]:
                        continue
                    row = totals.setdefault((depth, name), {"per_relation": 0.0, "one_call": 0.0, "build": 0.0,
                                                            "edges": 0})
                    for key, value in measure(layer, relations, args.width, args.repeats).items():
                        row[key] += value
                    row["edges"] += sum(layer.blocks[r].nnz for r in relations)
    load = max(load, os.getloadavg()[0])
    print(f"{graph!r}\nfanouts {fanouts}, batch {args.batch_size}, width {args.width}, {args.threads} threads, "
          f"{args.batches} batches, best of {args.repeats}; load average up to {load:.1f}")
    print("| layer | destination type | relations | edges | per relation CPU ms | one call CPU ms | ratio | "
          "stacking CPU ms |")
    print("|---|---|---|---|---|---|---|---|")
    for (depth, name), row in sorted(totals.items()):
        relations = sum(1 for r in graph.relations if r.dst == name)
        print(f"| {depth} | {name} | {relations} | {row['edges']:,} | {1e3 * row['per_relation']:.2f} | "
              f"{1e3 * row['one_call']:.2f} | {row['per_relation'] / row['one_call']:.2f}x | "
              f"{1e3 * row['build']:.2f} |")


if __name__ == "__main__":
    main()
