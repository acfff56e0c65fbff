"""`import morphpipe` has torch's allocator put large tensors on transparent huge pages unless the user chose."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from morphpipe.huge_pages import HUGE_PAGES_ENV, choose_huge_pages, kernel_mode

# Allocates and touches a 64 MiB tensor; prints morphpipe's setting and how much of it sits on huge pages.
SCRIPT = """
import morphpipe, torch
from morphpipe.huge_pages import huge_pages

def anon_huge_kib():
    with open("/proc/self/smaps_rollup") as smaps:
        return next(int(line.split()[1]) for line in smaps if line.startswith("AnonHugePages:"))

before = anon_huge_kib()
tensor = torch.empty(16 * 2**20, dtype=torch.float32)
tensor.fill_(1.0)
print(huge_pages().source, anon_huge_kib() - before)
"""


def run_script(user_value: str | None) -> tuple[str, int]:
    """Runs SCRIPT in a fresh Python with the variable set to `user_value` (None: unset)."""
    environment = {key: value for key, value in os.environ.items() if key != HUGE_PAGES_ENV}
    if user_value is not None:
        environment[HUGE_PAGES_ENV] = user_value
    result = subprocess.run([sys.executable, "-c", SCRIPT], env=environment, capture_output=True, text=True,
                            check=True, timeout=300)
    source, huge_kib = result.stdout.split()
    return source, int(huge_kib)


@pytest.mark.skipif(kernel_mode() != "madvise" or not Path("/proc/self/smaps_rollup").exists(),
                    reason="huge pages follow torch's request only where the kernel's THP mode is madvise")
def test_large_tensors_land_on_huge_pages_unless_the_user_opts_out() -> None:
    source, huge_kib = run_script(None)
    assert source == "morphpipe"
    assert huge_kib >= 32 * 1024  # most of the 64 MiB (the kernel may fall back to small pages for the edges)
    source, huge_kib = run_script("0")
    assert source == "user"
    assert huge_kib < 8 * 1024


@pytest.mark.parametrize("value", ["0", "1"])
@pytest.mark.parametrize("torch_loaded", [False, True])
def test_the_users_setting_wins_and_is_not_touched(value: str, torch_loaded: bool) -> None:
    environ = {HUGE_PAGES_ENV: value}
    chosen = choose_huge_pages(environ, torch_loaded, "madvise")
    assert (chosen.enabled, chosen.source) == (value == "1", "user")
    assert environ == {HUGE_PAGES_ENV: value}


def test_unset_becomes_on_and_says_when_it_may_be_too_late_or_useless() -> None:
    environ: dict[str, str] = {}
    chosen = choose_huge_pages(environ, torch_loaded=False, mode="madvise")
    assert (chosen.enabled, chosen.source, chosen.note) == (True, "morphpipe", "")
    assert environ == {HUGE_PAGES_ENV: "1"}
    assert "after torch was imported" in choose_huge_pages({}, torch_loaded=True, mode="madvise").note
    assert "no huge pages" in choose_huge_pages({}, torch_loaded=False, mode="never").note


@pytest.mark.parametrize(("text", "mode"), [("always [madvise] never\n", "madvise"),
                                            ("[always] madvise never\n", "always"),
                                            ("always madvise [never]\n", "never"), ("garbled\n", "unknown")])
def test_kernel_mode_reads_the_bracketed_word(tmp_path: Path, text: str, mode: str) -> None:
    path = tmp_path / "enabled"
    path.write_text(text)
    assert kernel_mode(path) == mode
    assert kernel_mode(tmp_path / "missing") == "unknown"
