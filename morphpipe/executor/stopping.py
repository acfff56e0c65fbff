"""A clean stop on SIGTERM: the request is noted, and training honours it at the next safe point.

Schedulers end a job with SIGTERM and, some seconds later, SIGKILL. `StopRequest.on_sigterm`
turns SIGTERM into a flag; the trainer checks it after every step and at every epoch's end: mid
epoch it drops the unfinished epoch (the checkpoint of the last completed one stays the resume
point), at an epoch's end it stops once that epoch's checkpoint is written. Either way it raises
`TrainingStopped`, whose message says where to resume from; the CLI exits with `STOP_EXIT_STATUS`.
"""
from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

STOP_EXIT_STATUS = 128 + signal.SIGTERM  # 143: the status a shell reports for a job ended by SIGTERM


class StopRequest:
    """A stop asked for from outside (a signal, or `request`): `reason` says by what; checked with `requested`."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason = ""

    def request(self, reason: str) -> None:
        self.reason = self.reason or reason
        self._event.set()

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
    """Raised after a step to leave an epoch on a stop request; `steps` is how many of its steps ran."""

    def __init__(self, steps: int) -> None:
        super().__init__(f"stop requested after {steps} steps")
        self.steps = steps
