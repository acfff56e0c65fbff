"""The executor's background threads: one stop flag, the first failure forwarded to the caller, joined together.

Every thread the executor starts (the CPU buffer's feeder, the virtual devices' streams) runs
through a `ThreadGroup`. The first exception raised in any of them is kept, the stop flag is
set so the others wind down, and the caller's next wait re-raises that exception object
itself, so it keeps its type and its original traceback (the worker's frames come first).
Waits on the caller's thread poll every `POLL_S`, so a failure or a Ctrl-C is seen within
that time, never after a deadlock.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

POLL_S = 0.05
JOIN_TIMEOUT_S = 10.0


class Stopped(Exception):
    """Raised inside a worker when the group is stopping: the worker should just return."""


class ThreadGroup:
    """Threads of one epoch: a shared stop flag, the first failure kept for the caller, joined together."""

    def __init__(self, name: str = "morphpipe") -> None:
        self.name = name
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._failure: BaseException | None = None
        self._threads: list[threading.Thread] = []

    def start(self, target: Callable[[], None], name: str) -> threading.Thread:
        """Runs `target` on a new daemon thread whose exceptions are forwarded to the caller."""
        thread = threading.Thread(target=self._run, args=(target,), name=f"{self.name}-{name}", daemon=True)
        self._threads.append(thread)
        thread.start()
        return thread

    def _run(self, target: Callable[[], None]) -> None:
        try:
            target()
        except Stopped:
            pass
        except BaseException as error:  # noqa: BLE001 - forwarded to the caller, whatever it is
            self.fail(error)

    def fail(self, error: BaseException) -> None:
        """Keeps `error` if it is the first failure (and nobody asked to stop), then stops the group."""
        with self._lock:
            if self._failure is None and not self.stopping.is_set():
                self._failure = error
        self.stopping.set()

    @property
    def failure(self) -> BaseException | None:
        return self._failure

    def check(self) -> None:
        """Re-raises the first failure of any thread in the group, with its original traceback."""
        failure = self._failure
        if failure is not None:
            raise failure

    def check_stopping(self) -> None:
        """Inside a worker: raises `Stopped` once the group is stopping."""
        if self.stopping.is_set():
            raise Stopped

    def wait_until(self, ready: Callable[[], bool], condition: threading.Condition | None = None) -> None:
        """Blocks the caller until `ready()`; re-raises a worker failure as soon as there is one.

        With `condition` (held by the caller), waits on it between polls, else sleeps briefly.
        """
        while not ready():
            self.check()
            if self.stopping.is_set():
                raise RuntimeError(f"{self.name}: stopped while waiting; see the error raised before this one")
            if condition is not None:
                condition.wait(POLL_S)
            else:
                time.sleep(POLL_S / 50)

    def wait_event(self, event: threading.Event) -> None:
        """Blocks the caller until `event` is set; re-raises a worker failure as soon as there is one."""
        while not event.wait(POLL_S):
            self.check()
            if self.stopping.is_set():
                raise RuntimeError(f"{self.name}: stopped while waiting; see the error raised before this one")
        self.check()

    def stop_and_join(self, timeout_s: float = JOIN_TIMEOUT_S) -> None:
        """Sets the stop flag and joins every thread; a thread that does not end in time is an error."""
        self.stopping.set()
        deadline = time.monotonic() + timeout_s
        stuck = []
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                stuck.append(thread.name)
        self._threads = [thread for thread in self._threads if thread.is_alive()]
        if stuck:
            raise RuntimeError(f"executor threads did not stop within {timeout_s:g} s: {', '.join(stuck)}")
