"""A layer's sources and their destination prefix `h_src[:num_dst]` as one autograd node, so that backward adds the
prefix's gradient into the sources' gradient in place instead of through a zero-filled `[num_src, F]` tensor.

Plain slicing backpropagates through `slice_backward`: a zero fill of the whole `[num_src, F]` shape, the prefix's
gradient copied in, then an add of that tensor to the gradient from the neighbours (three full-size passes). With
`split_prefix` the two gradients meet in one `add_` over the `num_dst` prefix rows.
"""
from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable


class PrefixSplit(torch.autograd.Function):
    """`(h_src, h_src[:num_dst])` as views; backward sums their gradients over the prefix rows only."""

    @staticmethod
    def forward(ctx: FunctionCtx, h_src: Tensor, num_dst: int) -> tuple[Tensor, Tensor]:
        ctx.num_dst, ctx.shape = num_dst, h_src.shape
        return h_src.view_as(h_src), h_src[:num_dst]

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad_all: Tensor | None, grad_prefix: Tensor | None) -> tuple[Tensor | None, None]:
        if grad_prefix is None:
            return grad_all, None
        if grad_all is None:
            grad_all = grad_prefix.new_zeros(ctx.shape)
        elif not grad_all.is_contiguous():
            # An expanded or broadcast gradient has aliased rows: add out of place (the slice's cost, no worse).
            grad_all = grad_all.clone(memory_format=torch.contiguous_format)
        # Otherwise grad_all is the fresh result of the sources' consumer (an aggregation's or a projection's
        # backward), which nothing else holds: accumulating into it is what autograd's own buffer would do.
        grad_all[: ctx.num_dst] += grad_prefix
        return grad_all, None


def split_prefix(h_src: Tensor, num_dst: int) -> tuple[Tensor, Tensor]:
    """`(h_src, h_src[:num_dst])`; through `PrefixSplit` when `h_src` needs a gradient, plain views otherwise.

    Both outputs are views of `h_src`: read them, never modify them in place.
    """
    if not (torch.is_grad_enabled() and h_src.requires_grad):
        return h_src, h_src[:num_dst]
    return PrefixSplit.apply(h_src, num_dst)
