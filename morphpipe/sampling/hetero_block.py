"""The typed layer of a heterogeneous mini-batch: one Block per relation, with per-type source and destination counts.

A relation `(src, name, dst)`'s Block maps the layer's `src`-type sources (local ids of that type)
to its `dst`-type destinations. Per node type the prefix convention holds: the first
`num_dst[t]` sources of type `t` are its destinations, in order. Every relation of the graph has
a Block in every layer (an empty one when none of its edges was sampled).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from morphpipe.sampling.minibatch import Block


@dataclass
class HeteroBlock:
    """One layer of a typed batch; moves, pins and counts like a `Block` (the `Layer` protocol)."""

    blocks: dict[Any, Block]  # relation (src, name, dst) -> Block
    num_src: dict[str, int]  # node type -> sources of that type
    num_dst: dict[str, int]  # node type -> destinations of that type

    @property
    def nnz(self) -> int:
        return sum(block.nnz for block in self.blocks.values())

    @property
    def nbytes(self) -> int:
        return sum(block.nbytes for block in self.blocks.values())

    @property
    def device(self) -> torch.device:
        return next(iter(self.blocks.values())).device

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "HeteroBlock":
        return self._map(lambda block: block.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> "HeteroBlock":
        return self._map(lambda block: block.pin_memory())

    def _map(self, block_fn) -> "HeteroBlock":
        return HeteroBlock({relation: block_fn(block) for relation, block in self.blocks.items()}, dict(self.num_src),
                           dict(self.num_dst))

    def tensors(self) -> list[torch.Tensor]:
        return [tensor for block in self.blocks.values() for tensor in block.tensors()]

    def record_stream(self, stream: "torch.cuda.Stream") -> None:
        for tensor in self.tensors():
            tensor.record_stream(stream)
