"""Every guard fires when its condition happens, and the epoch's loss and accuracy match hand-computed values.

Guards: the executor's exactly-once check (`check_complete`, both halves), the CPU buffer's
"more batches than the plan" check, the device-overlap check on traces. Bookkeeping: the epoch
loss is the mean over seeds (a batch weighs its number of seeds), accuracy is correct seeds over
all seeds. Profiling: the CPU batching operator measures each thread count it is asked for.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn
from tqdm import tqdm

from morphpipe.executor.trace import overlaps
from morphpipe.executor.virtual import VirtualDevices, virtual_executor
from morphpipe.nn import NodeClassification
from morphpipe.nn.evaluate import accuracy
from morphpipe.partitioner import Partitioner, PhaseTimes
from morphpipe.profiler import operators
from morphpipe.profiler.operators import ProfilingSession
from morphpipe.scheduler import Scheduler
from morphpipe.scheduler.result import TraceRecord

TIMES = PhaseTimes(12, 0.002, 2, 0.002, 0.002, 0.001)
BATCH_SIZE = 4
NUM_SEEDS = TIMES.num_batches * BATCH_SIZE - 1  # virtual_executor's seeds: the last batch is one short


def executor_for(n_cpu: int):
    split = Partitioner(TIMES, gbs=3).split(n_cpu)
    return virtual_executor(TIMES, split, Scheduler(TIMES, seed=0).durations, batch_size=BATCH_SIZE)


# --- the device-overlap check ----------------------------------------------------------------------

def record(start: float, end: float, lane: int = 0, device: str = "gpu", batch: int = 0) -> TraceRecord:
    return TraceRecord(batch, 0, "train", device, lane, start, end)


def test_overlap_check_fires_on_one_lane_only() -> None:
    found = overlaps([record(0.0, 1.0), record(0.5, 1.5, batch=1), record(2.0, 3.0, batch=2)])
    assert [(o.first.batch, o.second.batch) for o in found] == [(0, 1)]
    contained = overlaps([record(0.0, 3.0), record(1.0, 2.0, batch=1)])
    assert len(contained) == 1
    assert overlaps([record(0.0, 1.0), record(0.5, 1.5, lane=1)]) == []  # two CPU threads, two lanes
    assert overlaps([record(0.0, 1.0), record(0.5, 1.5, device="pcie")]) == []
    assert overlaps([record(0.0, 1.0), record(1.0, 2.0)]) == []  # back to back
    assert overlaps([record(0.0, 1.0), record(1.0 - 5e-7, 2.0)]) == []  # within the clock tolerance
    assert len(overlaps([record(0.0, 1.0), record(1.0 - 5e-6, 2.0)])) == 1


# --- the executor's exactly-once check ---------------------------------------------------------------

class DuplicatingDevices(VirtualDevices):
    """Virtual devices whose Route 1 batches all claim the first Route 1 position (a devices bug)."""

    def gpu_batch(self, batches, position):
        item = super().gpu_batch(batches, position)
        item.position = TIMES.num_batches - 1
        return item


def test_check_complete_fires_when_a_position_is_trained_twice() -> None:
    executor, _ = executor_for(4)
    executor.devices = DuplicatingDevices(executor.devices.machine)
    with pytest.raises(RuntimeError, match="instead of each of 0..11 once"):
        executor.run_epoch(0)


class LongEpoch:
    """Wraps a batcher: the plan's count for len(), one batch too many per epoch."""

    def __init__(self, batcher) -> None:
        self.batcher = batcher

    def __len__(self) -> int:
        return len(self.batcher)

    def epoch(self, epoch: int):
        batches = list(self.batcher.epoch(epoch))
        yield from batches
        yield batches[-1]

    def close(self) -> None:
        self.batcher.close()


def test_check_complete_fires_when_the_gpu_batcher_yields_more_than_the_plan() -> None:
    executor, _ = executor_for(4)
    executor.gpu_batcher = LongEpoch(executor.gpu_batcher)
    with pytest.raises(RuntimeError, match="GPU batcher yields more than the plan's 8"):
        executor.run_epoch(0)


def test_the_cpu_buffer_fires_when_the_cpu_batcher_yields_more_than_the_plan() -> None:
    executor, _ = executor_for(5)
    executor.cpu_batcher = LongEpoch(executor.cpu_batcher)
    with pytest.raises(RuntimeError, match="CPU batcher yields more than the plan's 5"):
        executor.run_epoch(0)


