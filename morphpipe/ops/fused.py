"""The fused backend: native CPU (OpenMP) / CUDA kernels that never allocate an edge-by-feature tensor.

Forward and backward are autograd Functions around the `torch.ops.morphpipe` kernels (csrc/cpu,
csrc/cuda). The kernel variant for each call (AdaptGear) comes from `morphpipe.ops.choice`:
row-wise sparse kernel or a densified adjacency for tiny dense blocks, destinations in stored or
degree-sorted order, and gradients to the sources through the transposed structure or by atomic
scatter. Every variant gives the same result up to floating-point summation order.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable

from morphpipe import native
from morphpipe.ops import choice, determinism, graph_kernel
from morphpipe.ops.community import GraphBlock
from morphpipe.ops.cost_model import Calibration, current_calibration
from morphpipe.ops.reference import accumulate_dtype, dst_index, gcn_scales, in_degrees
from morphpipe.sampling.minibatch import Block

NAME = "fused"
# The dense kernel is a candidate only while the densified adjacency stays small (16 MiB of float32).
DENSE_MAX_ENTRIES = 1 << 22


def unavailable(device_type: str) -> str | None:
    """Why the fused kernels cannot run on `device_type`, or None when they can."""
    if device_type not in ("cpu", "cuda"):
        return f"there are no fused kernels for device type {device_type!r}"
    try:
        module = native.load()
    except native.NativeBuildError as error:
        return str(error)
    if device_type == "cuda" and not module.built_with_cuda():
        return f"the CUDA kernels were not built ({native.build_config().cuda_skip_reason})"
    return None


def _signature(kind: str, block: Block, width: int, dtype: torch.dtype, *extra: object) -> choice.Signature:
    """Shape signature of one call: sizes in power-of-two buckets, exact width, dtype and device type."""
    return choice.block_signature(kind, block, dtype, width, *extra)


def _max_degree(block: Block) -> int:
    """Largest in-degree (one host sync on CUDA; only evaluated when a signature is new)."""
    return int(in_degrees(block).max()) if block.num_dst else 0


def _order_costs(calibration: Calibration, block: Block, work_per_edge: float) -> dict[str, float]:
    """Stored order risks the heaviest destination starting last; sorting costs a sort of the degrees."""
    rows = max(block.num_dst, 1)
    return {"natural": _max_degree(block) * work_per_edge,
            "degree_sorted": rows * math.log2(rows + 1) * calibration.transpose_edge}


def _row_order(block: Block, kind: str, width: int, dtype: torch.dtype,
               work_per_edge: Callable[[Calibration], float]) -> Tensor | None:
    """Destinations heaviest first when the order choice says so, else None (stored order)."""
    def costs() -> dict[str, float]:
        calibration = current_calibration(block.device)
        return _order_costs(calibration, block, work_per_edge(calibration))

    chosen = choice.choose("aggregate.order", _signature(kind, block, width, dtype), costs)
    if chosen == "natural" or block.num_dst == 0:
        return None
    return torch.argsort(in_degrees(block), descending=True, stable=True)


def _backward_costs(block: Block, edges: int, width: int) -> dict[str, float]:
    """Backward through the transposed structure (one pass per source) or by atomic scatter from destinations."""
    calibration = current_calibration(block.device)
    return {"transpose": calibration.transposed(edges, block.num_src, width),
            "scatter": calibration.scatter(edges, block.num_dst, width)}


def _gather_work(width: int) -> Callable[[Calibration], float]:
    """Seconds per edge of a row-wise aggregation `width` wide."""
    return lambda calibration: calibration.gather_edge + width * calibration.gather_element


def _edge_weight(edge_weight: Tensor | None, acc: torch.dtype) -> Tensor | None:
    """Edge weights in the accumulation dtype, contiguous (what the kernels take)."""
    return None if edge_weight is None else edge_weight.to(acc).contiguous()


def _sum_backward(block: Block, grad: Tensor, weight: Tensor | None, src_scale: Tensor | None,
                  dst_scale: Tensor | None, self_loop: bool) -> Tensor:
    """Gradient to the sources of `dst_scale * (A_w (src_scale * x) + self loop)`: transpose or scatter."""
    ops = native.ops()
    width = grad.shape[1]
    variant = choice.choose("aggregate.backward",
                            _signature("sum-backward", block, width, grad.dtype, determinism.required()),
                            lambda: _backward_costs(block, block.nnz, width),
                            options=determinism.backward_options("aggregate.backward"))
    if variant == "scatter":
        return ops.spmm_sum_scatter(block.indptr, block.indices, grad, weight, src_scale, dst_scale, self_loop,
                                    block.num_src)
    t_indptr, t_dst, t_eid = ops.csr_transpose(block.indptr, block.indices, block.num_src)
    t_weight = None if weight is None else weight[t_eid]
    return ops.spmm_sum(t_indptr, t_dst, grad, t_weight, dst_scale, src_scale, self_loop)


class WeightedSum(torch.autograd.Function):
    """`out[i] = dst_scale[i] * (sum_e w[e] src_scale[j] x[j] + [self_loop] src_scale[i] x[i])`, fused both ways.

    Gradients flow to `x` and `edge_weight`; the scales are structure-only constants.
    """

    @staticmethod
    def forward(ctx: FunctionCtx, x: Tensor, edge_weight: Tensor | None, block: Block, src_scale: Tensor | None,
                dst_scale: Tensor | None, self_loop: bool, row_order: Tensor | None) -> Tensor:
        acc = accumulate_dtype(x.dtype)
        x = x.contiguous()
        weight = _edge_weight(edge_weight, acc)
        out = native.ops().spmm_sum(block.indptr, block.indices, x, weight, src_scale, dst_scale, self_loop,
                                    row_order)
        needs_weight_grad = edge_weight is not None and edge_weight.requires_grad
        ctx.save_for_backward(x if needs_weight_grad else None, weight)
        ctx.block, ctx.scales, ctx.self_loop = block, (src_scale, dst_scale), self_loop
        ctx.weight_dtype = None if edge_weight is None else edge_weight.dtype
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad: Tensor) -> tuple[Tensor | None, ...]:
        x, weight = ctx.saved_tensors
        block, (src_scale, dst_scale) = ctx.block, ctx.scales
        grad = grad.contiguous()
        grad_x = grad_weight = None
        if ctx.needs_input_grad[0]:
            grad_x = _sum_backward(block, grad, weight, src_scale, dst_scale, ctx.self_loop)
        if ctx.needs_input_grad[1]:
            scaled = grad if dst_scale is None else (grad * dst_scale.unsqueeze(1)).to(grad.dtype)
            grad_weight = native.ops().sddmm(block.indptr, block.indices, scaled, x)
            if src_scale is not None:
                grad_weight = grad_weight * src_scale[block.indices]
            grad_weight = grad_weight.to(ctx.weight_dtype)
        return grad_x, grad_weight, None, None, None, None, None


class SegmentMax(torch.autograd.Function):
    """Per-destination max of `w[e] x[j]` with its argmax edge; the gradient goes to the argmax only
    (through torch's deterministic index_add_ when deterministic algorithms are required)."""

    @staticmethod
    def forward(ctx: FunctionCtx, x: Tensor, edge_weight: Tensor | None, block: Block,
                row_order: Tensor | None) -> Tensor:
        x = x.contiguous()
        weight = _edge_weight(edge_weight, accumulate_dtype(x.dtype))
        out, argmax = native.ops().spmm_max(block.indptr, block.indices, x, weight, row_order)
        ctx.save_for_backward(x, weight, argmax)
        ctx.block = block
        ctx.weight_dtype = None if edge_weight is None else edge_weight.dtype
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad: Tensor) -> tuple[Tensor | None, ...]:
        x, weight, argmax = ctx.saved_tensors
        need_x, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        backward = determinism.max_backward if determinism.required() else native.ops().spmm_max_backward
        grad_x, grad_weight = backward(ctx.block.indices, argmax, grad.contiguous(), x, weight, need_x, need_weight)
        return (grad_x if need_x else None, grad_weight.to(ctx.weight_dtype) if need_weight else None, None, None)


