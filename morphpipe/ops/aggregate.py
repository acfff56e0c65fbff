"""The aggregation interface the models call, and the registry of backends that implement it.

Models never index or scatter themselves: they call `aggregate`, `gcn_aggregate` and
`gat_attention`, which validate their inputs once, here, and dispatch to the active `Backend`.
The plain-PyTorch `reference` backend is always registered; fused CPU/CUDA kernels register as
further backends with the same signatures. The active backend is the process default
(`set_backend`) unless a `use_backend` block overrides it for the current thread or task. The
default is `"auto"`: per device type, the first backend registered with `preferred=True` that can
run there (the fused kernels, where the native ops are built), else the reference, said once in
the log. A backend explicitly selected that cannot run on the inputs' device is an error, never
a fallback.

Semantics shared by every backend (edges are a Block's CSC in-edges, local ids):
- a destination with no in-edges aggregates to zeros (GAT: to its self loop alone);
- duplicate edges are separate edges: they count twice in sums, means, degrees and softmax;
- self loops come from the prefix convention (destination `i` is source `i`), so they need
  `num_src >= num_dst` and are never stored in `block.indices`.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from morphpipe.ops import reference
from morphpipe.sampling.minibatch import Block

Reduce = Literal["sum", "mean", "max"]
REDUCTIONS: tuple[str, ...] = ("sum", "mean", "max")
AUTO = "auto"

log = logging.getLogger("morphpipe.ops")


@dataclass(frozen=True)
class Backend:
    """One implementation of the ops; receives validated inputs with features flattened to 2-D (3-D for GAT).

    `aggregate(block, h_src [num_src, F], reduce, edge_weight [nnz] | None) -> [num_dst, F]`
    `gcn_aggregate(block, h_src [num_src, F], add_self_loops) -> [num_dst, F]`
    `gat_attention(block, h_src [num_src, H or 1, F], score_src [num_src, H], score_dst [num_dst, H],
    negative_slope, add_self_loops) -> [num_dst, H, F]` (one h_src head: shared by every head)
    `gcn_aggregate_project(block, h_src [num_src, F], weight [out, F], add_self_loops) -> [num_dst, out]`: optional,
    `gcn_aggregate(...) @ weight^T` in one pass; None: the two apart.
    `device_types`: the device types it runs on (`{"cpu"}`, `{"cuda"}`), None for every device.
    `unavailable(device_type)`: why it cannot run there after all (e.g. native ops not built), None when it can.
    """

    name: str
    aggregate: Callable[[Block, Tensor, str, Tensor | None], Tensor]
    gcn_aggregate: Callable[[Block, Tensor, bool], Tensor]
    gat_attention: Callable[[Block, Tensor, Tensor, Tensor, float, bool], Tensor]
    device_types: frozenset[str] | None = None
    unavailable: Callable[[str], str | None] | None = None
    gcn_aggregate_project: Callable[[Block, Tensor, Tensor, bool], Tensor] | None = None

    def supports(self, device: torch.device) -> bool:
        """Whether this backend runs on `device`."""
        return self.device_types is None or device.type in self.device_types


REFERENCE = Backend(
    name="reference",
    aggregate=reference.aggregate,
    gcn_aggregate=reference.gcn_aggregate,
    gat_attention=reference.gat_attention,
)

_backends: dict[str, Backend] = {REFERENCE.name: REFERENCE}
_preferred: list[str] = []
_auto_resolved: dict[str, str] = {}
_excluded: dict[tuple[str, str], str] = {}  # (backend, device type) -> why "auto" must not pick it
_default_name: str = AUTO
_override_name: ContextVar[str | None] = ContextVar("morphpipe_ops_backend", default=None)


def register_backend(backend: Backend, *, replace: bool = False, preferred: bool = False) -> None:
    """Make `backend` selectable by name; registering a taken name needs `replace=True`.

    `preferred=True` also makes the automatic default try it (in registration order) before the reference.
    """
    if backend.name == AUTO:
        raise ValueError(f"backend name={AUTO!r} is reserved for the automatic default; pick another name")
    if backend.name in _backends and not replace:
        raise ValueError(
            f"backend name={backend.name!r} is already registered; pick another name or pass replace=True"
        )
    _backends[backend.name] = backend
    if preferred and backend.name not in _preferred:
        _preferred.append(backend.name)
    _auto_resolved.clear()


def exclude_from_auto(name: str, device_type: str, reason: str) -> None:
    """Keep `"auto"` from choosing backend `name` on `device_type` (e.g. it failed a self-check there); logged once."""
    _excluded[(name, device_type)] = reason
    _auto_resolved.pop(device_type, None)


def available_backends() -> list[str]:
    """Names of the registered backends, in registration order."""
    return list(_backends)


def _lookup(name: str) -> Backend:
    """The backend registered as `name`, or a ValueError listing the registered ones."""
    if name not in _backends:
        raise ValueError(f"backend name={name!r} is not registered; use one of {available_backends()}")
    return _backends[name]


def set_backend(name: str) -> None:
    """Make `name` (or `"auto"`) the process-wide default backend (a `use_backend` block still overrides it)."""
    global _default_name
    if name != AUTO:
        _lookup(name)
    _default_name = name


@contextmanager
def use_backend(name: str) -> Iterator[Backend]:
    """Force backend `name` (or `"auto"`) inside the block, for this thread / task only (benchmarks, tests)."""
    backend = _auto_backend("cpu") if name == AUTO else _lookup(name)
    token = _override_name.set(name)
    try:
        yield backend
    finally:
        _override_name.reset(token)


def current_backend(device: torch.device | str = "cpu") -> Backend:
    """The backend the ops dispatch to right now for inputs on `device` (it matters only under `"auto"`)."""
    name = _override_name.get() or _default_name
    return _auto_backend(torch.device(device).type) if name == AUTO else _lookup(name)


def _auto_backend(device_type: str) -> Backend:
    """The first preferred backend that runs on `device_type`, else the reference; a skipped one is logged once."""
    if device_type not in _auto_resolved:
        chosen = REFERENCE.name
        for name in _preferred:
            backend = _backends[name]
            if backend.device_types is not None and device_type not in backend.device_types:
                continue
            reason = _excluded.get((name, device_type))
            if reason is None and backend.unavailable:
                reason = backend.unavailable(device_type)
            if reason is None:
                chosen = name
                break
            log.warning("ops backend %r cannot run on %s (%s); the %r backend runs instead",
                        name, device_type, reason, REFERENCE.name)
        _auto_resolved[device_type] = chosen
    return _lookup(_auto_resolved[device_type])


def _backend_for(device: torch.device) -> Backend:
    """The active backend, or an error when it cannot run on `device`."""
    backend = current_backend(device)
    if not backend.supports(device):
        raise RuntimeError(
            f"ops backend {backend.name!r} runs on {sorted(backend.device_types or ())} but the inputs are on "
            f"{device}; move the inputs or select another backend with morphpipe.ops.use_backend(...)"
        )
    return backend


def _check_block(block: Block) -> None:
    """Block metadata (dtypes, shapes, devices) is consistent; contents are checked by whoever builds it."""
    for field, tensor in (("indptr", block.indptr), ("indices", block.indices)):
        if tensor.dtype != torch.int64 or tensor.dim() != 1:
            raise ValueError(
                f"block.{field} must be a 1-D int64 tensor, got {tensor.dtype} of shape {tuple(tensor.shape)}; "
                f"build it with .long()"
            )
    if block.indptr.numel() != block.num_dst + 1:
        raise ValueError(
            f"block.indptr has {block.indptr.numel()} entries but block.num_dst={block.num_dst} needs num_dst + 1"
        )
    if block.src_degrees is not None and tuple(block.src_degrees.shape) != (block.num_src,):
        raise ValueError(
            f"block.src_degrees has shape {tuple(block.src_degrees.shape)} but block.num_src={block.num_src}; "
            f"give one whole-layer out-degree per source, or None"
        )
    if block.indptr.device != block.indices.device:
        raise ValueError(
            f"block.indptr is on {block.indptr.device} but block.indices on {block.indices.device}; "
            f"move the block with block.to(device)"
        )


def _check_node_tensor(name: str, tensor: Tensor, rows: int, rows_name: str, block: Block, dims: int | None) -> None:
    """`tensor` is floating, has `rows` rows (and exactly `dims` dims when given) and sits on the block's device."""
    if not tensor.is_floating_point():
        raise ValueError(f"{name} must be floating point (float16/bfloat16/float32/float64), got {tensor.dtype}")
    if dims is not None and tensor.dim() != dims:
        raise ValueError(f"{name} must have {dims} dims, got shape {tuple(tensor.shape)}")
    if tensor.dim() == 0 or tensor.shape[0] != rows:
        raise ValueError(
            f"{name} has shape {tuple(tensor.shape)} but the block has {rows_name}={rows}; "
            f"its first dim must be {rows_name}"
        )
    if tensor.device != block.device:
        raise ValueError(f"{name} is on {tensor.device} but the block on {block.device}; move one of them")


