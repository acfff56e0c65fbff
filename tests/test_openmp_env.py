"""`import morphpipe` makes idle OpenMP threads sleep (OMP_WAIT_POLICY=PASSIVE) unless the user chose a policy."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from morphpipe.openmp_env import WAIT_POLICY_ENV, choose_wait_policy

SCRIPT = ("import morphpipe, torch; from morphpipe.openmp_env import wait_policy; "
          "torch.ones(4).sum(); print(wait_policy().source)")


def libgomp_spin_count(script: str) -> tuple[str, int]:
    """Runs `script` in a fresh Python; returns its output and the spin count libgomp reports at start-up."""
    environment = {key: value for key, value in os.environ.items() if key != WAIT_POLICY_ENV}
    environment["OMP_DISPLAY_ENV"] = "VERBOSE"
    result = subprocess.run([sys.executable, "-c", script], env=environment, capture_output=True, text=True,
                            check=True, timeout=300)
    lines = [line for line in result.stderr.splitlines() if "GOMP_SPINCOUNT" in line]
    assert lines, f"libgomp printed no environment: {result.stderr!r}"
    return result.stdout.strip(), int(lines[0].split("=")[1].strip().strip("'"))


def test_import_before_torch_makes_libgomp_sleep_without_spinning() -> None:
    source, spins = libgomp_spin_count(SCRIPT)
    assert (source, spins) == ("morphpipe", 0)


def test_torch_imported_first_is_reported_and_left_spinning() -> None:
    source, spins = libgomp_spin_count("import torch; " + SCRIPT)
    assert source.endswith("libgomp default")
    assert spins > 0


@pytest.mark.parametrize("policy", ["ACTIVE", "PASSIVE"])
@pytest.mark.parametrize("torch_loaded", [False, True])
def test_the_users_policy_wins_and_is_not_touched(policy: str, torch_loaded: bool) -> None:
    environ = {WAIT_POLICY_ENV: policy}
    chosen = choose_wait_policy(environ, torch_loaded)
    assert (chosen.value, chosen.source) == (policy, "user")
    assert environ == {WAIT_POLICY_ENV: policy}


def test_unset_policy_becomes_passive_only_before_torch() -> None:
    environ: dict[str, str] = {}
    assert choose_wait_policy(environ, torch_loaded=True).source == "libgomp default"
    assert environ == {}
    assert choose_wait_policy(environ, torch_loaded=False).value == "PASSIVE"
    assert environ == {WAIT_POLICY_ENV: "PASSIVE"}
