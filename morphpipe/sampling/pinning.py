"""Page-locks the graph store's host tensors in place, so the GPU reads them over UVA (Route 1).

`cudaHostRegister` pins memory that already exists: a 50 GB feature matrix is not copied, and
memory-mapped arrays stay where they are (registration faults every page in once). The GPU only
reads, so registrations are read-only for the device where the driver supports it, which is
also what lets CUDA pin read-only or copy-on-write file mappings; where the driver cannot register
read-only, a copy-on-write mapping (`GraphStore.load(mmap=True)`) is refused, since a writable
registration would make the driver copy every page of the file. `HostPinning` undoes every
registration on `close()` or at the end of a `with` block (and, as a last resort, when it is
garbage-collected). `mode="copy"` copies into pinned memory instead, for memory CUDA refuses to
register, at the price of a second host copy.
"""
from __future__ import annotations

import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from morphpipe.sampling.cuda_support import require_cuda

PIN_MODES = ("register", "copy")


class PinningError(RuntimeError):
    """A host tensor could not be page-locked for the GPU."""


@dataclass
class PinnedTensor:
    """One tensor as the GPU reads it: the original (registered here, or already pinned) or a pinned copy."""

    name: str
    tensor: torch.Tensor
    registered: bool  # True when HostPinning registered it and must unregister it


@dataclass(frozen=True)
class FileMapping:
    """The file a tensor's memory is mapped from, and whether the mapping is private (copy-on-write)."""

    path: str
    private: bool


def file_mapping(tensor: torch.Tensor) -> FileMapping | None:
    """How `tensor`'s memory is mapped from a file (Linux /proc/self/maps), or None for anonymous memory."""
    maps = Path("/proc/self/maps")
    if tensor.numel() == 0 or not maps.exists():
        return None
    address = tensor.data_ptr()
    for line in maps.read_text().splitlines():
        fields = line.split(maxsplit=5)
        low, high = (int(part, 16) for part in fields[0].split("-"))
        if low <= address < high:
            path = fields[5].strip() if len(fields) == 6 else ""
            return FileMapping(path, private=fields[1].endswith("p")) if path.startswith("/") else None
    return None


def mapped_file(tensor: torch.Tensor) -> str | None:
    """The file `tensor`'s memory is mapped from, or None for anonymous memory."""
    mapping = file_mapping(tensor)
    return None if mapping is None else mapping.path


def check_registrable(name: str, tensor: torch.Tensor, read_only_supported: bool) -> None:
    """Refuses a copy-on-write file mapping where registrations cannot be read-only.

    Registered writable, such a mapping makes the driver break copy-on-write on every page, i.e. copy
    the whole file into anonymous memory, once per process; a shared mapping pins the page cache itself.
    """
    if read_only_supported:
        return
    mapping = file_mapping(tensor)
    if mapping is None or not mapping.private:
        return
    size = tensor.numel() * tensor.element_size()
    raise PinningError(
        f"cannot page-lock graph tensor {name!r} ({size:,} bytes) in place: it is a copy-on-write memory map of "
        f"{mapping.path}, and this GPU cannot register memory read-only (cudaDevAttrHostRegisterReadOnlySupported "
        "is 0), so the driver would copy every page of the file. Fixes: pass pinning='copy' to copy it into "
        "pinned memory once, or load the graph into RAM (GraphStore.load(path, mmap=False))"
    )


class _Registrations:
    """Process-wide reference counts of registered ranges, so two batchers over one graph share a registration
    and the first to close does not unpin memory the other still reads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[int, int], int] = {}

    def acquire(self, native_module, tensor: torch.Tensor, read_only: bool) -> str:
        """Registers `tensor`'s range (or counts one more user); '' on success, else CUDA's error."""
        key = (tensor.data_ptr(), tensor.numel() * tensor.element_size())
        with self._lock:
            if key not in self._counts:
                error = native_module.cuda_host_register(tensor, read_only)
                if error:
                    return error
            self._counts[key] = self._counts.get(key, 0) + 1
            return ""

    def release(self, native_module, tensor: torch.Tensor) -> str:
        """One user fewer; the last one unregisters. '' on success, else CUDA's error."""
        key = (tensor.data_ptr(), tensor.numel() * tensor.element_size())
        with self._lock:
            self._counts[key] -= 1
            if self._counts[key] > 0:
                return ""
            del self._counts[key]
            return native_module.cuda_host_unregister(tensor)

    def holds(self, tensor: torch.Tensor) -> bool:
        """Whether this process registered exactly `tensor`'s range through HostPinning."""
        with self._lock:
            return (tensor.data_ptr(), tensor.numel() * tensor.element_size()) in self._counts


