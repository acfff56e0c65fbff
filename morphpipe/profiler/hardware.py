"""Hardware facts the planner needs: CPU cores (usable ones), host memory, GPUs and their PCIe links.

CPU facts come from psutil and `morphpipe.cores` (affinity mask, cgroup CPU quota); GPU facts
from NVML (nvidia-ml-py). Without an NVIDIA driver there are simply no GPUs, and `gpu_note`
says why, once, instead of failing.
"""
from __future__ import annotations

import os
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from morphpipe.cores import usable_cores_with_notes
from morphpipe.documents import FieldReader

# Usable bandwidth of one PCIe lane in one direction, GB/s (10^9 bytes/s), after line encoding:
# gen1/2 8b/10b, gen3-5 128b/130b, gen6 PAM4 with 242/256 FLIT encoding.
PCIE_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.984615, 4: 1.969231, 5: 3.938462, 6: 7.5625}


def pcie_bandwidth_gbps(generation: int | None, width: int | None) -> float | None:
    """Theoretical one-direction PCIe bandwidth in GB/s, or None when the link is unknown."""
    if generation is None or width is None or generation not in PCIE_LANE_GBPS or width < 1:
        return None
    return PCIE_LANE_GBPS[generation] * width


@dataclass(frozen=True)
class GpuFacts:
    """One GPU: name, memory and PCIe link (current, and the maximum the GPU and slot support)."""

    index: int
    name: str
    memory_bytes: int
    pcie_gen: int | None = None
    pcie_width: int | None = None
    pcie_max_gen: int | None = None
    pcie_max_width: int | None = None

    @property
    def pcie_gbps(self) -> float | None:
        """Theoretical one-direction bandwidth of the link at its maximum generation and width.

        GPUs drop their link to a low generation while idle, so the current generation
        understates what a transfer gets; the maximum is what a busy link runs at.
        """
        return pcie_bandwidth_gbps(self.pcie_max_gen or self.pcie_gen, self.pcie_max_width or self.pcie_width)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "pcie_gbps": self.pcie_gbps}

    @classmethod
    def from_fields(cls, reader: FieldReader) -> GpuFacts:
        return cls(
            index=reader.integer("index", minimum=0),
            name=reader.string("name"),
            memory_bytes=reader.integer("memory_bytes", minimum=0),
            pcie_gen=reader.integer("pcie_gen", minimum=1, optional=True),
            pcie_width=reader.integer("pcie_width", minimum=1, optional=True),
            pcie_max_gen=reader.integer("pcie_max_gen", minimum=1, optional=True),
            pcie_max_width=reader.integer("pcie_max_width", minimum=1, optional=True),
        )


