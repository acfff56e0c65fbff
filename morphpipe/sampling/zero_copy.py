"""Zero-copy CUDA views of page-locked host tensors, so torch's own CUDA kernels read them over UVA.

A view is a CUDA tensor whose data pointer is the device address of pinned host memory: indexing
it on the GPU reads host memory across PCIe without a copy (PyTorch-Direct, DUCATI). It is built
through `__cuda_array_interface__` (torch.as_tensor aliases the memory and keeps the exporting
object, hence the host tensor, alive), with the device address from the CUDA driver's
`cuMemHostGetDevicePointer`, or the host address itself where the driver cannot be asked (under
unified virtual addressing they coincide for registered memory). Only `cuda_view` needs a GPU;
the interface description is plain data and is tested on any machine.
"""
from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable
from typing import Any

import torch

# The same-width integer type each element is exported as; the view is reinterpreted to the tensor's dtype
# afterwards, so dtypes numpy cannot describe (bfloat16) travel too.
_RAW_TYPESTR = {1: "|u1", 2: "<i2", 4: "<i4", 8: "<i8"}

DevicePointer = Callable[[int], int]


class ZeroCopyError(RuntimeError):
    """A host tensor cannot be viewed from the GPU without a copy."""


class _Exported:
    """The object torch.as_tensor reads: the interface dict, plus a reference that keeps the host tensor alive."""

    def __init__(self, host: torch.Tensor, interface: dict[str, Any]) -> None:
        self.host = host
        self.__cuda_array_interface__ = interface


def array_interface(host: torch.Tensor, device_pointer: int) -> dict[str, Any]:
    """The `__cuda_array_interface__` (v2) describing `host`'s bytes at `device_pointer`, as raw integers."""
    if host.device.type != "cpu" or not host.is_contiguous():
        raise ZeroCopyError(f"a zero-copy view needs a contiguous host tensor, got one on {host.device} with shape "
                            f"{tuple(host.shape)} and strides {host.stride()}")
    size = host.element_size()
    if size not in _RAW_TYPESTR:
        raise ZeroCopyError(f"no zero-copy view for {host.dtype} ({size}-byte elements)")
    return {"shape": tuple(host.shape), "typestr": _RAW_TYPESTR[size], "strides": None,
            "data": (int(device_pointer), False), "version": 2}


def driver_device_pointer(host_pointer: int) -> int:
    """The device address of registered host memory at `host_pointer` (cuMemHostGetDevicePointer), on the
    current device's context; the host address itself where the driver library cannot be loaded."""
    name = ctypes.util.find_library("cuda") or "libcuda.so.1"
    try:
        driver = ctypes.CDLL(name)
    except OSError:
        return host_pointer
    address = ctypes.c_uint64(0)
    status = driver.cuMemHostGetDevicePointer_v2(ctypes.byref(address), ctypes.c_void_p(host_pointer),
                                                 ctypes.c_uint(0))
    if status != 0:
        raise ZeroCopyError(f"cuMemHostGetDevicePointer failed (CUresult {status}) for host address "
                            f"{host_pointer:#x}: the memory is not page-locked for this device; pin it first "
                            "(morphpipe.sampling.pinning.HostPinning)")
    return int(address.value)


def cuda_view(host: torch.Tensor, device: torch.device,
              device_pointer: DevicePointer = driver_device_pointer) -> torch.Tensor:
    """A CUDA tensor on `device` aliasing the page-locked host tensor `host` (no copy; reads go over PCIe)."""
    if host.numel() == 0:
        return torch.empty(host.shape, dtype=host.dtype, device=device)
    if not host.is_pinned():
        raise ZeroCopyError(f"a zero-copy view needs page-locked memory, but this {tuple(host.shape)} {host.dtype} "
                            "tensor is pageable; pin it first (morphpipe.sampling.pinning.HostPinning)")
    with torch.cuda.device(device):
        address = device_pointer(host.data_ptr())
        raw = torch.as_tensor(_Exported(host, array_interface(host, address)), device=device)
    if raw.data_ptr() != address or raw.device != device:
        raise ZeroCopyError(f"torch copied the zero-copy view instead of aliasing it (got {raw.device}, address "
                            f"{raw.data_ptr():#x} for {address:#x} on {device}); register the memory for {device}")
    return raw.view(host.dtype)