def _check_prefix(block: Block) -> None:
    """Self loops through the prefix convention need every destination to be a source."""
    if block.num_src < block.num_dst:
        raise ValueError(
            f"self loops need block.num_src >= block.num_dst (prefix convention), got num_src={block.num_src} "
            f"and num_dst={block.num_dst}; pass add_self_loops=False or fix the block"
        )


def aggregate(block: Block, h_src: Tensor, reduce: Reduce = "sum", edge_weight: Tensor | None = None) -> Tensor:
    """Reduce each destination's in-neighbour rows of `h_src [num_src, *F]` with sum / mean / max -> `[num_dst, *F]`.

    `edge_weight [nnz]` (CSC edge order) scales each message first; `mean` divides the weighted
    sum by the in-degree. Destinations with no in-edges get zeros.
    """
    _check_block(block)
    if reduce not in REDUCTIONS:
        raise ValueError(f"reduce={reduce!r} is not supported; use one of {list(REDUCTIONS)}")
    _check_node_tensor("h_src", h_src, block.num_src, "num_src", block, None)
    if h_src.dim() < 2:
        raise ValueError(f"h_src must be [num_src, features...], got shape {tuple(h_src.shape)}; use h_src.unsqueeze(-1)")
    if edge_weight is not None:
        _check_node_tensor("edge_weight", edge_weight, block.nnz, "nnz", block, 1)
    features = h_src.shape[1:]
    flat = h_src.reshape(block.num_src, math.prod(features))
    out = _backend_for(h_src.device).aggregate(block, flat, reduce, edge_weight)
    return out.reshape(block.num_dst, *features)


