"""Plain-PyTorch reference kernels behind the aggregation interface: simple, exact, autograd-ready.

Each op gathers one message per edge (an `[nnz, F]` tensor, which the fused kernels avoid) and
reduces the messages per destination with `index_add` / `scatter_reduce`; nothing is
`[num_dst, max_degree]`-padded or dense. Inputs in float16/bfloat16 are accumulated in float32
and cast back, as the fused kernels accumulate in float32 registers. Arguments arrive validated
and flattened by `morphpipe.ops.aggregate`; call that module, not this one.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from morphpipe.sampling.minibatch import Block


def accumulate_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype sums are taken in: float32 for half types, the input dtype otherwise."""
    return torch.promote_types(dtype, torch.float32)


def in_degrees(block: Block) -> Tensor:
    """Number of in-edges of every destination (duplicates counted), int64 `[num_dst]`."""
    return block.indptr[1:] - block.indptr[:-1]


def dst_index(block: Block) -> Tensor:
    """Destination local id of every edge in CSC order; `output_size` spares the CUDA sync."""
    return torch.repeat_interleave(
        torch.arange(block.num_dst, device=block.device), in_degrees(block), output_size=block.nnz
    )


def gcn_scales(block: Block, add_self_loops: bool = True, dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
    """GCN's symmetric normalisation factors `(src_scale [num_src], dst_scale [num_dst])` on a block.

    `dst_scale[i] = (in_degree(i) + 1)^-1/2` and `src_scale[j] = (out_degree(j) + [j < num_dst])^-1/2`,
    with degrees counted over the block's edges (duplicates separately) and the `+1` terms being
    the self loops of the prefix convention (dropped when `add_self_loops` is False). A zero
    degree gives a zero factor: such a node contributes or receives nothing. A slice of a square
    layer (`block.src_degrees` set, layer-wise inference) takes the whole layer's out-degrees
    instead, each plus one self loop: every source of a square layer is also its destination.
    """
    dst_degree = in_degrees(block).to(dtype)
    if block.src_degrees is not None:
        src_degree = block.src_degrees.to(dtype) + (1 if add_self_loops else 0)
        return _inverse_sqrt(src_degree), _inverse_sqrt(dst_degree + (1 if add_self_loops else 0))
    src_degree = torch.zeros(block.num_src, dtype=dtype, device=block.device)
    src_degree.index_add_(0, block.indices, torch.ones(block.nnz, dtype=dtype, device=block.device))
    if add_self_loops:
        dst_degree = dst_degree + 1
        src_degree[: block.num_dst] += 1
    return _inverse_sqrt(src_degree), _inverse_sqrt(dst_degree)


def _inverse_sqrt(degree: Tensor) -> Tensor:
    """`degree^-1/2`, with 0 where the degree is 0 (instead of inf)."""
    return degree.clamp(min=1).rsqrt().masked_fill(degree == 0, 0)


def aggregate(block: Block, h_src: Tensor, reduce: str, edge_weight: Tensor | None) -> Tensor:
    """Per-destination sum / mean / max of (optionally weighted) source rows; `[num_dst, F]`, zeros when no in-edges."""
    acc = accumulate_dtype(h_src.dtype)
    dst = dst_index(block)
    messages = h_src.index_select(0, block.indices).to(acc)
    if edge_weight is not None:
        messages = messages * edge_weight.to(acc).unsqueeze(-1)
    out = messages.new_zeros((block.num_dst, h_src.shape[1]))
    if reduce == "max":
        out = out.scatter_reduce(0, dst.unsqueeze(-1).expand_as(messages), messages, "amax", include_self=False)
    else:
        out = out.index_add(0, dst, messages)
        if reduce == "mean":
            out = out / in_degrees(block).clamp(min=1).to(acc).unsqueeze(-1)
    return out.to(h_src.dtype)


def gcn_aggregate(block: Block, h_src: Tensor, add_self_loops: bool) -> Tensor:
    """`dst_scale * ((A + I_prefix) @ (src_scale * h_src))`: GCN propagation with `gcn_scales`."""
    acc = accumulate_dtype(h_src.dtype)
    src_scale, dst_scale = gcn_scales(block, add_self_loops, acc)
    scaled = h_src.to(acc) * src_scale.unsqueeze(-1)
    out = aggregate(block, scaled, "sum", None)
    if add_self_loops:
        out = out + scaled[: block.num_dst]
    return (out * dst_scale.unsqueeze(-1)).to(h_src.dtype)


def edge_softmax(scores: Tensor, dst: Tensor, num_dst: int) -> Tensor:
    """Softmax of per-edge scores `[E, heads]` over each destination's in-edges, max-shifted for stability."""
    shape = (num_dst, scores.shape[1])
    peak = scores.new_zeros(shape).scatter_reduce(
        0, dst.unsqueeze(-1).expand_as(scores), scores.detach(), "amax", include_self=False
    )
    exp = (scores - peak.index_select(0, dst)).exp()
    total = exp.new_zeros(shape).index_add(0, dst, exp)
    return exp / total.index_select(0, dst)


def gat_attention(
    block: Block,
    h_src: Tensor,
    score_src: Tensor,
    score_dst: Tensor,
    negative_slope: float,
    add_self_loops: bool,
) -> Tensor:
    """GAT aggregation: `sum_j softmax_j(leaky_relu(score_src[j] + score_dst[i])) * h_src[j]`, `[num_dst, heads, F]`.

    An `h_src` with one head is shared by every head of the scores.
    """
    acc = accumulate_dtype(h_src.dtype)
    h_src = h_src.expand(-1, score_src.shape[1], -1)
    src, dst = block.indices, dst_index(block)
    if add_self_loops:
        loops = torch.arange(block.num_dst, device=block.device)
        src, dst = torch.cat([src, loops]), torch.cat([dst, loops])
    scores = F.leaky_relu(
        score_src.to(acc).index_select(0, src) + score_dst.to(acc).index_select(0, dst), negative_slope
    )
    alpha = edge_softmax(scores, dst, block.num_dst)
    messages = h_src.to(acc).index_select(0, src) * alpha.unsqueeze(-1)
    out = messages.new_zeros((block.num_dst, *h_src.shape[1:])).index_add(0, dst, messages)
    return out.to(h_src.dtype)
