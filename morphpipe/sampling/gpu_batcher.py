"""Route 1 batcher: the GPU samples and gathers mini-batches itself, reading the graph over UVA.

The graph store's topology, features and labels stay in host memory, page-locked in place
(`HostPinning`), and CUDA kernels read them through unified virtual addressing (DUCATI,
PyTorch-Direct), so graphs far larger than device memory are batched on the GPU; a dual cache
(`GpuCache`) keeps the hottest neighbour lists and feature rows in device memory. The iterator
contract is CpuBatcher's: `len()`, `iter()` for the next epoch, `epoch(k)` to replay epoch k,
`close()`. An epoch visits the same seeds in the same batches as a CpuBatcher with the same
seed; the sampled neighbours differ (another random generator) but follow the same distribution.
Batches come out on the device, made on the current CUDA stream.
"""
from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

import torch

from morphpipe import native
from morphpipe.sampling.cpu_batcher import blocks_from_native
from morphpipe.sampling.epochs import SeedBatcher, batch_seeds, epoch_seed
from morphpipe.sampling.cuda_support import require_cuda
from morphpipe.sampling.gpu_cache import CacheConfig, CachePlan, GpuCache, batch_hotness, degree_hotness, plan_cache
from morphpipe.sampling.minibatch import MiniBatch
from morphpipe.sampling.pinning import HostPinning

MASK63 = (1 << 63) - 1


def batch_seed(epoch_seed_value: int, batch_index: int) -> int:
    """The sampling seed of one batch: depends only on the epoch's seed and the batch's position."""
    mixed = (epoch_seed_value * 0x9E3779B97F4A7C15 + (batch_index + 1) * 0xBF58476D1CE4E5B9) & ((1 << 64) - 1)
    return (mixed ^ (mixed >> 31)) & MASK63


class GpuBatcher(SeedBatcher):
    """Epoch iterator over mini-batches of `seeds` (default: the train split), built on the GPU over UVA.

    `cache_bytes` is the device memory for the dual cache (0: none); `cache_split` the share of it
    for neighbour lists (None: split by expected PCIe bytes saved); `hotness` ranks nodes by
    "degree" or by a short "presample" pass. `pinning="copy"` copies the graph into pinned memory
    instead of registering it in place (for memory CUDA refuses to register).
    """

    route = 1

    def __init__(
        self,
        graph,
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
    ) -> None:
        super().__init__(graph, fanouts, batch_size, seeds, shuffle, drop_last, seed)
        self.cache_config = CacheConfig(budget_bytes=cache_bytes, adjacency_fraction=cache_split, hotness=hotness)
        self.pinning_mode = pinning
        require_cuda("GpuBatcher (Route 1)")
        self.device = torch.device("cuda" if device is None else device)
        if self.device.type != "cuda":
            raise ValueError(f"device={str(device)!r}: the GPU batcher runs on a CUDA device, e.g. 'cuda' or 'cuda:0'")
        if self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self._ops = native.ops()
        self._pinned: HostPinning | None = None
        self._cache: GpuCache | None = None
        self.cache_plan: CachePlan | None = None
        self._active_epoch: object | None = None
        self._open()

    def _open(self) -> None:
        """Pins the graph and fills the cache (planned at the first opening, after pre-sampling if asked)."""
        graph = self.graph
        self._pinned = HostPinning({"indptr": graph.indptr, "indices": graph.indices, "features": graph.features,
                                    "labels": graph.labels}, mode=self.pinning_mode)
        try:
            with torch.cuda.device(self.device):
                if self.cache_plan is None:
                    self._cache = GpuCache(CachePlan.empty(), graph.indptr, graph.indices,
                                           graph.features, self.device)
                    self.cache_plan = self._plan_cache()
                self._cache = GpuCache(self.cache_plan, graph.indptr, graph.indices, graph.features, self.device)
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
        return self._pinned is None

    def epoch(self, epoch: int) -> Iterator[MiniBatch]:
        """Starts epoch `epoch` (superseding any epoch in progress) and yields its batches in order, on the device."""
        if self.closed:
            self._open()
        token = object()
        self._active_epoch = token
        return self._batches(epoch, token)

    def _batches(self, epoch: int, token: object | None = None) -> Iterator[MiniBatch]:
        """Epoch `epoch`'s batches; with a `token`, each only while that epoch is still the active one."""
        order = self.epoch_order(epoch).to(self.device)
        seed_of_epoch = epoch_seed(self.seed, epoch)
        for batch_index in range(len(self)):
            if token is not None and self._active_epoch is not token:
                raise RuntimeError("GpuBatcher: this epoch was superseded by a newer one (or the batcher was "
                                   "closed); iterate the new epoch")
            seeds = batch_seeds(order, batch_index, self.batch_size)
            yield self._make_batch(seeds, batch_index, batch_seed(seed_of_epoch, batch_index))

    def _make_batch(self, seeds: torch.Tensor, batch_index: int, sampling_seed: int) -> MiniBatch:
        """Samples, gathers features and labels for `seeds` (a CUDA tensor) on the current stream."""
        pinned, cache = self._pinned, self._cache
        with torch.cuda.device(self.device):
            input_nodes, indptrs, indices = self._ops.sample_neighbors_cached(
                pinned["indptr"], pinned["indices"], seeds, self.fanouts, sampling_seed,
                cache.adjacency_slot, cache.adjacency_indptr, cache.adjacency_indices)
            # The sampler checked the seeds and produced input_nodes: skip the gathers' blocking bounds read-back.
            x = self._ops.gather_rows_cached(pinned["features"], input_nodes, cache.feature_slot, cache.feature_rows,
                                             False)
            no_cache = seeds.new_empty(0, dtype=torch.int32)
            y = self._ops.gather_rows_cached(pinned["labels"].view(-1, 1), seeds, no_cache, no_cache, False).view(-1)
        return MiniBatch(seeds=seeds, input_nodes=input_nodes,
                         blocks=blocks_from_native(input_nodes.numel(), indptrs, indices),
                         x=x, y=y, batch_index=batch_index, route=self.route)

    def close(self) -> None:
        """Frees the cache and unpins the graph; a later epoch pins and fills the cache again."""
        self._active_epoch = None
        self._cache = None
        if self._pinned is not None:
            pinned, self._pinned = self._pinned, None
            pinned.close()
