"""The previous layer's bias + ReLU + dropout and a SAGE layer's mean aggregation and own rows as one autograd node,
so that their backward is one native pass over the activations instead of three.

Between two SAGE layers the step ran `out = bias_act_dropout(pre, bias)`, then `split_prefix(out)` and the mean
over `out`; backward wrote the mean's gradient to a fresh `[num_src, F]` tensor (spmm_sum over the transposed
structure), added the own rows' gradient to its prefix, and read it again with `out` to write the gradient of
`pre` (bias_act_dropout_backward). `relu_mean` runs the same forward kernels and backpropagates with
`torch.ops.morphpipe.relu_mean_backward`, which sums, adds and applies the ReLU's derivative per row in registers
and takes the bias gradient's column sums in the same pass: the values are the three passes' (bit for bit in
float32), the traffic one pass's. CPU and the fused backend's row-wise mean only (`relu_mean_runs` says when);
elsewhere the caller runs the separate ops.
"""
from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable

from morphpipe import native
from morphpipe.ops import choice, fused
from morphpipe.ops.aggregate import current_backend
from morphpipe.ops.bias_act_dropout import draw_seed
from morphpipe.sampling.minibatch import Block


class ReluMean(torch.autograd.Function):
    """`(mean over block of out, out[:num_dst])` with `out = dropout(relu(pre + bias), p)`; saves `out` only."""

    @staticmethod
    def forward(ctx: FunctionCtx, pre: Tensor, bias: Tensor, block: Block, p: float, seed: int, dst_scale: Tensor,
                row_order: Tensor | None) -> tuple[Tensor, Tensor]:
        ops = native.ops()
        out, _ = ops.bias_act_dropout(pre, bias, "relu", p, seed)
        mean = ops.spmm_sum(block.indptr, block.indices, out, None, None, dst_scale, False, row_order)
        ctx.save_for_backward(out, dst_scale)
        ctx.block, ctx.p = block, p
        return mean, out[: block.num_dst]

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad_mean: Tensor, grad_own: Tensor) -> tuple[Tensor | None, ...]:
        out, dst_scale = ctx.saved_tensors
        block = ctx.block
        ops = native.ops()
        t_indptr, t_dst, _ = ops.csr_transpose(block.indptr, block.indices, block.num_src)
        grad_pre, grad_bias = ops.relu_mean_backward(t_indptr, t_dst, grad_mean.contiguous(), dst_scale,
                                                     grad_own.contiguous(), out, ctx.p)
        return grad_pre, grad_bias if ctx.needs_input_grad[1] else None, None, None, None, None, None


def relu_mean_runs(pre: Tensor, bias: Tensor, block: Block) -> bool:
    """Whether `relu_mean` can run on these inputs: a contiguous 2-D CPU `pre` with a bias of its dtype (autocast's
    casts happen before), and the fused backend's row-wise mean for this block."""
    return (pre.device.type == "cpu" and pre.dim() == 2 and pre.is_contiguous() and bias.dtype == pre.dtype
            and tuple(bias.shape) == (pre.shape[1],) and pre.shape[0] == block.num_src
            and current_backend(pre.device).name == fused.NAME
            and fused.unavailable("cpu") is None)


def relu_mean(pre: Tensor, bias: Tensor, block: Block, p: float) -> tuple[Tensor, Tensor] | None:
    """`(mean of dropout(relu(pre + bias), p) over block, its first num_dst rows)` in training, as one autograd node;
    None when the mean would not run the row-wise kernel (then the caller runs the separate ops). Draws the dropout
    seed as `bias_act_dropout` does, so the same generator state gives the same mask. Its backward goes through the
    transposed structure, so a forced `aggregate.backward` of "scatter" leaves the ops separate (honoured there)."""
    if choice.forced_option("aggregate.backward") == "scatter":
        return None
    plan = fused.rowwise_mean_plan(block, pre.shape[1], pre.dtype)
    if plan is None:
        return None
    dst_scale, row_order = plan
    return ReluMean.apply(pre, bias, block, float(p), draw_seed() if p > 0 else 0, dst_scale, row_order)
