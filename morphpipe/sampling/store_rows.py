"""Route 1's feature rows when the features are on disk: read through the host's FeatureStore, then copied over.

A GPU reads in-memory features over UVA, page-locked in place; features on disk cannot be (registering
their memory map would pin, and so read, the whole file). So Route 1 samples on its device, sends the
batch's input node ids to the host, gathers their rows through the store (its RAM cache of hot rows,
then the disk), and copies them back. `StoreRows` stands where a feature tensor would in
`torch_sampler.GraphTensors` and `GpuCache`: it has the tensor's shape and dtype and its `index_select`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from morphpipe.data.feature_store import FeatureStore


@dataclass(frozen=True)
class StoreRows:
    """The rows of FeatureStore `store`, delivered on `device` (pinned and copied asynchronously to a GPU)."""

    store: FeatureStore
    device: torch.device

    @property
    def shape(self) -> torch.Size:
        return torch.Size(self.store.shape)

    @property
    def dtype(self) -> torch.dtype:
        return self.store.dtype

    def index_select(self, dim: int, index: torch.Tensor) -> torch.Tensor:
        """Rows `index` (on any device) on `device`, bit for bit what `features.index_select(0, index)` gives."""
        if dim != 0:
            raise ValueError(f"StoreRows selects rows only (dim=0), not dim={dim}")
        rows = self.store.gather(index.to("cpu"))
        if self.device.type != "cuda":
            return rows.to(self.device)
        return rows.pin_memory().to(self.device, non_blocking=True)  # the host allocator keeps it until copied
