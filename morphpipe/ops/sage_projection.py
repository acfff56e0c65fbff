"""SAGE's two projections as one step: `neigh @ W_neigh^T + h_dst @ W_self^T` without a separate add.

Two forms give the same result up to summation order: `addmm` runs the second GEMM accumulating
in place into the first's output (no temporary, no add pass), `concat` runs one GEMM over `[neigh | h_dst]`
and `[W_neigh | W_self]` (one call, at the price of copying both inputs side by side). The
calibrated cost model picks per shape (`sage.projection`: the copy against one fewer call), and
the choice can be forced like every other (`morphpipe.ops.force_choices`).
"""
from __future__ import annotations

import torch
from torch import Tensor

from morphpipe.ops import choice
from morphpipe.ops.autocast_input import narrower_autocast_dtype
from morphpipe.ops.cost_model import current_calibration


def _costs(rows: int, in_features: int, out_features: int, device: torch.device) -> dict[str, float]:
    calibration = current_calibration(device)
    separate = 2 * calibration.gemm(rows, in_features, out_features)
    copy = rows * 2 * in_features * calibration.dense_element
    return {"addmm": separate, "concat": separate - calibration.call + copy}


def sage_projection(neigh: Tensor, h_dst: Tensor, w_neigh: Tensor, w_self: Tensor,
                    base: Tensor | None = None) -> Tensor:
    """`neigh @ w_neigh^T + h_dst @ w_self^T` (`neigh`, `h_dst` [rows, in]); with `base` given, `base + h_dst @ w_self^T`.

    `base` is the neighbour part already projected (SAGE projecting before aggregating); then the
    self projection accumulates into it.
    """
    if torch.is_autocast_enabled(h_dst.device.type):  # in-place addmm_ is not autocast: cast the operands here
        stored = narrower_autocast_dtype(h_dst)
        # The layer's input left as stored (`morphpipe.ops.autocast_input`): project in its precision, cast the output.
        dtype = h_dst.dtype if stored is not None else torch.get_autocast_dtype(h_dst.device.type)
        neigh, h_dst, w_neigh, w_self = (tensor.to(dtype) for tensor in (neigh, h_dst, w_neigh, w_self))
        base = None if base is None else base.to(dtype)
        if stored is not None:
            with torch.autocast(h_dst.device.type, enabled=False):
                return sage_projection(neigh, h_dst, w_neigh, w_self, base).to(stored)
    if base is not None:
        return base.addmm_(h_dst, w_self.t())
    rows, in_features, out_features = h_dst.shape[0], h_dst.shape[1], w_self.shape[0]
    signature = ("sage.projection", h_dst.device.type, str(h_dst.dtype).removeprefix("torch."), choice.bucket(rows),
                 in_features, out_features)
    form = choice.choose("sage.projection", signature, lambda: _costs(rows, in_features, out_features, h_dst.device))
    if form == "concat":
        return torch.cat([neigh, h_dst], 1) @ torch.cat([w_neigh, w_self], 1).t()
    return (neigh @ w_neigh.t()).addmm_(h_dst, w_self.t())
