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
from morphpipe.nn.hetero import HETERO_MODELS, build_hetero_model
from morphpipe.ops.community import GraphBlock
from morphpipe.sampling.batcher import Batcher
from morphpipe.sampling.cpu_batcher import CpuBatcher
from morphpipe.sampling.gpu_batcher import GpuBatcher
from morphpipe.sampling.hetero_batcher import HeteroCpuBatcher, TypedFanouts, relation_fanouts
from morphpipe.sampling.hetero_torch_batcher import HeteroTorchBatcher
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


def cast_features(x: Tensors, dtype: torch.dtype | None) -> Tensors:
    """Features (one tensor or one per node type) in the model's dtype, so a compact store costs no precision;
    None: as stored (a bf16 step's autocast reads half-precision features as they are). A typed batch's int64
    node ids (the input of a type without features, which the model embeds) stay ids."""
    if dtype is None:
        return x
    return map_tensors(x, lambda t: t.to(dtype) if t.is_floating_point() else t)


def is_hetero(graph: Any) -> bool:
    """True for a heterogeneous graph store (typed nodes and relations)."""
    return bool(getattr(graph, "is_hetero", False))


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

    def loss(self, model: nn.Module, batch: MiniBatch, dtype: torch.dtype | None) -> TaskLoss:
        """The model's outputs on `batch` (on the model's device) and the loss against the batch's targets; the
        features are cast to `dtype` first (None: as stored)."""
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

    def __init__(self, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
                 relation_fanouts: TypedFanouts | None = None) -> None:
        self.loss_fn = loss_fn or functional.cross_entropy
        # A heterogeneous graph's fanouts per relation (each relation named, one count per layer); None: the
        # trainer's fanouts for every relation.
        self.relation_fanouts = relation_fanouts

    def check_graph(self, graph: GraphStore) -> None:
        if self.relation_fanouts is not None:
            if not is_hetero(graph):
                raise ValueError(f"relation fanouts apply to a heterogeneous graph; {graph.name!r} has one node and "
                                 "one edge type: drop them (use fanouts)")
            relation_fanouts(graph, self.relation_fanouts)

    def typed_fanouts(self, fanouts: Sequence[int]) -> TypedFanouts:
        """What a heterogeneous graph is sampled with: the relation fanouts when given (with as many layers as
        `fanouts`), else `fanouts` for every relation."""
        if self.relation_fanouts is None:
            return fanouts
        hops = {len(counts) for counts in self.relation_fanouts.values()}
        if hops != {len(fanouts)}:
            raise ValueError(f"relation fanouts have {sorted(hops)} hops but fanouts {list(fanouts)} have "
                             f"{len(fanouts)}: give one count per layer for every relation")
        return self.relation_fanouts

    def meta(self) -> dict[str, Any]:
        if self.relation_fanouts is None:
            return super().meta()
        return {**super().meta(), "relation_fanouts": {str(key): list(counts)
                                                       for key, counts in self.relation_fanouts.items()}}

    def seeds(self, graph: GraphStore, split: str = "train") -> torch.Tensor:
        return getattr(graph, f"{check_split(split)}_idx")

    def batcher(self, graph: GraphStore, fanouts: Sequence[int], batch_size: int, *, route: int = 0,
                seeds: torch.Tensor | None = None, seed: int = 0, shuffle: bool = True, serial: bool = False,
                num_threads: int | None = None, pin_memory: bool | None = None,
                device: torch.device | str | None = None) -> Batcher:
        if is_hetero(graph):
            if route == 1:
                return HeteroTorchBatcher(graph, self.typed_fanouts(fanouts), batch_size, seeds=seeds, seed=seed,
                                          shuffle=shuffle, device=device)
            return HeteroCpuBatcher(graph, self.typed_fanouts(fanouts), batch_size, num_threads=num_threads,
                                    seeds=seeds, shuffle=shuffle, seed=seed, pin_memory=pin_memory, serial=serial)
        if route == 1:
            return GpuBatcher(graph, fanouts, batch_size, seeds=seeds, seed=seed, shuffle=shuffle, device=device)
        if serial:
            return SerialBatcher(graph, fanouts, batch_size, seeds=seeds, shuffle=shuffle, seed=seed,
                                 num_threads=num_threads or 1)
        return CpuBatcher(graph, fanouts, batch_size, num_threads=num_threads, seeds=seeds, shuffle=shuffle, seed=seed,
                          pin_memory=pin_memory)

    def build_model(self, name: str, graph: GraphStore, *, num_layers: int, hidden: int | None = None,
                    **options: Any) -> nn.Module:
        if is_hetero(graph):
            if name not in HETERO_MODELS:
                raise ValueError(f"model {name!r} ignores node and relation types; graph {graph.name!r} is "
                                 f"heterogeneous: use one of {list(HETERO_MODELS)}")
            return build_hetero_model(name, num_nodes={t.name: t.count for t in graph.node_types},
                                      feature_dims=graph.feature_dims, relations=graph.relations,
                                      target_type=graph.target_type, num_classes=graph.num_classes,
                                      num_layers=num_layers, hidden=hidden, **options)
        if name in HETERO_MODELS:
            raise ValueError(f"model {name!r} needs a heterogeneous graph; {graph.name!r} has one node and one edge "
                             "type: use sage, gcn, gat or mlp")
        return build_model(name, graph.feature_dim, graph.num_classes, num_layers=num_layers, hidden=hidden,
                           **options)

    def loss(self, model: nn.Module, batch: MiniBatch, dtype: torch.dtype | None) -> TaskLoss:
        logits = model(batch.blocks, cast_features(batch.x, dtype))
        labels, labels_ok = FiniteGuard.safe_labels(batch.y, logits.shape[-1])
        return TaskLoss(self.loss_fn(logits, labels), logits, batch.y, labels_ok)

    def evaluate(self, model: nn.Module, graph: GraphStore, seeds: torch.Tensor, settings: EvalSettings, *,
                 device: torch.device, graph_block: Callable[[], GraphBlock] | None = None) -> float:
        if is_hetero(graph):
            return self._typed_accuracy(model, graph, seeds, settings, device)
        if check_eval_mode(settings.mode) == "full":
            block = graph_block() if graph_block is not None else GraphBlock.of(graph.indptr, graph.indices)
            return full_accuracy(model, graph, seeds, device=device, graph_block=block,
                                 progress=settings.progress, log=settings.log)
        return accuracy(model, graph, seeds, settings.fanouts, batch_size=settings.batch_size, device=device,
                        seed=settings.seed, progress=settings.progress)

    @torch.no_grad()
    def _typed_accuracy(self, model: nn.Module, graph: Any, seeds: torch.Tensor, settings: EvalSettings,
                        device: torch.device) -> float:
        """Accuracy on a heterogeneous graph: sampled, or exact (layer-wise inference over every neighbour)."""
        if seeds.numel() == 0:
            raise ValueError("accuracy needs at least one seed; this split of the graph is empty")
        if check_eval_mode(settings.mode) == "full":
            return full_accuracy(model, graph, seeds, device=device, progress=settings.progress, log=settings.log)
        dtype = next(model.parameters()).dtype
        was_training = model.training
        model.eval()
        correct = 0
        try:
            with self.batcher(graph, settings.fanouts, settings.batch_size, seeds=seeds, seed=settings.seed,
                              shuffle=False, pin_memory=device.type == "cuda") as batcher:
                for batch in batcher:
                    batch = batch.to(device, non_blocking=True)
                    logits = model(batch.blocks, cast_features(batch.x, dtype))
                    correct += int((logits.argmax(dim=1) == batch.y).sum())
        finally:
            model.train(was_training)
        return correct / seeds.numel()


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
