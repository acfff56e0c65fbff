"""Runs on virtual devices keep time by sleeping: a run whose sleeps woke late measures the machine's load.

On a loaded machine (other processes holding every core) a sleeping phase's thread wakes late, which
stretches the epoch and reorders near-simultaneous events; such a run says nothing about the executor.
Measured under load 16 with three busy loops beside the tests: every run that disagreed with the
simulator had a sleep wake 20-35 ms late, while faithful runs woke at most one 4 ms scheduler tick late.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest

from morphpipe.executor.executor import EpochResult
from morphpipe.executor.virtual import VirtualTrainer, virtual_executor

# A run whose latest sleep woke more than this late is not compared.
WAKE_LIMIT_S = 0.010
ATTEMPTS = 3
Result = TypeVar("Result")


def faithful_runs(run: Callable[[], tuple[Result, VirtualTrainer]],
                  attempts: int = ATTEMPTS) -> Iterator[tuple[Result, VirtualTrainer]]:
    """The runs among `attempts` calls of `run` whose every sleep woke within WAKE_LIMIT_S (stop consuming to stop
    running); the test is skipped, with the lateness measured, when none was."""
    late = []
    for _ in range(attempts):
        result, trainer = run()
        if trainer.machine.latest_wake_s <= WAKE_LIMIT_S:
            yield result, trainer
        else:
            late.append(f"{trainer.machine.latest_wake_s * 1e3:.1f}")
    if len(late) == attempts:
        pytest.skip(f"the machine is too loaded to keep virtual time: in {attempts} runs a sleep woke "
                    f"{', '.join(late)} ms late (limit {WAKE_LIMIT_S * 1e3:.0f} ms)")


def virtual_epoch(*args, **kwargs) -> tuple[EpochResult, VirtualTrainer]:
    """One epoch of `virtual_executor(*args, **kwargs)`, and its trainer (which holds the machine's clock)."""
    executor, trainer = virtual_executor(*args, **kwargs)
    return executor.run_epoch(0), trainer
