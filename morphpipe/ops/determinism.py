"""What the fused backward may run when torch is asked for deterministic algorithms.

The scatter formulations of the backward passes (`aggregate.backward=scatter`,
`gat.backward=scatter`) and the max backward add floats atomically (CUDA `atomicAdd`, OpenMP
atomics on CPU), so their summation order, and with it the last bits of the gradient, changes from
run to run. Under `torch.use_deterministic_algorithms(True)` the fused backend takes the
transposed-structure formulation instead (one pass per source, a fixed summation order) and routes
the max gradient through torch's deterministic `index_add_`.
"""
from __future__ import annotations

import torch
from torch import Tensor

from morphpipe.ops import choice

# Options of a decision whose kernels accumulate with float atomics.
ATOMIC_OPTIONS: dict[str, tuple[str, ...]] = {
    "aggregate.backward": ("scatter",),
    "gat.backward": ("scatter",),
}


def required() -> bool:
    """Whether torch currently demands deterministic algorithms (warn-only mode included)."""
    return torch.are_deterministic_algorithms_enabled()


def backward_options(decision: str) -> tuple[str, ...]:
    """The options `decision` may choose from now: all of them, or only the atomic-free ones when determinism is required.

    A forced atomic option under deterministic mode is an error, as torch's own nondeterministic ops raise.
    """
    options = choice.DECISIONS[decision]
    if not required():
        return options
    atomic = ATOMIC_OPTIONS.get(decision, ())
    forced = choice.forced_option(decision)
    if forced in atomic and not torch.is_deterministic_algorithms_warn_only_enabled():
        raise RuntimeError(
            f"forced choice {decision}={forced!r} adds floats atomically, which is nondeterministic, but "
            f"torch.use_deterministic_algorithms(True) is set; force {decision}=transpose instead, or call "
            "torch.use_deterministic_algorithms(True, warn_only=True) to allow it"
        )
    if forced in atomic:
        return options
    return tuple(option for option in options if option not in atomic)


def max_backward(indices: Tensor, argmax: Tensor, grad: Tensor, x: Tensor, weight: Tensor | None,
                 need_grad_x: bool, need_grad_weight: bool) -> tuple[Tensor | None, Tensor | None]:
    """`spmm_max_backward` with torch's deterministic `index_add_` in place of atomic adds (acc dtype sums).

    Returns grad_x ([num_src, F], x's dtype) and grad_weight ([nnz], accumulation dtype), None where not needed.
    """
    acc = torch.float32 if grad.dtype in (torch.float16, torch.bfloat16) else grad.dtype
    rows, width = grad.shape
    num_src, nnz = x.shape[0], indices.numel()
    grad_x = torch.zeros(num_src * width, dtype=acc, device=grad.device) if need_grad_x else None
    grad_weight = torch.zeros(nnz, dtype=acc, device=grad.device) if need_grad_weight else None
    if nnz == 0 or rows * width == 0:
        return (None if grad_x is None else grad_x.view(num_src, width).to(grad.dtype)), grad_weight
    edge = argmax.reshape(-1)
    present = edge >= 0  # rows without edges have argmax -1 and pass no gradient
    edge = edge.clamp(min=0)
    source = indices[edge]
    feature = torch.arange(width, device=grad.device).repeat(rows)
    g = torch.where(present, grad.reshape(-1).to(acc), torch.zeros((), dtype=acc, device=grad.device))
    if grad_x is not None:
        scaled = g if weight is None else g * weight[edge]
        grad_x.index_add_(0, source * width + feature, scaled)
        grad_x = grad_x.view(num_src, width).to(grad.dtype)
    if grad_weight is not None:
        grad_weight.index_add_(0, edge, g * x.reshape(-1)[source * width + feature].to(acc))
    return grad_x, grad_weight
