"""Fused bias + activation + dropout between layers: one native pass forward and one backward, mask as bits.

`bias_act_dropout(x, bias, "relu", p, training)` equals `F.dropout(F.relu(x + bias), p, training)`
in distribution, computed by `torch.ops.morphpipe.bias_act_dropout` (csrc/cpu,
csrc/cuda): the keep mask comes from a counter-based generator (a keyed 32-bit hash of each
element's index, keyed by SplitMix64 of a per-call seed, so p acts in steps of 2^-32; see
`csrc/common/dropout_mask.h`) and is kept as one bit per element, the seed is drawn from torch's
default CPU generator (so `torch.manual_seed` reproduces a run, and a CUDA call needs no host
sync), and CPU and CUDA draw the same bits for the same seed. In eval mode or with p = 0 nothing
is drawn and no mask exists. `reference_bias_act_dropout` is the plain-PyTorch definition given a
mask, `unpack_mask` turns the bits into a bool tensor.
"""
from __future__ import annotations

import logging
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable

from morphpipe import native
from morphpipe.ops.fused import unavailable

Activation = Literal["relu", "identity"]
ACTIVATIONS: tuple[str, ...] = ("relu", "identity")
MASK_WORD_BITS = 32

log = logging.getLogger("morphpipe.ops")
_said_unavailable: set[str] = set()


def draw_seed() -> int:
    """A fresh 63-bit seed for one call's mask, from torch's default CPU generator."""
    return int(torch.empty((), dtype=torch.int64).random_())


def unpack_mask(mask: Tensor, shape: torch.Size | tuple[int, ...]) -> Tensor:
    """The keep mask as a bool tensor of `shape` from its int32 bit words (bit i % 32 of word i // 32)."""
    numel = 1
    for size in shape:
        numel *= size
    bits = torch.arange(MASK_WORD_BITS, device=mask.device, dtype=torch.int32)
    keep = (mask.unsqueeze(1) >> bits).bitwise_and(1).bool().flatten()
    return keep[:numel].view(shape)


def _activate(y: Tensor, activation: str) -> Tensor:
    return F.relu(y) if activation == "relu" else y


def reference_bias_act_dropout(x: Tensor, bias: Tensor | None, activation: Activation, p: float,
                               keep: Tensor | None) -> Tensor:
    """`keep * act(x + bias) / (1 - p)` in plain PyTorch (`keep` a bool mask of x's shape, None: keep all)."""
    y = _activate(x if bias is None else x + bias, activation)
    return y if keep is None else y * (keep.to(y.dtype) * (1.0 / (1.0 - p)))


class BiasActDropout(torch.autograd.Function):
    """Autograd around the native forward and backward; saves the output and the bit mask only."""

    @staticmethod
    def forward(ctx: FunctionCtx, x: Tensor, bias: Tensor | None, activation: str, p: float, seed: int) -> Tensor:
        out, mask = native.ops().bias_act_dropout(x, bias, activation, p, seed)
        ctx.save_for_backward(out, mask)
        ctx.activation, ctx.p, ctx.has_bias = activation, p, bias is not None
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad: Tensor) -> tuple[Tensor | None, ...]:
        out, mask = ctx.saved_tensors
        need_bias = ctx.has_bias and ctx.needs_input_grad[1]
        grad_x, grad_bias = native.ops().bias_act_dropout_backward(grad.contiguous(), out, mask, ctx.activation,
                                                                    ctx.p, need_bias)
        return (grad_x if ctx.needs_input_grad[0] else None, grad_bias if need_bias else None, None, None, None)


def _check(x: Tensor, bias: Tensor | None, activation: str, p: float) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p < 1.0:
        raise ValueError(f"p must be a float in [0, 1), got {p!r}")
    if x.dim() < 1:
        raise ValueError(f"x must have at least one dimension (features last), got shape {tuple(x.shape)}")
    if bias is not None and tuple(bias.shape) != (x.shape[-1],):
        raise ValueError(f"bias must have shape ({x.shape[-1]},) (x's last dim), got {tuple(bias.shape)}")


def _fused_unavailable(device_type: str) -> str | None:
    """Why the native op cannot run on `device_type` (said once per device type), None when it can."""
    reason = unavailable(device_type)
    if reason is not None and device_type not in _said_unavailable:
        _said_unavailable.add(device_type)
        log.warning("fused bias+activation+dropout cannot run on %s (%s); F.relu and F.dropout run instead",
                    device_type, reason)
    return reason


def bias_act_dropout(x: Tensor, bias: Tensor | None, activation: Activation = "relu", p: float = 0.0,
                     training: bool = True) -> Tensor:
    """`dropout(act(x + bias), p)` over the last dim's features (bias broadcast over rows), fused."""
    _check(x, bias, activation, p)
    drop = p if training else 0.0
    if _fused_unavailable(x.device.type) is not None:
        return F.dropout(_activate(x if bias is None else x + bias, activation), p=drop, training=drop > 0)
    if drop == 0.0 and activation == "identity":
        return x if bias is None else x + bias
    if bias is not None and bias.dtype != x.dtype:
        if not torch.is_autocast_enabled(x.device.type):
            raise ValueError(f"bias dtype {bias.dtype} differs from x's {x.dtype}; cast one of them")
        bias = bias.to(x.dtype)  # mixed precision: the float32 master bias applied in the activations' dtype
    flat = x.reshape(-1, x.shape[-1]).contiguous()
    out = BiasActDropout.apply(flat, bias, activation, float(drop), draw_seed() if drop > 0 else 0)
    return out.view(x.shape)
