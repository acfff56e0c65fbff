"""Route 0 batcher: multi-threaded C++ neighbour sampling and feature gathering on CPU cores.

Each of `num_threads` C++ threads builds whole mini-batches outside the GIL (SALIENT-style
batch-level parallelism); a bounded window of `queue_size` batches in flight bounds memory,
and batches come out in epoch order, so an epoch is the same for any thread count.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from morphpipe import native
from morphpipe.cores import usable_cores
from morphpipe.data import GraphStore
from morphpipe.numeric import check_int
from morphpipe.sampling.batcher import SeedBatcher
from morphpipe.sampling.epochs import check_files, epoch_seed, note_first_use
from morphpipe.sampling.minibatch import Block, EdgePairs, MiniBatch
from morphpipe.sampling.validation import check_fanouts, check_positive, check_seed_ids


def minibatch_from_native(parts: tuple, route: int = 0) -> MiniBatch:
    """Wraps the native (batch_index, seeds, input_nodes, indptrs, indices, x, y, build_seconds, pairs) tuple;
    `pairs` is an edge task's (edge_ids, src, dst, negative_dst), else None."""
    batch_index, seeds, input_nodes, block_indptrs, block_indices, x, y, build_seconds, pairs = parts
    return MiniBatch(
        seeds=seeds,
        input_nodes=input_nodes,
        blocks=blocks_from_native(input_nodes.numel(), block_indptrs, block_indices),
        x=x,
        y=y,
        batch_index=batch_index,
        route=route,
        build_s=build_seconds,
        pairs=None if pairs is None else EdgePairs(*pairs),
    )


def blocks_from_native(num_input_nodes: int, block_indptrs: list, block_indices: list) -> list[Block]:
    """Blocks, input layer first: each layer's sources are the previous layer's destinations."""
    blocks = []
    num_src = num_input_nodes
    for indptr, indices in zip(block_indptrs, block_indices):
        num_dst = indptr.numel() - 1
        blocks.append(Block(indptr=indptr, indices=indices, num_src=num_src, num_dst=num_dst))
        num_src = num_dst
    return blocks


class NativeEpochs:
    """The epoch loop of a batcher whose C++ object (`_native`: start_epoch, next, stop) builds batches on worker
    threads and hands them out in epoch order; `_minibatch` wraps each native tuple (CpuBatcher's, by default)."""

    _native: object
    _active_epoch: object | None = None

    def epoch(self, epoch: int) -> Iterator[MiniBatch]:
        """Starts epoch `epoch` (stopping any epoch in progress) and yields its batches in order."""
        return self.epoch_from(epoch, 0)

    def epoch_from(self, epoch: int, first: int) -> Iterator[MiniBatch]:
        """As `epoch`, from batch `first` on: the workers build no batch before it."""
        first = self.check_first(first)
        token = object()
        self._active_epoch = token
        self._native.start_epoch(self.epoch_order(epoch), self.batch_size, self.drop_last, epoch_seed(self.seed, epoch),
                                 first)
        return self._iterate(token)

    def _iterate(self, token: object) -> Iterator[MiniBatch]:
        while True:
            if self._active_epoch is not token:
                raise RuntimeError(f"{type(self).__name__}: this epoch was superseded by a newer one; iterate the new "
                                   "epoch")
            parts = self._native.next()
            if parts is None:
                return
            yield self._minibatch(parts)

    def _minibatch(self, parts: tuple) -> MiniBatch:
        return minibatch_from_native(parts, route=self.route)

    def close(self) -> None:
        """Stops the worker threads; the batcher can start a new epoch afterwards."""
        self._active_epoch = None
        self._native.stop()


class CpuBatcher(NativeEpochs, SeedBatcher):
    """Epoch iterator over mini-batches of `seeds` (default: the graph's train split), per the batcher contract.

    The last batch of an epoch may be short unless `drop_last`. `fanouts[h]` is the neighbour count at
    hop h from the seeds (PyG's num_neighbors order), -1 for all neighbours; blocks come out input
    layer first.
    """

    route = 0

    def __init__(
        self,
        graph: GraphStore,
        fanouts: Sequence[int],
        batch_size: int,
        *,
        num_threads: int | None = None,
        seeds: torch.Tensor | None = None,
        shuffle: bool = True,
        drop_last: bool = False,
        seed: int = 0,
        queue_size: int | None = None,
        pin_memory: bool | None = None,
    ) -> None:
        super().__init__(graph, fanouts, batch_size, seeds, shuffle, drop_last, seed)
        self.num_threads = check_positive("num_threads", num_threads if num_threads is not None else usable_cores())
        self.queue_size = check_positive("queue_size", queue_size if queue_size is not None else 2 * self.num_threads)
        self.pin_memory = torch.cuda.is_available() if pin_memory is None else bool(pin_memory)
        # Features on disk (GraphStore.load(features_on_disk=True)) are gathered through the graph's feature store.
        self.feature_store = getattr(graph, "feature_store", None)
        self._native = native_batcher(graph, self.fanouts, self.num_threads, self.queue_size, self.pin_memory)

    @property
    def pool_bytes(self) -> int:
        """Bytes the C++ batch buffer pool holds, batches lent out and idle buffers (flat from epoch to epoch)."""
        return self._native.pool_bytes


def native_batcher(graph: GraphStore, fanouts: list[int], num_threads: int, queue_size: int, pin_memory: bool):
    """The C++ CpuBatcher over `graph`: its feature rows from RAM (or the memory map), or through the graph's feature
    store when its features are on disk."""
    store = getattr(graph, "feature_store", None)
    return native.load().CpuBatcher(graph.indptr.contiguous(), graph.indices.contiguous(),
                                    None if store is not None else graph.features.contiguous(),
                                    graph.labels.contiguous(), fanouts, num_threads, queue_size, pin_memory,
                                    None if store is None else store.native)


def sample_neighbors(graph, seeds, fanouts: Sequence[int], seed: int = 0) -> MiniBatch:
    """Samples one mini-batch on the calling thread (the `morphpipe::sample_neighbors` op)."""
    batch = sample_blocks(graph, seeds, fanouts, seed)
    batch.x = gather_features(graph, batch.input_nodes)
    return batch


def sample_blocks(graph, seeds, fanouts: Sequence[int], seed: int = 0) -> MiniBatch:
    """`sample_neighbors` without the feature gather (`x` is empty until `gather_features` fills it): the native
    sampler runs outside the GIL on the calling thread, so several threads may sample batches at once."""
    note_first_use(graph)
    check_files(graph)
    fanouts = check_fanouts(fanouts)
    seed_ids = check_seed_ids(seeds, graph.num_nodes)
    ops = native.ops()
    input_nodes, block_indptrs, block_indices = ops.sample_neighbors(
        graph.indptr, graph.indices, seed_ids, fanouts, check_int("seed", seed, 0)
    )
    return MiniBatch(
        seeds=seed_ids,
        input_nodes=input_nodes,
        blocks=blocks_from_native(input_nodes.numel(), block_indptrs, block_indices),
        x=torch.empty(0),
        y=graph.labels[seed_ids],
    )


def gather_features(graph, ids: torch.Tensor) -> torch.Tensor:
    """Feature rows `ids` of `graph`: through its feature store when its features are on disk, else from RAM (or
    the memory map) with the native gather."""
    store = getattr(graph, "feature_store", None)
    return store.gather(ids) if store is not None else native.ops().gather_rows(graph.features, ids)
