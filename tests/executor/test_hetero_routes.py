"""Typed batches through the unchanged executor: both routes (C++ Route 0, torch Route 1) split one epoch, every
training paper is trained exactly once, and the result equals a sequential loop over the same batches."""
from __future__ import annotations

import copy

import torch

from morphpipe.data.hetero_generator import MagSpec, mag_shaped
from morphpipe.executor import CpuDevices, Executor, route_seeds
from morphpipe.executor.trainer import torch_threads
from morphpipe.nn import NodeClassification, TrainStep
from morphpipe.partitioner import Split

FANOUTS = [3, 2]
BATCH = 40


def test_both_routes_train_every_paper_once_as_a_sequential_loop_would() -> None:
    graph = mag_shaped(MagSpec(num_papers=300, num_authors=200, num_institutions=8, num_fields=20, feature_dim=6))
    graph.validate()
    task = NodeClassification()
    split = Split(3, 2, 2, 2)  # 3 batches on Route 0, 2 on Route 1
    routes = route_seeds(graph.train_idx, BATCH, split.n_cpu, 5, seed=0)
    cpu = task.batcher(graph, FANOUTS, BATCH, route=0, seeds=routes.cpu, seed=5, num_threads=2, pin_memory=False)
    gpu = task.batcher(graph, FANOUTS, BATCH, route=1, seeds=routes.gpu, seed=5, device="cpu")
    torch.manual_seed(0)
    model = task.build_model("rgat", graph, num_layers=2, hidden=8, heads=2)
    reference = copy.deepcopy(model)
    rng = torch.get_rng_state()
    step = TrainStep(model, torch.optim.Adam(model.parameters(), lr=0.01), task)
    executor = Executor(split, CpuDevices(), step, cpu_batcher=cpu, gpu_batcher=gpu)
    with torch_threads(1):
        order = executor.run_epoch(0).order
    assert {route for route, _ in order} == {0, 1}

    batches = {(0, b.batch_index): b for b in cpu.epoch(0)}
    batches.update({(1, split.n_cpu + b.batch_index): b for b in gpu.epoch(0)})
    trained = torch.cat([batches[key].units for key in order])
    assert sorted(trained.tolist()) == sorted(graph.train_idx.tolist()), "every training paper exactly once"
    torch.set_rng_state(rng)
    sequential = TrainStep(reference, torch.optim.Adam(reference.parameters(), lr=0.01), task)
    with torch_threads(1):
        for key in order:
            sequential(batches[key])
    cpu.close()
    for (name, parameter), expected in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(parameter, expected, msg=lambda m, name=name: f"{name}: {m}")