def _dense_sum(block: Block, x: Tensor, edge_weight: Tensor | None, src_scale: Tensor | None,
               dst_scale: Tensor | None, self_loop: bool) -> Tensor:
    """The same sum as `WeightedSum` through a densified `[num_dst, num_src]` adjacency and one GEMM."""
    acc = accumulate_dtype(x.dtype)
    values = torch.ones(block.nnz, dtype=acc, device=x.device) if edge_weight is None else edge_weight.to(acc)
    if src_scale is not None:
        values = values * src_scale[block.indices]
    adjacency = torch.zeros(block.num_dst, block.num_src, dtype=acc, device=x.device)
    adjacency = adjacency.index_put((dst_index(block), block.indices), values, accumulate=True)
    if self_loop:
        loops = torch.arange(block.num_dst, device=x.device)
        loop_values = torch.ones(block.num_dst, dtype=acc, device=x.device) if src_scale is None else src_scale[loops]
        adjacency = adjacency.index_put((loops, loops), loop_values, accumulate=True)
    out = adjacency @ x.to(acc)
    if dst_scale is not None:
        out = out * dst_scale.unsqueeze(1)
    return out.to(x.dtype)


def weighted_sum(block: Block, x: Tensor, edge_weight: Tensor | None = None, src_scale: Tensor | None = None,
                 dst_scale: Tensor | None = None, self_loop: bool = False, kind: str = "sum") -> Tensor:
    """`dst_scale * (A_w (src_scale * x) + self loop)` by the kernel the choice picks (row-wise or dense).

    An unweighted whole-graph layer (`GraphBlock`) goes to the AdaptGear selector first: plain CSR
    or a community decomposition, whichever timed fastest for the layer's shape.
    """
    if isinstance(block, GraphBlock) and edge_weight is None:
        plain = Block(block.indptr, block.indices, block.num_src, block.num_dst)
        return graph_kernel.graph_sum(
            block, x, src_scale, dst_scale, self_loop, kind,
            csr_sum=lambda: weighted_sum(plain, x, None, src_scale, dst_scale, self_loop, kind),
            inter_sum=lambda inter, h, src, dst: WeightedSum.apply(h, None, inter, src, dst, False, None))
    width = x.shape[1]
    if _kernel(block, width, x.dtype, self_loop, kind) == "dense":
        return _dense_sum(block, x, edge_weight, src_scale, dst_scale, self_loop)
    order = _row_order(block, kind, width, x.dtype, _gather_work(width))
    return WeightedSum.apply(x, edge_weight, block, src_scale, dst_scale, self_loop, order)


