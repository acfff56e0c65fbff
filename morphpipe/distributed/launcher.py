"""`--nproc N`: start N ranks of a command on this machine (torchrun's variables) and watch them.

When a rank exits with an error, the others get `grace_s` seconds to notice the broken
collective and stop on their own, then they are terminated: no rank outlives a failed one
for long, and the launcher names the first failing rank and how it ended (its exit status, or the
signal that killed it) and exits with that status (128 + N for signal N, as a shell reports it).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence

from morphpipe.distributed.env import free_port

POLL_S = 0.05


def rank_environment(rank: int, world: int, port: int, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment torchrun would give rank `rank` of `world` on this machine."""
    environ = dict(os.environ if base is None else base)
    environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    return environ


def launch(command: Sequence[str], nproc: int, *, grace_s: float = 5.0, env: Mapping[str, str] | None = None) -> int:
    """Runs `command` as ranks 0..nproc-1; returns 0, or the exit status of the first rank that failed."""
    if nproc < 1:
        raise ValueError(f"--nproc must be >= 1, got {nproc!r}")
    port = free_port()
    processes = [subprocess.Popen(list(command), env=rank_environment(rank, nproc, port, env))
                 for rank in range(nproc)]
    failed: tuple[int, int] | None = None
    deadline: float | None = None
    previous = _stop_on_sigterm()
    try:
        while [p.poll() for p in processes].count(None):  # poll every rank: `any` would stop at the first live one
            if failed is None:
                failed = first_failure(processes)
                if failed is not None:
                    deadline = time.monotonic() + grace_s
            if deadline is not None and time.monotonic() > deadline:
                _stop(processes)
                break
            time.sleep(POLL_S)
    except KeyboardInterrupt:  # Terminated too
        _stop(processes)
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    if failed is None:
        failed = first_failure(processes)
    if failed is not None:
        print(f"morphpipe: rank {failed[0]} of {nproc} {exit_description(failed[1])}; stopped the run",
              file=sys.stderr, flush=True)
        return failed[1] if failed[1] > 0 else 128 - failed[1]
    return 0


def first_failure(processes: Sequence[subprocess.Popen]) -> tuple[int, int] | None:
    """(rank, return code) of the rank to blame among those that ended badly: one a signal killed first (its
    peers then fail on the broken collective, often before the launcher's next poll), else the lowest rank."""
    failed = [(rank, p.returncode) for rank, p in enumerate(processes) if p.returncode not in (None, 0)]
    return min(failed, key=lambda item: (item[1] >= 0, item[0]), default=None)


def exit_description(returncode: int) -> str:
    """How a rank ended, from its Popen return code: 'exited with status N' or 'was killed by SIGKILL (signal 9)'."""
    if returncode >= 0:
        return f"exited with status {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = "an unknown signal"
    return f"was killed by {name} (signal {-returncode})"


class Terminated(KeyboardInterrupt):
    """The launcher was sent SIGTERM: its ranks are stopped too."""


def _stop_on_sigterm():
    """Turns SIGTERM into `Terminated` (main thread only), so the ranks are not left running; the old handler."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def terminated(signum, frame):
        raise Terminated("terminated (SIGTERM)")

    return signal.signal(signal.SIGTERM, terminated)


def _stop(processes: Sequence[subprocess.Popen]) -> None:
    """SIGTERM to the ranks still running, SIGKILL to those still there a second later."""
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    end = time.monotonic() + 1.0
    for process in processes:
        try:
            process.wait(timeout=max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
