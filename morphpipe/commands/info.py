"""`morphpipe info`: versions, native build, OpenMP, CUDA, GPU, cores and memory of this machine."""
from __future__ import annotations

import argparse
import platform

import numpy
import torch

import morphpipe
from morphpipe import native
from morphpipe.data.feature_store import reader_line
from morphpipe.huge_pages import huge_pages
from morphpipe.openmp_env import wait_policy
from morphpipe.ops.cpu_memory import reuse_line
from morphpipe.profiler.hardware import HardwareFacts
from morphpipe.sampling.backend_check import verdict_rows


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("info", help="show versions, native build status and hardware")
    parser.add_argument("--verbose", action="store_true", help="show the compiler output if the native ops build")
    parser.set_defaults(func=run)


def native_status(verbose: bool = False) -> list[tuple[str, str]]:
    """Rows describing the native extension, building it if needed (a failure is reported, not raised)."""
    try:
        config = native.build_config()
        module = native.load(verbose=verbose)
    except native.NativeBuildError as error:
        return [("native ops", f"NOT BUILT: {error}")]
    openmp = module.openmp_max_threads()
    return [
        ("native ops", native.build_info()),
        ("CUDA kernels", "built" if module.built_with_cuda() else f"not built: {config.cuda_skip_reason}"),
        ("CPU kernels", native.cpu_capability_info()),
        ("OpenMP threads", str(openmp) if openmp else "built without OpenMP"),
        ("OpenMP wait policy", wait_policy().line()),
        ("huge pages for large tensors", huge_pages().line()),
        ("CPU memory reuse in training", reuse_line()),
        ("feature store reader", reader_line()),
    ]


def run(args: argparse.Namespace) -> int:
    facts = HardwareFacts.detect()
    native_rows = native_status(args.verbose)
    rows = [
        ("morphpipe", morphpipe.__version__),
        ("python", platform.python_version()),
        ("torch", torch.__version__),
        ("numpy", numpy.__version__),
        *native_rows,
        *verdict_rows(),
        ("torch CUDA", f"available, CUDA {torch.version.cuda}" if torch.cuda.is_available()
         else f"not available ({'CPU-only build' if torch.version.cuda is None else 'no device visible'})"),
        ("CPU", facts.cpu_model),
        ("cores", f"{facts.usable_cores} usable, {facts.logical_cores} logical, {facts.physical_cores} physical"),
        ("memory", f"{facts.memory_bytes / 2**30:.1f} GiB total, {facts.memory_available_bytes / 2**30:.1f} GiB free"),
    ]
    for gpu in facts.gpus:
        link = f", PCIe gen{gpu.pcie_max_gen or gpu.pcie_gen} x{gpu.pcie_max_width or gpu.pcie_width}" if gpu.pcie_gbps else ""
        rows.append((f"GPU {gpu.index}", f"{gpu.name}, {gpu.memory_bytes / 2**30:.0f} GiB{link}"))
    if not facts.gpus:
        rows.append(("GPU", facts.gpu_note or "none"))
    rows += [("note", note) for note in facts.notes]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    native_built = not native_rows[0][1].startswith("NOT BUILT")
    return 0 if native_built else 1