def _kernel(block: Block, width: int, dtype: torch.dtype, self_loop: bool, kind: str) -> str:
    """"rowwise" or "dense": the kernel the choice picks for a sum over `block` of rows `width` wide."""
    edges = block.nnz + (block.num_dst if self_loop else 0)
    dense_fits = block.num_dst * block.num_src <= DENSE_MAX_ENTRIES

    def kernel_costs() -> dict[str, float]:
        calibration = current_calibration(block.device)
        return {"rowwise": calibration.gather(edges, block.num_dst, width),
                "dense": calibration.dense(block.num_dst, block.num_src, edges, width)}

    return choice.choose("aggregate.kernel", _signature(kind, block, width, dtype), kernel_costs,
                         options=("rowwise", "dense") if dense_fits else ("rowwise",))


def rowwise_mean_plan(block: Block, width: int, dtype: torch.dtype) -> tuple[Tensor, Tensor | None] | None:
    """`(dst_scale, row_order)` of the mean `aggregate` runs over `block` when that is the row-wise kernel (what
    `morphpipe.ops.relu_mean` fuses into), None when it is another (a whole-graph layer, the densified one)."""
    if isinstance(block, GraphBlock) or _kernel(block, width, dtype, False, "mean") != "rowwise":
        return None
    dst_scale = 1.0 / in_degrees(block).clamp(min=1).to(accumulate_dtype(dtype))
    return dst_scale, _row_order(block, "mean", width, dtype, _gather_work(width))


