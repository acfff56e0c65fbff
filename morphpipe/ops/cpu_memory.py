"""Large CPU tensors' memory kept for reuse: a training step and a batch built on demand stop paying first touches.

torch hands every CPU tensor of 2 MiB or more back to the kernel when it dies, so each step faults its
activations and gradients in afresh (a huge-page fault zeroes 2 MiB): on the 2-core machine of BENCHMARKS.md,
55-120 ms of system time in a 2-thread SAGE step of about 380 ms of user time. `reuse_cpu_memory()` installs
the native reusing allocator (csrc/cpu/reuse_allocator.cpp) as torch's CPU allocator, once per process: a freed
block of `REUSE_MIN_BYTES` or more is lent to the next request it holds (the smallest such) unless it is more than
twice that request's size (a small tensor must not tie up a large block), and what it holds (lent and idle) never
exceeds the most ever lent at once. `TrainStep` calls it for a CPU model; set
`MORPHPIPE_CPU_MEMORY_REUSE=0` to keep torch's own allocator (the step as it was).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from morphpipe import native

REUSE_ENV = "MORPHPIPE_CPU_MEMORY_REUSE"
REUSE_MIN_BYTES = 2 << 20  # torch's huge-page threshold: below it glibc's heap already reuses memory
WASTE_ENV = "MORPHPIPE_CPU_MEMORY_WASTE"
REUSE_MAX_WASTE = 2  # an idle block is lent only to a request of at least half its size


@dataclass(frozen=True)
class CpuMemoryReuse:
    """What the reusing allocator holds and has done since it was installed (all zero when it is not)."""

    installed: bool
    min_bytes: int
    max_waste: int  # an idle block is lent only to requests of at least 1/max_waste of its size (0: any)
    hits: int  # requests lent an idle block
    misses: int  # requests that took fresh memory
    oversized: int  # of those, requests an idle block held, but at more than max_waste times their size
    released: int  # idle blocks handed back to the system
    lent_bytes: int
    idle_bytes: int
    peak_bytes: int  # the most ever lent at once: the bound on lent + idle


def reuse_wanted(environ: dict[str, str] | os._Environ = os.environ) -> bool:
    """False when the user opted out with MORPHPIPE_CPU_MEMORY_REUSE=0 (or an empty value); any value but 0, 1 or
    empty is refused, naming them (a "false" or "off" must not leave reuse on unnoticed)."""
    value = environ.get(REUSE_ENV)
    if value is None or value.strip() == "1":
        return True
    if value.strip() in ("", "0"):
        return False
    raise ValueError(f"{REUSE_ENV}={value!r}: set it to 0 (torch's own allocator) or 1 (large CPU tensors' memory "
                     "reused, the default), or unset it")


def reuse_max_waste(environ: dict[str, str] | os._Environ = os.environ) -> int:
    """How many times a request's size an idle block lent to it may be: REUSE_MAX_WASTE unless MORPHPIPE_CPU_MEMORY_WASTE
    says otherwise (an integer of at least 1, or 0 for no limit, the rule before it existed: for comparisons)."""
    value = environ.get(WASTE_ENV)
    if value is None:
        return REUSE_MAX_WASTE
    try:
        factor = int(value.strip())
    except ValueError:
        factor = -1
    if factor < 0:
        raise ValueError(f"{WASTE_ENV}={value!r}: set it to an integer of at least 1 (an idle block is lent only to "
                         f"a request of at least 1/that of its size), 0 (any request it holds), or unset it "
                         f"(default {REUSE_MAX_WASTE})")
    return factor


_installed = False  # whether this process installed it (so releasing needs no native load before)


def reuse_cpu_memory() -> CpuMemoryReuse:
    """Installs the reusing allocator unless the user opted out or it is installed already; returns its state."""
    global _installed
    if reuse_wanted() and not _installed:
        native.load().install_cpu_memory_reuse(REUSE_MIN_BYTES, reuse_max_waste())
        _installed = True
    return cpu_memory_reuse()


def reuse_line(environ: dict[str, str] | os._Environ = os.environ) -> str:
    """One line for `morphpipe info`: whether CPU training reuses large tensors' memory, and who chose."""
    try:
        wanted = reuse_wanted(environ)
    except ValueError as error:
        return f"not chosen: {error}"
    if not wanted:
        return f"off ({REUSE_ENV}={environ.get(REUSE_ENV)!r}: torch's own allocator)"
    try:
        waste = reuse_max_waste(environ)
    except ValueError as error:
        return f"not chosen: {error}"
    lent = f"lent to requests of at least 1/{waste} of a block" if waste else f"lent to any request ({WASTE_ENV}=0)"
    state = "installed" if _installed else "installed by the first CPU training step"
    return f"on (blocks of {REUSE_MIN_BYTES >> 20} MiB or more, {lent}; {state}; {REUSE_ENV}=0 turns it off)"


def cpu_memory_reuse() -> CpuMemoryReuse:
    """The reusing allocator's state now."""
    return CpuMemoryReuse(**native.load().cpu_memory_reuse())


def release_idle_cpu_memory() -> int:
    """Hands the idle blocks back to the system (a memory measurement then sees what a step really adds); the
    bytes released (0 where the allocator was not installed)."""
    return int(native.load().release_idle_cpu_memory()) if _installed else 0
