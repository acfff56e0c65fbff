"""The resident-memory sampler the profiler measures a training step's peak with."""
from __future__ import annotations

import sys
import time

import pytest
import torch

from morphpipe.ops.cpu_memory import reuse_cpu_memory
from morphpipe.profiler.resident import PeakResident, resident

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/PID/status")


def test_resident_reads_the_total_and_its_parts():
    now = resident()
    assert set(now) == {"rss", "anon", "file", "shmem"}
    assert now["rss"] >= now["anon"] > 0


def test_the_peak_of_a_block_counts_memory_freed_before_it_ends():
    size = 96 << 20
    with PeakResident(interval_s=0.001) as peak:
        block = torch.ones(size // 4)  # written, so resident
        time.sleep(0.2)  # for the sampler's thread, even on a loaded machine
        del block
    assert peak.growth("anon") >= size * 0.9
    assert peak.growth("no-such-measure") == 0


def test_the_peak_counts_memory_the_reusing_allocator_kept_idle():
    # Blocks kept for reuse are resident before the block starts; the peak must still see the block's need.
    reuse_cpu_memory()
    size = 96 << 20
    kept = torch.ones(size // 4)
    del kept  # now idle in the reusing allocator, still resident
    with PeakResident(interval_s=0.001) as peak:
        block = torch.ones(size // 4)
        time.sleep(0.2)
        del block
    assert peak.growth("anon") >= size * 0.9
