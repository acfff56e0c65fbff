"""Loads the native extension: prebuilt in the installed package, or built (incrementally, cached per torch) from sources.

The extension registers `torch.ops.morphpipe.*` (schemas in csrc/ops.cpp, CPU kernels in
csrc/cpu/, CUDA kernels in csrc/cuda/ where CUDA torch and nvcc exist) and exposes the
threaded `CpuBatcher`. A wheel built against an installed torch (`pip install --no-build-isolation .`,
see setup.py) carries it compiled as `morphpipe._native` for that torch; a wheel built without
torch (a plain, isolated `pip install .`) carries csrc/ as `morphpipe/_csrc`, and a source checkout
(`pip install -e .`) has csrc/ itself: both compile it just in time against the installed torch,
which keeps one source tree working across torch 2.11-2.13 and across CPU-only and CUDA machines.
"""
from __future__ import annotations

import hashlib
import importlib
import json
import os
import platform
import re
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch

# The native sources: packaged into a wheel built without torch (setup.py), else the source checkout's csrc/.
PACKAGED_CSRC = Path(__file__).resolve().parent / "_csrc"
CSRC_DIR = PACKAGED_CSRC if (PACKAGED_CSRC / "ops.cpp").exists() else Path(__file__).resolve().parent.parent / "csrc"
PREBUILT_MODULE = "morphpipe._native"  # compiled into a wheel by setup.py
# Written by setup.py beside the prebuilt module: the torch, CUDA architectures and sources it was compiled from.
PREBUILT_INFO = Path(__file__).resolve().parent / "_native_build.json"
# Compiler and linker flags of both builds (just in time here, ahead of time in setup.py).
CXX_FLAGS = ("-O3", "-fopenmp", "-Wall", "-Wno-unused-function")
NVCC_FLAGS = ("-O3", "--use_fast_math", "-DMORPHPIPE_WITH_CUDA")
LD_FLAGS = ("-fopenmp",)
# Forces the instruction-set level of the CPU kernels (baseline, avx2, avx512); unset: the best this CPU supports.
CPU_CAPABILITY_ENV = "MORPHPIPE_CPU_CAPABILITY"
REINSTALL = ("`pip install --force-reinstall --no-deps <source checkout, sdist or git URL>` packages the sources "
             "(compiled on first use); with --no-build-isolation it compiles them in against the installed torch")
_lock = threading.Lock()
_module: ModuleType | None = None
_failure: NativeBuildError | None = None  # a failed build is not retried, except verbosely, to show the log
_announced_mismatch = False


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
    prebuilt_torch: str | None = None  # the torch a prebuilt wheel's module was compiled for; None when built here


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


def source_files(with_cuda: bool) -> list[Path]:
    """The translation units of the extension: the .cpp files under csrc/ (top level first, none under a
    cuda/ folder), then, when building CUDA, every .cu file."""
    def order(path: Path) -> tuple[int, Path]:
        return len(path.relative_to(CSRC_DIR).parts), path

    cpp = [path for path in CSRC_DIR.rglob("*.cpp") if "cuda" not in path.relative_to(CSRC_DIR).parts]
    return sorted(cpp, key=order) + (sorted(CSRC_DIR.rglob("*.cu"), key=order) if with_cuda else [])


