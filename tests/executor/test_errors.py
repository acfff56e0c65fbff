"""Failures anywhere end the epoch cleanly: the original error reaches the caller fast, no thread is left behind."""
from __future__ import annotations

import _thread
import signal
import threading
import time
import traceback

import pytest
import torch

from morphpipe.executor import CpuDevices, Executor, route_seeds
from morphpipe.executor.virtual import (VirtualCpuBatcher, VirtualGpuBatcher, VirtualTrainer, _VirtualCpuEpoch,
                                        virtual_executor)
from morphpipe.nn import NodeClassification, TrainStep, build_model
from morphpipe.partitioner import Partitioner, PhaseTimes, Split
from morphpipe.sampling import CpuBatcher
from morphpipe.scheduler import Scheduler

TIMES = PhaseTimes(30, 0.010, 2, 0.008, 0.008, 0.004)
SPLIT = Partitioner(TIMES, gbs=4).split(15)


class BatcherBroke(RuntimeError):
    """Raised by a test batcher."""


class ModelBroke(ValueError):
    """Raised by a test model."""


def virtual(split: Split = SPLIT):
    return virtual_executor(TIMES, split, Scheduler(TIMES, seed=0).durations, batch_size=2)


@pytest.fixture()
def no_leaked_threads():
    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + 2.0
    while set(threading.enumerate()) - before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert set(threading.enumerate()) - before == set()


def frames(error: BaseException) -> list[str]:
    return [frame.name for frame in traceback.extract_tb(error.__traceback__)]


def test_a_cpu_batcher_thread_that_raises(no_leaked_threads) -> None:
    raised_at: list[float] = []

    class BrokenEpoch(_VirtualCpuEpoch):
        def build(self, index: int, lane: int, disk_turn: int | None = None):
            if index == 7:
                raised_at.append(time.perf_counter())
                raise BatcherBroke("batch 7 could not be built")
            return super().build(index, lane, disk_turn)

    executor, _ = virtual()
    executor.cpu_batcher.make_epoch = lambda order: BrokenEpoch(executor.cpu_batcher.machine, order, 2, 2)
    with pytest.raises(BatcherBroke, match="batch 7") as caught:
        executor.run_epoch(0)
    assert time.perf_counter() - raised_at[0] < 1.0
    assert "build" in frames(caught.value), "the worker's own frame is in the traceback"


def test_a_gpu_batcher_that_raises(no_leaked_threads) -> None:
    class BrokenGpuBatcher(VirtualGpuBatcher):
        def make(self, number: int, order: torch.Tensor):
            if number == 3:
                raise BatcherBroke("UVA sampling failed")
            return super().make(number, order)

    executor, _ = virtual()
    gpu = executor.gpu_batcher
    executor.gpu_batcher = BrokenGpuBatcher(gpu.machine, gpu.seeds, gpu.batch_size, gpu.first_position)
    with pytest.raises(BatcherBroke, match="UVA"):
        executor.run_epoch(0)


def test_a_training_step_that_raises_on_the_compute_stream(no_leaked_threads) -> None:
    raised_at: list[float] = []

    class BrokenTrainer(VirtualTrainer):
        def __call__(self, batch):
            if self.steps == 9:
                raised_at.append(time.perf_counter())
                raise ModelBroke("NaN in the loss")
            return super().__call__(batch)

    executor, trainer = virtual()
    executor.step = BrokenTrainer(trainer.machine)
    with pytest.raises(ModelBroke, match="NaN") as caught:
        executor.run_epoch(0)
    assert time.perf_counter() - raised_at[0] < 1.0
    assert "__call__" in frames(caught.value)