# --- loss and accuracy bookkeeping ---------------------------------------------------------------------

@pytest.mark.parametrize("n_cpu", [0, 5, 12])
def test_epoch_loss_is_the_mean_over_seeds(n_cpu: int) -> None:
    executor, trainer = executor_for(n_cpu)

    def step(batch):
        trainer(batch)
        return batch.seeds.to(torch.float64).mean()  # a batch's loss: the mean of its seed ids

    executor.step = step
    result = executor.run_epoch(0)
    # Over seeds 0..NUM_SEEDS-1 the seed-weighted mean of batch means is the mean seed id; an
    # unweighted mean of batch means differs because the short batch holds different ids each epoch.
    assert result.seeds == NUM_SEEDS
    assert result.loss == pytest.approx((NUM_SEEDS - 1) / 2, rel=1e-6)
    batch_means = [seeds.double().mean().item() for seeds in trainer.trained]
    assert sum(batch_means) / len(batch_means) != pytest.approx(result.loss, rel=1e-6)


class LabelOracle(nn.Module):
    """Predicts the label stored in feature column 0 when column 1 is 1, else a wrong class."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1))

    def forward(self, blocks, x):
        seeds = x[: blocks[-1].num_dst]
        predicted = torch.where(seeds[:, 1] > 0.5, seeds[:, 0], (seeds[:, 0] + 1) % 3).long()
        return nn.functional.one_hot(predicted, 3).float() + self.weight


def test_accuracy_is_correct_seeds_over_all_seeds() -> None:
    num_nodes = 50
    labels = torch.arange(num_nodes) % 3
    right = (torch.arange(num_nodes) % 4 == 0) | (torch.arange(num_nodes) < 7)
    features = torch.stack([labels.float(), right.float()], 1)
    indptr = torch.arange(num_nodes + 1, dtype=torch.int64)
    graph = SimpleNamespace(indptr=indptr, indices=(torch.arange(num_nodes) + 1) % num_nodes, features=features,
                            labels=labels, num_nodes=num_nodes)
    seeds = torch.arange(0, 23)  # batches of 10, 10 and 3: per-batch accuracies 0.8, 0.2 and 1/3
    expected = int(right[:23].sum()) / 23
    assert expected == pytest.approx(11 / 23)
    assert accuracy(LabelOracle(), graph, seeds, [1], batch_size=10, num_threads=1) == pytest.approx(expected)


# --- the profiler measures the thread counts it is asked for ----------------------------------------

def test_cpu_batching_operator_runs_each_thread_count() -> None:
    built: list[int] = []

    class RecordingBatcher:
        def epoch(self, epoch):
            return iter([object()] * 4)

        def close(self) -> None:
            pass

    class RecordingTask(NodeClassification):
        def batcher(self, graph, fanouts, batch_size, *, route=0, num_threads=None, **options):
            built.append(num_threads)
            return RecordingBatcher()

    session = ProfilingSession(graph=None, fanouts=[2], batch_size=4, model_name="sage", hidden=None,
                               thread_counts=[1, 3, 2], warmup=1, steps=3, budget_s=1.0, seed=0,
                               progress=tqdm(disable=True), task=RecordingTask())
    scaling = operators.cpu_batching(session)
    assert built == [1, 3, 2]
    assert sorted(scaling.points) == [1, 2, 3]


def test_cpu_training_operator_runs_with_each_thread_count(monkeypatch) -> None:
    seen: list[int] = []

    class RecordingStep:
        def __call__(self, batch) -> None:
            seen.append(torch.get_num_threads())

    monkeypatch.setattr(ProfilingSession, "new_train_step", lambda self, device: RecordingStep())
    session = ProfilingSession(graph=None, fanouts=[2], batch_size=4, model_name="sage", hidden=None,
                               thread_counts=[1, 2], warmup=0, steps=3, budget_s=10.0, seed=0,
                               progress=tqdm(disable=True), task=NodeClassification(), sample_batches=[object()])
    before = torch.get_num_threads()
    operators.cpu_training(session)
    assert seen == [1, 1, 1, 2, 2, 2]
    assert torch.get_num_threads() == before
