"""Link prediction under the executor: every training edge exactly once per epoch across both routes, and
checkpoints that resume a link run and refuse one with other negatives."""
from __future__ import annotations

import pytest
import torch

from morphpipe.data import GraphStore
from morphpipe.data.generators import COMMUNITY, GeneratorSpec
from morphpipe.data.link_generator import EdgeSplitSpec, generate_link
from morphpipe.data.splits import SplitFractions
from morphpipe.executor import CpuDevices, Executor, Trainer, route_seeds
from morphpipe.executor.trainer import torch_threads
from morphpipe.nn import LinkPrediction, TrainStep
from morphpipe.partitioner import Split
from morphpipe.profiler import Profile
from morphpipe.scheduler import plan_from_profile

BATCH = 100
FANOUTS = [3, 3]


@pytest.fixture(scope="module")
def graph(tmp_path_factory) -> GraphStore:
    spec = GeneratorSpec(COMMUNITY, num_nodes=400, avg_degree=8, feature_dim=8, num_classes=4, homophily=0.9)
    return GraphStore.load(generate_link(spec, EdgeSplitSpec(SplitFractions(0.8, 0.1, 0.1), negatives=10),
                                         tmp_path_factory.mktemp("link") / "g", progress=False))


class RecordingLink(LinkPrediction):
    """The link task, recording the units (training edges) of every batch it trains."""

    def __init__(self, negatives: int = 1) -> None:
        super().__init__(negatives)
        self.trained: list[torch.Tensor] = []

    def loss(self, model, batch, dtype):
        self.trained.append(batch.units)
        return super().loss(model, batch, dtype)


def test_every_training_edge_once_per_epoch_over_both_routes(graph, community_cache):
    task = RecordingLink(2)
    units = task.seeds(graph)
    num_batches = -(-units.numel() // BATCH)
    split = Split(num_batches // 3, num_batches - num_batches // 3, 2, 3)
    routes = route_seeds(units, BATCH, split.n_cpu, num_batches, seed=0)
    torch.manual_seed(0)
    model = task.build_model("sage", graph, num_layers=2, hidden=8, dropout=0.0)
    step = TrainStep(model, torch.optim.Adam(model.parameters(), lr=0.01), task)
    cpu = task.batcher(graph, FANOUTS, BATCH, route=0, seeds=routes.cpu, seed=3, num_threads=2, pin_memory=False)
    gpu = task.batcher(graph, FANOUTS, BATCH, route=1, seeds=routes.gpu, seed=3, device="cpu")  # the torch path
    executor = Executor(split, CpuDevices(), step, cpu_batcher=cpu, gpu_batcher=gpu)
    with torch_threads(1):
        for epoch in range(2):
            task.trained = []
            order = executor.run_epoch(epoch).order
            assert {route for route, _ in order} == {0, 1}
            assert torch.equal(torch.sort(torch.cat(task.trained)).values, units)
    executor.close_batchers()


def plan_for(graph) -> object:
    batches = -(-graph.edge_split.train.shape[1] // BATCH)
    return plan_from_profile(Profile.synthetic(t_cb=0.004, t_m=0.006, num_batches=batches, cores=2), gbs=3)


def test_a_link_run_resumes_from_its_checkpoint_and_refuses_other_negatives(graph, tmp_path, community_cache):
    def trainer(task):
        torch.manual_seed(0)
        model = task.build_model("sage", graph, num_layers=2, hidden=8, dropout=0.0)
        return Trainer(graph, model, plan_for(graph), fanouts=FANOUTS, batch_size=BATCH, task=task, progress=False,
                       checkpoint_dir=tmp_path, log=lambda _: None)

    with trainer(LinkPrediction(2)) as first:
        first.fit(1)
        assert first.meta()["negatives"] == 2 and first.history[0].metric == "mrr"
    with trainer(LinkPrediction(2)) as resumed:
        history = resumed.fit(2)
        assert [stats.epoch for stats in history] == [0, 1] and history[1].val_acc is not None
    with trainer(LinkPrediction(3)) as other, pytest.raises(ValueError, match="negatives: checkpoint 2 vs now 3"):
        other.fit(3)