class Interrupter:
    """Interrupts the main thread (as Ctrl-C would) 0.05 s after `start` and every 0.05 s after that, until `caught`:
    an interrupt that lands inside a gc callback is swallowed there, so one is not enough. Its SIGINT handler
    raises only until then; it is installed for the test, because pytest started as a background job of a
    script inherits SIGINT ignored, and then `interrupt_main` does nothing."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._interrupt, name="test-interrupter")
        self.previous = signal.signal(signal.SIGINT, self._handler)

    def _handler(self, signum: int, frame: object) -> None:
        if not self.done.is_set():
            raise KeyboardInterrupt

    def _interrupt(self) -> None:
        while not self.done.wait(0.05):
            _thread.interrupt_main()

    def start(self) -> None:
        self.thread.start()

    def caught(self) -> None:
        self.done.set()
        if self.thread.is_alive():
            self.thread.join()

    def restore(self) -> None:
        self.caught()
        signal.signal(signal.SIGINT, self.previous)


@pytest.fixture
def interrupter():
    interrupter = Interrupter()
    yield interrupter
    interrupter.restore()


def test_a_keyboard_interrupt_stops_everything_and_the_next_epoch_runs(no_leaked_threads, interrupter) -> None:
    executor, trainer = virtual()
    interrupter.start()
    started = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        executor.run_epoch(0)
    interrupter.caught()
    assert time.perf_counter() - started < 1.05
    trainer.trained.clear()
    result = executor.run_epoch(1)
    executor.cpu_batcher.close()
    assert result.batches == TIMES.num_batches
    assert sorted(torch.cat(trainer.trained).tolist()) == list(range(59))


def test_a_batcher_shorter_than_the_plan_is_an_error_not_a_deadlock(no_leaked_threads) -> None:
    class ClaimsFifteen(VirtualCpuBatcher):
        def __len__(self) -> int:
            return 15

    executor, _ = virtual()
    batcher = executor.cpu_batcher
    executor.cpu_batcher = ClaimsFifteen(batcher.machine, batcher.seeds[:-2], 2)
    with pytest.raises(RuntimeError, match="ended after 14 batches"):
        executor.run_epoch(0)


def real_executor(graph, split: Split, loss_fn) -> Executor:
    """Real batchers and a real model on the CPU; Route 1 stands in as a second CpuBatcher."""
    routes = route_seeds(graph.train_idx, 128, split.n_cpu, split.n_cpu + split.n_gpu, seed=0)
    cpu = CpuBatcher(graph, [5, 5], 128, num_threads=1, seeds=routes.cpu, pin_memory=False)
    gpu = CpuBatcher(graph, [5, 5], 128, num_threads=1, seeds=routes.gpu, pin_memory=False) if split.n_gpu else None
    model = build_model("sage", graph.feature_dim, graph.num_classes, num_layers=2, hidden=16)
    step = TrainStep(model, torch.optim.Adam(model.parameters()), NodeClassification(loss_fn))
    return Executor(split, CpuDevices(), step, cpu_batcher=cpu, gpu_batcher=gpu)


def test_a_model_that_raises_with_real_batchers(tiny, no_leaked_threads) -> None:
    calls = []
    failing = [True]

    def loss_fn(logits, labels):
        calls.append(1)
        if failing[0] and len(calls) == 4:
            raise ModelBroke("bad logits")
        return torch.nn.functional.cross_entropy(logits, labels)

    executor = real_executor(tiny, Split(6, 9, 3, 4), loss_fn)
    with pytest.raises(ModelBroke, match="bad logits"):
        executor.run_epoch(0)
    failing[0] = False
    assert executor.run_epoch(1).batches == 15, "the batchers start a new epoch after a failure"
    executor.cpu_batcher.close()
    executor.gpu_batcher.close()


def test_a_keyboard_interrupt_in_training_with_real_batchers(tiny, no_leaked_threads) -> None:
    calls = []

    def loss_fn(logits, labels):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return torch.nn.functional.cross_entropy(logits, labels)

    executor = real_executor(tiny, Split(15, 0, 2, 0), loss_fn)
    with pytest.raises(KeyboardInterrupt):
        executor.run_epoch(0)
    executor.cpu_batcher.close()


@pytest.mark.parametrize("split, match", [
    (Split(15, 10, 2, 3), "pass gpu_batcher"),
    (Split(15, 0, 0, 0), "cbs must be >= 1"),
    (Split(14, 0, 2, 0), "makes 15 batches"),
])
def test_plans_that_do_not_fit_the_batchers_are_named(split: Split, match: str) -> None:
    executor, _ = virtual(Split(15, 15, 2, 4))
    with pytest.raises(ValueError, match=match):
        Executor(split, executor.devices, executor.step, cpu_batcher=executor.cpu_batcher)
