"""Aggregation and attention ops over Blocks, behind one interface with swappable backends.

Models call `aggregate`, `gcn_aggregate` (`gcn_aggregate_project`) and `gat_attention`; the active `Backend` runs them:
by default (`"auto"`) the `fused` native kernels where they are built, else the plain-PyTorch
`reference`. Choose with `set_backend` (process default) or `use_backend` (scoped, e.g. to force
one). Input-sensitive choices (kernel variant, re-association, sparse first layer) are forced
with `force_choices` and reported by `recorded_choices` / `choice_counts`. Importing the package
registers the fused backend and its self-check (run on a device's first Route 1 use).
"""
from morphpipe.ops import fused, self_check
from morphpipe.ops.aggregate import (
    AUTO,
    REDUCTIONS,
    Backend,
    Reduce,
    aggregate,
    available_backends,
    current_backend,
    gat_attention,
    gcn_aggregate,
    gcn_aggregate_project,
    register_backend,
    set_backend,
    use_backend,
)
from morphpipe.ops.choice import (
    ChoiceRecord,
    choice_counts,
    clear_choices,
    force_choices,
    recorded_choices,
    set_forced_choices,
)
from morphpipe.ops.reference import gcn_scales
from morphpipe.sampling.backend_check import register_self_check

register_backend(
    Backend(
        name=fused.NAME,
        aggregate=fused.aggregate,
        gcn_aggregate=fused.gcn_aggregate,
        gcn_aggregate_project=fused.gcn_aggregate_project,
        gat_attention=fused.gat_attention,
        device_types=frozenset({"cpu", "cuda"}),
        unavailable=fused.unavailable,
    ),
    preferred=True,
)
register_self_check(self_check.NAME, self_check.ops_problem, self_check.leave_auto)

__all__ = [
    "AUTO",
    "REDUCTIONS",
    "Backend",
    "ChoiceRecord",
    "Reduce",
    "aggregate",
    "available_backends",
    "choice_counts",
    "clear_choices",
    "current_backend",
    "force_choices",
    "gat_attention",
    "gcn_aggregate",
    "gcn_aggregate_project",
    "gcn_scales",
    "recorded_choices",
    "register_backend",
    "set_backend",
    "set_forced_choices",
    "use_backend",
]
