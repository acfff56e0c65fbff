"""A killed native build never makes a later command hang, and the next build finishes a half-written directory.

The real compile takes minutes, so the children here run `native.load()` with torch's builder replaced at
its seam (`torch.utils.cpp_extension.load`) by a stand-in that behaves like it where it matters: it takes
torch's `FileBaton` lock file (and waits on it forever when it exists), runs ninja in the build
directory on a rule that writes its output in two halves, and imports the output. A child is killed
(SIGKILL or SIGTERM) with torch's lock held, with an output half-written, or after the build before
the stamp; the next `native.load()` must finish, with a complete module and the stamp written.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from morphpipe.build_lock import LOCK_NAME, build_lock, describe_holder

CHILD = textwrap.dedent('''
    import importlib.util, os, subprocess, sys, time
    from pathlib import Path
    import torch.utils.cpp_extension as cpp_extension
    from torch.utils.file_baton import FileBaton

    PAUSE_AT = os.environ.get("FAKE_PAUSE_AT", "")
    MARKER = Path(os.environ["FAKE_MARKER"])

    def pause(point):
        if PAUSE_AT == point:
            MARKER.write_text(point)
            time.sleep(120)

    def fake_load(name, build_directory, **_):
        build = Path(build_directory)
        baton = FileBaton(str(build / "lock"))  # as torch's _jit_compile does
        if baton.try_acquire():
            try:
                pause("baton")
                (build / "build.ninja").write_text(
                    "rule halves\\n  command = {python} {halves} $in $out\\n"
                    "build fake_native.py: halves {source}\\n")
                subprocess.run(["ninja"], cwd=build, check=True, stdout=subprocess.DEVNULL)
            finally:
                baton.release()
        else:
            baton.wait()
        pause("built")
        spec = importlib.util.spec_from_file_location(name, build / "fake_native.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    cpp_extension.load = fake_load
    from morphpipe import native
    module = native.load()
    config = native.build_config()
    print(module.COMPLETE, (config.build_dir / "sources.sha256").read_text() == config.source_hash)
''')

# ninja's command: writes the first half of the source, optionally pauses (killed there in a test), then the rest.
HALVES = textwrap.dedent('''
    import os, sys, time
    from pathlib import Path
    text = Path(sys.argv[1]).read_text()
    with open(sys.argv[2], "w") as out:
        out.write(text[:len(text) // 2])
        out.flush()
        if os.environ.get("FAKE_PAUSE_AT") == "half":
            Path(os.environ["FAKE_MARKER"]).write_text("half")
            time.sleep(float(os.environ.get("FAKE_HALF_S", "120")))
        out.write(text[len(text) // 2:])
''')


@pytest.fixture
def scratch(tmp_path: Path) -> dict[str, object]:
    source = tmp_path / "fake_native_source.py"
    # The fake extension answers what native.load asks of every build: its CPU levels, and which one to run.
    source.write_text("VALUES = list(range(100))\n" * 20 + "COMPLETE = True\n"
                      "def cpu_capabilities():\n    return [('baseline', True, True)]\n"
                      "def set_cpu_capability(name):\n    pass\n")
    halves = tmp_path / "halves.py"
    halves.write_text(HALVES)
    child = tmp_path / "child.py"
    child.write_text(CHILD.format(python=sys.executable, halves=halves, source=source))
    env = {**os.environ, "MORPHPIPE_BUILD_DIR": str(tmp_path / "build"), "FAKE_MARKER": str(tmp_path / "reached"),
           "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    return {"child": child, "env": env, "marker": tmp_path / "reached", "root": tmp_path / "build"}


def start_and_pause(scratch: dict, point: str, **extra_env: str) -> subprocess.Popen:
    """A child building until it reaches `point`, where it waits to be killed."""
    env = {**scratch["env"], "FAKE_PAUSE_AT": point, **extra_env}
    child = subprocess.Popen([sys.executable, str(scratch["child"])], env=env, start_new_session=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not scratch["marker"].exists():
        assert child.poll() is None, child.communicate()
        assert time.monotonic() < deadline, "the child never reached " + point
        time.sleep(0.05)
    return child


def next_command(scratch: dict) -> subprocess.CompletedProcess:
    """The command after the kill: it must finish (not wait forever) with a complete build and its stamp."""
    done = subprocess.run([sys.executable, str(scratch["child"])], env=scratch["env"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True"], (done.stdout, done.stderr)
    return done


@pytest.mark.parametrize(("point", "signum"), [("baton", signal.SIGKILL), ("baton", signal.SIGTERM),
                                               ("half", signal.SIGKILL), ("built", signal.SIGKILL)])
def test_a_build_killed_anywhere_leaves_nothing_that_blocks_or_breaks_the_next(scratch, point: str,
                                                                                signum: int) -> None:
    child = start_and_pause(scratch, point)
    os.killpg(child.pid, signum)  # as a scheduler ends a job: the whole process group
    child.communicate(timeout=30)
    build_dir = next(scratch["root"].iterdir())
    if point == "baton":
        assert (build_dir / "lock").exists()  # torch's lock file, left behind: torch alone would wait on it forever
    if point == "half":
        assert "COMPLETE" not in (build_dir / "fake_native.py").read_text()  # newer than its source, yet partial
        log = build_dir / ".ninja_log"
        assert not log.exists() or "fake_native.py" not in log.read_text()  # so ninja knows it is unfinished
    done = next_command(scratch)
    assert not (build_dir / "lock").exists()
    if point == "baton":
        assert "removed" in done.stderr and "the lock of a native build that was killed" in done.stderr


def test_a_ninja_left_running_by_a_killed_builder_is_waited_for(scratch) -> None:
    child = start_and_pause(scratch, "half", FAKE_HALF_S="5")
    child.kill()  # the Python process only: its ninja runs on, orphaned, and finishes the output
    child.wait(timeout=30)  # (not communicate: the orphan holds the pipes open until it ends)
    build_dir = next(scratch["root"].iterdir())
    reports: list[str] = []
    with build_lock(build_dir, report=reports.append, report_every_s=0.5):
        assert "COMPLETE = True" in (build_dir / "fake_native.py").read_text()  # the orphan finished first
    assert reports and reports[0].startswith("morphpipe: waiting for ninja (PID ")
    assert f"left running in {build_dir} by a killed build" in reports[0]
    next_command(scratch)


def test_a_waiting_process_says_who_holds_the_lock_and_takes_it_when_the_holder_dies(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; from morphpipe.build_lock import build_lock\n"
         f"with build_lock(Path({str(tmp_path)!r})):\n    print('held', flush=True); time.sleep(120)"],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
    assert holder.stdout.readline() == "held\n"
    reports: list[str] = []

    def kill_after_two_reports() -> None:
        while len(reports) < 2:
            time.sleep(0.02)
        holder.kill()

    killer = threading.Thread(target=kill_after_two_reports)
    killer.start()
    with build_lock(tmp_path, report=reports.append, report_every_s=0.2):
        held = json.loads((tmp_path / LOCK_NAME).read_text())
    killer.join()
    holder.wait()
    assert held["pid"] == os.getpid()
    assert reports[0].startswith(f"morphpipe: waiting for the native build in {tmp_path}, held by PID {holder.pid} (`")
    assert "build_lock" in reports[0] and " since " in reports[0] and reports[0].endswith("; waited 0 s")
    assert reports[-1].startswith("morphpipe: got the native build lock after ")
    assert describe_holder(tmp_path / LOCK_NAME) == "a process that has not yet written its name"  # released: emptied
