"""Per-input choices: which option runs for a decision, cached per shape signature, forceable, logged once.

Every input-sensitive decision in the ops (kernel variant, re-association, first-layer path) is
named in `DECISIONS` with its options. `choose` returns the forced option if one is set, else the
cached option for the call's shape signature, else the cheapest option by the cost model (then
cached and logged once). `recorded_choices` and `choice_counts` make the choices visible, e.g. in
the executor's stats. Force options with `force_choices({...})` (scoped), `set_forced_choices`
(process-wide) or the environment: `MORPHPIPE_FORCE_CHOICE="sage.order=project_first,aggregate.kernel=dense"`.
"""
from __future__ import annotations

import logging
import math
import os
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import torch

from morphpipe.sampling.minibatch import Block

log = logging.getLogger("morphpipe.ops")

FORCE_ENV = "MORPHPIPE_FORCE_CHOICE"

DECISIONS: dict[str, tuple[str, ...]] = {
    # AdaptGear: kernel variants of the fused backend
    "aggregate.kernel": ("rowwise", "dense"),  # row-wise sparse kernel vs densified adjacency @ features
    "aggregate.order": ("natural", "degree_sorted"),  # destination order: as stored vs heaviest first (Seastar)
    "aggregate.backward": ("transpose", "scatter"),  # gradient to sources: transposed structure vs atomic scatter
    "gat.backward": ("transpose", "scatter"),
    # AdaptGear: whole-graph layers as plain CSR or dense community blocks + CSR remainder (timed once)
    "graph.kernel": ("csr", "community16", "community32", "community64"),
    # SENSEi: re-association per layer
    "sage.order": ("aggregate_first", "project_first"),
    "gcn.order": ("aggregate_first", "project_first"),
    "gat.order": ("aggregate_first", "project_first"),
    # SAGE's self + neighbour projections: GEMM accumulating into the other's output vs one GEMM over concatenations
    "sage.projection": ("addmm", "concat"),
    # heterogeneous layers: one sum/mean per relation into a node type vs one call over the relations stacked
    "hetero.relations": ("per_relation", "stacked"),
    # Morphling: first-layer transform from measured input density
    "input.transform": ("dense", "sparse"),
    # bf16 autocast: a layer's float32 input cast once for the layer vs read as stored, projected in float32 (timed)
    "autocast.input": ("cast", "as_stored"),
}

Signature = tuple[object, ...]


@dataclass(frozen=True)
class ChoiceRecord:
    """One decision taken for one shape signature: what ran, why, and the predicted seconds per option."""

    decision: str
    signature: Signature
    chosen: str
    reason: str  # "cost model" | "timed" | "forced" | "only option"
    costs: tuple[tuple[str, float], ...] = ()

    def as_dict(self) -> dict[str, object]:
        """JSON-ready form (executor stats, logs)."""
        return {
            "decision": self.decision,
            "signature": [str(part) for part in self.signature],
            "chosen": self.chosen,
            "reason": self.reason,
            "predicted_s": dict(self.costs),
        }


_lock = threading.Lock()
_cache: dict[tuple[str, Signature], ChoiceRecord] = {}
_counts: Counter[tuple[str, str]] = Counter()
_logged: list[ChoiceRecord] = []
_seen: set[tuple[str, Signature, str, str]] = set()
_env_cache: tuple[str, dict[str, str]] = ("", {})
_process_forced: dict[str, str] = {}
_scoped_forced: ContextVar[Mapping[str, str]] = ContextVar("morphpipe_forced_choices", default={})


def bucket(n: int) -> int:
    """Power-of-two size bucket (0 for 0): mini-batches of similar size share one signature."""
    return 0 if n <= 0 else 1 << (int(n) - 1).bit_length()


def block_signature(kind: str, block: Block, dtype: torch.dtype, *extra: object) -> Signature:
    """Shape signature of a call on `block`: kind, device type, dtype, sizes in power-of-two buckets, then `extra`."""
    return (kind, block.device.type, str(dtype).removeprefix("torch."), bucket(block.num_dst), bucket(block.num_src),
            bucket(block.nnz), *extra)


def _check_forced(choices: Mapping[str, str]) -> dict[str, str]:
    """`choices` with every decision and option validated, or a ValueError naming the bad one."""
    for decision, option in choices.items():
        if decision not in DECISIONS:
            raise ValueError(f"forced choice {decision!r} is not a decision; use one of {sorted(DECISIONS)}")
        if option not in DECISIONS[decision]:
            raise ValueError(
                f"forced choice {decision}={option!r} is not an option; use one of {list(DECISIONS[decision])}"
            )
    return dict(choices)


