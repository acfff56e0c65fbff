"""OpenMP's wait policy for the process: idle OpenMP threads sleep instead of spinning, unless the user says otherwise.

libgomp (torch's and the native ops' OpenMP runtime, one copy per process) reads
`OMP_WAIT_POLICY` once, when it is loaded, i.e. at `import torch`. Unset, an idle OpenMP thread
spins up to about 300,000 iterations after every parallel region before it sleeps. Between the
training step's ops that spinning burns the cores that the batcher's threads need, when a plan
has batching and training share cores or take turns on them. So `import morphpipe` (the CLI
included) sets `OMP_WAIT_POLICY=PASSIVE` when it runs before torch is imported and the user has
not set the variable; the user's own setting always wins (`OMP_WAIT_POLICY=ACTIVE` restores
spinning). If torch was imported first, libgomp has read its environment already and nothing is
changed; `wait_policy` reports which of these happened (`morphpipe info` prints it).
"""
from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping
from dataclasses import dataclass

WAIT_POLICY_ENV = "OMP_WAIT_POLICY"
PASSIVE = "PASSIVE"


@dataclass(frozen=True)
class WaitPolicy:
    """The OpenMP wait policy in force and who chose it ("user", "morphpipe" or "libgomp default")."""

    value: str
    source: str
    note: str = ""

    def line(self) -> str:
        """One line for `morphpipe info`."""
        return f"{self.value} ({self.source}{'; ' + self.note if self.note else ''})"


_policy: WaitPolicy | None = None


def choose_wait_policy(environ: MutableMapping[str, str], torch_loaded: bool) -> WaitPolicy:
    """Sets PASSIVE in `environ` when it has no policy and torch is not loaded; returns the policy that holds."""
    user = environ.get(WAIT_POLICY_ENV)
    if user:
        return WaitPolicy(user, "user")
    if torch_loaded:
        return WaitPolicy("spin, then sleep", "libgomp default",
                          "torch was imported before morphpipe; set OMP_WAIT_POLICY=PASSIVE before starting Python")
    environ[WAIT_POLICY_ENV] = PASSIVE
    return WaitPolicy(PASSIVE, "morphpipe", "set at import because it was unset")


def apply_wait_policy() -> WaitPolicy:
    """`choose_wait_policy` for this process, once (at `import morphpipe`)."""
    global _policy
    if _policy is None:
        _policy = choose_wait_policy(os.environ, "torch" in sys.modules)
    return _policy


def wait_policy() -> WaitPolicy:
    """What `apply_wait_policy` found or did when morphpipe was imported."""
    return apply_wait_policy()
