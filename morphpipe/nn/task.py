"""What a training task is, for every trainer, the profiler and the distributed split: one object per task.

A `Task` owns what differs between node classification and edge (link) prediction, so the
executor, the planner, re-planning, checkpoints and DDP stay the same for both:

- `seeds(graph, split)`: the units an epoch visits (node ids, or edge ids for an edge task);
  the routes and the ranks split these, and exactly-once counts them (`MiniBatch.units`);
- `batcher(...)`: the batcher of one route over some of those units (Route 0: the C++ CpuBatcher,
  or the SerialBatcher when phases take turns on the same cores; Route 1: the GPU batcher);
- `build_model(...)`: the model the task trains (node classification: a GNN with one output per class);
- `loss(model, batch, dtype)`: the model's outputs on a batch, its targets and the loss;
- `evaluate(...)`: the task's metric on a split (`metric` names it), sampled or exact.

`NodeClassification` is the node task, `nn.link_task.LinkPrediction` the edge task; `TASKS` maps `--task`
names to task classes (each registered with `register_task`).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn
from torch.nn import functional

from morphpipe.data import GraphStore
from morphpipe.nn.evaluate import EVAL_MODES, accuracy, full_accuracy
from morphpipe.nn.factory import build_model
from morphpipe.nn.finite_guard import FiniteGuard
from morphpipe.ops.community import GraphBlock
from morphpipe.sampling.batcher import Batcher
from morphpipe.sampling.cpu_batcher import CpuBatcher
from morphpipe.sampling.gpu_batcher import GpuBatcher
from morphpipe.sampling.minibatch import MiniBatch, Tensors, map_tensors
from morphpipe.sampling.serial_batcher import SerialBatcher

SPLITS = ("train", "val", "test")


def check_split(split: str) -> str:
    """`split` if it names one of the graph's splits, else a ValueError naming the choices."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return split


def check_eval_mode(mode: str) -> str:
    """`mode` if it is an evaluation mode, else a ValueError naming the choices."""
    if mode not in EVAL_MODES:
        raise ValueError(f"eval mode must be one of {EVAL_MODES}, got {mode!r}")
    return mode


def cast_features(x: Tensors, dtype: torch.dtype) -> Tensors:
    """Features (one tensor or one per node type) in the model's dtype: a compact store costs no precision."""
    return map_tensors(x, lambda t: t.to(dtype))


@dataclass
class TaskLoss:
    """A batch's loss with what the finite guard needs to name a bad step: outputs, targets, and which are valid."""

    loss: torch.Tensor
    outputs: torch.Tensor  # logits of the seeds, or scores of the pairs
    targets: torch.Tensor  # what the loss compared the outputs with (as stored in the batch)
    targets_ok: torch.Tensor  # bool scalar: every target is valid (e.g. a label inside the classes)
    # the unit (batch.units id) of each output row where outputs are not one per unit (pair scores); None: seeds
    output_units: torch.Tensor | None = None


@dataclass
class EvalSettings:
    """How a trainer evaluates: the mode ("sampled" or "full"), the sampled mode's fanouts, batch size and seed."""

    fanouts: Sequence[int]
    batch_size: int = 4096
    seed: int = 0
    mode: str = "sampled"
    progress: bool = True
    log: Callable[[str], None] | None = None


