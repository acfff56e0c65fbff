"""Transparent huge pages for torch's large CPU tensors, unless the user says otherwise.

torch's CPU allocator gets every tensor of 2 MiB or more fresh from the kernel and hands it back
when the tensor dies, so each training step touches its activations and gradients page by page
for the first time. With 4 KiB pages that is one page fault per 4 KiB: on the 2-core machine of
BENCHMARKS.md, writing a fresh 73,653 x 256 float tensor took 37 ms and 8 ms once it sat on 2 MiB
pages, and the whole SAGE step went from 0.61 s to 0.35 s. torch (2.2 and later) aligns such
tensors to 2 MiB and asks for huge pages (`madvise(MADV_HUGEPAGE)`) when `THP_MEM_ALLOC_ENABLE`
is set. It reads the variable once, at its first allocation of 2 MiB or more, so `import
morphpipe` sets `THP_MEM_ALLOC_ENABLE=1` when it is unset. The user's own setting always wins
(`THP_MEM_ALLOC_ENABLE=0` opts out). It matters only where the kernel's THP mode is `madvise`
(`always` gives huge pages anyway, `never` none). The cost: a large tensor occupies whole 2 MiB pages.
"""
from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path

HUGE_PAGES_ENV = "THP_MEM_ALLOC_ENABLE"
KERNEL_MODE_FILE = Path("/sys/kernel/mm/transparent_hugepage/enabled")


@dataclass(frozen=True)
class HugePages:
    """Whether torch's allocator asks for huge pages, who chose it, and the kernel's THP mode."""

    enabled: bool
    source: str
    kernel_mode: str
    note: str = ""

    def line(self) -> str:
        """One line for `morphpipe info`."""
        state = "on" if self.enabled else "off"
        note = f"; {self.note}" if self.note else ""
        return f"{state} ({self.source}; kernel THP mode {self.kernel_mode}{note})"


def kernel_mode(path: Path = KERNEL_MODE_FILE) -> str:
    """The kernel's THP mode (`always`, `madvise` or `never`; the bracketed word of `path`), or `unknown`."""
    try:
        text = path.read_text()
    except OSError:
        return "unknown"
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else "unknown"


def choose_huge_pages(environ: MutableMapping[str, str], torch_loaded: bool, mode: str) -> HugePages:
    """Sets the variable to 1 in `environ` when it is unset; returns the setting that holds."""
    user = environ.get(HUGE_PAGES_ENV)
    if user is not None:
        return HugePages(user.strip() not in ("", "0"), "user", mode)
    environ[HUGE_PAGES_ENV] = "1"
    note = ""
    if mode == "never":
        note = "the kernel gives no huge pages, so nothing changes"
    elif torch_loaded:
        note = "set after torch was imported: in force only if torch had not yet allocated 2 MiB at once"
    return HugePages(True, "morphpipe", mode, note)


_huge_pages: HugePages | None = None


def apply_huge_pages() -> HugePages:
    """`choose_huge_pages` for this process, once (at `import morphpipe`)."""
    global _huge_pages
    if _huge_pages is None:
        _huge_pages = choose_huge_pages(os.environ, "torch" in sys.modules, kernel_mode())
    return _huge_pages


def huge_pages() -> HugePages:
    """What `apply_huge_pages` found or did when morphpipe was imported."""
    return apply_huge_pages()
