"""The mini-batch data model shared by every batcher, the executor and the models.

A `Block` is one GNN layer of a sampled mini-batch in CSC form over local ids; a
`MiniBatch` is the whole sampled computation graph plus the gathered inputs and the task's
targets. Prefix convention: the first `num_dst` source nodes of a block are its destination
nodes, in order, so `h_src[:num_dst]` are the destination (self) features.

One shape serves every task and graph kind (the seam the link and heterogeneous work share):
- node tasks: `seeds` are the epoch's units and `y` their labels;
- edge tasks: `pairs` (an `EdgePairs`) holds the batch's seed edges (the epoch's units) and their
  negatives as local ids of `seeds`, the unique endpoints the last layer computes;
- typed (heterogeneous) graphs: a layer may be any `Layer` (a Block per relation), and `x` a dict
  of per-node-type feature tensors; `input_nodes` stays one tensor of global ids (node types are
  ranges of one id space).
Every tensor field may be a tensor or a dict of tensors; `to`, `pin_memory`, `record_stream` and
`nbytes` walk them all.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, Union

import torch

# A tensor field of a batch: one tensor, or one per node type or relation.
Tensors = Union[torch.Tensor, dict[Any, torch.Tensor]]


def tensors_of(value: Tensors | None) -> list[torch.Tensor]:
    """The tensors in a field (a tensor, a dict of them, or None)."""
    if value is None:
        return []
    if isinstance(value, dict):
        return list(value.values())
    return [value]


def map_tensors(value: Tensors | None, tensor_fn) -> Tensors | None:
    """`tensor_fn` applied to every tensor of a field, keeping its shape (tensor, dict or None)."""
    if value is None:
        return None
    if isinstance(value, dict):
        return {key: tensor_fn(tensor) for key, tensor in value.items()}
    return tensor_fn(value)


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

    def tensors(self) -> list[torch.Tensor]:
        """The block's structure tensors."""
        return [self.indptr, self.indices, *([] if self.src_degrees is None else [self.src_degrees])]

    def record_stream(self, stream: "torch.cuda.Stream") -> None:
        for tensor in self.tensors():
            tensor.record_stream(stream)


class Layer(Protocol):
    """What the executor and the devices need of one layer of a batch: a `Block`, or a typed layer (a Block per
    relation) that moves, pins and counts the same way."""

    @property
    def nnz(self) -> int: ...

    @property
    def nbytes(self) -> int: ...

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "Layer": ...

    def pin_memory(self) -> "Layer": ...

    def tensors(self) -> list[torch.Tensor]: ...

    def record_stream(self, stream: "torch.cuda.Stream") -> None: ...


@dataclass
class EdgePairs:
    """The seed edges of an edge-task batch and their negatives, as local ids of the batch's `seeds`.

    `edge_ids[i]` (global id of a training edge: the epoch's unit) joins `seeds[src[i]]` to `seeds[dst[i]]`;
    `negative_dst[i, j]` is the j-th corrupted destination of positive i (zero columns: no negatives).
    """

    edge_ids: torch.Tensor  # int64 [B]
    src: torch.Tensor  # int64 [B], local ids in [0, len(seeds))
    dst: torch.Tensor  # int64 [B]
    negative_dst: torch.Tensor  # int64 [B, k]

    @property
    def num_edges(self) -> int:
        return int(self.edge_ids.numel())

    def tensors(self) -> list[torch.Tensor]:
        return [self.edge_ids, self.src, self.dst, self.negative_dst]

    def map(self, tensor_fn) -> "EdgePairs":
        return EdgePairs(*(tensor_fn(t) for t in self.tensors()))


@dataclass
class MiniBatch:
    """A sampled mini-batch: `blocks` input layer first, `x = features[input_nodes]`, `y = labels[seeds]` (node
    tasks) or the seed edges and their negatives in `pairs` (edge tasks; `y` is then empty)."""

    seeds: torch.Tensor  # int64 [batch], global ids of the last layer's destinations
    input_nodes: torch.Tensor  # int64 [num_src of blocks[0]], global ids, seeds first
    blocks: list[Layer]
    x: Tensors  # [len(input_nodes), F], or per node type
    y: torch.Tensor  # int64 [batch] node labels; empty for edge tasks
    batch_index: int = -1  # position in the epoch, -1 when not produced by an epoch iterator
    route: int = field(default=0)  # 0: CPU batcher, 1: GPU batcher (DESIGN.md, routes)
    build_s: float | None = None  # seconds one batching thread spent building it, when the batcher measured it
    # how a batch made on its own CUDA stream is handed over (morphpipe.sampling.streams.Handoff); not copied by
    # to()/pin_memory(), whose results are made on the caller's stream; None: ready on the current stream
    handoff: Any = field(default=None, compare=False, repr=False)
    pairs: EdgePairs | None = None  # edge tasks: the seed edges and their negatives

    @property
    def num_seeds(self) -> int:
        """The epoch's units in this batch: seed nodes, or seed edges for an edge task."""
        return self.pairs.num_edges if self.pairs is not None else int(self.seeds.numel())

    @property
    def units(self) -> torch.Tensor:
        """Global ids of the epoch's units in this batch (what exactly-once counts): seed nodes or seed edges."""
        return self.pairs.edge_ids if self.pairs is not None else self.seeds

    @property
    def device(self) -> torch.device:
        """Where the batch's features are."""
        features = tensors_of(self.x)
        return features[0].device if features else self.seeds.device

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor of the batch except the blocks'."""
        pairs = self.pairs.tensors() if self.pairs is not None else []
        return [self.seeds, self.input_nodes, *tensors_of(self.x), self.y, *pairs]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors()) + sum(b.nbytes for b in self.blocks)

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
            x=map_tensors(self.x, tensor_fn),
            y=tensor_fn(self.y),
            batch_index=self.batch_index,
            route=self.route,
            pairs=self.pairs.map(tensor_fn) if self.pairs is not None else None,
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
        for t in self.tensors():
            t.record_stream(stream)
        for b in self.blocks:
            b.record_stream(stream)
