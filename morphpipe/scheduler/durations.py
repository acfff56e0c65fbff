"""Stochastic phase durations: gamma-distributed with the profile's mean and coefficient of variation.

A gamma law with shape 1/cv^2 and scale mean*cv^2 has exactly that mean and CV, and stays
positive; with cv = 0 every duration is the mean. One epoch's durations are drawn once, per
phase from its own seeded stream and indexed by the order the phase happens in (the j-th CPU
batch, the j-th transfer, ...), so both simulators, and every split the planner compares,
see the same numbers (common random numbers). A Route-0 batch's disk reads (features on disk) take
the same time for every batch: the misses of a static cache vary little from batch to batch; so do a Route-1
batch's (`gpu_disk`, indexed by the j-th GPU batch).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from morphpipe.partitioner.times import PhaseTimes


def draw(mean_s: float, cv: float, count: int, rng: np.random.Generator) -> list[float]:
    """`count` durations with the given mean and coefficient of variation (constant when cv = 0)."""
    if cv == 0.0:
        return [mean_s] * count
    return rng.gamma(1.0 / cv**2, mean_s * cv**2, count).tolist()


@dataclass(frozen=True)
class Durations:
    """One epoch's phase durations, in the order each phase happens."""

    cpu_batch: list[float]
    gpu_batch: list[float]
    dma: list[float]
    train: list[float]
    disk: list[float]  # the j-th CPU batch's cache misses hold the disk this long (empty: features in RAM)
    gpu_disk: list[float] = field(default_factory=list)  # the j-th GPU batch's misses (empty: none modelled)

    @classmethod
    def draw(cls, times: PhaseTimes, seed: int) -> Durations:
        """Draws every phase for `times.num_batches` batches; CPU batching as one worker's latency."""
        n = times.num_batches
        streams = [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(4)]
        return cls(
            cpu_batch=draw(times.cpu_batch_latency_s, times.cpu_batch_cv, n, streams[0]),
            gpu_batch=draw(times.gpu_batch_s, times.gpu_batch_cv, n, streams[1]) if times.gpu_batch_s else [],
            dma=draw(times.dma_s, times.dma_cv, n, streams[2]) if times.dma_s else [],
            train=draw(times.train_s, times.train_cv, n, streams[3]),
            disk=[times.disk_read_s] * n if times.disk_read_s > 0 else [],
            gpu_disk=[times.gpu_read_s] * n if times.gpu_read_s > 0 else [],
        )
