"""The native build's lock: an `flock` on a file in the build directory, released by the kernel when its holder dies.

torch's own build lock (`FileBaton`, a file created with O_EXCL and removed by its holder) outlives
a builder killed by SIGKILL or SIGTERM, and every later build then waits on it forever, silently.
This lock cannot be left behind; its file names the holder (PID, command, since when), so a
waiting process says who it waits for and for how long. Whoever holds it is the only builder, so a
torch lock file found then is a dead builder's and is removed, and a ninja that a killed builder
left running in the directory is waited for before the next build starts.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

LOCK_NAME = "morphpipe-build.lock"
TORCH_LOCK_NAME = "lock"  # torch.utils.cpp_extension's FileBaton in the build directory
REPORT_EVERY_S = 10.0
POLL_S = 0.1


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _own_command(limit: int = 200) -> str:
    """This process's command line on one line, as `ps` shows it, cut to `limit` characters."""
    try:
        words = Path("/proc/self/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        words = sys.argv
    command = " ".join(" ".join(words).split())
    return command if len(command) <= limit else command[:limit - 3] + "..."


def describe_holder(lock_path: Path) -> str:
    """Who holds the lock at `lock_path`, as its holder wrote it: "PID 12 (`morphpipe train ...`) since 10:41:03"."""
    try:
        holder = json.loads(lock_path.read_text())
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder["since"]))
        return f"PID {holder['pid']} (`{holder['command']}`) since {since}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a process that has not yet written its name"  # the holder is between taking the lock and writing


def _acquire(fd: int, lock_path: Path, report: Callable[[str], None], report_every_s: float) -> None:
    """Takes the exclusive flock on `fd`, saying every `report_every_s` seconds who holds it while waiting."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return
    except BlockingIOError:
        pass
    started = time.monotonic()
    next_report = started
    while True:
        now = time.monotonic()
        if now >= next_report:
            report(f"morphpipe: waiting for the native build in {lock_path.parent}, held by "
                   f"{describe_holder(lock_path)}; waited {now - started:.0f} s")
            next_report += report_every_s
        time.sleep(POLL_S)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            continue
    report(f"morphpipe: got the native build lock after {time.monotonic() - started:.0f} s")


def orphaned_builders(build_dir: Path) -> list[int]:
    """PIDs of ninja processes working in `build_dir` (Linux /proc): a killed builder's ninja runs on, orphaned."""
    target = str(build_dir.resolve())
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if (entry / "comm").read_text().strip() == "ninja" and os.readlink(entry / "cwd") == target:
                found.append(int(entry.name))
        except OSError:
            continue  # gone, or another user's
    return found


def _wait_for_orphans(build_dir: Path, report: Callable[[str], None], report_every_s: float) -> None:
    """Waits until no ninja left running by a killed builder writes into `build_dir`."""
    started = time.monotonic()
    next_report = started
    while pids := orphaned_builders(build_dir):
        now = time.monotonic()
        if now >= next_report:
            report(f"morphpipe: waiting for ninja (PID {', '.join(map(str, pids))}), left running in {build_dir} by "
                   f"a killed build, to finish; waited {now - started:.0f} s")
            next_report += report_every_s
        time.sleep(POLL_S)


@contextlib.contextmanager
def build_lock(build_dir: Path, *, report: Callable[[str], None] = _stderr,
               report_every_s: float = REPORT_EVERY_S) -> Iterator[None]:
    """Holds the build lock of `build_dir` for the block; a dead holder's lock is free at once.

    While it waits it reports who holds the lock and for how long, every `report_every_s` seconds.
    """
    build_dir.mkdir(parents=True, exist_ok=True)
    lock_path = build_dir / LOCK_NAME
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        _acquire(fd, lock_path, report, report_every_s)
        holder = json.dumps({"pid": os.getpid(), "command": _own_command(), "since": time.time()})
        os.ftruncate(fd, 0)
        os.pwrite(fd, holder.encode(), 0)
        _wait_for_orphans(build_dir, report, report_every_s)
        torch_lock = build_dir / TORCH_LOCK_NAME
        if torch_lock.exists():
            torch_lock.unlink(missing_ok=True)
            report(f"morphpipe: removed {torch_lock}, the lock of a native build that was killed")
        yield
        os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # releases the flock
