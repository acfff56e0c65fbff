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

from morphpipe.sampling.minibatch import Block, EdgePairs, MiniBatch
from morphpipe.sampling.store_rows import StoreRows

# Floyd's loop costs O(fanout^2) comparisons per destination; beyond this, random keys and a sort are cheaper.
FLOYD_MAX_FANOUT = 32
# A negative that is an edge is redrawn at most this often (as csrc/cpu/edge_batch.cpp does).
MAX_NEGATIVE_DRAWS = 64


@dataclass(frozen=True)
class GraphTensors:
    """What the sampler reads: CSC topology, features and labels, all on one device (or views that act so)."""

    indptr: torch.Tensor  # int64 [N + 1]
    indices: torch.Tensor  # int32/int64 [E]
    features: torch.Tensor | StoreRows  # [N, F]; StoreRows: on disk, read through the host's feature store
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


def _read_neighbours(graph: GraphTensors, cache: TorchCache | None, from_cache: torch.Tensor | None,
                     positions: torch.Tensor) -> torch.Tensor:
    """int64 neighbour ids at list `positions`, read from the cache where `from_cache` (None: none cached)."""
    if from_cache is None:
        return graph.indices.index_select(0, positions).to(torch.int64)
    neighbours = torch.empty(positions.numel(), dtype=torch.int64, device=positions.device)
    neighbours[from_cache] = cache.adjacency_indices.index_select(0, positions[from_cache]).to(torch.int64)
    neighbours[~from_cache] = graph.indices.index_select(0, positions[~from_cache]).to(torch.int64)
    return neighbours


@dataclass(frozen=True)
class ExcludedEdges:
    """Edges src -> dst that a batch passes no message over (an edge batch's own positives, and their reverses on an
    undirected graph), as sorted keys dst * num_nodes + src, with their sorted distinct destinations."""

    keys: torch.Tensor
    targets: torch.Tensor
    num_nodes: int

    @classmethod
    def of(cls, src: torch.Tensor, dst: torch.Tensor, num_nodes: int, undirected: bool) -> "ExcludedEdges":
        if undirected:
            src, dst = torch.cat([src, dst]), torch.cat([dst, src])
        return cls(torch.unique(dst * num_nodes + src), torch.unique(dst), num_nodes)


def _segments(lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(segment of every element, its offset inside the segment) for consecutive segments of `lengths`."""
    total = int(lengths.sum())
    segment = torch.repeat_interleave(torch.arange(lengths.numel(), device=lengths.device), lengths,
                                      output_size=total)
    starts = torch.cumsum(lengths, 0) - lengths
    return segment, torch.arange(total, device=lengths.device) - starts[segment]


def sample_hop(graph: GraphTensors, dst: torch.Tensor, fanout: int, generator: torch.Generator,
               cache: TorchCache | None = None,
               excluded: ExcludedEdges | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One hop for the distinct global ids `dst`: (block indptr [len(dst) + 1], global ids of the sampled sources).

    With `excluded`, a destination's excluded in-edges are left out of its list before sampling (its
    fanout is taken among the others)."""
    begin, degree, hit = _list_bounds(graph, cache, dst)
    filtered = torch.zeros(0, dtype=torch.int64, device=dst.device)
    if excluded is not None:
        filtered = torch.nonzero(torch.isin(dst, excluded.targets)).flatten()
    if filtered.numel() == 0:
        indptr, rows, offsets = sample_offsets(degree, fanout, generator)
        return indptr, _read_neighbours(graph, cache, None if hit is None else hit[rows], begin[rows] + offsets)
    segment, offset = _segments(degree[filtered])
    listed = _read_neighbours(graph, cache, None if hit is None else hit[filtered][segment],
                              begin[filtered][segment] + offset)
    keep = ~torch.isin(dst[filtered][segment] * excluded.num_nodes + listed, excluded.keys)
    allowed = torch.bincount(segment[keep], minlength=filtered.numel())
    allowed_offsets, allowed_starts = offset[keep], torch.cumsum(allowed, 0) - allowed
    effective = degree.clone()
    effective[filtered] = allowed
    indptr, rows, offsets = sample_offsets(effective, fanout, generator)
    position_in_filtered = torch.full((dst.numel(),), -1, dtype=torch.int64, device=dst.device)
    position_in_filtered[filtered] = torch.arange(filtered.numel(), device=dst.device)
    row_filter = position_in_filtered[rows]
    mapped = row_filter >= 0
    offsets[mapped] = allowed_offsets[allowed_starts[row_filter[mapped]] + offsets[mapped]]
    return indptr, _read_neighbours(graph, cache, None if hit is None else hit[rows], begin[rows] + offsets)


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
                  cache: TorchCache | None = None,
                  excluded: ExcludedEdges | None = None) -> tuple[torch.Tensor, list[Block]]:
    """(input nodes, blocks input layer first) for distinct `seeds`; `fanouts[h]` applies at hop h from the seeds;
    no block holds an `excluded` edge (whose destinations must be seeds)."""
    nodes = seeds.to(torch.int64)
    blocks: list[Block] = []
    for fanout in fanouts:
        indptr, neighbours = sample_hop(graph, nodes, int(fanout), generator, cache, excluded)
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


