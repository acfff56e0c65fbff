"""Compiles morphpipe's native ops into the package as `morphpipe._native`, against the torch installed here.

Build with the environment's own torch, installed first: `pip install --no-build-isolation .`
(`pip wheel --no-build-isolation .`, `python -m build --no-isolation`). torch is deliberately not a
build requirement in pyproject.toml: an isolated build would download another torch (from PyPI a
multi-GB CUDA build) and compile against it, not against the torch the package will run with, so
an isolated build stops with a message saying this instead. The CUDA kernels are compiled in where
native.py would compile them (CUDA torch and nvcc, see `_cuda_toolchain_problem`). The wheel's
version carries the torch it was built for (`0.1.0+torch2.13.0.cpu`) and `_native_build.json`
records it, so that native.py refuses another torch with a clear message instead of crashing.
An editable install (`pip install -e .`) compiles nothing: native.py builds csrc/ on first use.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
SUPPORTED_TORCH = ((2, 11), (2, 14))  # pyproject.toml's torch>=2.11,<2.14
INSTALL_TORCH_FIRST = (
    "morphpipe compiles its native ops against the torch it will run with, so torch must be installed "
    "before morphpipe and the build must see it: install torch (e.g. `pip install torch==2.13.0 "
    "--index-url https://download.pytorch.org/whl/cpu`), then `pip install --no-build-isolation .` "
    "(or `pip wheel --no-build-isolation .`, `python -m build --no-isolation`)"
)

try:
    import torch
except ImportError:  # an isolated build, or torch not installed yet: metadata and sdist need no torch
    torch = None


def base_version() -> str:
    """morphpipe.__version__, read without importing the package."""
    text = (ROOT / "morphpipe" / "__init__.py").read_text()
    return re.search(r'^__version__ = "([^"]+)"', text, re.MULTILINE).group(1)


def load_native_config():
    """morphpipe/native.py alone (it needs only torch), for the sources, flags and CUDA decision it uses."""
    spec = importlib.util.spec_from_file_location("_morphpipe_native_config", ROOT / "morphpipe" / "native.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look the module up while it executes
    spec.loader.exec_module(module)
    return module


def torch_label(version: str) -> str:
    """A torch version as a local version label: "2.13.0+cpu" -> "torch2.13.0.cpu"."""
    return "torch" + re.sub(r"[^0-9A-Za-z.]", ".", version)


class MissingTorch(build_ext):
    """Stands in for torch's builder when torch cannot be imported: says how to build instead."""

    def run(self) -> None:
        if not self.editable_mode:
            raise SystemExit(f"error: torch is not importable in this build environment. {INSTALL_TORCH_FIRST}")


def native_extension_build() -> tuple[list[Extension], dict[str, type]]:
    """The extension and the build_ext command that compiles it (torch's BuildExtension)."""
    if torch is None:
        return [Extension("morphpipe._native", sources=[])], {"build_ext": MissingTorch}
    from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension

    native = load_native_config()
    try:
        native._ensure_ninja_on_path()  # before BuildExtension looks for ninja; without it, a serial build
    except native.NativeBuildError:
        pass
    cuda_problem = native._cuda_toolchain_problem()
    with_cuda = cuda_problem is None
    sources = [os.path.relpath(path, ROOT) for path in native.source_files(with_cuda)]
    make = CUDAExtension if with_cuda else CppExtension
    extension = make(
        "morphpipe._native",
        sources,
        include_dirs=[str(native.CSRC_DIR)],
        # -g0 undoes the -g of Python's own CFLAGS, which setuptools adds (the just-in-time build has none).
        extra_compile_args={"cxx": [*native.CXX_FLAGS, "-g0", *(["-DMORPHPIPE_WITH_CUDA"] if with_cuda else [])],
                            "nvcc": list(native.NVCC_FLAGS)},
        extra_link_args=list(native.LD_FLAGS),
    )

    class BuildNative(BuildExtension):
        """torch's BuildExtension, skipped for editable installs, recording the build in _native_build.json."""

        def run(self) -> None:
            if self.editable_mode:
                print("morphpipe: editable install; the native ops compile from csrc/ on first use")
                return
            major_minor = tuple(int(part) for part in torch.__version__.split(".")[:2])
            if not SUPPORTED_TORCH[0] <= major_minor < SUPPORTED_TORCH[1]:
                raise SystemExit(f"error: morphpipe supports torch>=2.11,<2.14, but torch {torch.__version__} "
                                 "is installed")
            arch_list = native.cuda_arch_list() if with_cuda else None
            if arch_list == "none":
                raise SystemExit("error: building the CUDA kernels needs the GPU architectures to compile for and "
                                 "no GPU is visible: set TORCH_CUDA_ARCH_LIST (e.g. \"8.0;9.0+PTX\"), or "
                                 "MORPHPIPE_NO_CUDA=1 for the CPU kernels only")
            print(f"morphpipe: compiling the native ops against torch {torch.__version__} "
                  + (f"with CUDA kernels for {arch_list}" if with_cuda else f"(CPU kernels only: {cuda_problem})"))
            super().run()
            record = {"torch": torch.__version__, "torch_cuda": torch.version.cuda, "cuda_arch_list": arch_list,
                      "cuda_skip_reason": cuda_problem, "source_hash": native.source_hash()}
            self._record_path().write_text(json.dumps(record, indent=2) + "\n")

        def _record_path(self) -> Path:
            return Path(self.get_ext_fullpath("morphpipe._native")).parent / native.PREBUILT_INFO.name

        def get_outputs(self) -> list[str]:
            return [*super().get_outputs(), str(self._record_path())]

    return [extension], {"build_ext": BuildNative}


ext_modules, cmdclass = native_extension_build()
labelled = torch is not None and "sdist" not in sys.argv  # an sdist builds against any supported torch
setup(
    version=base_version() + (f"+{torch_label(torch.__version__)}" if labelled else ""),
    ext_modules=ext_modules,
    cmdclass=cmdclass,
)
