"""Builds (incrementally, cached per torch version) and loads the native extension.

The extension registers `torch.ops.morphpipe.*` (schemas in csrc/ops.cpp, CPU kernels in
csrc/cpu/, CUDA kernels in csrc/cuda/ where CUDA torch and nvcc exist) and exposes the
threaded `CpuBatcher`. Compiling just in time against the torch that is installed keeps one
source tree working across torch 2.11-2.13 and across CPU-only and CUDA machines.
"""
from __future__ import annotations

import hashlib
import os
import platform
import re
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch

from morphpipe.build_lock import build_lock

CSRC_DIR = Path(__file__).resolve().parent.parent / "csrc"
_lock = threading.Lock()
_module: ModuleType | None = None
_failure: NativeBuildError | None = None  # a failed build is not retried, except verbosely, to show the log


class NativeBuildError(RuntimeError):
    """The C++/CUDA extension could not be compiled or loaded."""


@dataclass(frozen=True)
class BuildConfig:
    """What gets compiled, with which toolchain, and where the cached build lives."""

    sources: tuple[Path, ...]
    with_cuda: bool
    cuda_skip_reason: str | None
    build_dir: Path
    module_name: str
    source_hash: str
    cuda_arch_list: str | None = None  # TORCH_CUDA_ARCH_LIST of the build; None without CUDA


def _cuda_toolchain_problem() -> str | None:
    """Why the CUDA kernels cannot be compiled here, or None when they can."""
    if os.environ.get("MORPHPIPE_NO_CUDA") == "1":
        return "MORPHPIPE_NO_CUDA=1 is set"
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU-only build"
    from torch.utils.cpp_extension import CUDA_HOME

    if CUDA_HOME is None:
        return "nvcc was not found (set CUDA_HOME)"
    if not (Path(CUDA_HOME) / "include" / "cuda_runtime.h").exists():
        return (f"CUDA_HOME={CUDA_HOME} has no include/cuda_runtime.h (torch guesses it from the nvcc on PATH); "
                "set CUDA_HOME to the CUDA toolkit root, e.g. /usr/local/cuda")
    if not any(CSRC_DIR.glob("cuda/*.cu")):
        return "csrc/cuda has no kernels yet"
    return None


def cuda_arch_list() -> str:
    """The GPU architectures torch's builder compiles the CUDA kernels for; part of the build cache key.

    TORCH_CUDA_ARCH_LIST when set (other than "native"), else the compute capabilities of the
    visible devices, from which the builder derives its flags; "none" without either. A binary is
    therefore never reused for a GPU of another architecture, nor after the variable changes.
    """
    requested = os.environ.get("TORCH_CUDA_ARCH_LIST", "").strip()
    if requested and requested != "native":
        return requested
    if torch.cuda.is_available():
        capabilities = {torch.cuda.get_device_capability(index) for index in range(torch.cuda.device_count())}
        return ";".join(f"{major}.{minor}" for major, minor in sorted(capabilities))
    return "none"


def _arch_tag(arch_list: str) -> str:
    """`arch_list` as a directory-name part: "8.0;9.0+PTX" -> "sm-8-0-9-0-ptx"."""
    return "sm-" + re.sub(r"[^0-9a-z]+", "-", arch_list.lower()).strip("-")


def build_config() -> BuildConfig:
    """Sources and build directory for this torch; ninja rebuilds only what changed in it."""
    if not (CSRC_DIR / "ops.cpp").exists():
        raise NativeBuildError(
            f"native sources not found at {CSRC_DIR}; install morphpipe from a source checkout "
            "with `pip install -e .` so csrc/ sits beside the package"
        )
    cuda_problem = _cuda_toolchain_problem()
    with_cuda = cuda_problem is None
    sources = [CSRC_DIR / "ops.cpp", CSRC_DIR / "python_module.cpp", *sorted(CSRC_DIR.glob("cpu/*.cpp"))]
    if with_cuda:
        sources += sorted(CSRC_DIR.glob("cuda/*.cu"))
    digest = hashlib.sha256()
    for path in sorted(CSRC_DIR.rglob("*")):
        if path.is_file() and path.suffix in {".cpp", ".cu", ".h", ".cuh"}:
            digest.update(str(path.relative_to(CSRC_DIR)).encode())
            digest.update(path.read_bytes())
    python = f"py{sys.version_info.major}{sys.version_info.minor}"
    arch_list = cuda_arch_list() if with_cuda else None
    kind = f"cuda-{_arch_tag(arch_list)}" if arch_list else "cpu"
    flavour = f"torch{torch.__version__.replace('+', '-')}-{python}-{platform.machine()}-{kind}"
    root = Path(os.environ.get("MORPHPIPE_BUILD_DIR", Path.home() / ".cache" / "morphpipe" / "build"))
    return BuildConfig(tuple(sources), with_cuda, cuda_problem, root / flavour, "morphpipe_native", digest.hexdigest(),
                       arch_list)


