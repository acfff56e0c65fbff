"""A process's resident memory (/proc/PID/status) and its peak over a block of work, sampled in a thread: what the
memory budget must hold beside the feature cache is measured, not guessed."""
from __future__ import annotations

import os
import threading

from morphpipe.ops.cpu_memory import release_idle_cpu_memory

# VmRSS and its three parts in /proc/PID/status: anonymous (heap, tensors, stacks), file-backed (memory-mapped
# files, shared libraries) and shared memory.
STATUS_FIELDS = {"VmRSS": "rss", "RssAnon": "anon", "RssFile": "file", "RssShmem": "shmem"}


def resident(pid: int | None = None) -> dict[str, int]:
    """Resident bytes of process `pid` (default: this one) now: total ("rss") and its "anon", "file" and "shmem"
    parts; empty where the system has no /proc/PID/status (not Linux)."""
    found = {}
    try:
        with open(f"/proc/{pid or os.getpid()}/status", encoding="ascii") as status:
            for line in status:
                name, _, rest = line.partition(":")  # "RssAnon:\t  1234 kB"
                if name in STATUS_FIELDS:
                    found[STATUS_FIELDS[name]] = int(rest.split()[0]) * 1024  # the kernel reports kB
    except FileNotFoundError:
        return {}
    return found


class PeakResident:
    """The peak of each `resident` measure while the block runs, sampled every `interval_s` in a thread (and at both
    ends); `growth(measure)` is the peak less the value on entry. Measuring this process, it first releases the
    CPU memory kept for reuse (`morphpipe.ops.cpu_memory`), so what the block needs shows as growth."""

    def __init__(self, interval_s: float = 0.2, pid: int | None = None) -> None:
        self.interval_s = interval_s
        self.pid = pid
        self.start: dict[str, int] = {}
        self.peak: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="peak-resident", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def sample(self) -> None:
        for key, value in resident(self.pid).items():
            self.peak[key] = max(self.peak.get(key, 0), value)

    def growth(self, measure: str = "anon") -> int:
        """How far `measure` rose above its value on entry at its peak (0 where it was not measured)."""
        return max(0, self.peak.get(measure, 0) - self.start.get(measure, 0))

    def __enter__(self) -> PeakResident:
        if self.pid in (None, os.getpid()):
            release_idle_cpu_memory()  # blocks kept for reuse are resident already: the growth would miss them
        self.start = resident(self.pid)
        self.peak = dict(self.start)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()
