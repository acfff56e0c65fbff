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
summed over `--batches` batches; one torch thread by default. The last column says what the models' timed
choice (`morphpipe.ops.relation_stack`, decision `hetero.relations`) picks for that shape. Then (`--models`,
on by default) R-GCN's and HeteroSAGE's whole forward + backward step on the same batches, the choice left to
its timing against forced per relation and forced stacked. Not a test.

Usage: python scripts/bench_hetero_relations.py [--dataset mag] [--fanouts 10,10] [--batch-size 1024] [--width 64]
"""
from __future__ import annotations

import argparse
import itertools
import os
import time
from pathlib import Path

import torch

from morphpipe.data.hetero_store import HeteroGraphStore
from morphpipe.data.presets import PRESETS
from morphpipe.data.store import ensure_preset
from morphpipe.nn.hetero import build_hetero_model
from morphpipe.ops import aggregate, choice_counts, clear_choices, force_choices
from morphpipe.ops.relation_stack import relation_aggregates, stack_blocks
from morphpipe.sampling.hetero_batcher import HeteroCpuBatcher
from morphpipe.sampling.minibatch import Block


def stacked(layer, relations) -> tuple[Block, list[str]]:
    """`relations`' blocks (all into one type) stacked as the models' stacked call stacks them."""
    return stack_blocks([layer.blocks[r] for r in relations], [r.src for r in relations], layer.num_src,
                        layer.num_dst[relations[0].dst])


def predicted(layer, relations, width: int, features) -> str:
    """What the timed choice picks for these relations' means (`hetero.relations`, as the models run it: the types
    with `features` need no gradient in the input layer)."""
    h = {name: torch.randn(count, width, requires_grad=name not in features) for name, count in layer.num_src.items()}
    clear_choices()
    relation_aggregates([layer.blocks[r] for r in relations], [r.src for r in relations], h,
                        layer.num_dst[relations[0].dst], "mean")
    return ", ".join(choice_counts().get("hetero.relations", {"per_relation (fewer than 2 with edges)": 1}))


def model_steps(graph, batches, width: int, repeats: int) -> dict[tuple[str, str], float]:
    """CPU seconds of R-GCN's and HeteroSAGE's forward + backward over `batches`, best of `repeats` per batch, with
    the `hetero.relations` choice left to its timing and forced each way (the first batch's timings included)."""
    seconds = {}
    for name in ("rgcn", "rsage"):
        torch.manual_seed(0)
        model = build_hetero_model(name, num_nodes={t.name: t.count for t in graph.node_types},
                                   feature_dims=graph.feature_dims, relations=graph.relations,
                                   target_type=graph.target_type, num_classes=graph.num_classes, hidden=width,
                                   dropout=0.0)
        for label, forced in (("choice", {}), ("per relation", {"hetero.relations": "per_relation"}),
                              ("stacked", {"hetero.relations": "stacked"})):
            def step(batch):
                model.zero_grad(set_to_none=True)
                model(batch.blocks, batch.x).square().mean().backward()

            clear_choices()
            with force_choices(forced):
                seconds[(name, label)] = sum(best_of(repeats, lambda: step(batch)) for batch in batches)
                if not forced:
                    seconds[(name, "choices")] = choice_counts().get("hetero.relations", {})
    return seconds


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
    parser.add_argument("--models", action=argparse.BooleanOptionalAction, default=True,
                        help="also time R-GCN's and HeteroSAGE's steps with the choice on and forced each way")
    args = parser.parse_args()
    directory = Path(args.dataset) if Path(args.dataset).is_dir() else ensure_preset(PRESETS[args.dataset])
    graph = HeteroGraphStore.load(directory)
    torch.set_num_threads(args.threads)
    fanouts = [int(f) for f in args.fanouts.split(",")]
    load = os.getloadavg()[0]
    totals: dict[tuple[int, str], dict[str, float]] = {}
    with HeteroCpuBatcher(graph, fanouts, args.batch_size, num_threads=1, pin_memory=False) as batcher:
        batches = list(itertools.islice(batcher.epoch(0), args.batches))
        for batch in batches:
            for depth, layer in enumerate(batch.blocks):
                for name in graph.type_names:
                    relations = [r for r in graph.relations if r.dst == name]
                    if len(relations) < 2 or not layer.num_dst[name]:
                        continue
                    row = totals.setdefault((depth, name), {"per_relation": 0.0, "one_call": 0.0, "build": 0.0,
                                                            "edges": 0, "picks": set()})
                    row["picks"].add(predicted(layer, relations, args.width, graph.feature_dims if depth == 0 else {}))
                    for key, value in measure(layer, relations, args.width, args.repeats).items():
                        row[key] += value
                    row["edges"] += sum(layer.blocks[r].nnz for r in relations)
    steps = model_steps(graph, batches, args.width, args.repeats) if args.models else {}
    load = max(load, os.getloadavg()[0])
    print(f"{graph!r}\nfanouts {fanouts}, batch {args.batch_size}, width {args.width}, {args.threads} threads, "
          f"{args.batches} batches, best of {args.repeats}; load average up to {load:.1f}")
    print("| layer | destination type | relations | edges | per relation CPU ms | one call CPU ms | ratio | "
          "stacking CPU ms | timed choice |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (depth, name), row in sorted(totals.items()):
        relations = sum(1 for r in graph.relations if r.dst == name)
        print(f"| {depth} | {name} | {relations} | {row['edges']:,} | {1e3 * row['per_relation']:.2f} | "
              f"{1e3 * row['one_call']:.2f} | {row['per_relation'] / row['one_call']:.2f}x | "
              f"{1e3 * row['build']:.2f} | {'; '.join(sorted(row['picks']))} |")
    if steps:
        print(f"\nModel step (forward + backward, hidden {args.width}), CPU ms over the {args.batches} batches:")
        print("| model | timed choice | forced per relation | forced stacked | per relation / choice | "
              "choices made |")
        print("|---|---|---|---|---|---|")
        for name in ("rgcn", "rsage"):
            auto, per, stack = (steps[(name, label)] for label in ("choice", "per relation", "stacked"))
            print(f"| {name} | {1e3 * auto:.1f} | {1e3 * per:.1f} | {1e3 * stack:.1f} | {per / auto:.2f}x | "
                  f"{steps[(name, 'choices')]} |")


if __name__ == "__main__":
    main()
