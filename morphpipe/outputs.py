"""Output paths: checked before any work, built beside the old result and swapped in at the end.

Every command that writes or replaces a result (datasets, plans, profiles, stats, plots,
checkpoints) goes through `replacing_file` or `replacing_directory`: the new result is written
under a hidden sibling name (`.NAME.partial-PID`), flushed to disk, then renamed over the old one
in one step, so a command that fails or is interrupted at any point leaves the previous result
byte-identical and removes its partial files. A process killed with SIGKILL (or a power cut)
cannot clean up: it may leave a `.NAME.partial-PID` entry beside the result, never a damaged result;
the next replacement of that result (or `remove_stale_partials`) deletes the entries of dead PIDs.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import re
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# Test hook: when set to a file path, a replacement writes the target's path there and waits (up to
# a minute) just before swapping the new result in, so tests can interrupt it at that point;
# STALL_ONLY_ENV, when also set, limits this to targets with that file name.
STALL_BEFORE_REPLACE_ENV = "MORPHPIPE_TEST_STALL_BEFORE_REPLACE"
STALL_ONLY_ENV = "MORPHPIPE_TEST_STALL_ONLY"
_STALL_SECONDS = 60.0
_RENAME_EXCHANGE = 2  # renameat2 flag (Linux >= 3.15): swap two paths atomically
_AT_FDCWD = -100


class OutputPathError(ValueError):
    """An output path that cannot receive the result; the message names the option, the path and the fix."""

    def __init__(self, option: str, path: Path, problem: str, fix: str):
        super().__init__(f"{option} {path}: {problem}; fix: {fix}")
        self.option = option
        self.path = path

    def __reduce__(self):
        return _rebuild_output_error, (str(self), self.option, self.path)


def _rebuild_output_error(message: str, option: str, path: Path) -> OutputPathError:
    error = OutputPathError.__new__(OutputPathError)
    ValueError.__init__(error, message)
    error.option, error.path = option, path
    return error


def check_output_file(path: str | os.PathLike, option: str = "output") -> Path:
    """`path` as a file the result can replace: not a directory, and under a writable directory (or none yet)."""
    target = Path(path).expanduser()
    if target.is_dir():
        raise OutputPathError(option, target, "is a directory, expected a file path",
                              f"give a file path, e.g. {target / 'result'}{target.suffix or '.json'}")
    _check_parent(target, option)
    return target


def check_output_dir(path: str | os.PathLike, option: str = "output") -> Path:
    """`path` as a directory the result can replace: not a file, and under a writable directory (or none yet)."""
    target = Path(path).expanduser()
    if target.exists() and not target.is_dir():
        raise OutputPathError(option, target, "exists and is not a directory", "choose another path")
    _check_parent(target, option)
    return target


def _check_parent(target: Path, option: str) -> None:
    """The nearest existing ancestor of `target` is a directory this process may create entries in."""
    for ancestor in target.absolute().parents:
        if not ancestor.exists():
            continue
        if not ancestor.is_dir():
            raise OutputPathError(option, target, f"{ancestor} is a file, so nothing can be created under it",
                                  "choose a path whose parent is a directory")
        if not os.access(ancestor, os.W_OK | os.X_OK):
            raise OutputPathError(option, target, f"directory {ancestor} is not writable",
                                  "choose a writable location")
        return


def partial_path(target: Path) -> Path:
    """The hidden sibling a new result is built in (the suffix is kept: matplotlib picks the format by it)."""
    return target.with_name(f".{target.stem}.partial-{os.getpid()}{target.suffix}")


def remove_stale_partials(target: str | os.PathLike) -> list[Path]:
    """Deletes the partial entries (`.NAME.partial-PID`, `.NAME.old-PID`) of `target` left by dead processes.

    Only names of exactly this pattern for this target are touched, and only when no process with
    that PID exists (a live one, even of another user, keeps its entry). Returns what was removed.
    """
    target = Path(target).expanduser()
    if not target.parent.is_dir():
        return []
    pattern = re.compile(rf"\.{re.escape(target.stem)}\.partial-(\d+){re.escape(target.suffix)}|"
                         rf"\.{re.escape(target.name)}\.old-(\d+)")
    removed = []
    for entry in target.parent.iterdir():
        match = pattern.fullmatch(entry.name)
        if match is None or _pid_alive(int(match.group(1) or match.group(2))):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        removed.append(entry)
    return removed


def _pid_alive(pid: int) -> bool:
    """Whether a process with `pid` exists (this one included)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # another user's process (or a PID beyond the system's range: never ours to judge)
    return True