REGISTRATIONS = _Registrations()


def _unregister_all(native_module, tensors: list[PinnedTensor]) -> list[str]:
    """Releases what was registered; returns failures as 'name: error' (also an unclosed HostPinning's finaliser)."""
    failures = []
    for pinned in tensors:
        if pinned.registered:
            error = REGISTRATIONS.release(native_module, pinned.tensor)
            if error:
                failures.append(f"{pinned.name}: {error}")
            pinned.registered = False
    return failures


class HostPinning:
    """Named host tensors page-locked for the GPU; `pinning["features"]` is the tensor kernels read."""

    def __init__(self, tensors: Mapping[str, torch.Tensor], mode: str = "register") -> None:
        if mode not in PIN_MODES:
            raise ValueError(f"pinning mode={mode!r}: use 'register' (pin in place, no copy) or 'copy' "
                             "(copy into pinned memory, doubling host memory)")
        self.mode = mode
        self._native = require_cuda("pinning host memory for the GPU")
        self._read_only = bool(self._native.cuda_host_register_read_only_supported())
        self._tensors: list[PinnedTensor] = []
        self._finalizer = weakref.finalize(self, _unregister_all, self._native, self._tensors)
        try:
            for name, tensor in tensors.items():
                self._tensors.append(self._pin(name, tensor))
        except BaseException:
            self.close()
            raise

    def _pin(self, name: str, tensor: torch.Tensor) -> PinnedTensor:
        if tensor.device.type != "cpu":
            raise PinningError(f"{name}: expected a host (CPU) tensor to pin, got one on {tensor.device}")
        if not tensor.is_contiguous():
            raise PinningError(f"{name}: a non-contiguous tensor ({tuple(tensor.shape)}, strides {tensor.stride()}) "
                               "cannot be pinned in place; store it contiguous (tensor.contiguous()) first")
        if tensor.numel() == 0 or (tensor.is_pinned() and not REGISTRATIONS.holds(tensor)):
            return PinnedTensor(name, tensor, registered=False)
        if self.mode == "copy":
            return PinnedTensor(name, tensor.pin_memory(), registered=False)
        check_registrable(name, tensor, self._read_only)
        error = REGISTRATIONS.acquire(self._native, tensor, self._read_only)
        if error:
            raise PinningError(self._refusal(name, tensor, error))
        return PinnedTensor(name, tensor, registered=True)

    def _refusal(self, name: str, tensor: torch.Tensor, error: str) -> str:
        """Why CUDA refused to register `tensor`, and the fixes."""
        size = f"{tuple(tensor.shape)} {tensor.dtype}, {tensor.numel() * tensor.element_size():,} bytes"
        source = mapped_file(tensor)
        where = f"it is memory-mapped from {source}, and CUDA refused to pin that file mapping" if source else \
            "it is ordinary host memory"
        return (f"cannot page-lock graph tensor {name!r} ({size}) in place: {error}; {where}. Fixes: load the graph "
                "into RAM (GraphStore.load(path, mmap=False)), or pass pinning='copy' to copy it into pinned memory "
                "(a second host copy of that size)")

    def __getitem__(self, name: str) -> torch.Tensor:
        for pinned in self._tensors:
            if pinned.name == name:
                return pinned.tensor
        raise KeyError(f"{name!r} is not pinned here; pinned: {', '.join(p.name for p in self._tensors)}")

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def close(self) -> None:
        """Unregisters every tensor registered here and drops pinned copies; safe to call twice."""
        if self.closed:
            return
        self._finalizer.detach()
        failures = _unregister_all(self._native, self._tensors)
        self._tensors.clear()
        if failures:
            raise PinningError(f"cudaHostUnregister failed for {'; '.join(failures)}")

    def __enter__(self) -> "HostPinning":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
