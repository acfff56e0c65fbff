"""SENSEi's re-association per layer: aggregate-then-project or project-then-aggregate, by predicted cost.

Aggregation is linear, so `A (X W) == (A X) W` (GCN, SAGE), and a GAT head's output
`sum_j alpha_ij W h_j == W sum_j alpha_ij h_j` with the attention scores folded into the input
space (`a . W h == (W^T a) . h`). Which order is cheaper depends on the block's sizes (how many
sources feed how many destinations over how many edges), the widths, and whether gradients are
needed; the layers ask here once per shape signature and the answer is cached (`choice`).
"""
from __future__ import annotations

import torch
from torch import Tensor

from morphpipe.ops import choice, fused
from morphpipe.ops.cost_model import Calibration, current_calibration
from morphpipe.ops.sparse_input import DENSITY_STEPS
from morphpipe.sampling.minibatch import Block

AGGREGATE_FIRST = "aggregate_first"
PROJECT_FIRST = "project_first"


def _project(calibration: Calibration, rows: int, in_features: int, out_features: int, density: float) -> float:
    """The input projection at the cheaper of dense GEMM and the sparse path (the input transform picks it)."""
    return min(calibration.gemm(rows, in_features, out_features),
               calibration.sparse_linear(rows, in_features, out_features, density))


def _signature(kind: str, block: Block, x: Tensor, widths: tuple[int, ...], density: float) -> choice.Signature:
    """Sizes in power-of-two buckets, widths, density step, and whether gradients are computed."""
    return choice.block_signature(kind, block, x.dtype, *widths, round(density * DENSITY_STEPS),
                                  torch.is_grad_enabled(), x.requires_grad)


def linear_layer_costs(calibration: Calibration, block: Block, in_features: int, out_features: int,
                       density: float, self_loops: bool, training: bool, input_grad: bool,
                       project_in_pass: bool = False) -> dict[str, float]:
    """Predicted seconds of a GCN/SAGE layer's aggregation + projection in either order (forward + backward).

    `project_in_pass`: aggregating first projects each aggregate row inside the aggregation's pass
    (`gcn_aggregate_project`'s one native pass) instead of by a GEMM after it; the backward is the same either way.
    """
    edges = block.nnz + (block.num_dst if self_loops else 0)
    num_src, num_dst = block.num_src, block.num_dst
    aggregate_first = calibration.gather(edges, num_dst, in_features) + (
        calibration.project_in_pass(num_dst, in_features, out_features) if project_in_pass
        else calibration.gemm(num_dst, in_features, out_features))
    project_first = _project(calibration, num_src, in_features, out_features, density) + calibration.gather(
        edges, num_dst, out_features)
    if training:
        aggregate_first += calibration.gemm(in_features, num_dst, out_features)
        project_first += calibration.backward(edges, num_src, out_features) + calibration.gemm(
            in_features, num_src, out_features)
        if input_grad:
            aggregate_first += calibration.gemm(num_dst, out_features, in_features) + calibration.backward(
                edges, num_src, in_features)
            project_first += calibration.gemm(num_src, out_features, in_features)
    return {AGGREGATE_FIRST: aggregate_first, PROJECT_FIRST: project_first}


def gat_layer_costs(calibration: Calibration, block: Block, in_features: int, out_features: int, heads: int,
                    density: float, training: bool, input_grad: bool) -> dict[str, float]:
    """Predicted seconds of a GAT layer projecting before attention, or attending over inputs and projecting after."""
    edges = block.nnz + block.num_dst
    num_src, num_dst, width = block.num_src, block.num_dst, heads * out_features
    # per-head projections after attention run as one bmm over head-major copies of input and output
    transposes = num_dst * heads * (in_features + out_features) * calibration.dense_element
    aggregate_first = (calibration.gemm(num_src, in_features, 2 * heads)
                       + calibration.attention(edges, heads, in_features, shared=True)
                       + calibration.gemm(num_dst, in_features, width) + transposes)
    project_first = (_project(calibration, num_src, in_features, width, density)
                     + calibration.gemm(num_src, in_features, 2 * heads)
                     + calibration.attention(edges, heads, out_features))
    if training:
        aggregate_first += (calibration.attention(edges, heads, in_features, shared=True)
                            + calibration.gemm(in_features, num_dst, width)
                            + calibration.gemm(num_dst, width, in_features)
                            + calibration.gemm(in_features, num_src, 2 * heads) + transposes)
        project_first += (calibration.attention(edges, heads, out_features)
                          + calibration.backward(edges, num_src, width)
                          + calibration.gemm(in_features, num_src, width)
                          + calibration.gemm(in_features, num_src, 2 * heads))
        if input_grad:
            aggregate_first += calibration.backward(edges, num_src, heads * in_features)
            project_first += calibration.gemm(num_src, width, in_features)
    return {AGGREGATE_FIRST: aggregate_first, PROJECT_FIRST: project_first}


def linear_layer_order(kind: str, block: Block, x: Tensor, out_features: int, density: float,
                       self_loops: bool, project_in_pass: bool = False) -> str:
    """`"aggregate_first"` or `"project_first"` for a GCN (`kind="gcn"`) or SAGE (`"sage"`) layer on this input.

    `project_in_pass`: the layer aggregating first would call `gcn_aggregate_project`; it is priced as one pass
    where the fused backend runs it so (`fused.projects_in_pass`), as a GEMM after the aggregation elsewhere.
    """
    in_features = x.shape[1]
    return choice.choose(
        f"{kind}.order", _signature(kind, block, x, (in_features, out_features, project_in_pass), density),
        lambda: linear_layer_costs(current_calibration(x.device), block, in_features, out_features, density, self_loops,
                                   torch.is_grad_enabled(), x.requires_grad,
                                   project_in_pass and fused.projects_in_pass(block, x)),
    )


def gat_layer_order(block: Block, x: Tensor, out_features: int, heads: int, density: float) -> str:
    """`"aggregate_first"` or `"project_first"` for a GAT layer on this input."""
    in_features = x.shape[1]
    return choice.choose(
        "gat.order", _signature("gat", block, x, (in_features, out_features, heads), density),
        lambda: gat_layer_costs(current_calibration(x.device), block, in_features, out_features, heads, density,
                                torch.is_grad_enabled(), x.requires_grad),
    )