class Task:
    """The contract of the module docstring. Subclasses set `name` and `metric` and implement the four methods."""

    name: ClassVar[str] = "task"
    metric: ClassVar[str] = "metric"

    def check_graph(self, graph: GraphStore) -> None:
        """Refuses a graph that lacks what the task needs, naming what to run to add it."""

    def seeds(self, graph: GraphStore, split: str = "train") -> torch.Tensor:
        """Global ids of the units of `split` (what an epoch visits for "train")."""
        raise NotImplementedError

    def batcher(self, graph: GraphStore, fanouts: Sequence[int], batch_size: int, *, route: int = 0,
                seeds: torch.Tensor | None = None, seed: int = 0, shuffle: bool = True, serial: bool = False,
                num_threads: int | None = None, pin_memory: bool | None = None,
                device: torch.device | str | None = None) -> Batcher:
        """The batcher of `route` over `seeds` (default: the training units); `serial` builds each batch on demand."""
        raise NotImplementedError

    def build_model(self, name: str, graph: GraphStore, *, num_layers: int, hidden: int | None = None,
                    **options: Any) -> nn.Module:
        """The model named `name` (`nn.factory.MODELS`) shaped for this task on `graph`."""
        raise NotImplementedError

    def loss(self, model: nn.Module, batch: MiniBatch, dtype: torch.dtype) -> TaskLoss:
        """The model's outputs on `batch` (on the model's device) and the loss against the batch's targets."""
        raise NotImplementedError

    def evaluate(self, model: nn.Module, graph: GraphStore, seeds: torch.Tensor, settings: EvalSettings, *,
                 device: torch.device, graph_block: Callable[[], GraphBlock] | None = None) -> float:
        """The task's metric of `model` on `seeds` (units of a split); `graph_block` gives the whole graph's block
        for exact inference (so a caller that evaluates often builds it once; None: built here)."""
        raise NotImplementedError

    def meta(self) -> dict[str, Any]:
        """What a checkpoint or a plan made for this task must agree with."""
        return {"task": self.name}


class NodeClassification(Task):
    """Predicts each seed node's class: cross entropy on its logits (or `loss_fn`), accuracy as the metric."""

    name = "node"
    metric = "accuracy"

    def __init__(self, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None) -> None:
        self.loss_fn = loss_fn or functional.cross_entropy

    def seeds(self, graph: GraphStore, split: str = "train") -> torch.Tensor:
        return getattr(graph, f"{check_split(split)}_idx")

    def batcher(self, graph: GraphStore, fanouts: Sequence[int], batch_size: int, *, route: int = 0,
                seeds: torch.Tensor | None = None, seed: int = 0, shuffle: bool = True, serial: bool = False,
                num_threads: int | None = None, pin_memory: bool | None = None,
                device: torch.device | str | None = None) -> Batcher:
        if route == 1:
            return GpuBatcher(graph, fanouts, batch_size, seeds=seeds, seed=seed, shuffle=shuffle, device=device)
        if serial:
            return SerialBatcher(graph, fanouts, batch_size, seeds=seeds, shuffle=shuffle, seed=seed)
        return CpuBatcher(graph, fanouts, batch_size, num_threads=num_threads, seeds=seeds, shuffle=shuffle, seed=seed,
                          pin_memory=pin_memory)

    def build_model(self, name: str, graph: GraphStore, *, num_layers: int, hidden: int | None = None,
                    **options: Any) -> nn.Module:
        return build_model(name, graph.feature_dim, graph.num_classes, num_layers=num_layers, hidden=hidden,
                           **options)

    def loss(self, model: nn.Module, batch: MiniBatch, dtype: torch.dtype) -> TaskLoss:
        logits = model(batch.blocks, cast_features(batch.x, dtype))
        labels, labels_ok = FiniteGuard.safe_labels(batch.y, logits.shape[-1])
        return TaskLoss(self.loss_fn(logits, labels), logits, batch.y, labels_ok)

    def evaluate(self, model: nn.Module, graph: GraphStore, seeds: torch.Tensor, settings: EvalSettings, *,
                 device: torch.device, graph_block: Callable[[], GraphBlock] | None = None) -> float:
        if check_eval_mode(settings.mode) == "full":
            block = graph_block() if graph_block is not None else GraphBlock.of(graph.indptr, graph.indices)
            return full_accuracy(model, graph, seeds, device=device, graph_block=block,
                                 progress=settings.progress, log=settings.log)
        return accuracy(model, graph, seeds, settings.fanouts, batch_size=settings.batch_size, device=device,
                        seed=settings.seed)


TASKS: dict[str, type[Task]] = {NodeClassification.name: NodeClassification}


def register_task(task: type[Task]) -> type[Task]:
    """Adds a Task class to TASKS under its `name` (a class decorator; `morphpipe.nn` imports every task module)."""
    TASKS[task.name] = task
    return task


def make_task(name: str, **options: Any) -> Task:
    """The task named `name` (a `--task` value) with `options` (e.g. the link task's negatives), else defaults."""
    if name not in TASKS:
        raise ValueError(f"task must be one of {tuple(TASKS)}, got {name!r}")
    return TASKS[name](**options)
