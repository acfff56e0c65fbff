"""One training step on a MiniBatch, shared by the executor and the profiler's training phase."""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional

from morphpipe.sampling.minibatch import MiniBatch


class TrainStep:
    """Forward over the batch's blocks, loss on its seeds, backward and optimizer step.

    Features stored in float16/bfloat16 are cast to the model's dtype on the device, so a
    compact feature store costs no precision in the model.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = functional.cross_entropy,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.dtype = next(model.parameters()).dtype

    def __call__(self, batch: MiniBatch) -> torch.Tensor:
        """Trains on `batch` (already on the model's device); returns the loss without syncing."""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        logits = self.model(batch.blocks, batch.x.to(self.dtype))
        loss = self.loss_fn(logits, batch.y)
        loss.backward()
        self.optimizer.step()
        return loss.detach()