def aggregate(block: Block, h_src: Tensor, reduce: str, edge_weight: Tensor | None) -> Tensor:
    """Fused sum / mean / max over each destination's in-edges (the `Backend.aggregate` contract)."""
    acc = accumulate_dtype(h_src.dtype)
    if reduce == "max":
        width = h_src.shape[1]
        order = _row_order(block, "max", width, h_src.dtype, _gather_work(width))
        return SegmentMax.apply(h_src, edge_weight, block, order)
    dst_scale = None
    if reduce == "mean":
        dst_scale = 1.0 / in_degrees(block).clamp(min=1).to(acc)
    return weighted_sum(block, h_src, edge_weight, None, dst_scale, False, kind=reduce)


def gcn_aggregate(block: Block, h_src: Tensor, add_self_loops: bool) -> Tensor:
    """Fused `D_dst^-1/2 (A + I) D_src^-1/2 h_src` (the `Backend.gcn_aggregate` contract)."""
    src_scale, dst_scale = gcn_scales(block, add_self_loops, accumulate_dtype(h_src.dtype))
    return weighted_sum(block, h_src, None, src_scale, dst_scale, add_self_loops, kind="gcn")


class WeightedSumProject(torch.autograd.Function):
    """`WeightedSum` (no edge weights) and the projection `@ weight^T` of its output in one native pass
    (`spmm_sum_project`): the aggregate is written once where the weight's gradient will read it (`keep_aggregate`),
    else never, and never read back forward.
    Backward is that of the two apart: `grad^T @ aggregate` to the weight, `grad @ weight` through the sum's adjoint."""

    @staticmethod
    def forward(ctx: FunctionCtx, x: Tensor, weight: Tensor, block: Block, src_scale: Tensor | None,
                dst_scale: Tensor | None, self_loop: bool, row_order: Tensor | None, keep_aggregate: bool) -> Tensor:
        aggregated, projected = native.ops().spmm_sum_project(block.indptr, block.indices, x.contiguous(), None,
                                                              src_scale, dst_scale, self_loop, weight.contiguous(),
                                                              row_order, keep_aggregate)
        ctx.save_for_backward(aggregated if keep_aggregate else None, weight)
        ctx.block, ctx.scales, ctx.self_loop = block, (src_scale, dst_scale), self_loop
        return projected

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad: Tensor) -> tuple[Tensor | None, ...]:
        aggregated, weight = ctx.saved_tensors
        src_scale, dst_scale = ctx.scales
        grad_x = grad_weight = None
        if ctx.needs_input_grad[0]:
            grad_x = _sum_backward(ctx.block, (grad @ weight).contiguous(), None, src_scale, dst_scale, ctx.self_loop)
        if ctx.needs_input_grad[1]:
            grad_weight = grad.t() @ aggregated
        return grad_x, grad_weight, None, None, None, None, None, None


def projects_in_pass(block: Block, h_src: Tensor) -> bool:
    """Whether `gcn_aggregate_project` can project in the aggregation's pass: a sampled block (not a whole-graph
    one) and float32/float64 features on the CPU; the row-wise kernel must also be the one chosen for it."""
    return (h_src.device.type == "cpu" and h_src.dtype in (torch.float32, torch.float64)
            and not isinstance(block, GraphBlock))


def gcn_aggregate_project(block: Block, h_src: Tensor, weight: Tensor, add_self_loops: bool) -> Tensor:
    """`gcn_aggregate(...) @ weight^T` (the `Backend.gcn_aggregate_project` contract): one native pass where
    `projects_in_pass` and the row-wise kernel is chosen, else apart."""
    if (not projects_in_pass(block, h_src)
            or _kernel(block, h_src.shape[1], h_src.dtype, add_self_loops, "gcn") == "dense"):
        return gcn_aggregate(block, h_src, add_self_loops) @ weight.t()
    src_scale, dst_scale = gcn_scales(block, add_self_loops, h_src.dtype)
    width = h_src.shape[1]
    order = _row_order(block, "gcn", width, h_src.dtype, _gather_work(width))
    # the aggregate is written only for the weight's gradient (Function.forward cannot see the grad mode)
    keep_aggregate = torch.is_grad_enabled() and weight.requires_grad
    return WeightedSumProject.apply(h_src, weight, block, src_scale, dst_scale, add_self_loops, order, keep_aggregate)


