"""Mean or sum over every relation into one node type: one aggregation per relation, or one stacked call.

Stacking puts the relations' blocks into one block whose destination `k * num_dst + i` is relation
k's destination i and whose sources are the distinct source types' rows concatenated (ids offset by
their type's place), then runs one `aggregate`. It saves a call per relation and, where relations
share a source type, that type's repeated backward rows and gradient adds; it costs a copy of every
source row. So it wins where edges are many against the rows copied (mag's papers) and loses where
few edges read a large table (mag's authors, from 115k paper rows): the calibrated cost model picks per
shape (decision `hetero.relations`, forceable like every other choice). Both give the same values.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from morphpipe.ops import choice
from morphpipe.ops.aggregate import aggregate
from morphpipe.ops.cost_model import Calibration, current_calibration
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


def _costs(calibration: Calibration, blocks: Sequence[Block], sources: Sequence[str], num_src: Mapping[str, int],
           num_dst: int, width: int) -> dict[str, float]:
    """Predicted seconds, forward + backward, of one aggregation per block against one over the stacked block."""
    def one_call(nnz: int, rows: int, src_rows: int) -> float:
        """Forward, then the cheaper backward kernel (scattering into zeroed source rows)."""
        scatter = calibration.scatter(nnz, rows, width) + src_rows * width * calibration.dense_element
        return calibration.gather(nnz, rows, width) + min(calibration.transposed(nnz, src_rows, width), scatter)

    per_relation = sum(one_call(block.nnz, num_dst, num_src[source]) for block, source in zip(blocks, sources))
    # the gradients of a source type read by several relations add up
    per_relation += sum((sources.count(name) - 1) * num_src[name] for name in set(sources)) * width * \
        calibration.dense_element
    rows = sum(num_src[name] for name in set(sources))
    nnz = sum(block.nnz for block in blocks)
    stacked = (one_call(nnz, num_dst * len(blocks), rows)
               + rows * width * calibration.dense_element  # the concatenated source rows
               + 2 * (nnz + num_dst * len(blocks)) * calibration.dense_element)  # the stacked int64 structure
    return {PER_RELATION: per_relation, STACKED: stacked}


def relation_aggregates(blocks: Sequence[Block], sources: Sequence[str], rows: Mapping[str, Tensor], num_dst: int,
                        reduce: str) -> list[Tensor]:
    """`[block.num_dst, *features]` per block: the `reduce` ("sum" | "mean") of each destination's in-neighbours among
    `rows[sources[k]]` (zeros without edges), by one call per block or one stacked call, whichever the cost model
    predicts cheaper for this shape. Every block goes into the same `num_dst` destinations (or a prefix of them)."""
    if reduce not in STACKABLE:
        raise ValueError(f"reduce={reduce!r} cannot be stacked over relations; use one of {list(STACKABLE)}")
    if any(block.num_dst > num_dst for block in blocks):
        raise ValueError(f"num_dst={num_dst} is fewer than a block's destinations ({[b.num_dst for b in blocks]}); "
                         "pass the destination type's count")
    live = [k for k, block in enumerate(blocks) if block.nnz and block.num_src and block.num_dst]
    outs = [rows[source].new_zeros(block.num_dst, *rows[source].shape[1:]) for block, source in zip(blocks, sources)]
    if len(live) >= 2:
        live_blocks, live_sources = [blocks[k] for k in live], [sources[k] for k in live]
        first = rows[live_sources[0]]
        stackable = all(rows[name].dtype == first.dtype and rows[name].device == first.device
                        and rows[name].shape[1:] == first.shape[1:] for name in live_sources)
        num_src = {name: rows[name].shape[0] for name in live_sources}
        width = math.prod(first.shape[1:])
        signature = (DECISION, first.device.type, str(first.dtype).removeprefix("torch."), reduce,
                     tuple(first.shape[1:]), choice.bucket(num_dst), *(choice.bucket(block.nnz) for block in live_blocks),
                     *(f"{name}:{choice.bucket(num_src[name])}" for name in live_sources))
        chosen = choice.choose(DECISION, signature,
                               lambda: _costs(current_calibration(first.device), live_blocks, live_sources, num_src,
                                              num_dst, width),
                               options=(PER_RELATION, STACKED) if stackable else (PER_RELATION,))
        if chosen == STACKED:
            block, types = stack_blocks(live_blocks, live_sources, num_src, num_dst)
            table = torch.cat([rows[name] for name in types]) if len(types) > 1 else rows[types[0]]
            stacked = aggregate(block, table, reduce).view(len(live), num_dst, *first.shape[1:])
            for k, out in zip(live, stacked):
                outs[k] = out[: blocks[k].num_dst]
            return outs
    for k in live:
        outs[k] = aggregate(blocks[k], rows[sources[k]], reduce)
    return outs
