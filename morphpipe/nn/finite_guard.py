"""Guards a training step against non-finite values: labels outside the classes, a NaN or infinite loss or gradient.

A store built from tensors is not validated, so NaN or infinite features and out-of-range labels
reach the model; without this, NaN losses and wrong accuracies would follow silently. The guard
costs one host sync per step (one flag over labels, loss and gradients), and under the policy
"stop" raises `NonFiniteError` at the first bad step with the epoch, the batch and a few of its
seeds; under "skip-batch" the step's optimizer update is left out and the skip counted.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import torch
from torch import nn

ON_NONFINITE = ("stop", "skip-batch")
SEEDS_SHOWN = 5


class NonFiniteError(RuntimeError):
    """A training step met labels outside [0, num_classes), or a non-finite loss or gradient."""


def check_on_nonfinite(policy: str) -> str:
    """`policy` if it is one of ON_NONFINITE, else a ValueError naming the choices."""
    if policy not in ON_NONFINITE:
        raise ValueError(f"on_nonfinite must be one of {ON_NONFINITE}, got {policy!r}")
    return policy


def _few(ids: torch.Tensor, values: torch.Tensor | None = None) -> str:
    """The first SEEDS_SHOWN ids (with their `values`), and how many there are in all."""
    shown = ids[:SEEDS_SHOWN].tolist()
    if values is None:
        text = ", ".join(str(i) for i in shown)
    else:
        text = ", ".join(f"{i} (label {v})" for i, v in zip(shown, values[:SEEDS_SHOWN].tolist()))
    more = f", ... ({ids.numel()} in all)" if ids.numel() > SEEDS_SHOWN else ""
    return text + more


class FiniteGuard:
    """Checks each step's labels, loss and gradients, and stops or skips the step (`policy`, ON_NONFINITE).

    A step calls `safe_labels` before its loss and `allows_update` after backward, and runs the
    optimizer only when that returns True. The trainer calls `start_epoch` to number the epochs
    in messages; `skipped` counts this epoch's skipped steps by reason.
    """

    def __init__(self, policy: str = "stop") -> None:
        self.policy = check_on_nonfinite(policy)
        self.epoch = 0
        self.skipped: Counter[str] = Counter()

    def start_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.skipped = Counter()

    @staticmethod
    def safe_labels(labels: torch.Tensor, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`labels` clamped into [0, num_classes) for the loss, and a device flag "all were in range" (no sync).

        Clamping keeps an out-of-range label from reaching the loss kernel (on CUDA, a device-side
        assert that ends the process; -100 is cross entropy's silently ignored label).
        """
        low, high = torch.aminmax(labels)
        return labels.clamp(0, num_classes - 1), (low >= 0) & (high < num_classes)

    def allows_update(self, *, loss: torch.Tensor, labels_ok: torch.Tensor, logits: torch.Tensor,
                      labels: torch.Tensor, seeds: torch.Tensor, inputs: tuple[torch.Tensor, torch.Tensor | None],
                      model: nn.Module, where: str, after_all_reduce: bool = False) -> bool:
        """True when the step may update the parameters; False (counted) to skip it; raises under "stop".

        One host sync: labels in range, loss finite, and every gradient finite (one fused norm;
        a gradient whose norm overflows counts as non-finite, as it would poison Adam's moments).
        `inputs` is (input features, their node ids; None: row i is node i), read only to explain a
        failure. `where` places the step in messages ("batch 3 of Route 0"); `after_all_reduce`: the
        gradients were averaged over ranks, so a bad gradient may come from another rank's batch.
        """
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        ok = labels_ok & torch.isfinite(loss)
        if grads:
            ok = ok & torch.isfinite(torch.stack(torch._foreach_norm(grads))).all()
        if bool(ok):
            return True
        reason, detail = _diagnose(loss, labels_ok, logits, labels, seeds, inputs, model, after_all_reduce)
        if self.policy == "stop":
            raise NonFiniteError(
                f"epoch {self.epoch + 1}, {where}: {detail}. Check the graph's features and labels (a store built "
                "from tensors is not validated: graph.validate() checks it), or lower the learning rate; to skip "
                "such batches instead, train with --on-nonfinite skip-batch (on_nonfinite='skip-batch')")
        self.skipped[reason] += 1
        return False


