"""A clean stop on SIGTERM: the request is noted, and training honours it at the next safe point.

Schedulers end a job with SIGTERM and, some seconds later, SIGKILL (Slurm's KillWait and
Kubernetes' termination grace period are 30 s by default). `StopRequest.on_sigterm` turns SIGTERM
into a flag; the trainer checks it after every step and at every epoch's end. Mid epoch, when a
checkpoint directory was given and the rest of the epoch (its steps and validation, estimated from
the steps so far) fits in `grace_s` from the signal, it finishes the epoch and checkpoints it;
otherwise it stops after the step in flight and checkpoints the steps applied so far (a mid-epoch
checkpoint, `morphpipe.executor.partial_epoch`: the resumed run trains only the rest of that epoch).
Without a checkpoint directory the unfinished epoch is dropped. At an epoch's end it stops once that
epoch's checkpoint is written. Either way it raises `TrainingStopped`, whose message says where to
resume from; the CLI exits with `STOP_EXIT_STATUS`.
"""
from __future__ import annotations

import math
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from morphpipe.executor.partial_epoch import EpochProgress

STOP_EXIT_STATUS = 128 + signal.SIGTERM  # 143: the status a shell reports for a job ended by SIGTERM
DEFAULT_GRACE_S = 20.0  # finish an epoch after SIGTERM only if it ends this soon: 10 s short of the usual 30 s


class StopRequest:
    """A stop asked for from outside (a signal, or `request`): `reason` says by what; checked with `requested`.

    `grace_s` is how long after the request the job may still run to finish its epoch (0: stop at the next step).
    """

    def __init__(self, grace_s: float = DEFAULT_GRACE_S) -> None:
        if not (math.isfinite(grace_s) and grace_s >= 0):
            raise ValueError(f"grace_s={grace_s!r}: give the seconds a stop may wait for the epoch's end, >= 0")
        self._event = threading.Event()
        self.reason = ""
        self.grace_s = float(grace_s)
        self.requested_at: float | None = None  # time.monotonic() of the first request

    def request(self, reason: str) -> None:
        self.reason = self.reason or reason
        if self.requested_at is None:
            self.requested_at = time.monotonic()
        self._event.set()

    def grace_left_s(self) -> float:
        """Seconds left of the grace period (the full period before any request)."""
        if self.requested_at is None:
            return self.grace_s
        return self.grace_s - (time.monotonic() - self.requested_at)

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    @contextmanager
    def on_sigterm(self) -> Iterator[StopRequest]:
        """Inside the block SIGTERM requests a stop instead of ending the process (main thread only)."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = signal.signal(signal.SIGTERM, lambda signum, frame: self.request("SIGTERM"))
        try:
            yield self
        finally:
            signal.signal(signal.SIGTERM, previous)


class TrainingStopped(RuntimeError):
    """Training ended early on a stop request; the message says what was kept and how to resume."""

    def __init__(self, message: str, epochs_done: int) -> None:
        super().__init__(message)
        self.epochs_done = epochs_done


class StepStop(Exception):
    """Raised after a step to leave an epoch on a stop request; `steps` is how many of its steps ran. The executor
    adds the epoch's `progress` (what was applied, to checkpoint and continue from) as it passes through."""

    def __init__(self, steps: int) -> None:
        super().__init__(f"stop requested after {steps} steps")
        self.steps = steps
        self.progress: EpochProgress | None = None


def epoch_finish_estimate_s(steps_done: int, steps_total: int, elapsed_s: float, validation_s: float) -> float:
    """Seconds until an epoch with `steps_done` of `steps_total` steps run in `elapsed_s` is trained and validated,
    at the mean step time so far; infinite before the first step (nothing to estimate from)."""
    if steps_done <= 0:
        return math.inf
    return (steps_total - steps_done) * elapsed_s / steps_done + validation_s
