"""Stream discipline of CudaDevices and the GPU batcher, checked on the CPU against a recording double.

Over every plan kind (all-CPU, all-GPU, mixed, CPU-only with shared cores) the executor trains
real batches (C++ CPU batcher, torch-path GPU batcher) with CudaDevices running on
`RecordingStreams`; every tensor used on a stream other than the one that made it must be
preceded by a wait on an event recorded after it was made and be `record_stream`-ed there, and
host batches must outlive the copies reading them. Broken variants show the checks bite.
"""
from __future__ import annotations

import pytest
import torch
from stream_double import RecordingStreams
from test_sampling import make_graph
from torch import nn

from morphpipe import ops
from morphpipe.executor.devices import CudaDevices, InFlight, Launched
from morphpipe.executor.executor import Executor
from morphpipe.executor.routes import route_seeds
from morphpipe.nn.train_step import TrainStep
from morphpipe.partitioner.partitioner import Split
from morphpipe.sampling import CpuBatcher, GpuBatcher, SerialBatcher

FANOUTS = [3, 2]
BATCH = 32
CPU = torch.device("cpu")


class TinyModel(nn.Module):
    """Mean aggregation and a linear layer per block."""

    def __init__(self, features: int, classes: int, layers: int) -> None:
        super().__init__()
        widths = [features] + [8] * (layers - 1) + [classes]
        self.linears = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths, widths[1:]))

    def forward(self, blocks, x):
        for layer, (block, linear) in enumerate(zip(blocks, self.linears)):
            x = linear(ops.aggregate(block, x, "mean"))
            if layer < len(self.linears) - 1:
                x = torch.relu(x)
        return x


class WatchedHostBatches:
    """Wraps a Route 0 batcher so the double checks when each host batch is released."""

    def __init__(self, batcher, api: RecordingStreams) -> None:
        self.batcher, self.api = batcher, api

    def __len__(self) -> int:
        return len(self.batcher)

    def epoch(self, epoch: int):
        for batch in self.batcher.epoch(epoch):
            self.api.watch_host(batch)
            yield batch

    def close(self) -> None:
        self.batcher.close()


PLANS = {
    "all-cpu": (Split(8, 0, 2, 2), False),
    "all-gpu": (Split(0, 8, 0, 3), False),
    "mixed": (Split(3, 5, 2, 3), False),
    "shares-cores": (Split(8, 0, 2, 2), True),
}


@pytest.fixture(scope="module")
def graph():
    return make_graph(500)


def run_plan(graph, split: Split, shares_cores: bool, api: RecordingStreams, devices_class=CudaDevices) -> None:
    """One epoch of `split` on CudaDevices over the double, everything built while tracking."""
    torch.manual_seed(0)
    model = TinyModel(graph.features.shape[1], 5, len(FANOUTS))
    step = TrainStep(model, torch.optim.SGD(model.parameters(), lr=0.1))
    routes = route_seeds(graph.train_idx, BATCH, split.n_cpu, split.n_cpu + split.n_gpu, seed=0)
    with api.tracking():
        devices = devices_class(CPU, streams=api)
        cpu = None
        if split.n_cpu and shares_cores:
            cpu = WatchedHostBatches(SerialBatcher(graph, FANOUTS, BATCH, seeds=routes.cpu, seed=0), api)
        elif split.n_cpu:
            cpu = WatchedHostBatches(CpuBatcher(graph, FANOUTS, BATCH, num_threads=2, seeds=routes.cpu, seed=0), api)
        gpu = GpuBatcher(graph, FANOUTS, BATCH, seeds=routes.gpu, seed=0, device=CPU, backend="torch",
                         streams=api) if split.n_gpu else None
        executor = Executor(split, devices, step, cpu_batcher=cpu, gpu_batcher=gpu, shares_cores=shares_cores)
        result = executor.run_epoch(0)
        assert result.batches == split.n_cpu + split.n_gpu
        for batcher in (cpu, gpu):
            if batcher is not None:
                batcher.close()


@pytest.mark.parametrize("kind", list(PLANS))
def test_every_cross_stream_use_waits_on_an_event_and_is_recorded(graph, kind):
    split, shares_cores = PLANS[kind]
    api = RecordingStreams()
    run_plan(graph, split, shares_cores, api)
    assert api.violations == []
    assert api.missing_record_streams() == []
    used_across = {stream for _, stream in api.cross_uses}
    assert used_across == {"default"}, "training (on the compute stream) is where batches cross streams"
    if split.n_cpu:
        assert api.released_hosts > 0, "host batches are released once their copies are known to be done"
    if split.n_gpu:
        assert any(entry[0] == "wait_event" and entry[2] not in ("default", "s1") for entry in api.log), \
            "the compute stream waits on the GPU batcher's own stream"


