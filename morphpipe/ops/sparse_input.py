"""Morphling's sparsity-aware input transform: `x @ W^T` as sparse-times-dense when x is sparse enough.

A layer measures the density of its input once (`InputDensity`, on a row sample of the first
input it sees). `sparse_aware_linear` then runs the projection as a dense GEMM or, when the
cost model predicts it faster at that density (below `Calibration.sparse_threshold`), by
converting x to CSR and multiplying with the fused row-wise kernel. Both give the same result up
to floating-point summation order, and the same gradients to the weight and the bias. The sparse
path is a candidate only when x needs no gradient (a model's input features): it could not
give x's gradient at its zero entries.
"""
from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from morphpipe.ops import choice
from morphpipe.ops.autocast_input import project
from morphpipe.ops.cost_model import current_calibration
from morphpipe.ops.dense_to_csr import dense_to_csr
from morphpipe.ops.fused import WeightedSum, unavailable

# Rows sampled to estimate the density: enough for a stable fraction, cheap on any input.
DENSITY_SAMPLE_ROWS = 4096
# Densities are compared in steps of 1/64 so that batches of one dataset share one signature.
DENSITY_STEPS = 64


@dataclass
class InputDensity:
    """Fraction of non-zero entries in a layer's input, measured once on the first input and then kept."""

    density: float | None = None

    def measure(self, x: Tensor) -> float:
        """The kept density, measuring it on up to `DENSITY_SAMPLE_ROWS` evenly spaced rows of `x` the first time."""
        if self.density is None:
            step = max(1, x.shape[0] // DENSITY_SAMPLE_ROWS)
            sample = x.detach()[::step]
            self.density = float(sample.count_nonzero()) / max(sample.numel(), 1)
        return self.density

    def reset(self) -> None:
        """Measure again on the next input (e.g. after switching datasets)."""
        self.density = None


def _sparse_linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """`x @ weight^T + bias` with x in CSR and the fused row-wise kernel (`weight^T` rows gathered per non-zero)."""
    structure, values = dense_to_csr(x.detach())
    out = WeightedSum.apply(weight.t().contiguous(), values, structure, None, None, False, None)
    return out if bias is None else out + bias


def transform_choice(x: Tensor, out_features: int, density: float) -> str:
    """"dense" or "sparse": how `x @ W^T` with `out_features` outputs runs at `density` on this machine."""
    rows, in_features = x.shape[0], x.shape[1]
    step = round(density * DENSITY_STEPS) / DENSITY_STEPS
    signature = ("linear", x.device.type, str(x.dtype).removeprefix("torch."), choice.bucket(rows), in_features,
                 out_features, step)
    def costs() -> dict[str, float]:
        calibration = current_calibration(x.device)
        return {"dense": calibration.gemm(rows, in_features, out_features),
                "sparse": calibration.sparse_linear(rows, in_features, out_features, density)}

    options = ("dense", "sparse") if not x.requires_grad and unavailable(x.device.type) is None else ("dense",)
    return choice.choose("input.transform", signature, costs, options=options)


def sparse_aware_linear(x: Tensor, weight: Tensor, bias: Tensor | None, density: float) -> Tensor:
    """`F.linear(x, weight, bias)`, as sparse-times-dense when `density` makes that cheaper on this machine."""
    if transform_choice(x, weight.shape[0], density) == "sparse":
        return _sparse_linear(x, weight, bias)
    return project(x, weight, bias)
