"""Expected-access hotness: how many of an epoch's batches read each node's feature row under our sampler, computed
from the CSC, the training seeds and the fanouts (no batch is sampled), to rank the rows a static host cache keeps.

The sampler (uniform, without replacement, `fanouts[h]` at hop h from the seeds) makes every node found so far a
destination of the next hop, and a destination v of degree d takes each of its in-neighbours with probability
min(1, f / d). Treating the picks as independent, the probability q_h(u) that u is among a batch's first h hops obeys
    1 - q_{h+1}(u) = (1 - q_h(u)) * prod over edges u -> v of (1 - q_h(v) * min(1, f_h / deg(v))),
one pass over the edges per hop (`morphpipe::add_to_sources`, reading the memory-mapped indices in place). q_0 is
a node's chance of being a seed of a given batch (batch_size / seeds for a training node; for link prediction's edge
batches, whose seeds are their edges' endpoints and negatives, it follows from each node's training edges and the
negatives' distribution: `link_seed_probability`). A typed graph's sampler picks over each relation with its own
fanout, one pass per relation and hop (`expected_typed_batch_reads`). A batch reads each of its
input nodes once, so the rows a cache of k rows should hold are the k with the largest q_L: that maximises the
expected hits under the model. Where paths meet, the independence over-counts (tests/sampling/test_access_hotness.py
bounds by how much); measured rankings: BENCHMARKS.md, "Ranking the hot rows by expected access".
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from tqdm import tqdm

from morphpipe import native
from morphpipe.numeric import check_int
from morphpipe.sampling.edge_batcher import NegativeSampling
from morphpipe.sampling.hetero_batcher import TypedFanouts, relation_fanouts
from morphpipe.sampling.validation import check_fanouts, check_seed_ids

# Edges per native call: the progress bar's step.
CHUNK_EDGES = 1 << 25


def read_probability(indptr: torch.Tensor, indices: torch.Tensor, seed_probability: torch.Tensor,
                     fanouts: Sequence[int], *, chunk_edges: int = CHUNK_EDGES,
                     progress: bool = False) -> torch.Tensor:
    """float64 [N]: the probability that one batch reads each node's row (is among its input nodes), when node v
    is a seed of the batch with probability `seed_probability[v]` and the batch samples `fanouts` (-1: every
    neighbour) over the CSC `indptr`/`indices` (in-neighbours of v at indices[indptr[v]:indptr[v+1]]). Each hop is
    one native pass over the edges, `chunk_edges` at a time (the progress bar's steps); memory: three [N] float64."""
    num_nodes = indptr.numel() - 1
    if seed_probability.shape != (num_nodes,):
        raise ValueError(f"seed_probability: expected one probability per node, shape ({num_nodes},), got "
                         f"{tuple(seed_probability.shape)}")
    probability = seed_probability.to(torch.float64, copy=True).clamp_(0.0, 1.0)
    return _propagate(indptr, indices, probability, fanouts, chunk_edges, progress)


def _propagate(indptr: torch.Tensor, indices: torch.Tensor, probability: torch.Tensor, fanouts: Sequence[int],
               chunk_edges: int, progress: bool) -> torch.Tensor:
    """`read_probability` from the seed probabilities `probability` (float64, in [0, 1]), updated in place."""
    fanouts = check_fanouts(fanouts)
    chunk_edges = check_int("chunk_edges", chunk_edges, 1)
    indptr = indptr.contiguous()
    num_nodes, num_edges = indptr.numel() - 1, int(indptr[-1])
    bounds = _destination_bounds(indptr, chunk_edges)
    weight = torch.empty(num_nodes, dtype=torch.float64)
    unpicked = torch.empty(num_nodes, dtype=torch.float64)
    ops = native.ops()
    with tqdm(total=len(fanouts) * num_edges, desc="expected row reads", unit="edge", unit_scale=True,
              disable=not progress) as bar:
        for fanout in fanouts:
            torch.sub(indptr[1:], indptr[:-1], out=weight)
            _log_unpicked(weight, probability, fanout)
            unpicked.zero_()
            for begin, end in zip(bounds[:-1], bounds[1:]):
                ops.add_to_sources(indptr, indices, weight, begin, end, unpicked)
                bar.update(int(indptr[end] - indptr[begin]))
            _add_picks(probability, unpicked)
    return probability


def _destination_bounds(indptr: torch.Tensor, chunk_edges: int) -> list[int]:
    """Bounds of destination ranges of about `chunk_edges` edges each (one long list may make a range longer)."""
    num_nodes, num_edges = indptr.numel() - 1, int(indptr[-1])
    marks = torch.tensor(range(chunk_edges, num_edges, chunk_edges), dtype=torch.int64)
    return torch.unique(torch.cat([torch.tensor([0]), torch.searchsorted(indptr, marks),
                                   torch.tensor([num_nodes])])).tolist()


def _log_unpicked(weight: torch.Tensor, probability: torch.Tensor, fanout: int) -> torch.Tensor:
    """`weight` (float64, each destination's in-degree) becomes, in place, the log of the chance that a visit of the
    destination (made with `probability`) leaves a given in-neighbour unpicked: log(1 - q * min(1, f / deg))."""
    if fanout < 0:
        torch.neg(probability, out=weight)
    else:
        weight.clamp_(min=fanout).reciprocal_().mul_(-fanout).mul_(probability)
    return weight.log1p_()


def _add_picks(probability: torch.Tensor, unpicked: torch.Tensor) -> None:
    """One hop, in place: q <- 1 - (1 - q) * exp(unpicked), `unpicked` each node's summed log chance to stay unpicked
    (spent)."""
    probability.neg_().add_(1.0).mul_(unpicked.exp_()).neg_().add_(1.0)


def expected_batch_reads(indptr: torch.Tensor, indices: torch.Tensor, seeds: torch.Tensor, fanouts: Sequence[int],
                         batch_size: int, *, progress: bool = False) -> torch.Tensor:
    """float64 [N]: how many of an epoch's batches are expected to read each node's feature row, when the epoch
    visits `seeds` (node ids, each once) in shuffled batches of `batch_size` sampled with `fanouts`: the hotness of
    a static cache of feature rows (`FeatureStore(hotness=...)`)."""
    num_nodes = indptr.numel() - 1
    batch_size = check_int("batch_size", batch_size, 1)
    seed_ids = check_seed_ids(seeds, num_nodes)
    num_batches = max(1, math.ceil(seed_ids.numel() / batch_size))
    probability = torch.zeros(num_nodes, dtype=torch.float64)
    probability[seed_ids] = min(1.0, batch_size / seed_ids.numel())
    return _propagate(indptr, indices, probability, fanouts, CHUNK_EDGES, progress).mul_(num_batches)


def link_seed_probability(num_nodes: int, pair_src: torch.Tensor, pair_dst: torch.Tensor, batch_size: int,
                          negatives: int, negative_probability: torch.Tensor) -> torch.Tensor:
    """float64 [N]: the probability that a node is a seed of one edge batch of `batch_size` of the training edges
    `pair_src[i] -> pair_dst[i]` (drawn without replacement), each positive with `negatives` corrupted destinations
    drawn from `negative_probability` (one chance per node): the batch's seeds are its edges' endpoints and its
    negatives. A node touched by c training edges is no endpoint with probability C(E - c, B) / C(E, B) (about
    (1 - B / (E - (c - 1) / 2))^c: exact for c = 1, close while c is far below E), and no negative with
    (1 - p)^(B k); the two are taken as independent (`reject_positives`' redraws are not modelled)."""
    num_edges = pair_src.numel()
    batch = min(check_int("batch_size", batch_size, 1), num_edges)
    negatives = check_int("negatives", negatives, 0)
    if pair_dst.shape != (num_edges,) or negative_probability.shape != (num_nodes,):
        raise ValueError(f"link seeds: expected pair_src and pair_dst of one shape ({num_edges},) and one negative "
                         f"probability per node ({num_nodes},), got {tuple(pair_dst.shape)} and "
                         f"{tuple(negative_probability.shape)}")
    if num_edges and not (0 <= int(torch.minimum(pair_src.min(), pair_dst.min())) and
                          int(torch.maximum(pair_src.max(), pair_dst.max())) < num_nodes):
        raise ValueError(f"link seeds: training edges name nodes outside [0, {num_nodes})")
    # training edges per node (a self loop touches its node once)
    touched = (torch.bincount(pair_src, minlength=num_nodes) + torch.bincount(pair_dst, minlength=num_nodes)
               - torch.bincount(pair_dst[pair_src == pair_dst], minlength=num_nodes))
    # log C(E - c, B) / C(E, B) = sum over i < c of log(1 - B / (E - i)), taken at the middle term c times: lgamma
    # differences would lose it (E ln E is 3e10 at papers100M's 1.6 billion edges, B / E 6e-7)
    touched = touched.to(torch.float64)
    log_missed = torch.log1p(-batch / (num_edges - (touched - 1).clamp_(min=0) / 2)).mul_(touched)
    log_missed.masked_fill_(num_edges - touched < batch, -math.inf)
    log_missed += torch.log1p(-negative_probability.to(torch.float64).clamp(0.0, 1.0)) * (batch * negatives)
    return log_missed.exp_().neg_().add_(1.0)


def expected_link_batch_reads(indptr: torch.Tensor, indices: torch.Tensor, pair_src: torch.Tensor,
                              pair_dst: torch.Tensor, fanouts: Sequence[int], batch_size: int, negatives: int,
                              negative_probability: torch.Tensor, *, progress: bool = False) -> torch.Tensor:
    """float64 [N]: how many of an epoch's edge batches are expected to read each node's feature row, when the epoch
    visits the training edges `pair_src[i] -> pair_dst[i]` (each once) in shuffled batches of `batch_size`, with
    `negatives` corrupted destinations per positive drawn from `negative_probability`, and samples `fanouts` from
    every seed (`link_seed_probability`); link prediction's `expected_batch_reads`. The batch's own positive edges,
    which the batcher leaves out of its blocks, are not left out here."""
    num_nodes = indptr.numel() - 1
    probability = link_seed_probability(num_nodes, pair_src, pair_dst, batch_size, negatives, negative_probability)
    num_batches = max(1, math.ceil(pair_src.numel() / batch_size))
    return _propagate(indptr, indices, probability, fanouts, CHUNK_EDGES, progress).mul_(num_batches)


def expected_typed_batch_reads(graph, seeds: torch.Tensor, fanouts: TypedFanouts, batch_size: int, *,
                               progress: bool = False) -> dict[str, torch.Tensor]:
    """Per featured node type of the typed graph `graph` (a HeteroGraphStore), float64 [its node count]: how many of
    an epoch's batches are expected to read each node's feature row, when the epoch visits `seeds` (global ids, each
    once) in shuffled batches of `batch_size` sampled by the typed sampler with `fanouts` (one list for every
    relation, or a list per relation): `expected_batch_reads`' recurrence, where a destination's visit at hop h picks
    each in-neighbour over relation r with probability min(1, f_hr / deg_r), one pass over each relation's edges per
    hop (a torch scatter: the native pass adds within one id space)."""
    num_nodes = graph.num_nodes
    batch_size = check_int("batch_size", batch_size, 1)
    seed_ids = check_seed_ids(seeds, num_nodes)
    hops = relation_fanouts(graph, fanouts)
    types = {node_type.name: node_type for node_type in graph.node_types}
    probability = torch.zeros(num_nodes, dtype=torch.float64)
    probability[seed_ids] = min(1.0, batch_size / max(seed_ids.numel(), 1))
    unpicked = torch.empty(num_nodes, dtype=torch.float64)
    total = sum(graph.indices[relation].numel() for hop in hops for relation, fanout in zip(graph.relations, hop)
                if fanout != 0)
    with tqdm(total=total, desc="expected row reads", unit="edge", unit_scale=True, disable=not progress) as bar:
        for hop in hops:
            unpicked.zero_()
            for relation, fanout in zip(graph.relations, hop):
                if fanout == 0:
                    continue
                src, dst = types[relation.src], types[relation.dst]
                indptr, indices = graph.indptr[relation].contiguous(), graph.indices[relation]
                degrees = indptr[1:] - indptr[:-1]
                weight = _log_unpicked(degrees.to(torch.float64), probability[dst.start:dst.stop], fanout)
                sources = unpicked[src.start:src.stop]
                bounds = _destination_bounds(indptr, CHUNK_EDGES)
                for begin, end in zip(bounds[:-1], bounds[1:]):
                    first, last = int(indptr[begin]), int(indptr[end])
                    sources.index_add_(0, indices[first:last].long(),
                                       weight[begin:end].repeat_interleave(degrees[begin:end]))
                    bar.update(last - first)
            _add_picks(probability, unpicked)
    probability.mul_(max(1, math.ceil(seed_ids.numel() / batch_size)))
    return {name: probability[types[name].start:types[name].stop].clone() for name in graph.features}


def rank_by_expected_typed_access(graph, seeds: torch.Tensor, fanouts: TypedFanouts, batch_size: int, *,
                                  progress: bool = False) -> bool:
    """Ranks the shared feature cache of typed `graph` (features on disk) by `expected_typed_batch_reads` per byte of
    row for an epoch over `seeds` in batches of `batch_size` sampled with `fanouts`, unless it already is for these;
    returns whether the cache is ranked so. Nothing changes for a graph without feature stores or a homogeneous one."""
    if not getattr(graph, "is_hetero", False) or not graph.feature_stores:
        return False
    hops = relation_fanouts(graph, fanouts)
    if all(len(set(hop)) == 1 for hop in hops):
        described = ",".join(str(hop[0]) for hop in hops)
    else:
        described = "; ".join(f"{relation.key} {','.join(str(hop[index]) for hop in hops)}"
                              for index, relation in enumerate(graph.relations))
    ranked_by = f"expected access per byte (fanouts {described}, batch {batch_size}, {len(seeds):,} seeds)"
    _rank_if_changed(graph, ranked_by, lambda: expected_typed_batch_reads(graph, seeds, fanouts, batch_size,
                                                                          progress=progress))
    return True


def rank_by_expected_access(graph, seeds: torch.Tensor, fanouts: Sequence[int], batch_size: int, *,
                            progress: bool = False) -> bool:
    """Ranks the feature cache of homogeneous `graph` (features on disk) by `expected_batch_reads` for an epoch over
    node ids `seeds` in batches of `batch_size` sampled with `fanouts`, unless it already is for these; returns
    whether the cache is ranked so. Nothing changes for a graph without a feature store or a typed graph."""
    fanouts = check_fanouts(fanouts)
    return _rank_feature_cache(
        graph, f"expected access (fanouts {','.join(map(str, fanouts))}, batch {batch_size}, {len(seeds):,} seeds)",
        lambda: expected_batch_reads(graph.indptr, graph.indices, seeds, fanouts, batch_size, progress=progress))


def rank_by_expected_link_access(graph, edge_ids: torch.Tensor, fanouts: Sequence[int], batch_size: int,
                                 negatives: NegativeSampling, *, progress: bool = False) -> bool:
    """Ranks the feature cache of homogeneous `graph` (features on disk) by `expected_link_batch_reads` for an epoch
    over its training edges `edge_ids` (ids into `graph.edge_split.train`) in batches of `batch_size`, with
    `negatives`' corruption, sampled with `fanouts`, unless it already is for these; returns whether the cache is
    ranked so. Nothing changes for a graph without a feature store or a typed graph."""
    fanouts = check_fanouts(fanouts)
    ranked_by = (f"expected access of link batches (fanouts {','.join(map(str, fanouts))}, batch {batch_size}, "
                 f"{len(edge_ids):,} training edges, {negatives.k} {negatives.kind} negatives each)")

    def reads() -> torch.Tensor:
        pairs = graph.require_edge_split().train
        ids = check_seed_ids(edge_ids, pairs.shape[1], "edge_ids", unit="training edge")
        if ids.numel() < pairs.shape[1]:  # every edge (an epoch's usual units) in any order: the same counts, no copy
            pairs = pairs[:, ids]
        return expected_link_batch_reads(graph.indptr, graph.indices, pairs[0], pairs[1], fanouts, batch_size,
                                         negatives.k, negatives.draw_probability(graph), progress=progress)
    return _rank_feature_cache(graph, ranked_by, reads)


def _rank_feature_cache(graph, ranked_by: str, reads: Callable[[], torch.Tensor]) -> bool:
    """Ranks homogeneous `graph`'s feature cache by `reads()` (said as `ranked_by`) unless it already is; see the
    callers."""
    if getattr(graph, "feature_store", None) is None or getattr(graph, "is_hetero", False):
        return False
    _rank_if_changed(graph, ranked_by, reads)
    return True


def _rank_if_changed(graph, ranked_by: str, reads: Callable[[], torch.Tensor | dict[str, torch.Tensor]]) -> None:
    """`graph.rank_feature_cache` by `reads()` (a tensor, or one per node type) unless the cache is ranked by
    `ranked_by` already; kept as float32: half the memory, the same ranking but for near ties."""
    if graph.cache_ranked_by == ranked_by:
        return
    hotness = reads()
    graph.rank_feature_cache(hotness.to(torch.float32) if isinstance(hotness, torch.Tensor) else
                             {name: part.to(torch.float32) for name, part in hotness.items()}, ranked_by)