@dataclass(frozen=True)
class HardwareFacts:
    """The machine: CPU model, physical/logical/usable cores, memory, GPUs (empty without a driver)."""

    cpu_model: str
    physical_cores: int | None
    logical_cores: int
    usable_cores: int
    memory_bytes: int
    memory_available_bytes: int
    gpus: tuple[GpuFacts, ...] = ()
    gpu_note: str = ""
    driver_version: str | None = None
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if isinstance(self.usable_cores, bool) or not isinstance(self.usable_cores, int) or self.usable_cores < 1:
            raise ValueError(f"HardwareFacts.usable_cores must be an integer >= 1, got {self.usable_cores!r}")
        object.__setattr__(self, "gpus", tuple(self.gpus))
        object.__setattr__(self, "notes", tuple(self.notes))

    @property
    def gpu(self) -> GpuFacts | None:
        """The first GPU, the one a single-GPU plan uses; None without one."""
        return self.gpus[0] if self.gpus else None

    @classmethod
    def detect(cls) -> HardwareFacts:
        """Reads the facts of the machine this process runs on."""
        memory = psutil.virtual_memory()
        logical = psutil.cpu_count(logical=True) or os.cpu_count() or 1
        usable, core_notes = usable_cores_with_notes(logical)
        gpus, gpu_note, driver = _detect_gpus()
        return cls(
            cpu_model=_cpu_model(),
            physical_cores=psutil.cpu_count(logical=False),
            logical_cores=logical,
            usable_cores=usable,
            memory_bytes=int(memory.total),
            memory_available_bytes=int(memory.available),
            gpus=tuple(gpus),
            gpu_note=gpu_note,
            driver_version=driver,
            notes=tuple(core_notes),
        )

    @classmethod
    def synthetic(cls, cores: int, gpu: bool = True, pcie_gen: int = 4, pcie_width: int = 16) -> HardwareFacts:
        """Made-up facts for synthetic profiles and what-if machines."""
        gpus = (GpuFacts(0, "synthetic GPU", 80 << 30, pcie_gen, pcie_width, pcie_gen, pcie_width),) if gpu else ()
        return cls(
            cpu_model="synthetic CPU",
            physical_cores=cores,
            logical_cores=cores,
            usable_cores=cores,
            memory_bytes=256 << 30,
            memory_available_bytes=256 << 30,
            gpus=gpus,
            gpu_note="" if gpu else "synthetic machine without a GPU",
            notes=("synthetic",),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "cpu_model": self.cpu_model,
            "physical_cores": self.physical_cores,
            "logical_cores": self.logical_cores,
            "usable_cores": self.usable_cores,
            "memory_bytes": self.memory_bytes,
            "memory_available_bytes": self.memory_available_bytes,
            "gpus": [gpu.to_dict() for gpu in self.gpus],
            "gpu_note": self.gpu_note,
            "driver_version": self.driver_version,
            "notes": list(self.notes),
        }

    @classmethod
    def from_fields(cls, reader: FieldReader) -> HardwareFacts:
        """Reads and validates the `hardware` section of a profile."""
        notes = reader.data.get("notes", [])
        if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
            raise reader.error("notes", "must be a list of strings", notes)
        return cls(
            cpu_model=reader.string("cpu_model"),
            physical_cores=reader.integer("physical_cores", minimum=1, optional=True),
            logical_cores=reader.integer("logical_cores", minimum=1),
            usable_cores=reader.integer("usable_cores", minimum=1),
            memory_bytes=reader.integer("memory_bytes", minimum=0),
            memory_available_bytes=reader.integer("memory_available_bytes", minimum=0),
            gpus=tuple(GpuFacts.from_fields(item) for item in reader.sections("gpus")),
            gpu_note=reader.string("gpu_note"),
            driver_version=reader.string("driver_version", optional=True),
            notes=tuple(notes),
        )


def _cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo (Linux), else what the platform module reports."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown CPU"


def _detect_gpus() -> tuple[list[GpuFacts], str, str | None]:
    """GPUs through NVML; without the library or a driver, no GPUs and a note saying why."""
    try:
        import pynvml
    except ImportError:
        return [], "nvidia-ml-py is not installed, GPU facts unavailable (pip install nvidia-ml-py)", None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        return [], f"no NVIDIA driver or GPU found (NVML: {error}); planning for the CPU only", None
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            gpus.append(
                GpuFacts(
                    index=index,
                    name=_text(pynvml.nvmlDeviceGetName(handle)),
                    memory_bytes=int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
                    pcie_gen=_optional(pynvml.nvmlDeviceGetCurrPcieLinkGeneration, handle),
                    pcie_width=_optional(pynvml.nvmlDeviceGetCurrPcieLinkWidth, handle),
                    pcie_max_gen=_optional(pynvml.nvmlDeviceGetMaxPcieLinkGeneration, handle),
                    pcie_max_width=_optional(pynvml.nvmlDeviceGetMaxPcieLinkWidth, handle),
                )
            )
        note = "" if gpus else "the NVIDIA driver reports no GPUs; planning for the CPU only"
        return gpus, note, driver
    finally:
        pynvml.nvmlShutdown()


def _optional(query: Any, handle: Any) -> int | None:
    """An NVML integer query that some GPUs (or virtualised ones) do not support."""
    import pynvml

    try:
        return int(query(handle))
    except pynvml.NVMLError:
        return None


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
