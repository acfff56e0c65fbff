"""The Scheduler: evaluates plans for one machine configuration in the simulator.

It draws one epoch's phase durations (seeded) and simulates any CPU:GPU split, or a CPU-only
core split, with the SimPy model ("simpy", the reference, which also yields the trace) or its
fast twin ("fast", for searches); both give the same numbers.
"""
from __future__ import annotations

import numpy as np
import psutil

from morphpipe.partitioner.partitioner import Split, buffer_sizes
from morphpipe.partitioner.times import PhaseTimes
from morphpipe.profiler.profile import Profile
from morphpipe.scheduler.durations import Durations
from morphpipe.scheduler.fastsim import FastCpuOnly, FastDualBuffer
from morphpipe.scheduler.model import CpuOnlyModel, DualBufferModel
from morphpipe.scheduler.result import SimulationResult

ENGINES = ("simpy", "fast")
# Peak memory of simulating one batch of an epoch: tracemalloc measured 150-680 bytes per batch (drawn durations,
# per-batch records, the SimPy engine's trace included) for a planning sweep of 2,000 to 20,000 batches; rounded up.
SIMULATED_BATCH_BYTES = 1024


class Scheduler:
    """Simulates plans on one configuration (phase times + seed), SimPy or fast engine."""

    def __init__(self, times: PhaseTimes, seed: int = 0) -> None:
        check_simulation_fits(times.num_batches)
        self.times = times
        self.seed = seed
        self.durations = Durations.draw(times, seed)

    @classmethod
    def from_profile(cls, profile: Profile, seed: int = 0, cpu_threads: int | None = None,
                     train_threads: int | None = None, cache_bytes: int | None = None,
                     io_threads: int | None = None) -> Scheduler:
        """A scheduler for a profile at the given thread counts (default: every usable core batches) and, with
        features on disk, host cache size (default: the largest the memory budget allows) and feature store I/O
        threads (default: those it was profiled with)."""
        return cls(PhaseTimes.from_profile(profile, cpu_threads, train_threads, cache_bytes, io_threads), seed)

    def simulate(self, split: Split, *, engine: str = "simpy", trace: bool = False) -> SimulationResult:
        """One epoch of dual-buffer scheduling with this split."""
        _check_engine(engine)
        if self.times.device != "cuda":
            raise ValueError("Scheduler.simulate needs a CPU+GPU configuration; use simulate_cpu_only")
        if split.n_cpu + split.n_gpu != self.times.num_batches:
            raise ValueError(
                f"split has {split.n_cpu} + {split.n_gpu} batches, the profile {self.times.num_batches}; "
                "build the split with Partitioner.split"
            )
        model = DualBufferModel if engine == "simpy" else FastDualBuffer
        return model(self.times, split, self.durations, trace).run()

    def lower_bounds(self) -> np.ndarray:
        """Lower bounds on the simulated epoch for every n_cpu in [0, n], from this epoch's drawn durations.

        The CPU threads need sum(latency)/P for the Route-0 batches, then the last one still
        crosses PCIe and trains; the PCIe link carries every DMA and UVA batch, then one more
        training follows; the GPU runs every UVA batch and every training step; with features on
        disk, a CPU thread also waits out its batch's reads, and the disk serves every batch's reads
        (both routes') before the last one is built (or UVA-batched), crosses and trains; the executor
        waits out each Route-1 batch's reads and UVA batching in turn, then one step trains. No schedule
        of these durations beats the largest of these, so the planner can prune with it.
        """
        if self.times.device != "cuda":
            raise ValueError("Scheduler.lower_bounds needs a CPU+GPU configuration")
        d = self.durations
        n = self.times.num_batches
        n_cpu = np.arange(n + 1)
        reads = np.concatenate(([0.0], np.cumsum(d.disk))) if d.disk else np.zeros(n + 1)
        cpu = (np.concatenate(([0.0], np.cumsum(d.cpu_batch))) + reads) / self.times.cpu_threads
        cpu[1:] += min(d.dma) + min(d.train)
        gpu_reads = (np.concatenate(([0.0], np.cumsum(d.gpu_disk))) if d.gpu_disk else np.zeros(n + 1))[n - n_cpu]
        cpu_tail = min(d.cpu_batch) + min(d.dma) + min(d.train)
        gpu_tail = min(d.gpu_batch) + min(d.train) if d.gpu_batch else cpu_tail
        disk = reads.copy()
        disk[1:] += cpu_tail  # the last Route-0 read, then its batch is built, crosses and trains
        last = np.where(n_cpu == 0, gpu_tail, np.where(n_cpu == n, cpu_tail, min(cpu_tail, gpu_tail)))
        disk = np.maximum(disk, reads + gpu_reads + last)  # the last read of either route, then its batch's rest
        dma = np.concatenate(([0.0], np.cumsum(d.dma)))
        uva = np.concatenate(([0.0], np.cumsum(d.gpu_batch)))[n - n_cpu]
        pcie = dma + uva + min(d.train)
        gpu = uva + sum(d.train)
        executor = gpu_reads + uva + min(d.train)
        return np.maximum.reduce([cpu, pcie, gpu, disk, executor])

    def all_cpu(self, gbs: int = 10, *, engine: str = "simpy", trace: bool = False) -> SimulationResult:
        """The all-CPU baseline: every batch on Route 0, the naive three-stage pipeline (SALIENT-like)."""
        n = self.times.num_batches
        cbs, gbs = buffer_sizes(n, 0, gbs)
        return self.simulate(Split(n, 0, cbs, gbs), engine=engine, trace=trace)

    def all_gpu(self, gbs: int = 10, *, engine: str = "simpy", trace: bool = False) -> SimulationResult:
        """The all-GPU baseline: UVA batching then training, no overlap (DUCATI-like)."""
        n = self.times.num_batches
        return self.simulate(Split(0, n, 0, gbs), engine=engine, trace=trace)

    def simulate_cpu_only(self, cbs: int, shared_core: bool = False, *, engine: str = "simpy",
                          trace: bool = False) -> SimulationResult:
        """One epoch on a CPU-only machine: batching threads feed a buffer of `cbs`, training threads train."""
        _check_engine(engine)
        if self.times.device != "cpu":
            raise ValueError("Scheduler.simulate_cpu_only needs a CPU-only configuration")
        if cbs < 1:
            raise ValueError(f"cbs (CPU buffer size) must be >= 1, got {cbs!r}")
        model = CpuOnlyModel if engine == "simpy" else FastCpuOnly
        return model(self.times, cbs, self.durations, shared_core, trace).run()


def _check_engine(engine: str) -> None:
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")


def check_simulation_fits(num_batches: int) -> None:
    """Refuses, before drawing anything, an epoch of more batches than this machine's free memory can simulate."""
    needed = num_batches * SIMULATED_BATCH_BYTES
    available = psutil.virtual_memory().available
    if needed > available:
        raise ValueError(f"simulating an epoch of {num_batches:,} batches needs about {needed / 1e9:,.1f} GB of memory "
                         f"({SIMULATED_BATCH_BYTES} bytes per batch), {available / 1e9:,.1f} GB are available; fix: "
                         "plan fewer batches per epoch (a larger batch size, fewer seeds) or use a machine with more "
                         "memory")
