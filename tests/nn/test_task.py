"""The task seam: one batch shape for node, edge and typed batches, and the Task contract the trainers use."""
from __future__ import annotations

import pytest
import torch
from torch.nn import functional

from morphpipe.executor import Trainer
from morphpipe.nn import NodeClassification, TrainStep, build_model, make_task
from morphpipe.nn.task import EvalSettings
from morphpipe.profiler.profile import Profile
from morphpipe.sampling import CpuBatcher
from morphpipe.sampling.minibatch import Block, EdgePairs, MiniBatch
from morphpipe.sampling.serial_batcher import SerialBatcher
from morphpipe.scheduler import plan_from_profile


def edge_batch() -> MiniBatch:
    """An edge-task batch over a typed layer's features: 2 seed edges with 3 negatives each, x per node type."""
    pairs = EdgePairs(edge_ids=torch.tensor([7, 3]), src=torch.tensor([0, 1]), dst=torch.tensor([2, 3]),
                      negative_dst=torch.tensor([[1, 2, 3], [0, 2, 3]]))
    block = Block(indptr=torch.tensor([0, 1, 2, 2, 3]), indices=torch.tensor([4, 5, 0]), num_src=6, num_dst=4)
    return MiniBatch(seeds=torch.arange(10, 14), input_nodes=torch.arange(10, 16), blocks=[block],
                     x={"paper": torch.ones(4, 3), "author": torch.zeros(2, 5, dtype=torch.float16)},
                     y=torch.zeros(0, dtype=torch.long), pairs=pairs)


def test_an_edge_batch_counts_its_seed_edges_as_the_epochs_units() -> None:
    batch = edge_batch()
    assert batch.num_seeds == 2
    assert torch.equal(batch.units, torch.tensor([7, 3]))
    node_batch = MiniBatch(seeds=torch.tensor([4, 9]), input_nodes=torch.tensor([4, 9]), blocks=[],
                           x=torch.zeros(2, 1), y=torch.tensor([0, 1]))
    assert node_batch.num_seeds == 2 and torch.equal(node_batch.units, torch.tensor([4, 9]))


def test_every_tensor_of_a_typed_edge_batch_moves_and_is_counted() -> None:
    batch = edge_batch()
    expected = (4 + 6 + 0) * 8 + 4 * 3 * 4 + 2 * 5 * 2 + (2 + 2 + 2 + 6) * 8 + (5 + 3) * 8
    assert batch.nbytes == expected
    moved = batch.to("cpu")
    assert set(moved.x) == {"paper", "author"} and moved.x["author"].dtype == torch.float16
    assert torch.equal(moved.pairs.negative_dst, batch.pairs.negative_dst)
    assert len(batch.tensors()) == 4 + 1 + 4  # seeds, input_nodes, two feature tables, y; four pair tensors
    assert batch.device == torch.device("cpu")


def test_node_classification_is_the_default_task_and_its_loss_is_cross_entropy(tiny) -> None:
    task = make_task("node")
    assert isinstance(task, NodeClassification) and task.meta() == {"task": "node"}
    assert isinstance(TrainStep(torch.nn.Linear(1, 1), None).task, NodeClassification)
    for split in ("train", "val", "test"):
        assert torch.equal(task.seeds(tiny, split), getattr(tiny, f"{split}_idx"))
    torch.manual_seed(0)
    model = task.build_model("sage", tiny, num_layers=2, hidden=16).eval()  # no dropout: two calls agree
    with task.batcher(tiny, [3, 2], 32, seed=1, num_threads=1) as batcher:
        batch = next(iter(batcher))
    scored = task.loss(model, batch, torch.float32)
    assert torch.equal(scored.loss, functional.cross_entropy(model(batch.blocks, batch.x.float()), batch.y))
    assert bool(scored.targets_ok) and torch.equal(scored.targets, batch.y)
    batch.y[0] = tiny.num_classes  # a label outside the classes is flagged, never fed to the loss kernel
    assert not bool(task.loss(model, batch, torch.float32).targets_ok)


def test_the_task_chooses_each_routes_batcher_and_unknown_names_are_refused(tiny) -> None:
    task = NodeClassification()
    assert isinstance(task.batcher(tiny, [2], 8, serial=True), SerialBatcher)
    with task.batcher(tiny, [2], 8, num_threads=1) as threaded:
        assert isinstance(threaded, CpuBatcher)
    with pytest.raises(ValueError, match=r"task must be one of \('node',.*got 'edge'"):
        make_task("edge")
    with pytest.raises(ValueError, match="split must be one of"):
        task.seeds(tiny, "validation")
    with pytest.raises(ValueError, match="eval mode must be one of"):
        task.evaluate(build_model("sage", tiny.feature_dim, tiny.num_classes, num_layers=1), tiny, tiny.val_idx,
                      EvalSettings([2], mode="exact"), device=torch.device("cpu"))


class HalfTheSeeds(NodeClassification):
    """A task whose epoch visits only the even positions of the train split and records what it trains."""

    def __init__(self) -> None:
        super().__init__()
        self.trained: list[torch.Tensor] = []

    def seeds(self, graph, split: str = "train") -> torch.Tensor:
        seeds = super().seeds(graph, split)
        return seeds[::2] if split == "train" else seeds

    def loss(self, model, batch, dtype):
        self.trained.append(batch.units)
        return super().loss(model, batch, dtype)


def test_the_trainer_trains_the_tasks_units_with_the_tasks_loss(tiny) -> None:
    task = HalfTheSeeds()
    units = task.seeds(tiny)
    batch_size = 64
    batches = -(-units.numel() // batch_size)
    plan = plan_from_profile(Profile.synthetic(t_cb=0.004, t_m=0.006, num_batches=batches, cores=2), gbs=4)
    torch.manual_seed(0)
    model = build_model("sage", tiny.feature_dim, tiny.num_classes, num_layers=2, hidden=16)
    with Trainer(tiny, model, plan, fanouts=[3, 2], batch_size=batch_size, task=task, progress=False,
                 log=lambda _: None) as trainer:
        assert trainer.meta()["task"] == "node" and trainer.step.task is task
        trainer.fit(1, validate=False)
    assert torch.equal(torch.sort(torch.cat(task.trained)).values, torch.sort(units).values)


def test_a_trainer_takes_a_task_or_a_loss_not_both(tiny) -> None:
    plan = plan_from_profile(Profile.synthetic(t_cb=0.004, t_m=0.006, num_batches=2, cores=2), gbs=4)
    model = build_model("sage", tiny.feature_dim, tiny.num_classes, num_layers=1)
    with pytest.raises(ValueError, match="either task= .* or loss_fn="):
        Trainer(tiny, model, plan, fanouts=[2], batch_size=512, task=NodeClassification(),
                loss_fn=functional.cross_entropy)
