"""What Route 1 needs before it starts: a CUDA device and the native ops built with their CUDA kernels.

One check, one clear error naming what is missing and what runs instead, so a GPU batcher never
half-starts on a machine that cannot run it.
"""
from __future__ import annotations

from types import ModuleType

import torch

from morphpipe import native


class CudaUnavailableError(RuntimeError):
    """Route 1 (GPU batching over UVA) cannot run on this machine or with this build."""


def cuda_problem() -> str | None:
    """Why Route 1 cannot run here (torch without CUDA, no GPU), or None when it can; builds nothing."""
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU-only build"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no CUDA device"
    return None


def require_cuda(what: str) -> ModuleType:
    """The native module with its CUDA kernels loaded, or CudaUnavailableError saying why `what` cannot run."""
    problem = cuda_problem()
    if problem is not None:
        raise CudaUnavailableError(f"{what} needs a CUDA GPU, but {problem}; batch on the CPU with "
                                   "morphpipe.sampling.CpuBatcher (Route 0) instead")
    module = native.load()
    if not module.built_with_cuda():
        reason = native.build_config().cuda_skip_reason or "the build has no CUDA kernels"
        raise CudaUnavailableError(f"{what} needs the CUDA kernels of the native ops, which were not built "
                                   f"({reason}); install nvcc / set CUDA_HOME and rebuild, or use CpuBatcher")
    return module
