"""Eq. 6 and the lower bound by hand where training is the binding term (the other hand cases tie it)."""
from __future__ import annotations

import math

import pytest

from morphpipe.partitioner import PhaseTimes
from morphpipe.partitioner.bounds import best_eq6, eq6, lower_bound


def test_eq6_and_lower_bound_when_training_binds() -> None:
    times = PhaseTimes(100, cpu_batch_s=3.0, cpu_threads=1, train_s=2.0, gpu_batch_s=1.0, dma_s=1.0)
    # x = 1: 100 * (1 * 1 / 2 + max(1 / 2, 2, (3 - 1) / 2)) = 100 * 2.5
    assert eq6(times, 1.0) == pytest.approx(250.0)
    # x = 3: 100 * (3 / 4 + max(1 / 4, 2, 0)) = 275; all on the GPU: 100 * (1 + 2)
    assert eq6(times, 3.0) == pytest.approx(275.0)
    assert eq6(times, math.inf) == pytest.approx(300.0)
    # y = 1/(1+x): C'/n = (1 - y) + max(y, 2, 4y - 1) = max(1, 3 - y, 3y), least at y = 3/4 (x = 1/3)
    best = best_eq6(times)
    assert best.cpu_fraction == pytest.approx(0.75)
    assert best.value_s == pytest.approx(225.0)
    # LB(50) = max(50 * 3, 50 * 1 + 50 * 1, 50 * 1 + 100 * 2) = 250
    assert lower_bound(times, 50) == pytest.approx(250.0)
