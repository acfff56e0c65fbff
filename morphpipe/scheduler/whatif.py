"""What-if machines: one measured profile re-read for other core counts or PCIe bandwidths.

Model (documented in `morphpipe simulate --help`):
- cores: the machine has `cores` usable cores and the CPU batcher runs one thread per core;
  T_CB(P) comes from the profile's thread scaling (measured points, interpolated in
  throughput, extrapolated beyond the largest measured count by its marginal per-thread
  gain, never improving past the core count). GPU phases do not change. On a CPU-only
  profile the cores are split again between batching and training.
- PCIe bandwidth: with r = (this machine's link bandwidth) / (the what-if bandwidth), DMA takes
  r times as long, and so does the part of UVA batching that moves bytes over the link; the
  rest of T_GB (sampling and gathering on the GPU) is unchanged. The transfer part is the
  profile's `uva_transfer_s` when measured, else min(T_GB, T_DMA): UVA gathers roughly the
  bytes a DMA would copy. This machine's link is its theoretical one (HardwareFacts) when
  known, else the effective bandwidth batch_bytes / T_DMA, and the note says which.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from morphpipe.profiler.profile import Profile
from morphpipe.scheduler.plan import Plan
from morphpipe.scheduler.planning import plan_from_profile


@dataclass(frozen=True)
class WhatIf:
    """A profile re-read for another machine, with notes on how it was derived."""

    profile: Profile
    notes: tuple[str, ...]


def reference_pcie_gbps(profile: Profile) -> tuple[float, str]:
    """This machine's PCIe bandwidth (GB/s) for scaling, and where the number comes from."""
    gpu = profile.hardware.gpu
    if gpu is not None and gpu.pcie_gbps is not None:
        return gpu.pcie_gbps, f"theoretical link of {gpu.name}"
    if profile.dma is not None and profile.batch_bytes > 0:
        return profile.batch_bytes / profile.dma.mean_s / 1e9, "effective DMA bandwidth batch_bytes / T_DMA"
    raise ValueError(
        "the profile knows neither its PCIe link (hardware.gpus) nor batch_bytes, so it cannot be scaled to "
        "another bandwidth; re-profile on the GPU machine, or leave out --pcie-gbps"
    )


def what_if(profile: Profile, cores: int | None = None, pcie_gbps: float | None = None) -> WhatIf:
    """The profile as it would read on a machine with `cores` usable cores and a `pcie_gbps` link."""
    notes: list[str] = []
    hardware = profile.hardware
    if cores is not None:
        if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
            raise ValueError(f"cores must be an integer >= 1, got {cores!r}")
        hardware = replace(hardware, physical_cores=cores, logical_cores=cores, usable_cores=cores,
                           notes=(*hardware.notes, f"what-if: {cores} cores"))
        notes.append(f"{cores} cores")
    changes: dict = {"hardware": hardware}
    if pcie_gbps is not None:
        if not pcie_gbps > 0:
            raise ValueError(f"--pcie-gbps must be > 0, got {pcie_gbps!r}")
        if profile.device != "cuda" or profile.dma is None or profile.gpu_batching is None:
            raise ValueError("--pcie-gbps needs a GPU profile: a CPU-only profile has no PCIe transfers")
        reference, source = reference_pcie_gbps(profile)
        ratio = reference / pcie_gbps
        t_gb = profile.gpu_batching.mean_s
        transfer = profile.uva_transfer_s if profile.uva_transfer_s is not None else min(t_gb, profile.dma.mean_s)
        scaled_gb = t_gb - transfer + transfer * ratio
        changes.update(
            dma=profile.dma.scaled(ratio),
            gpu_batching=profile.gpu_batching.scaled(scaled_gb / t_gb),
            uva_transfer_s=transfer * ratio,
            hardware=replace(hardware, notes=(*hardware.notes, f"what-if: PCIe {pcie_gbps:g} GB/s")),
        )
        notes.append(
            f"PCIe {pcie_gbps:g} GB/s vs {reference:.3g} GB/s ({source}): T_DMA x{ratio:.3g}, "
            f"T_GB {t_gb:.4g} s -> {scaled_gb:.4g} s (transfer part {transfer:.4g} s)"
        )
    return WhatIf(replace(profile, **changes), tuple(notes))


def sweep(profile: Profile, cores: Sequence[int], pcie_gbps: float | None = None, gbs: int = 10, seed: int = 0,
          engine: str = "fast") -> list[Plan]:
    """One plan per core count (what-if machines from one profile): the data of the paper's Figure 9."""
    return [plan_from_profile(what_if(profile, count, pcie_gbps).profile, gbs, seed, engine=engine)
            for count in cores]
