"""Aggregation and attention ops over Blocks, behind one interface with swappable backends.

Models call `aggregate`, `gcn_aggregate` and `gat_attention`; the active `Backend` (default:
the plain-PyTorch `reference`) runs them. Fused kernels plug in with `register_backend` and are
chosen with `set_backend` (process default) or `use_backend` (scoped, e.g. to force one).
"""
from morphpipe.ops.aggregate import (
    REDUCTIONS,
    Backend,
    Reduce,
    aggregate,
    available_backends,
    current_backend,
    gat_attention,
    gcn_aggregate,
    register_backend,
    set_backend,
    use_backend,
)
from morphpipe.ops.reference import gcn_scales

__all__ = [
    "REDUCTIONS",
    "Backend",
    "Reduce",
    "aggregate",
    "available_backends",
    "current_backend",
    "gat_attention",
    "gcn_aggregate",
    "gcn_scales",
    "register_backend",
    "set_backend",
    "use_backend",
]
