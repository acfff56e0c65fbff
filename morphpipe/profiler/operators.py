"""The registry of phase operators, one per (phase, hardware) as in MorphGL's Table III.

An operator runs one phase of the mini-batch pipeline on real data (warm-up, then k timed
steps) and returns its timing; the Profiler asks the registry for the phases its hardware
has. New batchers and devices add operators here without touching the Profiler.
"""
from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from tqdm import tqdm

from morphpipe.nn.task import Task
from morphpipe.nn.train_step import TrainStep, make_optimizer
from morphpipe.profiler.profile import PhaseTiming, ThreadScaling
from morphpipe.sampling.minibatch import MiniBatch

PHASES = ("cpu_batching", "gpu_batching", "dma", "training")


@dataclass
class ProfilingSession:
    """What every operator needs: the workload, the measurement settings and the progress bar."""

    graph: object
    fanouts: list[int]
    batch_size: int
    model_name: str
    hidden: int | None
    thread_counts: list[int]
    warmup: int
    steps: int
    budget_s: float
    seed: int
    progress: tqdm
    task: Task
    precision: str = "float32"
    sample_batches: list[MiniBatch] = field(default_factory=list)

    def cycled_batches(self) -> Iterator[MiniBatch]:
        """The pre-sampled batches, repeated as often as a measurement needs."""
        return itertools.cycle(self.sample_batches)

    def new_train_step(self, device: torch.device, precision: str | None = None) -> TrainStep:
        """A freshly initialised model and optimizer on `device`, as training would start, stepping in
        `precision` (default: the session's, the one training will run)."""
        torch.manual_seed(self.seed)
        model = self.task.build_model(self.model_name, self.graph, num_layers=len(self.fanouts),
                                      hidden=self.hidden).to(device)
        return TrainStep(model, make_optimizer(model.parameters(), 1e-3, device), self.task,
                         precision=precision or self.precision)


Operator = Callable[[ProfilingSession], PhaseTiming | ThreadScaling]
OPERATORS: dict[tuple[str, str], Operator] = {}


def register_operator(phase: str, hardware: str) -> Callable[[Operator], Operator]:
    """Registers the decorated function as the operator measuring `phase` on `hardware`."""
    if phase not in PHASES:
        raise ValueError(f"phase={phase!r} is not a pipeline phase; use one of {PHASES}")

    def decorate(operator: Operator) -> Operator:
        OPERATORS[(phase, hardware)] = operator
        return operator

    return decorate


MIN_TIMED_STEPS = 3


def timed_steps(session: ProfilingSession, step: Callable[[], None], synchronize: Callable[[], None]) -> PhaseTiming:
    """Runs `step` warmup + steps times and summarises the timed steps.

    Once MIN_TIMED_STEPS steps are timed and the measurement has used its time budget, it
    stops early, so a slow phase costs seconds, not minutes, of profiling.
    """
    seconds = []
    began = time.perf_counter()
    for index in range(session.warmup + session.steps):
        start = time.perf_counter()
        step()
        synchronize()
        if index >= session.warmup:
            seconds.append(time.perf_counter() - start)
        session.progress.update(1)
        if len(seconds) >= MIN_TIMED_STEPS and time.perf_counter() - began > session.budget_s:
            session.progress.update(session.warmup + session.steps - index - 1)
            break
    return PhaseTiming.from_samples(seconds)


def no_sync() -> None:
    """Nothing to wait for: CPU work is finished when the call returns."""


@register_operator("cpu_batching", "cpu")
def cpu_batching(session: ProfilingSession) -> ThreadScaling:
    """Wall time per delivered batch of the C++ batcher at each thread count (1 / throughput)."""
    points = {}
    for threads in session.thread_counts:
        batcher = session.task.batcher(session.graph, session.fanouts, session.batch_size, route=0,
                                       num_threads=threads, seed=session.seed)
        needed = session.warmup + session.steps
        batches = itertools.chain.from_iterable(batcher.epoch(epoch) for epoch in itertools.count())
        seconds = []
        start = time.perf_counter()
        for index, _ in enumerate(itertools.islice(batches, needed)):
            now = time.perf_counter()
            if index >= session.warmup:
                seconds.append(now - start)
            start = now
            session.progress.update(1)
        batcher.close()
        points[threads] = PhaseTiming.from_samples(seconds)
    return ThreadScaling(points)


@register_operator("training", "cpu")
def cpu_training(session: ProfilingSession) -> ThreadScaling:
    """Training step time on the CPU with each number of intra-op threads."""
    saved_threads = torch.get_num_threads()
    points = {}
    try:
        for threads in session.thread_counts:
            torch.set_num_threads(threads)
            train_step = session.new_train_step(torch.device("cpu"))
            batches = session.cycled_batches()
            points[threads] = timed_steps(session, lambda: train_step(next(batches)), no_sync)
    finally:
        torch.set_num_threads(saved_threads)
    return ThreadScaling(points)


@register_operator("gpu_batching", "cuda")
def cuda_gpu_batching(session: ProfilingSession) -> PhaseTiming:
    """Route 1 batch time (T_UVA): sampling, feature and label gathering on the GPU over UVA, per batch."""
    with session.task.batcher(session.graph, session.fanouts, session.batch_size, route=1,
                              seed=session.seed) as batcher:
        batches = itertools.chain.from_iterable(batcher.epoch(epoch) for epoch in itertools.count())
        return timed_steps(session, lambda: next(batches), torch.cuda.synchronize)


@register_operator("dma", "cuda")
def cuda_dma(session: ProfilingSession) -> PhaseTiming:
    """Host-to-device copy of a pinned batch (T_DMA)."""
    pinned = [batch.pin_memory() for batch in session.sample_batches]
    batches = itertools.cycle(pinned)
    return timed_steps(session, lambda: next(batches).to("cuda", non_blocking=True), torch.cuda.synchronize)


@register_operator("training", "cuda")
def cuda_training(session: ProfilingSession) -> PhaseTiming:
    """Training step time on the GPU for batches already in device memory (T_M)."""
    train_step = session.new_train_step(torch.device("cuda"))
    on_device = [batch.to("cuda") for batch in session.sample_batches]
    batches = itertools.cycle(on_device)
    return timed_steps(session, lambda: train_step(next(batches)), torch.cuda.synchronize)