def source_hash() -> str:
    """SHA-256 over the paths and contents of every source and header under csrc/."""
    digest = hashlib.sha256()
    for path in sorted(CSRC_DIR.rglob("*")):
        if path.is_file() and path.suffix in {".cpp", ".cu", ".h", ".cuh"}:
            digest.update(str(path.relative_to(CSRC_DIR)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def _build_root() -> Path:
    return Path(os.environ.get("MORPHPIPE_BUILD_DIR", Path.home() / ".cache" / "morphpipe" / "build"))


def _flavour(kind: str) -> str:
    """This torch, python and machine with `kind` ("cpu", "cuda-sm-9-0"), as a directory name."""
    python = f"py{sys.version_info.major}{sys.version_info.minor}"
    return f"torch{torch.__version__.replace('+', '-')}-{python}-{platform.machine()}-{kind}"


def _prebuilt_config() -> BuildConfig | None:
    """The prebuilt module's configuration when it fits this torch (and csrc/, if present), else None.

    A module compiled for another torch would fail with undefined symbols, so it is never imported:
    the mismatch is announced once and the sources are compiled instead, or, without sources, the
    error names both torch versions.
    """
    global _announced_mismatch
    try:
        built = json.loads(PREBUILT_INFO.read_text())
    except FileNotFoundError:
        return None
    have_sources = (CSRC_DIR / "ops.cpp").exists()
    if built["torch"] != torch.__version__:
        problem = (f"the prebuilt native ops were compiled for torch {built['torch']}, but torch "
                   f"{torch.__version__} is installed")
        if not have_sources:
            raise NativeBuildError(f"{problem}; install torch=={built['torch']}, or reinstall morphpipe: {REINSTALL}")
        if not _announced_mismatch:
            print(f"morphpipe: {problem}; compiling them from {CSRC_DIR} instead", file=sys.stderr)
            _announced_mismatch = True
        return None
    if have_sources and built["source_hash"] != source_hash():
        return None  # csrc/ changed since the module was built: the just-in-time build follows it
    arch_list = built["cuda_arch_list"]
    kind = f"cuda-{_arch_tag(arch_list)}" if arch_list else "cpu"
    return BuildConfig((), arch_list is not None, built["cuda_skip_reason"], _build_root() / f"prebuilt-{_flavour(kind)}",
                       PREBUILT_MODULE, built["source_hash"], arch_list, built["torch"])


def build_config() -> BuildConfig:
    """The build in use: the prebuilt module when it fits, else sources and build directory for this torch.

    In the latter case ninja rebuilds only what changed in the build directory. A prebuilt module's
    build directory holds no build, only state that belongs beside it (recorded backend verdicts).
    """
    prebuilt = _prebuilt_config()
    if prebuilt is not None:
        return prebuilt
    if not (CSRC_DIR / "ops.cpp").exists():
        raise NativeBuildError(
            f"morphpipe was installed without its native ops (no prebuilt {PREBUILT_MODULE}, no sources in "
            f"{PACKAGED_CSRC} nor {CSRC_DIR}); reinstall it: {REINSTALL} (or `pip install -e .` in a source checkout)"
        )
    cuda_problem = _cuda_toolchain_problem()
    with_cuda = cuda_problem is None
    arch_list = cuda_arch_list() if with_cuda else None
    kind = f"cuda-{_arch_tag(arch_list)}" if arch_list else "cpu"
    return BuildConfig(tuple(source_files(with_cuda)), with_cuda, cuda_problem, _build_root() / _flavour(kind),
                       "morphpipe_native", source_hash(), arch_list)


def build_info() -> str:
    """Which build of the native ops is in use, for `morphpipe info`."""
    config = build_config()
    kind = f"cuda {config.cuda_arch_list}" if config.with_cuda else "cpu"
    if config.prebuilt_torch is not None:
        return f"prebuilt wheel (torch {config.prebuilt_torch}, {kind})"
    origin = "packaged sources" if CSRC_DIR == PACKAGED_CSRC else "source checkout"
    return f"built on first use from the {origin} in {CSRC_DIR} ({kind}; build cached in {config.build_dir})"


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
        if config.prebuilt_torch is not None:
            try:
                module = importlib.import_module(PREBUILT_MODULE)
            except ImportError as error:
                _failure = NativeBuildError(f"the prebuilt native ops {PREBUILT_MODULE} failed to load ({error}); "
                                            "reinstall morphpipe against the installed torch")
                raise _failure from error
        else:
            from morphpipe.build_lock import build_lock  # here: setup.py loads this file alone, without the package

            with build_lock(config.build_dir):
                module = _compile_and_load(config, verbose)
        _apply_cpu_capability(module)
        _module = module
        return _module


def choose_cpu_capability(requested: str | None, levels: list[tuple[str, bool, bool]]) -> str:
    """The level to run the CPU kernels at: `requested` (from $MORPHPIPE_CPU_CAPABILITY) when this build and CPU
    have it, else ValueError naming the choices; None: the highest level `levels` (name, compiled, supported;
    lowest first, as the extension reports them) marks supported."""
    supported = [name for name, _, usable in levels if usable]
    if requested is None:
        return supported[-1]
    known = {name: (built, usable) for name, built, usable in levels}
    if requested not in known:
        raise ValueError(f"{CPU_CAPABILITY_ENV}={requested!r} is not a CPU capability; choose one of "
                         f"{', '.join(known)} (this CPU: {', '.join(supported)}), or unset it for the best")
    built, usable = known[requested]
    if not usable:
        lacking = "this CPU lacks its instructions" if built else "this build compiled no kernels for it"
        raise ValueError(f"{CPU_CAPABILITY_ENV}={requested!r} cannot run here ({lacking}); choose one of "
                         f"{', '.join(supported)}, or unset it for the best")
    return requested


def _apply_cpu_capability(module: ModuleType) -> None:
    """Runs the CPU kernels at the level $MORPHPIPE_CPU_CAPABILITY names, else at the best this CPU supports."""
    requested = os.environ.get(CPU_CAPABILITY_ENV, "").strip() or None
    module.set_cpu_capability(choose_cpu_capability(requested, module.cpu_capabilities()))


def cpu_capability_info() -> str:
    """The instruction-set level the CPU kernels run at, whether it was forced, and what else there is."""
    module = load()
    levels = module.cpu_capabilities()
    supported = [name for name, _, usable in levels if usable]
    compiled = [name for name, built, _ in levels if built]
    active = module.cpu_capability()
    why = (f"forced by {CPU_CAPABILITY_ENV}" if os.environ.get(CPU_CAPABILITY_ENV, "").strip()
           else "the best this CPU supports")
    return f"{active} ({why}; this CPU supports {', '.join(supported)}; compiled: {', '.join(compiled)})"


def supported_cpu_capabilities() -> list[str]:
    """The levels this build holds kernels for and this CPU can run, lowest first."""
    return [name for name, _, usable in load().cpu_capabilities() if usable]


@contextmanager
def forced_cpu_capability(name: str) -> Iterator[None]:
    """Runs the CPU kernels at level `name` inside the block (benchmarks, tests), then at the level before; the level
    is the process's, so kernels that other threads run meanwhile take it too."""
    module = load()
    before = module.cpu_capability()
    module.set_cpu_capability(name)
    try:
        yield
    finally:
        module.set_cpu_capability(before)


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
    try:
        module = cpp_extension.load(
            name=config.module_name,
            sources=[str(s) for s in config.sources],
            extra_cflags=[*CXX_FLAGS, *(["-DMORPHPIPE_WITH_CUDA"] if config.with_cuda else [])],
            extra_cuda_cflags=list(NVCC_FLAGS),
            extra_ldflags=list(LD_FLAGS),
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
    if config.prebuilt_torch is not None or stamp.exists() and stamp.read_text() == config.source_hash:
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
