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
- memory (features on disk): the machine has `memory` times the memory budget for data; the
  topology still needs what it needs, the feature cache may take the rest (and the planner
  chooses its size again); the hit ratio beyond the largest measured cache size rises linearly
  to 1 at every row cached. Available memory (pinned buffers) scales alike.
- disk speed (features on disk): random and sequential reads `disk_speed` times as fast, so a
  missed row holds the disk 1/disk_speed as long.
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


def what_if(profile: Profile, cores: int | None = None, pcie_gbps: float | None = None, *,
            memory: float | None = None, disk_speed: float | None = None) -> WhatIf:
    """The profile as it would read on a machine with `cores` usable cores, a `pcie_gbps` link, `memory` times the
    memory budget and a disk `disk_speed` times as fast."""
    notes: list[str] = []
    hardware = profile.hardware
    disk = profile.disk
    for name, factor in (("--ram-scale", memory), ("--disk-speed", disk_speed)):
        if factor is None:
            continue
        if not factor > 0:
            raise ValueError(f"{name} must be > 0, got {factor!r}")
        if disk is None:
            raise ValueError(f"{name} needs a profile with features on disk (its 'disk' section); this one read its "
                             "features from RAM: tune with --features-on-disk (or a --memory-budget below the "
                             "features) first")
    if memory is not None:
        disk = disk.scaled(memory=memory)
        hardware = replace(hardware, memory_available_bytes=int(hardware.memory_available_bytes * memory),
                           notes=(*hardware.notes, f"what-if: {memory:g}x the memory"))
        notes.append(f"{memory:g}x the memory: feature cache budget {profile.disk.cache_budget_bytes / 1e6:,.1f} MB "
                     f"-> {disk.cache_budget_bytes / 1e6:,.1f} MB")
    if disk_speed is not None:
        disk = disk.scaled(disk=disk_speed)
        notes.append(f"a disk {disk_speed:g}x as fast: {profile.disk.facts.random_reads_per_s:,.0f} -> "
                     f"{disk.facts.random_reads_per_s:,.0f} random reads/s")
    if cores is not None:
        if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
            raise ValueError(f"cores must be an integer >= 1, got {cores!r}")
        hardware = replace(hardware, physical_cores=cores, logical_cores=cores, usable_cores=cores,
                           notes=(*hardware.notes, f"what-if: {cores} cores"))
        notes.append(f"{cores} cores")
    changes: dict = {"hardware": hardware, "disk": disk}
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
          engine: str = "fast", *, memory: float | None = None, disk_speed: float | None = None) -> list[Plan]:
    """One plan per core count (what-if machines from one profile): the data of the paper's Figure 9."""
    return [plan_from_profile(what_if(profile, count, pcie_gbps, memory=memory, disk_speed=disk_speed).profile, gbs,
                              seed, engine=engine)
            for count in cores]