def _gat_grad_h(block: Block, alpha: Tensor, alpha_self: Tensor, grad: Tensor, h_heads: int) -> Tensor:
    """Gradient to the source features from the attention weights: transposed structure or atomic scatter."""
    ops = native.ops()
    heads, width = grad.shape[1], grad.shape[2]
    edges = block.nnz + alpha_self.shape[0]
    variant = choice.choose("gat.backward",
                            _signature("gat-backward", block, width, grad.dtype, heads, h_heads,
                                       determinism.required()),
                            lambda: _backward_costs(block, edges, heads * width),
                            options=determinism.backward_options("gat.backward"))
    if variant == "scatter":
        return ops.gat_grad_h_scatter(block.indptr, block.indices, alpha, alpha_self, grad, block.num_src, h_heads)
    t_indptr, t_dst, t_eid = ops.csr_transpose(block.indptr, block.indices, block.num_src)
    return ops.gat_grad_h(t_indptr, t_dst, t_eid, alpha, alpha_self, grad, h_heads)


class GatAttention(torch.autograd.Function):
    """Fused GAT: scores, leaky ReLU, edge softmax and weighted sum in one pass; backward keeps per-edge scalars.

    `h` is `[num_src, heads, F]`, or `[num_src, 1, F]` when every head attends over the same features.
    """

    @staticmethod
    def forward(ctx: FunctionCtx, h: Tensor, score_src: Tensor, score_dst: Tensor, block: Block,
                negative_slope: float, self_loop: bool, row_order: Tensor | None) -> Tensor:
        acc = accumulate_dtype(h.dtype)
        ctx.score_dtypes = (score_src.dtype, score_dst.dtype)
        h = h.contiguous()
        score_src, score_dst = score_src.to(acc).contiguous(), score_dst.to(acc).contiguous()
        out, row_max, row_sum = native.ops().gat_forward(block.indptr, block.indices, h, score_src, score_dst,
                                                         negative_slope, self_loop, row_order)
        ctx.save_for_backward(h, score_src, score_dst, row_max, row_sum)
        ctx.block, ctx.negative_slope, ctx.self_loop, ctx.row_order = block, negative_slope, self_loop, row_order
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad: Tensor) -> tuple[Tensor | None, ...]:
        h, score_src, score_dst, row_max, row_sum = ctx.saved_tensors
        block = ctx.block
        grad = grad.contiguous()
        alpha, alpha_self, grad_edge, grad_self, grad_dst = native.ops().gat_backward(
            block.indptr, block.indices, h, score_src, score_dst, row_max, row_sum, grad, ctx.negative_slope,
            ctx.self_loop, ctx.row_order,
        )
        grad_h = _gat_grad_h(block, alpha, alpha_self, grad, h.shape[1]) if ctx.needs_input_grad[0] else None
        grad_src = grad_dst_out = None
        if ctx.needs_input_grad[1]:
            grad_src = torch.zeros_like(score_src).index_add_(0, block.indices, grad_edge)
            if ctx.self_loop:
                grad_src[: block.num_dst] += grad_self
            grad_src = grad_src.to(ctx.score_dtypes[0])
        if ctx.needs_input_grad[2]:
            grad_dst_out = grad_dst.to(ctx.score_dtypes[1])
        return grad_h, grad_src, grad_dst_out, None, None, None, None


def gat_attention(block: Block, h_src: Tensor, score_src: Tensor, score_dst: Tensor, negative_slope: float,
                  add_self_loops: bool) -> Tensor:
    """Fused multi-head GAT (the `Backend.gat_attention` contract); a one-head h_src is read once for all heads."""
    heads, width = score_src.shape[1], h_src.shape[2]
    order = _row_order(block, "gat", width, h_src.dtype,
                       lambda calibration: heads * (calibration.attention_edge + width * calibration.attention_element))
    return GatAttention.apply(h_src, score_src, score_dst, block, negative_slope, add_self_loops, order)