def _diagnose(loss: torch.Tensor, labels_ok: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor,
              seeds: torch.Tensor, inputs: tuple[torch.Tensor, torch.Tensor | None], model: nn.Module,
              after_all_reduce: bool) -> tuple[str, str]:
    """(short reason, full description) of a step that failed the check; off the fast path."""
    seeds = seeds.cpu()
    if not bool(labels_ok):
        num_classes = logits.shape[-1]
        bad = ((labels < 0) | (labels >= num_classes)).cpu()
        return "labels out of range", (f"labels outside [0, {num_classes}) for seeds "
                                       f"{_few(seeds[bad], labels.cpu()[bad])}")
    if bool(torch.isfinite(loss)):
        names = _non_finite_parameters(model.named_parameters())
        reason = "non-finite gradient"
        more = " ..." if len(names) > SEEDS_SHOWN else ""
        what = f"non-finite gradients for {', '.join(names[:SEEDS_SHOWN])}{more} with a finite loss {float(loss):.4g}"
    else:
        reason, what = "non-finite loss", f"the loss is {float(loss)}"
    bad_nodes = _non_finite_rows(*inputs)
    bad_outputs = (~torch.isfinite(logits.detach()).all(dim=-1)).cpu()
    if bad_nodes.numel():
        cause = f"the features of nodes {_few(bad_nodes)} are NaN or infinite (seeds {_few(seeds)})"
    elif bool(bad_outputs.any()):
        cause = f"the model's outputs are NaN or infinite for seeds {_few(seeds[bad_outputs])}"
    elif after_all_reduce and reason == "non-finite gradient":
        cause = (f"this rank's inputs, labels and loss are finite: another rank's batch of this step is the cause "
                 f"(the gradients are all-reduced; seeds here {_few(seeds)})")
    else:
        cause = f"the inputs and outputs are finite (seeds {_few(seeds)})"
    return reason, f"{what}; {cause}"


def _non_finite_rows(features: torch.Tensor | dict[str, torch.Tensor], nodes: torch.Tensor | None) -> torch.Tensor:
    """Ids of the input nodes whose feature rows hold NaN or Inf (row positions when `nodes` is None). A typed batch's
    dict of per-type rows lies in `nodes` type after type; a type's int64 node ids (no features) are always finite."""
    parts = features.values() if isinstance(features, dict) else [features]
    bad, offset = [], 0
    for rows in parts:
        if rows.is_floating_point():
            rows_bad = ~torch.isfinite(rows).reshape(rows.shape[0], -1).all(dim=-1)
            bad.append(rows_bad.cpu().nonzero().flatten() + offset)
        offset += rows.shape[0]
    positions = torch.cat(bad) if bad else torch.empty(0, dtype=torch.long)
    return positions if nodes is None else nodes.cpu()[positions]


def _non_finite_parameters(named: Iterable[tuple[str, nn.Parameter]]) -> list[str]:
    """Names of the parameters whose gradient norm is not finite."""
    return [name for name, p in named
            if p.grad is not None and not bool(torch.isfinite(torch.linalg.vector_norm(p.grad)))]


def skipped_text(skipped: Counter[str] | dict[str, int]) -> str:
    """"skipped 3 batches (non-finite loss 2, labels out of range 1)", or "" when none was skipped."""
    total = sum(skipped.values())
    if not total:
        return ""
    reasons = ", ".join(f"{reason} {count}" for reason, count in sorted(skipped.items()))
    return f"skipped {total} batch{'es' if total != 1 else ''} ({reasons})"
