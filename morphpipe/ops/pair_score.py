"""Fused pair scoring for link prediction's dot decoder: score[i] = <h[src[i]], h[dst[i]]> over one embedding table.

`pair_dot(h, src, dst)` equals `(h[src] * h[dst]).sum(-1)` (`reference_pair_dot`) without the two
[pairs, width] gathers and their backward (index_put accumulations of [pairs, width] into h): the
native `torch.ops.morphpipe.pair_dot` (csrc/cpu/pair_score.cpp) reads both rows of each pair, and
its backward sums each row's contributions into grad_h directly. With 100 negatives per positive a
1024-edge batch scores 103,424 pairs; their gathered rows at width 256 are 2 x 106 MB per pass.
Where the native kernel cannot run (no build, or a device without one) the reference runs instead.
"""
from __future__ import annotations

import logging

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable

from morphpipe import native
from morphpipe.ops.fused import unavailable

log = logging.getLogger("morphpipe.ops")
_said_unavailable: set[str] = set()
DISPATCH_KEYS = {"cpu": "CPU", "cuda": "CUDA"}


def reference_pair_dot(h: Tensor, src: Tensor, dst: Tensor) -> Tensor:
    """`(h[src] * h[dst]).sum(-1)` in plain PyTorch: the definition the native op computes."""
    return (h[src] * h[dst]).sum(dim=-1)


class PairDot(torch.autograd.Function):
    """Autograd around the native forward and backward; saves h and the pair lists only."""

    @staticmethod
    def forward(ctx: FunctionCtx, h: Tensor, src: Tensor, dst: Tensor) -> Tensor:
        ctx.save_for_backward(h, src, dst)
        return native.ops().pair_dot(h, src, dst)

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad: Tensor) -> tuple[Tensor | None, None, None]:
        h, src, dst = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None
        return native.ops().pair_dot_backward(h, src, dst, grad.to(h.dtype).contiguous()), None, None


def _native_unavailable(device_type: str) -> str | None:
    """Why the native pair scorer cannot run on `device_type` (said once per device type), None when it can."""
    reason = unavailable(device_type)
    if reason is None and not torch._C._dispatch_has_kernel_for_dispatch_key("morphpipe::pair_dot",
                                                                            DISPATCH_KEYS[device_type]):
        reason = f"no {device_type} kernel of morphpipe::pair_dot is built"
    if reason is not None and device_type not in _said_unavailable:
        _said_unavailable.add(device_type)
        log.warning("fused pair scoring cannot run on %s (%s); gathered rows are scored instead", device_type, reason)
    return reason


def pair_dot(h: Tensor, src: Tensor, dst: Tensor) -> Tensor:
    """Scores [pairs] = <h[src[i]], h[dst[i]]> of embeddings h [rows, width] for int64 index lists src and dst of
    one length (any shape: the scores take it), fused where the native kernel runs."""
    if h.dim() != 2:
        raise ValueError(f"h must be 2-D [rows, width] embeddings, got shape {tuple(h.shape)}")
    if src.shape != dst.shape:
        raise ValueError(f"src and dst must have one shape (one pair per position), got {tuple(src.shape)} and "
                         f"{tuple(dst.shape)}")
    if src.dtype != torch.int64 or dst.dtype != torch.int64:
        raise ValueError(f"src and dst must be int64 indices, got {src.dtype} and {dst.dtype}; convert with .long()")
    if _native_unavailable(h.device.type) is not None:
        return reference_pair_dot(h, src, dst)
    scores = PairDot.apply(h.contiguous(), src.reshape(-1).contiguous(), dst.reshape(-1).contiguous())
    return scores.view(src.shape)
