"""A cluster of virtual ranks: each rank the real Executor on virtual devices, steps synchronised like DDP.

Every rank of a `ClusterPrediction` runs, in its own thread, the Executor on virtual devices
whose phases sleep for the durations the simulator drew for that rank's plan
(morphpipe.executor.virtual). Each training step ends at a barrier shared by all ranks, the
stand-in for DDP's gradient all-reduce: no rank starts step k+1 before every rank finished
step k. The measured cluster epoch (the slowest rank's) can then be held against the
prediction, for even and weighted splits of heterogeneous ranks, on any machine.
"""
from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from morphpipe.distributed.cluster import ClusterPrediction, local_profile
from morphpipe.executor.devices import Step
from morphpipe.executor.executor import EpochResult
from morphpipe.executor.virtual import virtual_executor
from morphpipe.partitioner.times import PhaseTimes
from morphpipe.profiler.profile import Profile
from morphpipe.sampling.minibatch import MiniBatch
from morphpipe.scheduler.scheduler import Scheduler

BARRIER_TIMEOUT_S = 60.0


class SynchronisedStep:
    """A training step that returns only once every rank has finished the same step (the all-reduce)."""

    def __init__(self, step: Step, barrier: threading.Barrier) -> None:
        self.step = step
        self.barrier = barrier

    def __call__(self, batch: MiniBatch) -> torch.Tensor:
        loss = self.step(batch)
        self.barrier.wait(BARRIER_TIMEOUT_S)
        return loss


@dataclass(frozen=True)
class VirtualClusterEpoch:
    """One measured epoch of a virtual cluster: every rank's epoch and the prediction."""

    rank_epoch_s: tuple[float, ...]
    predicted_epoch_s: float

    @property
    def epoch_s(self) -> float:
        return max(self.rank_epoch_s)


def run_virtual_cluster(profiles: Sequence[Profile], prediction: ClusterPrediction) -> VirtualClusterEpoch:
    """Runs one epoch of every rank of `prediction` (one profile per rank) on virtual devices, in step."""
    split = prediction.split
    world = split.world_size
    barrier = threading.Barrier(world)
    start = threading.Barrier(world)
    executors = []
    for rank, (profile, plan) in enumerate(zip(profiles, prediction.plans)):
        local = local_profile(profile, split.local_batches[rank], split.steps)
        times = PhaseTimes.from_profile(local, plan.cpu_threads, plan.train_threads)
        durations = Scheduler(times, plan.seed).durations
        executor, trainer = virtual_executor(times, plan.split, durations, batch_size=split.local_batches[rank],
                                             seed=plan.seed, shares_cores=plan.shares_cores)
        executor.step = SynchronisedStep(trainer, barrier)
        executors.append(executor)
    results: list[EpochResult | None] = [None] * world
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        try:
            start.wait(BARRIER_TIMEOUT_S)
            results[rank] = executors[rank].run_epoch(0)
        except BaseException as error:  # noqa: BLE001 - re-raised below, after the other ranks stopped
            errors.append(error)
            barrier.abort()

    threads = [threading.Thread(target=run, args=(rank,), name=f"virtual-rank-{rank}") for rank in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return VirtualClusterEpoch(tuple(r.epoch_s for r in results if r is not None), prediction.epoch_s)
