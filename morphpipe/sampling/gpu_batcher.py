"""Route 1 batcher: the GPU samples and gathers mini-batches itself, reading the graph over UVA.

The graph store's topology, features and labels stay in host memory, page-locked in place
(`HostPinning`), and the GPU reads them through unified virtual addressing (DUCATI,
PyTorch-Direct), so graphs far larger than device memory are batched on the GPU (features on disk
are read through the host's feature store instead, `StoreRows`); a dual cache
(`GpuCache`) keeps the hottest neighbour lists and feature rows in device memory. Two backends
make the batches: "kernels" (our fused CUDA sampler and gather) and "torch" (the same algorithm
in plain PyTorch ops over zero-copy views, `morphpipe.sampling.torch_sampler`, which also runs on
CPU tensors). "auto" takes the kernels only where a short self-check on the device passed
(`morphpipe.sampling.backend_check`). It keeps the batcher contract (`morphpipe.sampling.batcher`).
An epoch visits the same seeds in the same batches as a CpuBatcher with the same seed; the sampled
neighbours differ (another random generator) but follow the same distribution. On a GPU, batches
are made on the batcher's own stream and each carries a `Handoff` (its stream and events) for
whoever uses it on another.
"""
from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator, Sequence

import torch

from morphpipe import native
from morphpipe.data import GraphStore
from morphpipe.sampling import torch_sampler
from morphpipe.sampling.cpu_batcher import blocks_from_native
from morphpipe.sampling.cuda_support import require_cuda
from morphpipe.sampling.batcher import SeedBatcher
from morphpipe.sampling.epochs import batch_seeds, epoch_seed
from morphpipe.sampling.gpu_cache import CacheConfig, CachePlan, GpuCache, batch_hotness, degree_hotness, plan_cache
from morphpipe.sampling.minibatch import MiniBatch
from morphpipe.sampling.pinning import HostPinning
from morphpipe.sampling.store_rows import StoreRows
from morphpipe.sampling.streams import CUDA_STREAMS, Handoff, StreamApi
from morphpipe.sampling.zero_copy import cuda_view

MASK63 = (1 << 63) - 1
BACKENDS = ("auto", "kernels", "torch")
GRAPH_PARTS = ("indptr", "indices", "features", "labels")


def batch_seed(epoch_seed_value: int, batch_index: int) -> int:
    """The sampling seed of one batch: depends only on the epoch's seed and the batch's position."""
    mixed = (epoch_seed_value * 0x9E3779B97F4A7C15 + (batch_index + 1) * 0xBF58476D1CE4E5B9) & ((1 << 64) - 1)
    return (mixed ^ (mixed >> 31)) & MASK63


def resolve_device(device: torch.device | str | None, backend: str) -> torch.device:
    """The device batches are made on: a CUDA device with its index, or the CPU for the torch backend."""
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}: use one of {BACKENDS} ('auto': the CUDA kernels where the device's "
                         "self-check passed, else the torch path)")
    resolved = torch.device("cuda" if device is None else device)
    if resolved.type == "cpu":
        if backend == "kernels":
            raise ValueError("backend='kernels' runs on a CUDA device; on device='cpu' use backend='torch'")
        return resolved
    if resolved.type != "cuda":
        raise ValueError(f"device={str(device)!r}: the GPU batcher runs on a CUDA device ('cuda', 'cuda:1') or, "
                         "with backend='torch', on 'cpu'")
    require_cuda("GpuBatcher (Route 1)")
    return resolved if resolved.index is not None else torch.device("cuda", torch.cuda.current_device())


