"""Route 1's algorithm in plain vectorised PyTorch: the same function on CPU tensors (CI) and on CUDA tensors.

One hop samples, for every destination at once, up to `fanout` distinct in-neighbours uniformly
without replacement (all of them for `fanout = -1` or a smaller degree, none for degree 0):
Floyd's algorithm vectorised over destinations for small fanouts, random keys with a segmented
sort for large ones. Sources are relabelled in order of first occurrence with the destinations as
their prefix, and each hop becomes a CSC `Block`; feature rows and labels are gathered with
`index_select`. Randomness comes from one `torch.Generator` on the tensors' device, seeded per
batch, so a batch is a function of (seed, batch) on a given device. On a GPU the topology,
features and labels are zero-copy CUDA views of pinned host memory (`morphpipe.sampling.zero_copy`),
so torch's own CUDA kernels do the reads over UVA; an optional `TorchCache` serves hot lists and
rows from device memory instead, without changing what a batch holds.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from morphpipe.sampling.minibatch import Block, MiniBatch

# Floyd's loop costs O(fanout^2) comparisons per destination; beyond this, random keys and a sort are cheaper.
FLOYD_MAX_FANOUT = 32


@dataclass(frozen=True)
class GraphTensors:
    """What the sampler reads: CSC topology, features and labels, all on one device (or views that act so)."""

    indptr: torch.Tensor  # int64 [N + 1]
    indices: torch.Tensor  # int32/int64 [E]
    features: torch.Tensor  # [N, F]
    labels: torch.Tensor  # int64 [N]


@dataclass(frozen=True)
class TorchCache:
    """Device-resident copies of hot neighbour lists and feature rows (a GpuCache's tables); -1 slots: not cached."""

    adjacency_slot: torch.Tensor  # int32 [N] or empty
    adjacency_indptr: torch.Tensor  # int64 [M + 1]
    adjacency_indices: torch.Tensor  # [E_cached]
    feature_slot: torch.Tensor  # int32 [N] or empty
    feature_rows: torch.Tensor  # [R, F]


def seeded_generator(device: torch.device, seed: int) -> torch.Generator:
    """A generator on `device` seeded with `seed`: the only source of randomness of one batch."""
    return torch.Generator(device=device).manual_seed(int(seed))


def uniform_below(bound: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """int64, one uniform draw in [0, bound_i) per entry of `bound` (every bound >= 1)."""
    draws = torch.rand(bound.shape, generator=generator, dtype=torch.float64, device=bound.device)
    return torch.minimum((draws * bound).to(torch.int64), bound - 1)


def floyd_offsets(degree: torch.Tensor, fanout: int, generator: torch.Generator) -> torch.Tensor:
    """int64 [len(degree), fanout]: distinct offsets into each list, a uniform `fanout`-subset (degree > fanout).

    Floyd: for j = d - k .. d - 1 draw t in [0, j]; keep t unless already taken, else keep j.
    """
    picks = torch.empty((degree.numel(), fanout), dtype=torch.int64, device=degree.device)
    for step in range(fanout):
        upper = degree - fanout + step
        draw = uniform_below(upper + 1, generator)
        if step:
            taken = (picks[:, :step] == draw.unsqueeze(1)).any(dim=1)
            draw = torch.where(taken, upper, draw)
        picks[:, step] = draw
    return picks


def random_key_offsets(degree: torch.Tensor, fanout: int, generator: torch.Generator) -> torch.Tensor:
    """int64 [len(degree), fanout]: the offsets of the `fanout` smallest of one random key per list entry."""
    rows = degree.numel()
    total = int(degree.sum())
    segment = torch.repeat_interleave(torch.arange(rows, device=degree.device), degree, output_size=total)
    keys = torch.rand(total, generator=generator, dtype=torch.float64, device=degree.device)
    order = torch.sort(keys).indices
    order = order[torch.sort(segment[order], stable=True).indices]
    starts = torch.cumsum(degree, 0) - degree
    sorted_segment = segment[order]
    rank = torch.arange(total, device=degree.device) - starts[sorted_segment]
    offsets = order - starts[sorted_segment]
    return offsets[rank < fanout].view(rows, fanout)


def sample_offsets(degree: torch.Tensor, fanout: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor,
                                                                                          torch.Tensor]:
    """For destinations of in-degree `degree`: (block indptr [m + 1], row of each edge, offset into its list)."""
    take = degree if fanout < 0 else torch.clamp(degree, max=fanout)
    indptr = torch.zeros(degree.numel() + 1, dtype=torch.int64, device=degree.device)
    torch.cumsum(take, 0, out=indptr[1:])
    total = int(indptr[-1])
    rows = torch.repeat_interleave(torch.arange(degree.numel(), device=degree.device), take, output_size=total)
    offsets = torch.arange(total, device=degree.device) - indptr[:-1][rows]
    if fanout >= 0:
        sampled = torch.nonzero(degree > fanout).flatten()
        if sampled.numel():
            pick = floyd_offsets if fanout <= FLOYD_MAX_FANOUT else random_key_offsets
            picks = pick(degree[sampled], fanout, generator)
            slots = indptr[sampled].unsqueeze(1) + torch.arange(fanout, device=degree.device)
            offsets[slots.flatten()] = picks.flatten()
    return indptr, rows, offsets


def _list_bounds(graph: GraphTensors, cache: TorchCache | None, dst: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor,
                                                                                         torch.Tensor | None]:
    """Where each destination's neighbour list begins, its length, and whether it is read from the cache."""
    if cache is None or cache.adjacency_slot.numel() == 0:
        begin = graph.indptr.index_select(0, dst)
        return begin, graph.indptr.index_select(0, dst + 1) - begin, None
    slot = cache.adjacency_slot.index_select(0, dst).to(torch.int64)
    hit = slot >= 0
    begin = torch.empty_like(dst)
    end = torch.empty_like(dst)
    cached_slots, missed = slot[hit], dst[~hit]
    begin[hit] = cache.adjacency_indptr.index_select(0, cached_slots)
    end[hit] = cache.adjacency_indptr.index_select(0, cached_slots + 1)
    begin[~hit] = graph.indptr.index_select(0, missed)
    end[~hit] = graph.indptr.index_select(0, missed + 1)
    return begin, end - begin, hit


def sample_hop(graph: GraphTensors, dst: torch.Tensor, fanout: int, generator: torch.Generator,
               cache: TorchCache | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One hop for the distinct global ids `dst`: (block indptr [len(dst) + 1], global ids of the sampled sources)."""
    begin, degree, hit = _list_bounds(graph, cache, dst)
    indptr, rows, offsets = sample_offsets(degree, fanout, generator)
    positions = begin[rows] + offsets
    if hit is None:
        return indptr, graph.indices.index_select(0, positions).to(torch.int64)
    neighbours = torch.empty(positions.numel(), dtype=torch.int64, device=dst.device)
    from_cache = hit[rows]
    neighbours[from_cache] = cache.adjacency_indices.index_select(0, positions[from_cache]).to(torch.int64)
    neighbours[~from_cache] = graph.indices.index_select(0, positions[~from_cache]).to(torch.int64)
    return indptr, neighbours


def relabel(dst: torch.Tensor, neighbours: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sources: distinct ids in order of first occurrence, `dst` first; local id of every neighbour)."""
    nodes = torch.cat([dst, neighbours])
    distinct, inverse = torch.unique(nodes, return_inverse=True)
    first = torch.full((distinct.numel(),), nodes.numel(), dtype=torch.int64, device=nodes.device)
    first.scatter_reduce_(0, inverse, torch.arange(nodes.numel(), device=nodes.device), reduce="amin")
    order = torch.argsort(first)
    local_of = torch.empty_like(order)
    local_of[order] = torch.arange(order.numel(), device=nodes.device)
    return distinct[order], local_of[inverse[dst.numel():]]


def sample_blocks(graph: GraphTensors, seeds: torch.Tensor, fanouts: Sequence[int], generator: torch.Generator,
                  cache: TorchCache | None = None) -> tuple[torch.Tensor, list[Block]]:
    """(input nodes, blocks input layer first) for distinct `seeds`; `fanouts[h]` applies at hop h from the seeds."""
    nodes = seeds.to(torch.int64)
    blocks: list[Block] = []
    for fanout in fanouts:
        indptr, neighbours = sample_hop(graph, nodes, int(fanout), generator, cache)
        sources, local = relabel(nodes, neighbours)
        blocks.append(Block(indptr=indptr, indices=local, num_src=sources.numel(), num_dst=nodes.numel()))
        nodes = sources
    return nodes, blocks[::-1]


def gather_rows(source: torch.Tensor, index: torch.Tensor, slot: torch.Tensor | None = None,
                rows: torch.Tensor | None = None) -> torch.Tensor:
    """`source[index]`, taking rows whose `slot` is >= 0 from the cached `rows` instead."""
    if slot is None or slot.numel() == 0:
        return source.index_select(0, index)
    where = slot.index_select(0, index).to(torch.int64)
    hit = where >= 0
    out = torch.empty((index.numel(), *source.shape[1:]), dtype=source.dtype, device=index.device)
    out[hit] = rows.index_select(0, where[hit])
    out[~hit] = source.index_select(0, index[~hit])
    return out


def make_batch(graph: GraphTensors, seeds: torch.Tensor, fanouts: Sequence[int], seed: int, *,
               cache: TorchCache | None = None, batch_index: int = -1, route: int = 1) -> MiniBatch:
    """A whole mini-batch for `seeds` on their device, deterministic for `seed`."""
    generator = seeded_generator(seeds.device, seed)
    input_nodes, blocks = sample_blocks(graph, seeds, fanouts, generator, cache)
    x = gather_rows(graph.features, input_nodes, *((cache.feature_slot, cache.feature_rows) if cache else ()))
    y = graph.labels.index_select(0, seeds).to(torch.int64)
    return MiniBatch(seeds=seeds, input_nodes=input_nodes, blocks=blocks, x=x, y=y, batch_index=batch_index,
                     route=route)
