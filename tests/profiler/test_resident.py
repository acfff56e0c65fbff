"""The resident-memory sampler the profiler measures a training step's peak with."""
from __future__ import annotations

import subprocess
import sys

import pytest

from morphpipe.profiler.resident import resident

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/PID/status")


def test_resident_reads_the_total_and_its_parts():
    now = resident()
    assert set(now) == {"rss", "anon", "file", "shmem"}
    assert now["rss"] >= now["anon"] > 0


# Each peak is measured in a fresh interpreter: resident memory is the whole process's, and in the full suite's
# process (CI at 3686699) the 96 MiB block grew the anonymous peak by only 1.6 MiB and 4 KiB, after some earlier
# test's state: not understood yet, and not what these tests cover.
PEAK_SCRIPT = """
import sys, time
import torch
from morphpipe.ops.cpu_memory import reuse_cpu_memory
from morphpipe.profiler.resident import PeakResident
size = 96 << 20
if sys.argv[1] == "kept-idle":  # blocks kept for reuse are resident before the block starts
    reuse_cpu_memory()
    kept = torch.ones(size // 4)
    del kept
with PeakResident(interval_s=0.001) as peak:
    block = torch.ones(size // 4)  # written, so resident
    time.sleep(0.2)  # for the sampler's thread, even on a loaded machine
    del block
print(peak.growth("anon"), peak.growth("no-such-measure"))
"""


def peak_growth(case: str) -> tuple[int, int]:
    done = subprocess.run([sys.executable, "-c", PEAK_SCRIPT, case], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    anon, other = done.stdout.split()
    return int(anon), int(other)


def test_the_peak_of_a_block_counts_memory_freed_before_it_ends():
    anon, other = peak_growth("fresh")
    assert anon >= (96 << 20) * 0.9
    assert other == 0


def test_the_peak_counts_memory_the_reusing_allocator_kept_idle():
    assert peak_growth("kept-idle")[0] >= (96 << 20) * 0.9
