"""Full-graph training for graphs that fit: one step per epoch over the whole graph (Morphling's, AdaptGear's setting).

Every layer runs on one whole-graph block (`GraphBlock`), so the AdaptGear selector times plain
CSR against the community-decomposed kernels on the first step and keeps the fastest; the loss
is taken on the training nodes only. Validation is exact (layer-wise inference on the same
block). Checkpoints are the executor's format (`morphpipe evaluate` reads them).
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional
from tqdm.auto import tqdm

from morphpipe.data import GraphStore
from morphpipe.executor.checkpoint import Checkpointing, run_meta
from morphpipe.executor.trainer import LogOnce, choice_counts_since
from morphpipe.nn.evaluate import full_accuracy
from morphpipe.nn.finite_guard import FiniteGuard, skipped_text
from morphpipe.nn.task import check_split
from morphpipe.ops.choice import choice_counts
from morphpipe.ops.community import GraphBlock
from morphpipe.sampling.validation import check_positive


@dataclass
class FullGraphEpoch:
    """One full-graph epoch: its time, loss, validation accuracy and the op choices made during it."""

    epoch: int
    epoch_s: float
    loss: float
    val_acc: float | None
    op_choices: dict[str, dict[str, int]] = field(default_factory=dict)
    skipped_batches: dict[str, int] = field(default_factory=dict)  # the epoch's step, when left out, and why

    def line(self, epochs: int) -> str:
        """One progress line."""
        val = f", val acc {self.val_acc:.4f}" if self.val_acc is not None else ""
        if self.skipped_batches:
            val += f", {skipped_text(self.skipped_batches)}"
        kernel = self.op_choices.get("graph.kernel")
        kernels = f", graph.kernel {kernel}" if kernel else ""
        return f"epoch {self.epoch + 1}/{epochs}: {self.epoch_s:.2f} s (full graph), loss {self.loss:.4f}{val}{kernels}"


class FullGraphTrainer:
    """Trains `model` on the whole `graph` at once: forward over every node, loss on the training nodes, one step.

    `on_nonfinite` ("stop" or "skip-batch") is what a step with out-of-range labels or a non-finite
    loss or gradient does (`FiniteGuard`).
    """

    def __init__(self, graph: GraphStore, model: nn.Module, *, lr: float = 3e-3, device: str | torch.device = "cpu",
                 checkpoint_dir: str | os.PathLike | None = None, model_spec: dict[str, Any] | None = None,
                 progress: bool = True, log: Callable[[str], None] | None = None,
                 on_nonfinite: str = "stop") -> None:
        self.graph = graph
        self.guard = FiniteGuard(on_nonfinite)
        self.device = torch.device("cpu" if device in (None, "auto") else device)
        self.model = model.to(self.device)
        self.dtype = next(self.model.parameters()).dtype
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=lr)
        self.progress = progress
        self.log = log or tqdm.write
        self.checkpoints = (Checkpointing(checkpoint_dir, self.model, self.optimizer, log=self.log,
                                          model_spec=model_spec) if checkpoint_dir is not None else None)
        self.block = GraphBlock.of(graph.indptr, graph.indices).to(self.device)
        self.features = torch.as_tensor(graph.features).to(device=self.device, dtype=self.dtype)
        self.train_idx = graph.train_idx.to(self.device)
        self.train_labels = graph.labels[graph.train_idx].to(self.device)
        self.history: list[FullGraphEpoch] = []
        self._say_once = LogOnce(self.log)

    def step(self) -> float:
        """One full-graph training step; returns the loss (not finite when the guard skipped the update)."""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        blocks = [self.block] * self.model.num_layers
        logits = self.model(blocks, self.features)[self.train_idx]
        labels, labels_ok = self.guard.safe_labels(self.train_labels, logits.shape[-1])
        loss = functional.cross_entropy(logits, labels)
        loss.backward()
        if self.guard.allows_update(loss=loss, labels_ok=labels_ok, logits=logits, labels=self.train_labels,
                                    seeds=self.train_idx, inputs=(self.features, None), model=self.model,
                                    where="the full-graph step"):
            self.optimizer.step()
        return float(loss.detach())

    def fit(self, epochs: int, *, validate: bool = True) -> list[FullGraphEpoch]:
        """Trains until `epochs` epochs are done (continuing from a checkpoint), one step per epoch."""
        check_positive("epochs", epochs)
        for epoch in range(self._resume(), epochs):
            before = choice_counts()
            self.guard.start_epoch(epoch)
            start = time.perf_counter()
            loss = self.step()
            epoch_s = time.perf_counter() - start
            choices = choice_counts_since(before)
            val_acc = self.evaluate("val") if validate else None
            stats = FullGraphEpoch(epoch, epoch_s, loss, val_acc, choices, dict(self.guard.skipped))
            self.history.append(stats)
            self.log(stats.line(epochs))
            if self.checkpoints is not None:
                self.save(epoch + 1)
        return self.history

    def evaluate(self, split: str = "val") -> float:
        """Exact accuracy on the 'train', 'val' or 'test' nodes (layer-wise inference on the whole-graph block)."""
        return full_accuracy(self.model, self.graph, getattr(self.graph, f"{check_split(split)}_idx"),
                             device=self.device, graph_block=self.block, progress=self.progress, log=self._say_once)

    def meta(self) -> dict[str, Any]:
        """What a checkpoint must agree with to be continued by this trainer."""
        return {**run_meta(self.graph, self.model), "full_graph": True}

    def save(self, epochs_done: int) -> Path:
        """Writes a checkpoint after `epochs_done` completed epochs."""
        assert self.checkpoints is not None
        return self.checkpoints.save(epochs_done, [asdict(stats) for stats in self.history], self.meta())

    def _resume(self) -> int:
        """Continues from the checkpoint in `checkpoint_dir`, if any; returns the epoch to continue from."""
        state = self.checkpoints.resume(self.meta()) if self.checkpoints is not None else None
        if state is None:
            return len(self.history)
        self.history = self.checkpoints.history(state, FullGraphEpoch)
        return state.epoch