class GpuBatcher(SeedBatcher):
    """Epoch iterator over mini-batches of `seeds` (default: the train split), built on the GPU over UVA.

    `cache_bytes` is the device memory for the dual cache (0: none); `cache_split` the share of it
    for neighbour lists (None: split by expected PCIe bytes saved); `hotness` ranks nodes by
    "degree" or by a short "presample" pass. `pinning="copy"` copies the graph into pinned memory
    instead of registering it in place (for memory CUDA refuses to register). `backend` picks who
    makes batches ("auto", "kernels", "torch"); `device` may be "cpu" with the torch backend.
    `streams` replaces torch.cuda's stream API (tests inject a recording double).
    """

    route = 1

    def __init__(
        self,
        graph: GraphStore,
        fanouts: Sequence[int],
        batch_size: int,
        *,
        seeds: torch.Tensor | None = None,
        shuffle: bool = True,
        drop_last: bool = False,
        seed: int = 0,
        cache_bytes: int = 0,
        cache_split: float | None = None,
        hotness: str = "degree",
        pinning: str = "register",
        device: torch.device | str | None = None,
        backend: str = "auto",
        streams: StreamApi | None = None,
    ) -> None:
        super().__init__(graph, fanouts, batch_size, seeds, shuffle, drop_last, seed)
        self.cache_config = CacheConfig(budget_bytes=cache_bytes, adjacency_fraction=cache_split, hotness=hotness)
        self.pinning_mode = pinning
        self.device = resolve_device(device, backend)
        on_gpu = self.device.type == "cuda"
        self.streams: StreamApi | None = streams if streams is not None else (CUDA_STREAMS if on_gpu else None)
        self.backend, self.backend_reason = self._choose_backend(backend)
        self._ops = native.ops() if self.backend == "kernels" else None
        self._stream = self.streams.Stream(self.device) if self.streams is not None else None
        self._pinned: HostPinning | None = None
        self._graph: torch_sampler.GraphTensors | None = None
        self._cache: GpuCache | None = None
        self.cache_plan: CachePlan | None = None
        self._active_epoch: object | None = None
        self._open()

    def _choose_backend(self, requested: str) -> tuple[str, str]:
        """The backend that makes batches, and why."""
        if requested != "auto":
            return requested, f"backend={requested!r} was asked for (no self-check)"
        if self.device.type != "cuda":
            return "torch", f"the kernels run on CUDA only and the device is {self.device}"
        from morphpipe.sampling.backend_check import device_verdict

        verdict = device_verdict(self.device)
        return ("kernels" if verdict.kernels_ok else "torch"), verdict.summary()

    def _on_device(self) -> contextlib.AbstractContextManager:
        """The batcher's CUDA device made current (nothing to do on the CPU)."""
        return self.streams.device(self.device) if self.streams is not None else contextlib.nullcontext()

    def _on_stream(self) -> contextlib.AbstractContextManager:
        """The batcher's own stream made current (nothing to do on the CPU)."""
        return self.streams.stream(self._stream) if self.streams is not None else contextlib.nullcontext()

    def _open(self) -> None:
        """Pins the graph and fills the cache (planned at the first opening, after pre-sampling if asked). Features
        on disk (the graph's feature store open) are not pinned: their rows come through the store."""
        graph = self.graph
        store = getattr(graph, "feature_store", None)
        on_host = GRAPH_PARTS if store is None else tuple(name for name in GRAPH_PARTS if name != "features")
        parts = {name: getattr(graph, name) for name in on_host}
        features = graph.features if store is None else StoreRows(store, self.device)  # where the cache copies from
        try:
            with self._on_device():
                if self.device.type == "cuda":
                    self._pinned = HostPinning(parts, mode=self.pinning_mode)
                    parts = {name: self._pinned[name] for name in on_host}
                if self.backend == "torch" and self.device.type == "cuda":
                    parts = {name: cuda_view(tensor, self.device) for name, tensor in parts.items()}
                self._graph = torch_sampler.GraphTensors(**({"features": features} | parts))
                with self._on_stream():
                    if self.cache_plan is None:
                        self._cache = GpuCache(CachePlan.empty(), graph.indptr, graph.indices, features, self.device)
                        self.cache_plan = self._plan_cache()
                    self._cache = GpuCache(self.cache_plan, graph.indptr, graph.indices, features, self.device)
        except BaseException:
            self.close()
            raise

    def _plan_cache(self) -> CachePlan:
        config, graph = self.cache_config, self.graph
        if config.budget_bytes == 0:
            return CachePlan.empty()
        degrees = graph.indptr[1:] - graph.indptr[:-1]
        if config.hotness == "degree":
            feature_hot = adjacency_hot = degree_hotness(graph.indices, graph.num_nodes)
        else:
            feature_hot, adjacency_hot = batch_hotness(self._presample(config.presample_batches), graph.num_nodes)
        return plan_cache(feature_hot, adjacency_hot, degrees,
                          row_bytes=graph.features.shape[1] * graph.features.element_size(),
                          index_bytes=graph.indices.element_size(), fanouts=self.fanouts,
                          budget_bytes=config.budget_bytes, adjacency_fraction=config.adjacency_fraction)

    def _presample(self, count: int) -> Iterator[MiniBatch]:
        """The first `count` batches of a throw-away epoch (-1), made without a cache (DUCATI's pre-sampling)."""
        return itertools.islice(self._batches(-1), count)

    @property
    def cache_bytes_used(self) -> int:
        """Device bytes the cache holds now (0 once closed); never more than `cache_bytes`."""
        return self._cache.bytes_used if self._cache is not None else 0

    @property
    def closed(self) -> bool:
        return self._graph is None

    def epoch(self, epoch: int) -> Iterator[MiniBatch]:
        """Starts epoch `epoch` (superseding any epoch in progress) and yields its batches in order, on the device."""
        return self.epoch_from(epoch, 0)

    def epoch_from(self, epoch: int, first: int) -> Iterator[MiniBatch]:
        """As `epoch`, from batch `first` on."""
        first = self.check_first(first)
        if self.closed:
            self._open()
        token = object()
        self._active_epoch = token
        return self._batches(epoch, token, first)

    def _batches(self, epoch: int, token: object | None = None, first: int = 0) -> Iterator[MiniBatch]:
        """Epoch `epoch`'s batches from `first` on; with a `token`, each only while that epoch is still the active
        one."""
        with self._on_device(), self._on_stream():
            order = self.epoch_order(epoch).to(self.device)
        seed_of_epoch = epoch_seed(self.seed, epoch)
        for batch_index in range(first, len(self)):
            if token is not None and self._active_epoch is not token:
                raise RuntimeError("GpuBatcher: this epoch was superseded by a newer one (or the batcher was "
                                   "closed); iterate the new epoch")
            seeds = batch_seeds(order, batch_index, self.batch_size)
            yield self._make_batch(seeds, batch_index, batch_seed(seed_of_epoch, batch_index))

    def _make_batch(self, seeds: torch.Tensor, batch_index: int, sampling_seed: int) -> MiniBatch:
        """Samples, gathers features and labels for `seeds` (on the device) on the batcher's stream."""
        with self._on_device(), self._on_stream():
            start = self._event()
            if self.backend == "kernels":
                batch = self._kernel_batch(seeds, batch_index, sampling_seed)
            else:
                cache = self._cache
                tables = torch_sampler.TorchCache(cache.adjacency_slot, cache.adjacency_indptr,
                                                  cache.adjacency_indices, cache.feature_slot, cache.feature_rows)
                batch = torch_sampler.make_batch(self._graph, seeds, self.fanouts, sampling_seed, cache=tables,
                                                 batch_index=batch_index, route=self.route)
            if start is not None:
                batch.handoff = Handoff(self._stream, start, self._event())
        return batch

    def _event(self):
        """A timing event recorded now on the batcher's stream (None on the CPU)."""
        if self.streams is None:
            return None
        event = self.streams.Event(enable_timing=True)
        event.record(self._stream)
        return event

    def _kernel_batch(self, seeds: torch.Tensor, batch_index: int, sampling_seed: int) -> MiniBatch:
        """One batch by the fused CUDA sampler and gather (on the current stream)."""
        graph, cache = self._graph, self._cache
        input_nodes, indptrs, indices = self._ops.sample_neighbors_cached(
            graph.indptr, graph.indices, seeds, self.fanouts, sampling_seed,
            cache.adjacency_slot, cache.adjacency_indptr, cache.adjacency_indices)
        if isinstance(graph.features, StoreRows):
            x = torch_sampler.gather_rows(graph.features, input_nodes, cache.feature_slot, cache.feature_rows)
        else:  # the sampler checked the seeds and produced input_nodes: skip the gather's blocking bounds read-back
            x = self._ops.gather_rows_cached(graph.features, input_nodes, cache.feature_slot, cache.feature_rows,
                                             False)
        no_cache = seeds.new_empty(0, dtype=torch.int32)
        y = self._ops.gather_rows_cached(graph.labels.view(-1, 1), seeds, no_cache, no_cache, False).view(-1)
        return MiniBatch(seeds=seeds, input_nodes=input_nodes,
                         blocks=blocks_from_native(input_nodes.numel(), indptrs, indices),
                         x=x, y=y, batch_index=batch_index, route=self.route)

    def close(self) -> None:
        """Frees the cache and unpins the graph; a later epoch pins and fills the cache again."""
        self._active_epoch = None
        self._cache = None
        self._graph = None
        if self._pinned is not None:
            self._stream.synchronize()  # kernels still reading the pinned graph finish before it is unpinned
            pinned, self._pinned = self._pinned, None
            pinned.close()
