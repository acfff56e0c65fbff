"""Expected-access hotness: how many of an epoch's batches read each node's feature row under our sampler, computed
from the CSC, the training seeds and the fanouts (no batch is sampled), to rank the rows a static host cache keeps.

The sampler (uniform, without replacement, `fanouts[h]` at hop h from the seeds) makes every node found so far a
destination of the next hop, and a destination v of degree d takes each of its in-neighbours with probability
min(1, f / d). Treating the picks as independent, the probability q_h(u) that u is among a batch's first h hops obeys
    1 - q_{h+1}(u) = (1 - q_h(u)) * prod over edges u -> v of (1 - q_h(v) * min(1, f_h / deg(v))),
one pass over the edges per hop (`morphpipe::add_to_sources`, reading the memory-mapped indices in place). q_0 is
a node's chance of being a seed of a given batch (batch_size / seeds for a training node). A batch reads each of its
input nodes once, so the rows a cache of k rows should hold are the k with the largest q_L: that maximises the
expected hits under the model. Where paths meet, the independence over-counts (tests/sampling/test_access_hotness.py
bounds by how much); measured rankings: BENCHMARKS.md, "Ranking the hot rows by expected access".
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from tqdm import tqdm

from morphpipe import native
from morphpipe.numeric import check_int
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
    # destination ranges of about `chunk_edges` edges each (one long list may make a range longer)
    marks = torch.tensor(range(chunk_edges, num_edges, chunk_edges), dtype=torch.int64)
    bounds = torch.unique(torch.cat([torch.tensor([0]), torch.searchsorted(indptr, marks),
                                     torch.tensor([num_nodes])])).tolist()
    weight = torch.empty(num_nodes, dtype=torch.float64)
    unpicked = torch.empty(num_nodes, dtype=torch.float64)
    ops = native.ops()
    with tqdm(total=len(fanouts) * num_edges, desc="expected row reads", unit="edge", unit_scale=True,
              disable=not progress) as bar:
        for fanout in fanouts:
            # per destination: log P(its visit leaves a given in-neighbour unpicked) = log(1 - q * min(1, f / deg))
            if fanout < 0:
                torch.neg(probability, out=weight)
            else:
                torch.sub(indptr[1:], indptr[:-1], out=weight)
                weight.clamp_(min=fanout).reciprocal_().mul_(-fanout).mul_(probability)
            weight.log1p_()
            unpicked.zero_()
            for begin, end in zip(bounds[:-1], bounds[1:]):
                ops.add_to_sources(indptr, indices, weight, begin, end, unpicked)
                bar.update(int(indptr[end] - indptr[begin]))
            # q <- 1 - (1 - q) * exp(unpicked)
            probability.neg_().add_(1.0).mul_(unpicked.exp_()).neg_().add_(1.0)
    return probability


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


def rank_by_expected_access(graph, seeds: torch.Tensor, fanouts: Sequence[int], batch_size: int, *,
                            progress: bool = False) -> bool:
    """Ranks the feature cache of homogeneous `graph` (features on disk) by `expected_batch_reads` for an epoch over
    node ids `seeds` in batches of `batch_size` sampled with `fanouts`, unless it already is for these; returns
    whether the cache is ranked so. Nothing changes for a graph without a feature store or a typed graph."""
    if getattr(graph, "feature_store", None) is None or not hasattr(graph, "rank_feature_cache"):
        return False
    fanouts = check_fanouts(fanouts)
    ranked_by = (f"expected access (fanouts {','.join(map(str, fanouts))}, batch {batch_size}, "
                 f"{len(seeds):,} seeds)")
    if graph.cache_ranked_by != ranked_by:  # kept as float32: half the memory, the same ranking but for near ties
        reads = expected_batch_reads(graph.indptr, graph.indices, seeds, fanouts, batch_size, progress=progress)
        graph.rank_feature_cache(reads.to(torch.float32), ranked_by)
    return True
