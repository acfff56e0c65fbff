"""The mini-batch data model shared by every batcher, the executor and the models.

A `Block` is one GNN layer of a sampled mini-batch in CSC form over local ids; a
`MiniBatch` is the whole sampled computation graph plus the gathered inputs and labels.
Prefix convention: the first `num_dst` source nodes of a block are its destination nodes,
in order, so `h_src[:num_dst]` are the destination (self) features.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class Block:
    """One layer: for each of `num_dst` destinations, its sampled sources (local ids)."""

    indptr: torch.Tensor  # int64 [num_dst + 1]
    indices: torch.Tensor  # int64 [nnz], local ids in [0, num_src)
    num_src: int
    num_dst: int
    # Sources' out-degrees over the whole layer when the block is a slice of a square (whole-graph)
    # layer, as layer-wise inference cuts it; None: degrees are counted over the block's own edges.
    src_degrees: torch.Tensor | None = None

    @property
    def nnz(self) -> int:
        return int(self.indices.numel())

    @property
    def device(self) -> torch.device:
        return self.indices.device

    @property
    def nbytes(self) -> int:
        return self.indptr.numel() * self.indptr.element_size() + self.indices.numel() * self.indices.element_size()

    def dst_of_edges(self) -> torch.Tensor:
        """Destination local id of every edge, in CSC order (the expanded indptr)."""
        degrees = self.indptr[1:] - self.indptr[:-1]
        return torch.repeat_interleave(torch.arange(self.num_dst, device=self.device), degrees)

    def edge_index(self) -> torch.Tensor:
        """PyG-style `[2, nnz]` edge_index (row 0 source, row 1 destination, flow source_to_target)."""
        return torch.stack([self.indices, self.dst_of_edges()])

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "Block":
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> "Block":
        return self._map(lambda t: t.pin_memory())

    def _map(self, tensor_fn) -> "Block":
        degrees = None if self.src_degrees is None else tensor_fn(self.src_degrees)
        return Block(tensor_fn(self.indptr), tensor_fn(self.indices), self.num_src, self.num_dst, degrees)

    def record_stream(self, stream: "torch.cuda.Stream") -> None:
        self.indptr.record_stream(stream)
        self.indices.record_stream(stream)
        if self.src_degrees is not None:
            self.src_degrees.record_stream(stream)


@dataclass
class MiniBatch:
    """A sampled mini-batch: `blocks` input layer first, `x = features[input_nodes]`, `y = labels[seeds]`."""

    seeds: torch.Tensor  # int64 [batch], global ids
    input_nodes: torch.Tensor  # int64 [num_src of blocks[0]], global ids, seeds first
    blocks: list[Block]
    x: torch.Tensor  # [len(input_nodes), F]
    y: torch.Tensor  # int64 [batch]
    batch_index: int = -1  # position in the epoch, -1 when not produced by an epoch iterator
    route: int = field(default=0)  # 0: CPU batcher, 1: GPU batcher (DESIGN.md, routes)
    build_s: float | None = None  # seconds one batching thread spent building it, when the batcher measured it
    # how a batch made on its own CUDA stream is handed over (morphpipe.sampling.streams.Handoff); not copied by
    # to()/pin_memory(), whose results are made on the caller's stream; None: ready on the current stream
    handoff: Any = field(default=None, compare=False, repr=False)

    @property
    def num_seeds(self) -> int:
        return int(self.seeds.numel())

    @property
    def device(self) -> torch.device:
        return self.x.device

    @property
    def nbytes(self) -> int:
        tensors = (self.seeds, self.input_nodes, self.x, self.y)
        return sum(t.numel() * t.element_size() for t in tensors) + sum(b.nbytes for b in self.blocks)

    def num_sampled_edges(self) -> int:
        return sum(b.nnz for b in self.blocks)

    def edge_indices(self) -> list[torch.Tensor]:
        """PyG-style edge_index of every layer, input layer first."""
        return [b.edge_index() for b in self.blocks]

    def _map(self, tensor_fn, block_fn) -> "MiniBatch":
        return MiniBatch(
            seeds=tensor_fn(self.seeds),
            input_nodes=tensor_fn(self.input_nodes),
            blocks=[block_fn(b) for b in self.blocks],
            x=tensor_fn(self.x),
            y=tensor_fn(self.y),
            batch_index=self.batch_index,
            route=self.route,
        )

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "MiniBatch":
        return self._map(
            lambda t: t.to(device, non_blocking=non_blocking),
            lambda b: b.to(device, non_blocking=non_blocking),
        )

    def pin_memory(self) -> "MiniBatch":
        return self._map(lambda t: t if t.is_pinned() else t.pin_memory(), lambda b: b.pin_memory())

    def record_stream(self, stream: "torch.cuda.Stream") -> None:
        """Mark every tensor as used on `stream` so the caching allocator does not reuse it early."""
        for t in (self.seeds, self.input_nodes, self.x, self.y):
            t.record_stream(stream)
        for b in self.blocks:
            b.record_stream(stream)