def gcn_aggregate(block: Block, h_src: Tensor, add_self_loops: bool = True) -> Tensor:
    """GCN propagation `D_dst^-1/2 (A + I) D_src^-1/2 h_src` on a block -> `[num_dst, F]`.

    Degrees are the block's: in-degree for destinations, out-degree within the block for
    sources, each plus one for the prefix-convention self loop (see `gcn_scales`).
    """
    _check_block(block)
    _check_node_tensor("h_src", h_src, block.num_src, "num_src", block, 2)
    if add_self_loops:
        _check_prefix(block)
    return _backend_for(h_src.device).gcn_aggregate(block, h_src, add_self_loops)


def gcn_aggregate_project(block: Block, h_src: Tensor, weight: Tensor, add_self_loops: bool = True) -> Tensor:
    """`gcn_aggregate(block, h_src, add_self_loops) @ weight^T` -> `[num_dst, out]` (`weight [out, F]`, a linear
    layer's), in one pass where the backend has it: GCN's layer when it aggregates before projecting."""
    _check_block(block)
    _check_node_tensor("h_src", h_src, block.num_src, "num_src", block, 2)
    if weight.dim() != 2 or weight.shape[1] != h_src.shape[1]:
        raise ValueError(f"weight must be [out_features, {h_src.shape[1]}] (h_src's width), got shape "
                         f"{tuple(weight.shape)}")
    if weight.dtype != h_src.dtype or weight.device != h_src.device:
        raise ValueError(f"weight is {weight.dtype} on {weight.device} but h_src {h_src.dtype} on {h_src.device}; "
                         f"convert one of them")
    if add_self_loops:
        _check_prefix(block)
    backend = _backend_for(h_src.device)
    if backend.gcn_aggregate_project is None:
        return backend.gcn_aggregate(block, h_src, add_self_loops) @ weight.t()
    return backend.gcn_aggregate_project(block, h_src, weight, add_self_loops)


def gat_attention(
    block: Block,
    h_src: Tensor,
    score_src: Tensor,
    score_dst: Tensor,
    negative_slope: float = 0.2,
    add_self_loops: bool = True,
) -> Tensor:
    """Multi-head GAT aggregation over a block -> `[num_dst, heads, F]`.

    `h_src [num_src, heads, F]` are the projected source features (or `[num_src, 1, F]`: one set
    shared by every head), `score_src [num_src, heads]` and `score_dst [num_dst, heads]` the
    attention halves. Edge `j -> i` scores
    `leaky_relu(score_src[j] + score_dst[i], negative_slope)`; scores are softmax-normalised over
    each destination's in-edges (plus its self loop) and weight the sum of `h_src[j]`.
    """
    _check_block(block)
    _check_node_tensor("h_src", h_src, block.num_src, "num_src", block, 3)
    _check_node_tensor("score_src", score_src, block.num_src, "num_src", block, 2)
    _check_node_tensor("score_dst", score_dst, block.num_dst, "num_dst", block, 2)
    heads = score_src.shape[1]
    if score_dst.shape[1] != heads:
        raise ValueError(f"score_dst has {score_dst.shape[1]} heads but score_src has {heads}; they must match")
    if h_src.shape[1] not in (heads, 1):
        raise ValueError(
            f"h_src has {h_src.shape[1]} heads but the scores have {heads}; give h_src {heads} heads, "
            f"or 1 to share its features across the heads"
        )
    if add_self_loops:
        _check_prefix(block)
    return _backend_for(h_src.device).gat_attention(
        block, h_src, score_src, score_dst, float(negative_slope), add_self_loops
    )
