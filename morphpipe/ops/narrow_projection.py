"""`x @ weight` for a weight of a few columns (GAT's attention scores: `[n, in] @ [in, 2 * heads]`), with each
product laid out the way BLAS runs it fast.

Autograd's `mm` runs these skinny products in layouts BLAS handles poorly: the weight's gradient `x^T @ grad`
reduces over all n rows with a transposed operand (on the Zen 4 machine, 118 ms for a [73858, 256] input at one
thread, against 10 ms for the same product computed as `(grad^T @ x)^T`), and the forward reads a row-major
[in, 2 * heads] weight (22 ms, against 9 ms column-major). Same products, other summation order: results agree
within float rounding (BENCHMARKS.md, "GAT's attention-score products").
"""
from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable


class NarrowProjection(torch.autograd.Function):
    """`x [n, in] @ weight [in, c]`, c small: the forward with the weight column-major, the weight's gradient as
    `(grad^T @ x)^T`, the input's as `grad @ weight^T`."""

    @staticmethod
    def forward(ctx: FunctionCtx, x: Tensor, weight: Tensor) -> Tensor:
        ctx.save_for_backward(x, weight)
        return torch.mm(x, weight.t().contiguous().t())

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad: Tensor) -> tuple[Tensor | None, Tensor | None]:
        x, weight = ctx.saved_tensors
        grad = grad.contiguous()
        grad_x = torch.mm(grad, weight.t()) if ctx.needs_input_grad[0] else None
        grad_weight = torch.mm(grad.t(), x).t() if ctx.needs_input_grad[1] else None
        return grad_x, grad_weight


def narrow_projection(x: Tensor, weight: Tensor) -> Tensor:
    """`x @ weight` (2-D, float32, on the CPU: the layouts above were measured there); other inputs take `x @
    weight` as it is."""
    if x.device.type != "cpu" or x.dtype != torch.float32 or weight.dtype != torch.float32 or x.dim() != 2:
        return x @ weight
    return NarrowProjection.apply(x, weight)
