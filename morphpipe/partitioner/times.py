"""PhaseTimes: the per-batch phase times of one machine configuration, as the planner uses them.

A Profile stores measurements; PhaseTimes fixes the thread counts and reads off the numbers
the lower bound, Eq. 6 and the simulator need: T_CB (CPU batching per batch at P threads,
counted as throughput), T_GB (UVA batching), T_DMA and T_M, each with its coefficient of
variation (for CPU batching, the spread of one thread's batch, measured at the fewest
threads). On a CPU-only machine T_GB and T_DMA are None and T_M is the CPU training step at
`train_threads` threads. With features on disk, `disk_read_s` is the time a Route-0 batch's cache
misses hold the disk (0: every row from RAM), for the host cache size and the store's `io_threads` it was read at,
and `read_cpu_s` the CPU time those reads take on the cores. The I/O threads' work lands on the batching side's
cores: a batching thread waits for its batch's reads while the disk serves them, and its core serves the reads'
system calls meanwhile, so T_CB includes only the CPU time beyond that wait (`cpu_beyond_the_wait`); the training
threads keep their cores (CPU-only: P + Q cores). Charging all of it after the wait put papers100m-like's epoch
at 499 s against 351 s measured, whose reads held the disk for 95% of it.

Route 1 (the GPU batcher) gathers the input rows its GPU cache does not hold through the same feature store: its
misses hold the same disk for `gpu_read_s` per batch (0: features in RAM, or a profile whose T_GB still holds its
reads), before the batch's GPU work, T_GB, which then counts the GPU's and the PCIe link's time alone. The executor
thread that waits for those reads serves their system calls, so only the CPU time beyond the wait lengthens T_GB.
"""
from __future__ import annotations

from dataclasses import dataclass

from morphpipe.profiler.profile import PhaseTiming, Profile


def cpu_beyond_the_wait(read_s: float, read_cpu_s: float) -> float:
    """The CPU time a batch's reads (`read_cpu_s` in all) still take once its batching thread's wait for them
    (`read_s`, the disk's time) is over: the waiting thread's core serves them during the wait."""
    return max(0.0, read_cpu_s - read_s)