@dataclass(frozen=True)
class EdgeTask:
    """What an edge batch is drawn from, on the batcher's device: the training positives pair_src[e] -> pair_dst[e],
    `negatives` corrupted destinations per positive (uniform, or by the cumulative weights `negative_cdf`),
    whether a negative that is an edge is redrawn, and whether the batch's positives (and reverses) are excluded."""

    pair_src: torch.Tensor
    pair_dst: torch.Tensor
    negatives: int
    negative_cdf: torch.Tensor | None
    reject_positives: bool
    exclude: bool
    undirected: bool


def is_edge(graph: GraphTensors, src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    """bool, per pair: `src[i]` is an in-neighbour of `dst[i]` in the topology."""
    begin = graph.indptr.index_select(0, dst)
    segment, offset = _segments(graph.indptr.index_select(0, dst + 1) - begin)
    match = graph.indices.index_select(0, begin[segment] + offset).to(torch.int64) == src[segment]
    found = torch.zeros(dst.numel(), dtype=torch.bool, device=dst.device)
    found[segment[match]] = True
    return found


def draw_negatives(graph: GraphTensors, task: EdgeTask, src: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """int64 [len(src), k] corrupted destinations per source (none an edge from it, nor itself, when rejecting)."""
    num_nodes = graph.indptr.numel() - 1

    def draw(count: int) -> torch.Tensor:
        if task.negative_cdf is None:
            return uniform_below(torch.full((count,), num_nodes, dtype=torch.int64, device=src.device), generator)
        targets = torch.rand(count, generator=generator, dtype=torch.float64, device=src.device) * task.negative_cdf[-1]
        return torch.clamp(torch.searchsorted(task.negative_cdf, targets, right=True), max=num_nodes - 1)

    negatives = draw(src.numel() * task.negatives).view(src.numel(), task.negatives)
    if not task.reject_positives:
        return negatives
    sources = src.unsqueeze(1).expand_as(negatives)
    for _ in range(MAX_NEGATIVE_DRAWS):
        bad = (negatives == sources) | is_edge(graph, sources.reshape(-1), negatives.reshape(-1)).view_as(negatives)
        count = int(bad.sum())
        if count == 0:
            return negatives
        negatives[bad] = draw(count)
    raise ValueError(f"negative sampling: some source is joined to nearly every node it could be corrupted to; no "
                     f"non-edge destination was found in {MAX_NEGATIVE_DRAWS} draws; sample negatives without "
                     "rejecting positives (reject_positives=False)")


def make_edge_batch(graph: GraphTensors, task: EdgeTask, edge_ids: torch.Tensor, fanouts: Sequence[int], seed: int, *,
                    cache: TorchCache | None = None, batch_index: int = -1, route: int = 1) -> MiniBatch:
    """An edge batch for training edges `edge_ids` on their device, deterministic for `seed`: every endpoint a seed
    (each positive's source and destination in order, then the negatives), sampled in one pass with the batch's
    positives excluded when `task.exclude` (csrc/cpu/edge_batch.h is the same on the CPU, with its own draws)."""
    generator = seeded_generator(edge_ids.device, seed)
    src, dst = task.pair_src.index_select(0, edge_ids), task.pair_dst.index_select(0, edge_ids)
    negatives = draw_negatives(graph, task, src, generator)
    endpoints = torch.cat([torch.stack([src, dst], dim=1).reshape(-1), negatives.reshape(-1)])
    seeds, local = relabel(endpoints[:0], endpoints)
    count = edge_ids.numel()
    excluded = ExcludedEdges.of(src, dst, graph.indptr.numel() - 1, task.undirected) if task.exclude else None
    input_nodes, blocks = sample_blocks(graph, seeds, fanouts, generator, cache, excluded)
    x = gather_rows(graph.features, input_nodes, *((cache.feature_slot, cache.feature_rows) if cache else ()))
    pairs = EdgePairs(edge_ids, local[0:2 * count:2], local[1:2 * count:2], local[2 * count:].view(count, task.negatives))
    return MiniBatch(seeds=seeds, input_nodes=input_nodes, blocks=blocks, x=x,
                     y=torch.empty(0, dtype=torch.int64, device=edge_ids.device), batch_index=batch_index,
                     route=route, pairs=pairs)
