"""Route 0 batchers of link prediction: mini-batches of training edges with negatives, built in native code.

An edge batch holds a slice of the epoch's training edges (the units an epoch visits, ids into the
graph's `edge_split.train`), `NegativeSampling.k` corrupted destinations per positive, and the
sampled neighbourhood of every endpoint, built in one pass with one relabelling
(csrc/cpu/edge_batch.h): `MiniBatch.seeds` are the endpoints, `MiniBatch.pairs` the positives and
negatives in their local ids. With `exclude` (the default) the batch's own positive edges, and their
reverses on an undirected graph, are left out of every block, so the model never reads the edge it
is asked to predict. The batcher contract holds with edges as units: every training edge in exactly
one batch per epoch, `epoch(k)` replays, and the same seed gives the same batches on the threaded
`EdgeBatcher` and the on-demand `SerialEdgeBatcher`.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from morphpipe import native
from morphpipe.cores import usable_cores
from morphpipe.data import GraphStore
from morphpipe.numeric import check_float, check_int
from morphpipe.sampling.batcher import SeedBatcher
from morphpipe.sampling import torch_sampler
from morphpipe.sampling.cpu_batcher import NativeEpochs, blocks_from_native, gather_features, native_batcher
from morphpipe.sampling.gpu_batcher import GpuBatcher
from morphpipe.sampling.epochs import batch_seeds, epoch_seed, note_first_use
from morphpipe.sampling.minibatch import EdgePairs, MiniBatch
from morphpipe.sampling.streams import Handoff
from morphpipe.sampling.validation import check_fanouts, check_positive, check_seed_ids

NEGATIVE_KINDS = ("uniform", "degree")
MASK64 = (1 << 64) - 1


@dataclass(frozen=True)
class NegativeSampling:
    """How training negatives are drawn: `k` corrupted destinations per positive, uniform over the nodes or
    ("degree") in proportion to in-degree^`exponent` (word2vec's 0.75); `reject_positives` redraws a destination
    that is an edge of the training topology from the positive's source (or the source itself)."""

    k: int = 1
    kind: str = "uniform"
    exponent: float = 0.75
    reject_positives: bool = False

    def __post_init__(self) -> None:
        check_int("negatives", self.k, 0)
        if self.kind not in NEGATIVE_KINDS:
            raise ValueError(f"negative sampling kind must be one of {NEGATIVE_KINDS}, got {self.kind!r}")
        check_float("negative sampling exponent", self.exponent, 0)

    def cdf(self, graph: GraphStore) -> torch.Tensor | None:
        """The cumulative corruption weights over the nodes (float64 [N]), or None for uniform corruption."""
        if self.kind == "uniform":
            return None
        weights = graph.in_degrees().to(torch.float64).pow(self.exponent)
        cdf = torch.cumsum(weights, 0)
        if cdf.numel() == 0 or float(cdf[-1]) <= 0:
            raise ValueError(f"negative sampling 'degree': graph {graph.name!r} has no edges, so every in-degree is "
                             "0; draw negatives uniformly (kind='uniform')")
        return cdf

    def draw_probability(self, graph: GraphStore) -> torch.Tensor:
        """float64 [N]: the chance that one corruption draws each node (before `reject_positives` redraws one)."""
        cdf = self.cdf(graph)
        if cdf is None:
            return torch.full((graph.num_nodes,), 1.0 / max(graph.num_nodes, 1), dtype=torch.float64)
        return torch.diff(cdf, prepend=cdf.new_zeros(1)).div_(cdf[-1])


def native_batch_seed(run_seed: int, epoch: int, batch_index: int) -> int:
    """The seed `sample_edge_batch` takes for batch `batch_index` of epoch `epoch` so that it draws what the
    threaded batcher draws for it (csrc: splitmix64(splitmix64(epoch seed) ^ batch index)), as a signed int64."""
    value = _splitmix64(epoch_seed(run_seed, epoch)) ^ batch_index
    return value - (1 << 64) if value >= 1 << 63 else value


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


class EdgeSeedBatcher(SeedBatcher):
    """A batcher over training edges of `graph`'s edge split (default: all of them): `seeds` are training edge ids
    (the units the epoch visits, which routes and ranks split), with validated fanouts, sizes and negative
    sampling, and the epoch order every batcher shares for the same `seed`."""

    def __init__(self, graph: GraphStore, fanouts: Sequence[int], batch_size: int, edge_ids: torch.Tensor | None,
                 shuffle: bool, drop_last: bool, seed: int, negatives: NegativeSampling | None,
                 exclude: bool) -> None:
        self.graph = graph
        note_first_use(graph)
        split = graph.require_edge_split()
        self.pair_src, self.pair_dst = (split.train[0].contiguous(), split.train[1].contiguous())
        self.undirected = split.undirected
        self.fanouts = check_fanouts(fanouts)
        self.batch_size = check_positive("batch_size", batch_size)
        self.seeds = self.check_units(torch.arange(self.pair_src.numel()) if edge_ids is None else edge_ids)
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.seed = check_int("seed", seed, 0)
        self.negatives = negatives or NegativeSampling()
        self.exclude = bool(exclude)
        self.negative_cdf = self.negatives.cdf(graph)

    def check_units(self, ids: torch.Tensor) -> torch.Tensor:
        """`ids` as training edge ids: 1-D int64, each in [0, E_train), none repeated."""
        return check_seed_ids(ids, self.pair_src.numel(), "edge_ids", unit="training edge")


class EdgeBatcher(NativeEpochs, EdgeSeedBatcher):
    """Edge batches built by `num_threads` C++ threads outside the GIL (the CpuBatcher's workers and window),
    delivered in epoch order; the last batch of an epoch may be short unless `drop_last`."""

    route = 0

    def __init__(self, graph: GraphStore, fanouts: Sequence[int], batch_size: int, *,
                 negatives: NegativeSampling | None = None, exclude: bool = True, num_threads: int | None = None,
                 edge_ids: torch.Tensor | None = None, shuffle: bool = True, drop_last: bool = False, seed: int = 0,
                 queue_size: int | None = None, pin_memory: bool | None = None) -> None:
        super().__init__(graph, fanouts, batch_size, edge_ids, shuffle, drop_last, seed, negatives, exclude)
        self.num_threads = check_positive("num_threads", num_threads if num_threads is not None else usable_cores())
        self.queue_size = check_positive("queue_size", queue_size if queue_size is not None else 2 * self.num_threads)
        self.pin_memory = torch.cuda.is_available() if pin_memory is None else bool(pin_memory)
        self._native = native_batcher(graph, self.fanouts, self.num_threads, self.queue_size, self.pin_memory)
        self._native.set_edge_task(self.pair_src, self.pair_dst, self.negatives.k, self.negative_cdf, self.exclude,
                                   self.undirected, self.negatives.reject_positives)


class SerialEdgeBatcher(EdgeSeedBatcher):
    """Edge batches built when asked for, while nothing else runs (plans whose phases take turns on the same cores):
    the same batches as an EdgeBatcher with the same seed. With `num_threads` > 1 a request for batch i builds
    batches i .. i + num_threads - 1 at once, one per thread (the native builder runs outside the GIL), and keeps
    the rest for the next requests (up to `num_threads` batches held at once), so a turn of batching uses every
    core the training step uses."""

    route = 0

    def __init__(self, graph: GraphStore, fanouts: Sequence[int], batch_size: int, *,
                 negatives: NegativeSampling | None = None, exclude: bool = True, num_threads: int = 1,
                 edge_ids: torch.Tensor | None = None, shuffle: bool = True, seed: int = 0) -> None:
        super().__init__(graph, fanouts, batch_size, edge_ids, shuffle, False, seed, negatives, exclude)
        self.num_threads = check_positive("num_threads", num_threads)

    def epoch(self, epoch: int) -> Iterator[MiniBatch]:
        return self.epoch_from(epoch, 0)

    def epoch_from(self, epoch: int, first: int) -> Iterator[MiniBatch]:
        """As `epoch`, from batch `first` on."""
        return self._build_each(epoch, self.check_first(first))

    def _build_each(self, epoch: int, first: int) -> Iterator[MiniBatch]:
        order = self.epoch_order(epoch)
        build = lambda index: self._batch(order, epoch, index)  # noqa: E731
        if self.num_threads == 1:
            yield from map(build, range(first, len(self)))
            return
        with ThreadPoolExecutor(self.num_threads, thread_name_prefix="edge-batch") as pool:
            for start in range(first, len(self), self.num_threads):
                yield from pool.map(build, range(start, min(len(self), start + self.num_threads)))

    def _batch(self, order: torch.Tensor, epoch: int, index: int) -> MiniBatch:
        """Batch `index` of the epoch whose edge order is `order`, drawn as the threaded batcher draws it."""
        batch = sample_edge_batch(self.graph, batch_seeds(order, index, self.batch_size), self.fanouts,
                                  negatives=self.negatives, exclude=self.exclude,
                                  seed=native_batch_seed(self.seed, epoch, index), negative_cdf=self.negative_cdf)
        batch.batch_index = index
        return batch

    def close(self) -> None:
        """Nothing runs between calls."""


class GpuEdgeBatcher(GpuBatcher):
    """Route 1 for edges: edge batches made on `device` by the torch path (`torch_sampler.make_edge_batch`, over
    zero-copy views of the pinned graph on a GPU, or on "cpu"), the same epoch order as the Route 0 edge batchers
    (the same edges in the same batches for a seed; its own random draws). The fused CUDA kernels make node
    batches only, so the backend is "torch"."""

    def __init__(self, graph: GraphStore, fanouts: Sequence[int], batch_size: int, *,
                 negatives: NegativeSampling | None = None, exclude: bool = True,
                 edge_ids: torch.Tensor | None = None, shuffle: bool = True, drop_last: bool = False, seed: int = 0,
                 cache_bytes: int = 0, device: torch.device | str | None = None) -> None:
        split = graph.require_edge_split()
        self.pair_src, self.pair_dst = split.train[0].contiguous(), split.train[1].contiguous()
        self.negatives = negatives or NegativeSampling()
        super().__init__(graph, fanouts, batch_size, seeds=torch.arange(self.pair_src.numel()) if edge_ids is None
                         else edge_ids, shuffle=shuffle, drop_last=drop_last, seed=seed, cache_bytes=cache_bytes,
                         device=device, backend="torch")
        cdf = self.negatives.cdf(graph)
        self.task = torch_sampler.EdgeTask(self.pair_src.to(self.device), self.pair_dst.to(self.device),
                                           self.negatives.k, None if cdf is None else cdf.to(self.device),
                                           self.negatives.reject_positives, bool(exclude), split.undirected)

    def check_units(self, ids: torch.Tensor) -> torch.Tensor:
        """`ids` as training edge ids: 1-D int64, each in [0, E_train), none repeated."""
        return check_seed_ids(ids, self.pair_src.numel(), "edge_ids", unit="training edge")

    def _make_batch(self, seeds: torch.Tensor, batch_index: int, sampling_seed: int) -> MiniBatch:
        """The edge batch of training edges `seeds` (on the device), on the batcher's stream."""
        with self._on_device(), self._on_stream():
            start = self._event()
            cache = self._cache
            tables = torch_sampler.TorchCache(cache.adjacency_slot, cache.adjacency_indptr, cache.adjacency_indices,
                                              cache.feature_slot, cache.feature_rows)
            batch = torch_sampler.make_edge_batch(self._graph, self.task, seeds, self.fanouts, sampling_seed,
                                                  cache=tables, batch_index=batch_index, route=self.route)
            if start is not None:
                batch.handoff = Handoff(self._stream, start, self._event())
        return batch


def sample_edge_batch(graph: GraphStore, edge_ids: torch.Tensor, fanouts: Sequence[int], *,
                      negatives: NegativeSampling | None = None, exclude: bool = True, seed: int = 0,
                      negative_cdf: torch.Tensor | None = None) -> MiniBatch:
    """One edge batch of training edges `edge_ids`, built on the calling thread (the `sample_edge_batch` op);
    `negative_cdf` reuses weights computed once (default: from `negatives`)."""
    split = graph.require_edge_split()
    negatives = negatives or NegativeSampling()
    if negative_cdf is None:
        negative_cdf = negatives.cdf(graph)
    ops = native.ops()
    seeds, src, dst, negative_dst, input_nodes, indptrs, indices = ops.sample_edge_batch(
        graph.indptr, graph.indices, split.train[0].contiguous(), split.train[1].contiguous(),
        torch.as_tensor(edge_ids, dtype=torch.int64), check_fanouts(fanouts), negatives.k, negative_cdf,
        bool(exclude), split.undirected, negatives.reject_positives, int(seed))
    return MiniBatch(seeds=seeds, input_nodes=input_nodes,
                     blocks=blocks_from_native(input_nodes.numel(), indptrs, indices),
                     x=gather_features(graph, input_nodes), y=torch.empty(0, dtype=torch.int64),
                     pairs=EdgePairs(torch.as_tensor(edge_ids, dtype=torch.int64).clone(), src, dst, negative_dst))
