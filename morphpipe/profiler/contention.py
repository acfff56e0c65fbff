"""Watching the machine while profiling: other processes' CPU use on our cores, steal time, load.

A profile taken while another process computes on the same cores describes that moment, not
the machine: the plan made from it (e.g. 1 batching + 1 training thread on a 2-core machine
with a co-tenant) is wrong once the co-tenant leaves. The monitor samples, in a background
thread, how much CPU time the rest of the machine used on the cores this process may run on
(system-wide busy time minus this process's own), how much the hypervisor stole, and the load
average; the profiler repeats a measurement taken under contention and records the verdict in
the profile, so a plan made on a busy machine is recognisable as such.
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import psutil

# Other processes using at least this share of our usable cores, on average, count as contention.
OTHER_CPU_SHARE = 0.25
# The hypervisor stealing at least this share of our cores' time counts as contention.
STEAL_SHARE = 0.10


@dataclass(frozen=True)
class CpuSample:
    """Cumulative CPU seconds at one instant: busy and stolen on our cores, and used by this process."""

    wall_s: float
    busy_s: float
    steal_s: float
    own_s: float


@dataclass(frozen=True)
class Contention:
    """What the machine did besides us while a measurement ran."""

    other_cores: float  # cores' worth of CPU other processes used on our cores, on average
    steal_share: float  # share of our cores' time stolen by the hypervisor
    load_average: float  # 1-minute load average at the end
    cores: int
    seconds: float

    @property
    def busy(self) -> bool:
        """True when other processes or the hypervisor took enough of our cores to distort timings."""
        return self.other_cores >= OTHER_CPU_SHARE * self.cores or self.steal_share >= STEAL_SHARE

    def describe(self) -> str:
        verdict = "busy machine" if self.busy else "quiet machine"
        return (f"{verdict}: other processes used {self.other_cores:.2f} of {self.cores} cores, "
                f"{self.steal_share:.0%} stolen, load {self.load_average:.2f} over {self.seconds:.1f} s")

    def to_dict(self) -> dict[str, float | int | bool]:
        return {**asdict(self), "busy": self.busy}


def sample_cpu(cpus: list[int]) -> CpuSample:
    """System-wide busy and steal seconds on `cpus`, and this process's own CPU seconds (children included)."""
    per_cpu = psutil.cpu_times(percpu=True)
    busy = steal = 0.0
    for index in cpus:
        times = per_cpu[index]
        steal += getattr(times, "steal", 0.0)
        busy += times.user + times.system + getattr(times, "nice", 0.0) + getattr(times, "irq", 0.0) \
            + getattr(times, "softirq", 0.0)
    own = psutil.Process().cpu_times()
    return CpuSample(time.monotonic(), busy, steal,
                     own.user + own.system + own.children_user + own.children_system)


def our_cpus() -> list[int]:
    """The CPUs this process may run on (its affinity), or all of them where affinity is unknown."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(psutil.cpu_count() or 1))


class ContentionMonitor:
    """Measures contention between `start()` and `stop()`; `sample` is injectable for tests."""

    def __init__(self, sample: Callable[[list[int]], CpuSample] = sample_cpu, cpus: list[int] | None = None,
                 load_average: Callable[[], float] = lambda: os.getloadavg()[0]) -> None:
        self.sample = sample
        self.cpus = cpus if cpus is not None else our_cpus()
        self.load_average = load_average
        self._first: CpuSample | None = None

    def start(self) -> ContentionMonitor:
        self._first = self.sample(self.cpus)
        return self

    def stop(self) -> Contention:
        """Contention since `start()`."""
        if self._first is None:
            raise RuntimeError("ContentionMonitor.stop() before start()")
        last = self.sample(self.cpus)
        wall = max(last.wall_s - self._first.wall_s, 1e-9)
        other = (last.busy_s - self._first.busy_s) - (last.own_s - self._first.own_s)
        stolen = last.steal_s - self._first.steal_s
        cores = len(self.cpus)
        return Contention(other_cores=max(0.0, other / wall), steal_share=max(0.0, stolen / (wall * cores)),
                          load_average=float(self.load_average()), cores=cores, seconds=wall)

    def measure(self, seconds: float) -> Contention:
        """Contention over the next `seconds` (a quick look before profiling starts)."""
        self.start()
        threading.Event().wait(seconds)
        return self.stop()
