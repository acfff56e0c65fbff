"""Which dense parts of the training step run fused: today's step stays selectable for benchmarks and checks.

`StepVariant.fused_activation` runs bias + activation + dropout between layers as one native op
(`morphpipe.ops.bias_act_dropout`) instead of an add, `F.relu` and `F.dropout`;
`fused_projection` runs SAGE's self and neighbour projections as one GEMM accumulating into the
other's output, or one GEMM over concatenations (`morphpipe.ops.sage_projection`), instead of two
linears and an add. Both are on by default;
`use_step_variant(LEGACY_STEP)` runs the step as it was before they existed.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass


@dataclass(frozen=True)
class StepVariant:
    """Switches for the fused dense parts of the step (True: fused)."""

    fused_activation: bool = True
    fused_projection: bool = True


FUSED_STEP = StepVariant()
LEGACY_STEP = StepVariant(fused_activation=False, fused_projection=False)

_variant: ContextVar[StepVariant] = ContextVar("morphpipe_step_variant", default=FUSED_STEP)


def current_step_variant() -> StepVariant:
    """The variant in force for the current thread or task."""
    return _variant.get()


def set_step_variant(variant: StepVariant) -> None:
    """Sets the variant for the current context (the process default when called at start-up)."""
    if not isinstance(variant, StepVariant):
        raise TypeError(f"variant must be a StepVariant (e.g. FUSED_STEP, LEGACY_STEP), got {variant!r}")
    _variant.set(variant)


@contextmanager
def use_step_variant(variant: StepVariant) -> Iterator[StepVariant]:
    """Runs the block with `variant`, restoring the previous one after."""
    if not isinstance(variant, StepVariant):
        raise TypeError(f"variant must be a StepVariant (e.g. FUSED_STEP, LEGACY_STEP), got {variant!r}")
    token = _variant.set(variant)
    try:
        yield variant
    finally:
        _variant.reset(token)
