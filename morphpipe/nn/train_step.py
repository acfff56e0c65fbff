"""One training step on a MiniBatch, shared by the executor and the profiler's training phase."""
from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from morphpipe.nn.finite_guard import FiniteGuard
from morphpipe.nn.task import NodeClassification, Task
from morphpipe.ops.cpu_memory import reuse_cpu_memory
from morphpipe.ops.step_variant import current_step_variant
from morphpipe.sampling.minibatch import MiniBatch

OPTIMIZER_IMPLEMENTATIONS = ("fused", "foreach", "for-loop")
# The arithmetic of a step's forward: float32 throughout, or bfloat16 autocast (projections and aggregations in
# bfloat16 with float32 accumulation; float32 master weights, optimizer state and loss).
PRECISIONS = ("float32", "bf16")
# Device types with a fused Adam kernel in torch 2.11-2.13.
FUSED_ADAM_DEVICES = frozenset({"cpu", "cuda", "mps", "xpu"})


def make_optimizer(params: Iterable[nn.Parameter], lr: float, device: torch.device | str,
                   implementation: str | None = None) -> torch.optim.Optimizer:
    """Adam(lr) in torch's `implementation` ("fused", "foreach" or "for-loop", torch's default on CPU).

    None takes the step variant's (`morphpipe.ops.step_variant`: "fused" unless the legacy step is selected).
    "fused" is one kernel over all parameters (CPU and CUDA since torch 2.4); on a device type torch
    has no fused Adam for, "foreach" runs instead (grouped per-op kernels, same arithmetic).
    """
    implementation = implementation or current_step_variant().optimizer
    if implementation not in OPTIMIZER_IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {OPTIMIZER_IMPLEMENTATIONS}, got {implementation!r}")
    device_type = torch.device(device).type
    if implementation == "fused" and device_type not in FUSED_ADAM_DEVICES:
        implementation = "foreach"
    flags = {"fused": {"fused": True}, "foreach": {"foreach": True}, "for-loop": {"foreach": False}}[implementation]
    return torch.optim.Adam(params, lr=lr, **flags)


class TrainStep:
    """Forward over the batch's blocks, the task's loss, backward and optimizer step.

    `task` (default: node classification with cross entropy) computes the outputs and the loss;
    features stored in float16/bfloat16 are cast to the model's dtype on the device, so a compact
    feature store costs no precision in the model; with `precision="bf16"` the forward and loss run
    under bfloat16 autocast instead, and features enter as stored (the first projection reads them in
    bfloat16 anyway). On the CPU, large tensors' memory is kept for reuse from the first step on
    (`morphpipe.ops.cpu_memory`), so a step does not fault its activations in afresh. `guard` checks
    targets, loss and gradients before the update (`FiniteGuard`); a skipped step returns a NaN loss,
    which the epoch's mean leaves out.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, task: Task | None = None,
                 guard: FiniteGuard | None = None, precision: str = "float32") -> None:
        if precision not in PRECISIONS:
            raise ValueError(f"precision={precision!r} is not one of {PRECISIONS}")
        self.model = model
        self.optimizer = optimizer
        self.task = task or NodeClassification()
        self.guard = guard or FiniteGuard()
        self.precision = precision
        parameter = next(model.parameters())
        self.dtype = parameter.dtype
        if parameter.device.type == "cpu":
            reuse_cpu_memory()  # each step's activations and gradients reuse the last step's pages
        self.autocast = torch.autocast(parameter.device.type, dtype=torch.bfloat16, enabled=precision == "bf16")

    @property
    def feature_dtype(self) -> torch.dtype | None:
        """The dtype the batch's features are cast to before the model: its own, or None (as stored) under bf16."""
        return None if self.precision == "bf16" else self.dtype

    def __call__(self, batch: MiniBatch) -> torch.Tensor:
        """Trains on `batch` (already on the model's device); returns the loss (one sync: the guard's check)."""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        with self.autocast:
            scored = self.task.loss(self.model, batch, self.feature_dtype)
        loss = scored.loss
        self.backward(batch, loss, scored.targets_ok)
        if not self.guard.allows_update(loss=loss, labels_ok=scored.targets_ok, logits=scored.outputs,
                                        labels=scored.targets, seeds=batch.units, inputs=(batch.x, batch.input_nodes),
                                        output_units=scored.output_units,
                                        model=self.model, after_all_reduce=self.after_all_reduce,
                                        where=self.place(batch)):
            return torch.full_like(loss.detach(), float("nan"))
        self.optimizer.step()
        return loss.detach()

    after_all_reduce = False  # True where backward all-reduces the gradients (the guard then names every rank)

    def backward(self, batch: MiniBatch, loss: torch.Tensor, labels_ok: torch.Tensor) -> None:
        """Backpropagates the batch's loss; a data-parallel step scales it first."""
        loss.backward()

    def place(self, batch: MiniBatch) -> str:
        """Where `batch` sits, for the guard's messages."""
        return batch_place(batch)


def batch_place(batch: MiniBatch) -> str:
    """Where `batch` sits in its epoch, for messages: "batch 4 of Route 0"."""
    return f"batch {batch.batch_index + 1} of Route {batch.route}"