@dataclass(frozen=True)
class PhaseTimes:
    """Per-batch phase times (seconds) and their coefficients of variation for one configuration."""

    num_batches: int
    cpu_batch_s: float
    cpu_threads: int
    train_s: float
    gpu_batch_s: float | None = None
    dma_s: float | None = None
    cpu_batch_cv: float = 0.0
    gpu_batch_cv: float = 0.0
    dma_cv: float = 0.0
    train_cv: float = 0.0
    train_threads: int | None = None
    device: str = "cuda"
    disk_read_s: float = 0.0
    io_threads: int | None = None
    read_cpu_s: float = 0.0
    gpu_read_s: float = 0.0

    def __post_init__(self) -> None:
        if self.num_batches < 1:
            raise ValueError(f"PhaseTimes.num_batches must be >= 1, got {self.num_batches!r}")
        if self.cpu_threads < 1:
            raise ValueError(f"PhaseTimes.cpu_threads must be >= 1, got {self.cpu_threads!r}")
        for name in ("cpu_batch_s", "train_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"PhaseTimes.{name} must be > 0 seconds, got {getattr(self, name)!r}")
        if self.device == "cuda" and not (self.gpu_batch_s and self.gpu_batch_s > 0 and self.dma_s and self.dma_s > 0):
            raise ValueError("PhaseTimes on device 'cuda' needs gpu_batch_s > 0 and dma_s > 0")
        if not self.disk_read_s >= 0:
            raise ValueError(f"PhaseTimes.disk_read_s must be >= 0 seconds, got {self.disk_read_s!r}")
        if not self.read_cpu_s >= 0:
            raise ValueError(f"PhaseTimes.read_cpu_s must be >= 0 seconds, got {self.read_cpu_s!r}")
        if not self.gpu_read_s >= 0:
            raise ValueError(f"PhaseTimes.gpu_read_s must be >= 0 seconds, got {self.gpu_read_s!r}")
        if self.gpu_read_s > 0 and self.device != "cuda":
            raise ValueError(f"PhaseTimes.gpu_read_s ({self.gpu_read_s!r}) is Route 1's reads; device "
                             f"{self.device!r} has no Route 1: give 0")
        if self.device == "cpu" and (self.train_threads is None or self.train_threads < 1):
            raise ValueError(f"PhaseTimes on device 'cpu' needs train_threads >= 1, got {self.train_threads!r}")

    @property
    def route_1_batch_s(self) -> float:
        """What the executor spends on one Route-1 batch: waiting out its misses' reads, then UVA batching."""
        if self.gpu_batch_s is None:
            raise ValueError("PhaseTimes.route_1_batch_s needs GPU phase times; this is a CPU-only configuration")
        return self.gpu_read_s + self.gpu_batch_s

    @property
    def cpu_batch_latency_s(self) -> float:
        """Time one CPU worker takes for one batch: P workers deliver one batch per T_CB together."""
        return self.cpu_batch_s * self.cpu_threads

    @classmethod
    def from_profile(cls, profile: Profile, cpu_threads: int | None = None,
                     train_threads: int | None = None, cache_bytes: int | None = None,
                     io_threads: int | None = None) -> PhaseTimes:
        """Reads the phase times at the given thread counts (default: every usable core batches).

        On a CPU-only profile both thread counts are needed: they split the cores. With features on disk,
        `cache_bytes` is the host cache of hot rows (default: the largest the profile's memory budget allows) and
        `io_threads` the feature store's I/O threads (default: those it was profiled with); both routes' misses are
        read at them.
        """
        cores = profile.cores
        threads = cores if cpu_threads is None else cpu_threads
        disk = profile.disk
        cache = None if disk is None else disk.cache_candidates()[-1] if cache_bytes is None else cache_bytes
        disk_read_s = 0.0 if disk is None else disk.read_s_per_batch(cache, io_threads)
        read_cpu_s = 0.0 if disk is None else disk.read_cpu_s_per_batch(cache, io_threads)
        batching = PhaseTiming.from_mean(profile.cpu_batching.per_batch_time(threads, cores)
                                         + cpu_beyond_the_wait(disk_read_s, read_cpu_s) / threads,
                                         profile.cpu_batching.fewest_threads_cv())
        if profile.device == "cpu":
            if train_threads is None:
                raise ValueError("PhaseTimes.from_profile on a CPU-only profile needs train_threads")
            assert profile.cpu_training is not None
            training = profile.cpu_training.timing(train_threads, cores)
            return cls(profile.num_batches, batching.mean_s, threads, training.mean_s,
                       cpu_batch_cv=batching.cv, train_cv=training.cv, train_threads=train_threads, device="cpu",
                       disk_read_s=disk_read_s, io_threads=io_threads, read_cpu_s=read_cpu_s)
        assert profile.gpu_batching is not None and profile.dma is not None and profile.training is not None
        gpu_read_s = 0.0 if disk is None else disk.read_s_per_batch(cache, io_threads, route=1)
        gpu_read_cpu_s = 0.0 if disk is None else disk.read_cpu_s_per_batch(cache, io_threads, route=1)
        return cls(
            profile.num_batches, batching.mean_s, threads, profile.training.mean_s,
            gpu_batch_s=profile.gpu_batching.mean_s + cpu_beyond_the_wait(gpu_read_s, gpu_read_cpu_s),
            dma_s=profile.dma.mean_s,
            cpu_batch_cv=batching.cv, gpu_batch_cv=profile.gpu_batching.cv, dma_cv=profile.dma.cv,
            train_cv=profile.training.cv, disk_read_s=disk_read_s, io_threads=io_threads, read_cpu_s=read_cpu_s,
            gpu_read_s=gpu_read_s,
        )

    def summary(self) -> dict[str, float | int | str | None]:
        """The numbers, JSON-ready (for plans and reports)."""
        return {
            "device": self.device, "num_batches": self.num_batches, "cpu_threads": self.cpu_threads,
            "train_threads": self.train_threads, "t_cb_s": self.cpu_batch_s, "t_gb_s": self.gpu_batch_s,
            "t_dma_s": self.dma_s, "t_m_s": self.train_s, "t_disk_s": self.disk_read_s,
            "io_threads": self.io_threads, "t_read_cpu_s": self.read_cpu_s, "t_gpu_disk_s": self.gpu_read_s,
        }