@contextmanager
def replacing_file(path: str | os.PathLike, option: str = "output") -> Iterator[Path]:
    """Yields a temporary path to write the result to; on success it replaces `path` atomically.

    On any exception (KeyboardInterrupt included) the temporary file is removed and `path` is untouched.
    """
    target = check_output_file(path, option)
    temporary = partial_path(target)
    with _errors_named_by_target(target, temporary, option):
        target.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_partials(target)
        try:
            yield temporary
            if not temporary.is_file():
                raise RuntimeError(f"{option} {target}: nothing was written to {temporary}")
            _fsync(temporary)
            _stall_for_tests(target)
            os.replace(temporary, target)
            _fsync_directory(target.parent)
        finally:
            temporary.unlink(missing_ok=True)


def write_text_atomic(path: str | os.PathLike, text: str, option: str = "output") -> Path:
    """Writes `text` (UTF-8) to `path` through `replacing_file`; returns the path."""
    with replacing_file(path, option) as temporary:
        temporary.write_text(text, encoding="utf-8")
    return Path(path).expanduser()


@contextmanager
def replacing_directory(path: str | os.PathLike, option: str = "output") -> Iterator[Path]:
    """Yields an empty staging directory beside `path`; on success it takes the place of `path` in one step.

    The old directory (if any) is swapped out atomically (Linux renameat2 RENAME_EXCHANGE; elsewhere two
    renames, with a moment where `path` is absent) and then deleted. On any exception the staging
    directory is removed and `path` is untouched. The caller decides beforehand whether `path` may be replaced.
    """
    target = check_output_dir(path, option)
    staging = partial_path(target)
    with _errors_named_by_target(target, staging, option):
        target.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_partials(target)
        if staging.exists():
            shutil.rmtree(staging)
        staging.mkdir()
        try:
            yield staging
            for entry in staging.iterdir():
                if entry.is_file():
                    _fsync(entry)
            _fsync_directory(staging)
            _stall_for_tests(target)
            _swap_in(staging, target)
            _fsync_directory(target.parent)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)


@contextmanager
def _errors_named_by_target(target: Path, partial: Path, option: str) -> Iterator[None]:
    """Reports a failure to create or write the result (its partial file, or the directories above it) under the
    user's path and option, not the hidden partial name; other errors pass through."""
    try:
        yield
    except OSError as error:
        if error.filename is None:
            raise
        failed = Path(os.fsdecode(error.filename)).absolute()
        ours = partial.absolute()
        if failed != ours and ours not in failed.parents and failed not in target.absolute().parents:
            raise
        raise OutputPathError(option, target, f"cannot be written ({error.strerror or error})",
                              "choose a location this process can write to") from error


def _swap_in(staging: Path, target: Path) -> None:
    """Puts `staging` at `target`; the replaced directory ends up at `staging` (removed by the caller)."""
    if not target.exists():
        os.rename(staging, target)
        return
    if _rename_exchange(staging, target):
        return
    aside = target.with_name(f".{target.name}.old-{os.getpid()}")
    os.rename(target, aside)
    os.rename(staging, target)
    os.rename(aside, staging)


def _rename_exchange(first: Path, second: Path) -> bool:
    """Swaps two paths atomically with renameat2; False where the call is unavailable."""
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return False
    libc = ctypes.CDLL(libc_name, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return False
    result = renameat2(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE)
    return result == 0


def _fsync(path: Path) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def _fsync_directory(path: Path) -> None:
    """Makes a rename in `path` durable (a no-op where directories cannot be opened)."""
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


def _stall_for_tests(target: Path) -> None:
    """The STALL_BEFORE_REPLACE_ENV test hook: announce the target, then wait to be interrupted."""
    marker = os.environ.get(STALL_BEFORE_REPLACE_ENV)
    only = os.environ.get(STALL_ONLY_ENV)
    if not marker or (only and target.name != only):
        return
    Path(marker).write_text(str(target), encoding="utf-8")
    time.sleep(_STALL_SECONDS)