def parse_forced(text: str) -> dict[str, str]:
    """`"a.b=x,c.d=y"` (the `MORPHPIPE_FORCE_CHOICE` format) as a validated mapping."""
    pairs = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        decision, sep, option = item.partition("=")
        if not sep:
            raise ValueError(f"{FORCE_ENV} entry {item!r} must be decision=option, e.g. sage.order=project_first")
        pairs[decision.strip()] = option.strip()
    return _check_forced(pairs)


def set_forced_choices(choices: Mapping[str, str]) -> None:
    """Force `choices` ({decision: option}) process-wide, replacing earlier ones; `{}` clears."""
    validated = _check_forced(choices)
    with _lock:
        _process_forced.clear()
        _process_forced.update(validated)


@contextmanager
def force_choices(choices: Mapping[str, str]) -> Iterator[None]:
    """Force `choices` inside the block, for this thread / task (tests, benchmarks)."""
    token = _scoped_forced.set({**_scoped_forced.get(), **_check_forced(choices)})
    try:
        yield
    finally:
        _scoped_forced.reset(token)


def forced_option(decision: str) -> str | None:
    """The option forced for `decision` (scope, then process, then environment), or None."""
    scoped = _scoped_forced.get()
    if decision in scoped:
        return scoped[decision]
    if decision in _process_forced:
        return _process_forced[decision]
    return _environment_forced().get(decision)


def _environment_forced() -> dict[str, str]:
    """The choices forced by `MORPHPIPE_FORCE_CHOICE`, re-parsed only when the variable changes."""
    global _env_cache
    text = os.environ.get(FORCE_ENV, "")
    if text != _env_cache[0]:
        _env_cache = (text, parse_forced(text))
    return _env_cache[1]


def choose(
    decision: str,
    signature: Signature,
    costs: Callable[[], Mapping[str, float]],
    options: tuple[str, ...] | None = None,
    reason: str = "cost model",
) -> str:
    """The option to run for `decision` on an input of shape `signature`.

    `costs()` (predicted seconds per option) is called only when the signature is new and nothing is
    forced; `reason` says where its seconds come from ("cost model", "timed");
    `options` narrows `DECISIONS[decision]` to what can run on this input. A forced option
    that cannot run on this input is an error, not a silent substitute.
    """
    allowed = options if options is not None else DECISIONS[decision]
    forced = forced_option(decision)
    if forced is not None:
        if forced not in allowed:
            raise ValueError(
                f"forced choice {decision}={forced!r} cannot run on this input (signature {signature}); "
                f"it allows {list(allowed)}"
            )
        return _remember(ChoiceRecord(decision, signature, forced, "forced"))
    key = (decision, signature)
    record = _cache.get(key)
    if record is None:
        if len(allowed) == 1:
            record = ChoiceRecord(decision, signature, allowed[0], "only option")
        else:
            predicted = {option: float(cost) for option, cost in costs().items() if option in allowed}
            best = min(allowed, key=lambda option: predicted.get(option, math.inf))
            record = ChoiceRecord(decision, signature, best, reason, tuple(sorted(predicted.items())))
    return _remember(record)


def _remember(record: ChoiceRecord) -> str:
    """Count the choice, cache it unless forced, and log it the first time it is seen."""
    seen = (record.decision, record.signature, record.chosen, record.reason)
    with _lock:
        _counts[(record.decision, record.chosen)] += 1
        if record.reason != "forced":
            _cache.setdefault((record.decision, record.signature), record)
        if seen not in _seen:
            _seen.add(seen)
            _logged.append(record)
            log.info("ops choice %s -> %s (%s) for %s %s", record.decision, record.chosen, record.reason,
                     record.signature, dict(record.costs) or "")
    return record.chosen


def recorded_choices() -> list[ChoiceRecord]:
    """Every distinct choice made so far, in order (first occurrence of each decision/signature/option)."""
    with _lock:
        return list(_logged)


def choice_counts() -> dict[str, dict[str, int]]:
    """How many calls ran each option of each decision since the last `clear_choices` (executor stats)."""
    with _lock:
        counts: dict[str, dict[str, int]] = {}
        for (decision, option), count in sorted(_counts.items()):
            counts.setdefault(decision, {})[option] = count
        return counts


def clear_choices() -> None:
    """Forget cached choices, counts and records (e.g. after recalibrating); forced options stay."""
    with _lock:
        _cache.clear()
        _counts.clear()
        _logged.clear()
        _seen.clear()
