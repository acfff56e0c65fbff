"""How far a stopped epoch got, so that a resumed run trains only the batches it had not applied yet.

Each route trains its batches in batch order (the CPU buffer, the GPU buffer and the transfers are
first in, first out), so whatever the interleaving of the two routes, the batches applied when an
epoch stops between steps are a prefix of each route's batches: Route 0's first `a`, Route 1's first
`b`. Which seeds those are depends only on the run seed, the epoch and the route split (`n_cpu`,
see `route_seeds`), so a resume under the same split continues with Route 0 from batch `a` and
Route 1 from batch `b`. The losses and seed counts of the applied steps are kept so the resumed
epoch's loss is the same float sum an uninterrupted epoch makes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from morphpipe.executor.checkpoint import CheckpointError

FIELD = "partial_epoch"  # the checkpoint field that holds an EpochProgress (absent or None at an epoch's end)


@dataclass
class EpochProgress:
    """The steps an epoch applied before it stopped: (route, position) of each in training order (as
    `EpochResult.order`; Route 1's positions follow Route 0's `n_cpu`), each step's loss (float32, NaN for a
    skipped step) and seed count, the seconds it ran, and the steps skipped for non-finite values by reason."""

    epoch: int
    n_cpu: int
    order: list[tuple[int, int]]
    losses: torch.Tensor
    seeds: list[int]
    elapsed_s: float
    skipped: dict[str, int] = field(default_factory=dict)

    @property
    def steps(self) -> int:
        return len(self.order)

    def first_batches(self, num_batches: int) -> tuple[int, int]:
        """The first batch of Route 0 and of Route 1 not yet applied: each route's applied batches must be a
        prefix of its batches (Route 0's positions 0..a-1, Route 1's n_cpu..n_cpu+b-1), else a ValueError."""
        cpu = [position for route, position in self.order if route == 0]
        gpu = [position - self.n_cpu for route, position in self.order if route == 1]
        if len(cpu) + len(gpu) != len(self.order):
            raise ValueError(f"routes {sorted({route for route, _ in self.order} - {0, 1})} are neither 0 nor 1")
        for route, applied, count in ((0, cpu, self.n_cpu), (1, gpu, num_batches - self.n_cpu)):
            if sorted(applied) != list(range(len(applied))) or len(applied) > count:
                raise ValueError(f"the Route {route} batches applied, {applied[:8]}{'...' if len(applied) > 8 else ''}"
                                 f", are not its first {len(applied)} of {count}")
        return len(cpu), len(gpu)

    def to_dict(self) -> dict[str, Any]:
        """As plain containers and a tensor (a checkpoint loads with weights_only)."""
        return {"epoch": self.epoch, "n_cpu": self.n_cpu, "order": [list(entry) for entry in self.order],
                "losses": self.losses.to(torch.float32).cpu(), "seeds": list(self.seeds),
                "elapsed_s": float(self.elapsed_s), "skipped": dict(self.skipped)}

    @classmethod
    def from_checkpoint(cls, value: Any, path: Path, epochs_done: int, num_batches: int) -> EpochProgress:
        """The checkpoint's `partial_epoch` field, checked against the run (`epochs_done` completed epochs of
        `num_batches` batches); a malformed one is a CheckpointError naming the file and the field."""
        def bad(name: str, problem: str) -> CheckpointError:
            return CheckpointError(path, f"field '{FIELD}.{name}' {problem}")

        if not isinstance(value, dict):
            raise CheckpointError(path, f"field '{FIELD}' is {type(value).__name__}, expected a dict")
        for name, kind in (("epoch", int), ("n_cpu", int), ("order", list), ("losses", torch.Tensor),
                           ("seeds", list), ("elapsed_s", float), ("skipped", dict)):
            if name not in value:
                raise CheckpointError(path, f"field '{FIELD}' lacks '{name}'")
            if not isinstance(value[name], kind) or isinstance(value[name], bool):
                raise bad(name, f"is {type(value[name]).__name__}, expected {kind.__name__}")
        if value["epoch"] != epochs_done:
            raise bad("epoch", f"is {value['epoch']}, but the checkpoint holds {epochs_done} completed epochs: the "
                               f"stopped epoch must be the next one ({epochs_done})")
        if not 0 <= value["n_cpu"] <= num_batches:
            raise bad("n_cpu", f"is {value['n_cpu']}, expected Route 0's batch count in [0, {num_batches}]")
        order = value["order"]
        if not all(isinstance(entry, list) and len(entry) == 2 and all(type(v) is int for v in entry)
                   for entry in order):
            raise bad("order", "holds an entry that is not a [route, position] pair of ints")
        steps = len(order)
        if steps > num_batches:
            raise bad("order", f"holds {steps} steps, more than the epoch's {num_batches} batches")
        losses = value["losses"]
        if losses.dtype != torch.float32 or losses.shape != (steps,):
            raise bad("losses", f"is a {losses.dtype} tensor of shape {tuple(losses.shape)}, expected float32 of "
                                f"shape ({steps},): one loss per applied step")
        seeds = value["seeds"]
        if len(seeds) != steps or not all(type(count) is int and count > 0 for count in seeds):
            raise bad("seeds", f"holds {len(seeds)} entries, expected {steps} positive seed counts (one per step)")
        if not value["elapsed_s"] >= 0:
            raise bad("elapsed_s", f"is {value['elapsed_s']!r}, expected seconds >= 0")
        if not all(isinstance(k, str) and type(v) is int and v >= 0 for k, v in value["skipped"].items()):
            raise bad("skipped", f"is {value['skipped']!r}, expected counts of skipped steps by reason")
        progress = cls(value["epoch"], value["n_cpu"], [(route, position) for route, position in order], losses,
                       list(seeds), value["elapsed_s"], dict(value["skipped"]))
        try:
            progress.first_batches(num_batches)
        except ValueError as error:
            raise bad("order", f"is not what an epoch applies: {error}") from None
        return progress