class NoRouteOneWait(CudaDevices):
    """Trains Route 1 batches without waiting for the batcher's stream (the defect of issue 11)."""

    def gpu_batch(self, batches, position: int) -> InFlight:
        item = super().gpu_batch(batches, position)
        item.ready = None
        return item


class EarlyHostRelease(CudaDevices):
    """Drops the host copy as soon as the copy is queued, before anything waited on it."""

    def transfer(self, batch, position: int) -> InFlight:
        item = super().transfer(batch, position)
        item.host = None
        return item


class ForgetsRecordStream(RecordingStreams):
    def record_stream(self, tensor: torch.Tensor, stream) -> None:
        pass


def test_the_double_catches_a_missing_wait(graph):
    api = RecordingStreams()
    run_plan(graph, Split(0, 8, 0, 3), False, api, NoRouteOneWait)
    assert any("without waiting" in violation for violation in api.violations)


def test_the_double_catches_a_host_buffer_released_early(graph):
    api = RecordingStreams()
    run_plan(graph, Split(8, 0, 2, 2), False, api, EarlyHostRelease)
    assert any("host buffer was released" in violation for violation in api.violations)


def test_the_double_catches_a_missing_record_stream(graph):
    api = ForgetsRecordStream()
    run_plan(graph, Split(3, 5, 2, 3), False, api)
    assert api.violations == []
    assert api.missing_record_streams()


def test_gpu_batcher_makes_batches_on_its_own_stream_with_a_handoff(graph):
    api = RecordingStreams()
    with api.tracking():
        batcher = GpuBatcher(graph, FANOUTS, BATCH, device=CPU, backend="torch", streams=api)
        batch = next(iter(batcher))
    assert batch.handoff.stream is not api.default and batch.handoff.stream is batcher._stream
    assert batch.handoff.ready.stream_name == batcher._stream.name
    assert api.producers, "the batch's tensors were made by tracked ops on the batcher's stream"
    assert {stream for stream, _ in api.producers.values()} == {batcher._stream.name}
    batcher.close()


def test_launch_waits_records_and_times(graph):
    """One Route 1 launch: the compute stream waits on the handoff, every batch tensor is recorded on it."""
    api = RecordingStreams()
    with api.tracking():
        devices = CudaDevices(CPU, streams=api)
        batcher = GpuBatcher(graph, FANOUTS, BATCH, device=CPU, backend="torch", streams=api)
        from morphpipe.executor.threads import ThreadGroup
        from morphpipe.executor.trace import Trace

        devices.start_epoch(ThreadGroup("test"), Trace())
        item = devices.gpu_batch(iter(batcher), 0)
        launched = devices.launch(item, lambda batch: batch.x.sum())
        devices.wait(launched)
        devices.finish_epoch()
    assert isinstance(launched, Launched) and item.ready is item.batch.handoff.ready
    assert ("wait_event", "default", batcher._stream.name) in api.log
    assert api.violations == [] and api.missing_record_streams() == []
    batcher.close()


def test_route_one_on_cpu_tensors_trains_in_the_executor(graph):
    """The torch-path GPU batcher on the CPU is a Route 1 the executor trains (CpuDevices): each seed once."""
    from morphpipe.executor.devices import CpuDevices

    split = Split(3, 5, 2, 3)
    routes = route_seeds(graph.train_idx, BATCH, split.n_cpu, split.n_cpu + split.n_gpu, seed=0)
    model = TinyModel(graph.features.shape[1], 5, len(FANOUTS))
    step = TrainStep(model, torch.optim.SGD(model.parameters(), lr=0.1))
    trained = []

    def recording_step(batch):
        trained.append(batch.seeds.clone())
        return step(batch)

    with CpuBatcher(graph, FANOUTS, BATCH, num_threads=1, seeds=routes.cpu, seed=0) as cpu, \
            GpuBatcher(graph, FANOUTS, BATCH, seeds=routes.gpu, seed=0, device=CPU, backend="torch") as gpu:
        result = Executor(split, CpuDevices(), recording_step, cpu_batcher=cpu, gpu_batcher=gpu).run_epoch(0)
    assert sorted(route for route, _ in result.order) == [0] * 3 + [1] * 5
    seen = torch.cat(trained)
    assert torch.equal(torch.sort(seen).values, torch.sort(graph.train_idx).values)
