"""Which dense parts of the training step run fused: today's step stays selectable for benchmarks and checks.

`StepVariant.fused_activation` runs bias + activation + dropout between layers as one native op
(`morphpipe.ops.bias_act_dropout`) instead of an add, `F.relu` and `F.dropout`;
`fused_projection` runs SAGE's self and neighbour projections as one GEMM accumulating into the
other's output, or one GEMM over concatenations (`morphpipe.ops.sage_projection`), instead of two
linears and an add, and GCN's projection in its aggregation's pass (`morphpipe.ops.gcn_aggregate_project`), and GAT's attention
scores in the layouts BLAS runs fast (`morphpipe.ops.narrow_projection`); `optimizer` is the Adam implementation `make_optimizer` builds by default
(torch's "fused", or "for-loop", torch's default on CPU). `set_step_variant` sets the process
default (seen by every thread), `use_step_variant` overrides it in a scope;
`LEGACY_STEP` runs the step as it was before these existed.
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
    optimizer: str = "fused"


FUSED_STEP = StepVariant()
LEGACY_STEP = StepVariant(fused_activation=False, fused_projection=False, optimizer="for-loop")

_process_variant = FUSED_STEP
_scoped: ContextVar[StepVariant | None] = ContextVar("morphpipe_step_variant", default=None)


def current_step_variant() -> StepVariant:
    """The scoped variant of the current thread or task, else the process default."""
    return _scoped.get() or _process_variant


def set_step_variant(variant: StepVariant) -> None:
    """Sets the process default variant (every thread sees it unless a `use_step_variant` scope overrides it)."""
    global _process_variant
    if not isinstance(variant, StepVariant):
        raise TypeError(f"variant must be a StepVariant (e.g. FUSED_STEP, LEGACY_STEP), got {variant!r}")
    _process_variant = variant


@contextmanager
def use_step_variant(variant: StepVariant) -> Iterator[StepVariant]:
    """Runs the block with `variant`, restoring the previous one after."""
    if not isinstance(variant, StepVariant):
        raise TypeError(f"variant must be a StepVariant (e.g. FUSED_STEP, LEGACY_STEP), got {variant!r}")
    token = _scoped.set(variant)
    try:
        yield variant
    finally:
        _scoped.reset(token)
