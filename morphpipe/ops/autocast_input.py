"""Under autocast, a layer's wider input (float32 features in a bf16 step) is cast once for the whole layer, or read
as stored with its input projection run in the stored precision, whichever timed faster on the layer's shape.

Autocast casts a float32 input at every product that reads it, while the fused aggregations (custom ops, not
autocast) run on it in float32 and hand a float32 result to the next product, which casts again: SAGE's first layer
cast its mean and its destinations' rows, two passes, and aggregated 512-byte rows where 256 would do. Cast once at
the layer's entry (`cast`), every product and aggregation of the layer reads the narrow copy. But that cast is itself
a pass over the whole input, writing fresh memory: for a projection that narrows (GCN's 128 -> 16 features) it costs
more than the bfloat16 GEMM saves, and then (`as_stored`) the layer's projection runs in float32 on the input as
stored, its narrow output cast to the autocast dtype. The decision `autocast.input` times both (forward product and
the weight's gradient product) once per shape on the call's own input, as the whole-graph selector does
(`morphpipe.ops.graph_kernel`), and can be forced like every choice.
"""
from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F

from morphpipe.ops import choice
from morphpipe.ops.graph_kernel import current_timer

DECISION = "autocast.input"
CAST = "cast"
AS_STORED = "as_stored"


def narrower_autocast_dtype(x: Tensor) -> torch.dtype | None:
    """The autocast dtype when autocast is on for x's device and narrower than x's floating dtype, else None."""
    device_type = x.device.type
    if not (x.is_floating_point() and torch.is_autocast_enabled(device_type)):
        return None
    dtype = torch.get_autocast_dtype(device_type)
    return dtype if dtype.itemsize < x.element_size() else None


def _timings(x: Tensor, weight: Tensor, dtype: torch.dtype, weight_grad: bool) -> dict[str, float]:
    """Seconds of the layer's projection (and its weight-gradient product) with the input cast first or as stored."""
    x, weight = x.detach(), weight.detach()

    def cast() -> None:
        narrow = x.to(dtype)
        out = narrow @ weight.to(dtype).t()
        if weight_grad:
            out.t() @ narrow

    def as_stored() -> None:
        out = x @ weight.t()
        if weight_grad:
            out.t() @ x
        out.to(dtype)

    timer = current_timer()
    with torch.autocast(x.device.type, enabled=False):
        return {CAST: timer(CAST, cast), AS_STORED: timer(AS_STORED, as_stored)}


def layer_input(x: Tensor, weight: Tensor) -> Tensor:
    """`x` for a layer whose input projection is `weight` (`[out, in]`): in the autocast dtype, cast here once, or as
    stored (then `project` runs the projection in x's precision). Outside autocast, or when x is no wider, x itself."""
    dtype = narrower_autocast_dtype(x)
    if dtype is None:
        return x
    weight_grad = torch.is_grad_enabled() and weight.requires_grad
    signature = (x.device.type, str(x.dtype).removeprefix("torch."), str(dtype).removeprefix("torch."),
                 choice.bucket(x.shape[0]), x.shape[1], weight.shape[0], weight_grad)
    chosen = choice.choose(DECISION, signature, lambda: _timings(x, weight, dtype, weight_grad), reason="timed")
    return x.to(dtype) if chosen == CAST else x


def project(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """`F.linear(x, weight, bias)`; under autocast an input wider than the autocast dtype (one `layer_input` left as
    stored) is projected in its own precision and only the output is cast to the autocast dtype."""
    dtype = narrower_autocast_dtype(x)
    if dtype is None:
        return F.linear(x, weight, bias)
    with torch.autocast(x.device.type, enabled=False):
        return F.linear(x, weight.to(x.dtype), None if bias is None else bias.to(x.dtype)).to(dtype)