def _ensure_ninja_on_path() -> None:
    """torch's JIT builder calls `ninja`; the pip package ships it outside an unactivated venv's PATH."""
    try:
        import ninja
    except ImportError as error:
        raise NativeBuildError("the `ninja` package is missing; `pip install ninja`") from error
    os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")


def load(verbose: bool = False) -> ModuleType:
    """The loaded extension, compiling it first if this source/torch combination is not cached."""
    global _module, _failure
    with _lock:
        if _module is not None:
            return _module
        if _failure is not None and not verbose:
            raise _failure
        config = build_config()
        with build_lock(config.build_dir):
            _module = _compile_and_load(config, verbose)
        return _module


def _compile_and_load(config: BuildConfig, verbose: bool) -> ModuleType:
    """Builds (ninja: only what changed, or was left half-written by a killed build) and imports the extension.

    Runs under the build lock. The stamp `sources.sha256` says "these sources were built and loaded";
    it is removed before a build and written after the load, so a build killed half-way is never taken
    for a finished one (ninja itself rebuilds any output its log does not record as completed).
    """
    global _failure
    from torch.utils import cpp_extension

    stamp = config.build_dir / "sources.sha256"
    up_to_date = stamp.exists() and stamp.read_text() == config.source_hash
    if not up_to_date:
        stamp.unlink(missing_ok=True)
        print(f"morphpipe: compiling native ops into {config.build_dir} (after install or source changes)",
              file=sys.stderr)
        if config.cuda_skip_reason:
            print(f"morphpipe: CUDA kernels not built ({config.cuda_skip_reason}); CPU kernels only",
                  file=sys.stderr)
    _ensure_ninja_on_path()
    cflags = ["-O3", "-fopenmp", "-Wall", "-Wno-unused-function"]
    try:
        module = cpp_extension.load(
            name=config.module_name,
            sources=[str(s) for s in config.sources],
            extra_cflags=cflags + (["-DMORPHPIPE_WITH_CUDA"] if config.with_cuda else []),
            extra_cuda_cflags=["-O3", "--use_fast_math", "-DMORPHPIPE_WITH_CUDA"],
            extra_ldflags=["-fopenmp"],
            extra_include_paths=[str(CSRC_DIR)],
            build_directory=str(config.build_dir),
            with_cuda=config.with_cuda,
            verbose=verbose,
        )
    except Exception as error:
        _failure = NativeBuildError(
            f"building the native ops failed ({type(error).__name__}: {error}); rerun "
            f"`morphpipe info --verbose` for the compiler log (build dir: {config.build_dir})"
        )
        raise _failure from error
    stamp.write_text(config.source_hash)
    return module


def prepare(announce=print) -> None:
    """Compiles the native ops now, if needed, with a line of its own and its elapsed time.

    Commands that time things (tune, train --auto) call this first so that a first-use build
    (about a minute) is not counted in, or shown as, their progress bars.
    """
    if _module is not None:
        return
    config = build_config()
    stamp = config.build_dir / "sources.sha256"
    if stamp.exists() and stamp.read_text() == config.source_hash:
        load()
        return
    announce("compiling the native ops (first use after install or a source change; about a minute) ...")
    started = time.perf_counter()
    load()
    announce(f"compiled the native ops in {time.perf_counter() - started:.0f} s")


def ops() -> object:
    """`torch.ops.morphpipe`, after making sure the extension that registers it is loaded."""
    load()
    return torch.ops.morphpipe
