"""Mean or sum over every relation into one node type: one aggregation per relation, or one stacked call.

Stacking puts the relations' blocks into one block whose destination `k * num_dst + i` is relation
k's destination i and whose sources are the distinct source types' rows concatenated (ids offset by
their type's place), then runs one `aggregate`. It saves the fixed cost of a call per relation and,
where relations share a source type, that type's repeated backward rows and gradient adds; it costs a
copy of every source row. So it wins where edges are many against the rows copied (mag's papers) and
can lose where few edges read a large table (mag's authors, from 115k paper rows). The fixed cost of an
aggregation through autograd is most of the difference and is not in the kernels' calibration, so,
as the whole-graph selector (`graph_kernel`) does, the first call of a shape signature times both
options once on its own input (forward + backward where it will be differentiated) and keeps the
faster (decision `hetero.relations`, cached per signature, forceable like every other choice).
Both give the same values.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from morphpipe.ops import choice, graph_kernel
from morphpipe.ops.aggregate import aggregate
from morphpipe.sampling.minibatch import Block

DECISION = "hetero.relations"
PER_RELATION, STACKED = "per_relation", "stacked"
STACKABLE = ("sum", "mean")


def stack_blocks(blocks: Sequence[Block], sources: Sequence[str], num_src: Mapping[str, int],
                 num_dst: int) -> tuple[Block, list[str]]:
    """One block over `blocks` (block k reads node type `sources[k]`, has at most `num_dst` destinations): row
    `k * num_dst + i` is block k's destination i (no edges past its own destinations); its sources are the
    distinct types' rows concatenated in the returned order."""
    types = list(dict.fromkeys(sources))
    offsets, start = {}, 0
    for name in types:
        offsets[name], start = start, start + num_src[name]
    indptrs, indices, base = [blocks[0].indptr.new_zeros(1)], [], 0
    for block, source in zip(blocks, sources):
        pointers = block.indptr[1:] + base
        if block.num_dst < num_dst:  # destinations it lacks: rows without edges
            pointers = torch.cat([pointers, pointers.new_full((num_dst - block.num_dst,), base + block.nnz)])
        indptrs.append(pointers)
        indices.append(block.indices + offsets[source])
        base += block.nnz
    return Block(torch.cat(indptrs), torch.cat(indices), start, num_dst * len(blocks)), types


def _stacked(blocks: Sequence[Block], sources: Sequence[str], rows: Mapping[str, Tensor], num_dst: int,
             reduce: str) -> list[Tensor]:
    """`[block.num_dst, *features]` per block by one aggregation over the blocks stacked."""
    num_src = {name: rows[name].shape[0] for name in sources}
    block, types = stack_blocks(blocks, sources, num_src, num_dst)
    table = torch.cat([rows[name] for name in types]) if len(types) > 1 else rows[types[0]]
    out = aggregate(block, table, reduce).view(len(blocks), num_dst, *table.shape[1:])
    return [part[: each.num_dst] for part, each in zip(out, blocks)]


def _per_relation(blocks: Sequence[Block], sources: Sequence[str], rows: Mapping[str, Tensor], num_dst: int,
                  reduce: str) -> list[Tensor]:
    """`[block.num_dst, *features]` per block by one aggregation each."""
    del num_dst
    return [aggregate(block, rows[source], reduce) for block, source in zip(blocks, sources)]


OPTIONS = {PER_RELATION: _per_relation, STACKED: _stacked}


def _timings(blocks: Sequence[Block], sources: Sequence[str], rows: Mapping[str, Tensor], num_dst: int,
             reduce: str, backward: bool) -> dict[str, float]:
    """Seconds of each option, forward (+ `backward`), on detached copies of this call's rows (its graph untouched)."""
    timer = graph_kernel.current_timer()  # timer(option, run): run() is the option's forward (+ backward)
    seconds = {}
    for option, run in OPTIONS.items():
        # as the call's rows: features need no gradient, so one relation's backward over them is skipped when per
        # relation and not when stacked with a type that needs one
        leaves = {name: rows[name].detach().requires_grad_(backward and rows[name].requires_grad)
                  for name in set(sources)}

        def step(run=run, leaves=leaves) -> None:
            with torch.set_grad_enabled(backward):
                outs = [out for out in run(blocks, sources, leaves, num_dst, reduce) if out.requires_grad]
                if outs:
                    torch.autograd.backward(outs, [torch.ones_like(out) for out in outs])
                    for leaf in leaves.values():
                        leaf.grad = None

        seconds[option] = timer(option, step)
    return seconds


def relation_aggregates(blocks: Sequence[Block], sources: Sequence[str], rows: Mapping[str, Tensor], num_dst: int,
                        reduce: str) -> list[Tensor]:
    """`[block.num_dst, *features]` per block: the `reduce` ("sum" | "mean") of each destination's in-neighbours among
    `rows[sources[k]]` (zeros without edges), by one call per block or one stacked call, whichever timed faster for
    this shape (once per shape signature). Every block goes into the same `num_dst` destinations (or a prefix of
    them)."""
    if reduce not in STACKABLE:
        raise ValueError(f"reduce={reduce!r} cannot be stacked over relations; use one of {list(STACKABLE)}")
    if any(block.num_dst > num_dst for block in blocks):
        raise ValueError(f"num_dst={num_dst} is fewer than a block's destinations ({[b.num_dst for b in blocks]}); "
                         "pass the destination type's count")
    live = [k for k, block in enumerate(blocks) if block.nnz and block.num_src and block.num_dst]
    outs = [rows[source].new_zeros(block.num_dst, *rows[source].shape[1:]) for block, source in zip(blocks, sources)]
    live_blocks, live_sources = [blocks[k] for k in live], [sources[k] for k in live]
    chosen = PER_RELATION
    if len(live) >= 2:
        first = rows[live_sources[0]]
        stackable = all(rows[name].dtype == first.dtype and rows[name].device == first.device
                        and rows[name].shape[1:] == first.shape[1:] for name in live_sources)
        backward = torch.is_grad_enabled() and any(rows[name].requires_grad for name in live_sources)
        signature = (DECISION, first.device.type, str(first.dtype).removeprefix("torch."), reduce, backward,
                     tuple(first.shape[1:]), choice.bucket(num_dst),
                     *(choice.bucket(block.nnz) for block in live_blocks),
                     *(f"{name}:{choice.bucket(rows[name].shape[0])}" for name in live_sources))
        chosen = choice.choose(DECISION, signature,
                               lambda: _timings(live_blocks, live_sources, rows, num_dst, reduce, backward),
                               options=(PER_RELATION, STACKED) if stackable else (PER_RELATION,), reason="timed")
    for k, out in zip(live, OPTIONS[chosen](live_blocks, live_sources, rows, num_dst, reduce)):
        outs[k] = out
    return outs
