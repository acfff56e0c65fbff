"""Route 0 for heterogeneous graphs: the C++ typed batcher (per-relation fanouts, one relabelling per node type).

`HeteroCpuBatcher` keeps the batcher contract (`morphpipe.sampling.batcher`): the epoch order,
exactly-once and replay are those of every other batcher for the same seed. Its batches carry
`HeteroBlock` layers, `x` as a dict node type -> rows (the gathered features, or the type's local
node ids, int64, for a type without features: the model embeds them), `input_nodes` as one tensor of
global ids, type after type in the order of the graph's node types. With `serial=True` each batch is
built on the calling thread when asked for (plans whose batching and training take turns on the same
cores), the same batch a worker thread would build.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import torch

from morphpipe import native
from morphpipe.cores import usable_cores
from morphpipe.data.hetero_store import HeteroGraphStore
from morphpipe.sampling.batcher import SeedBatcher
from morphpipe.sampling.cpu_batcher import NativeEpochs
from morphpipe.sampling.epochs import batch_seeds, epoch_seed
from morphpipe.sampling.hetero_block import HeteroBlock
from morphpipe.sampling.minibatch import Block, MiniBatch
from morphpipe.sampling.validation import MAX_FANOUT, check_positive

# Fanouts of a typed batch: one list for every relation, or a list per relation (keyed by triple, `src__name__dst`
# or the relation's name when unique).
TypedFanouts = Sequence[int] | Mapping[object, Sequence[int]]


def relation_fanouts(graph: HeteroGraphStore, fanouts: TypedFanouts) -> list[list[int]]:
    """`fanouts[hop][relation]` in the graph's relation order, each -1 (all), 0 (none) or positive; a dict must name
    every relation once, with the same number of hops."""
    relations = graph.relations
    if isinstance(fanouts, Mapping):
        per_relation: dict = {}
        for key, counts in fanouts.items():
            try:
                relation = graph.relation(key)
            except ValueError as error:
                raise ValueError(f"fanouts: {error}") from None
            if relation in per_relation:
                raise ValueError(f"fanouts: relation {relation.key} is given twice")
            per_relation[relation] = _hop_counts(f"fanouts[{relation.key!r}]", counts, allow_zero=True)
        missing = [relation.key for relation in relations if relation not in per_relation]
        if missing:
            raise ValueError(f"fanouts: no fanouts for relation(s) {missing}; a fanout dict names every relation of "
                             f"graph {graph.name!r} (use 0 to skip one), or pass one list for all relations")
        hops = {len(counts) for counts in per_relation.values()}
        if len(hops) != 1:
            raise ValueError(f"fanouts: relations have different hop counts {sorted(hops)}; give every relation one "
                             "fanout per layer")
    else:
        counts = _hop_counts("fanouts", fanouts, allow_zero=False)
        per_relation = {relation: counts for relation in relations}
    num_hops = len(next(iter(per_relation.values())))
    return [[per_relation[relation][hop] for relation in relations] for hop in range(num_hops)]


def _hop_counts(name: str, counts: object, allow_zero: bool) -> list[int]:
    if isinstance(counts, (str, bytes)) or not isinstance(counts, Sequence) or len(counts) == 0:
        raise ValueError(f"{name}: expected a non-empty list of ints such as [15, 10], got {counts!r}")
    lowest = 0 if allow_zero else 1
    checked = []
    for hop, count in enumerate(counts):
        if isinstance(count, bool) or not isinstance(count, int) or (count != -1 and not lowest <= count <= MAX_FANOUT):
            raise ValueError(f"{name}[{hop}] = {count!r}: a fanout is a neighbour count >= {lowest} or -1 for all "
                             "neighbours")
        checked.append(int(count))
    return checked


class HeteroCpuBatcher(NativeEpochs, SeedBatcher):
    """Epoch iterator over typed mini-batches of `seeds` (default: the target type's train split)."""

    route = 0

    def __init__(self, graph: HeteroGraphStore, fanouts: TypedFanouts, batch_size: int, *,
                 num_threads: int | None = None, seeds: torch.Tensor | None = None, shuffle: bool = True,
                 drop_last: bool = False, seed: int = 0, queue_size: int | None = None,
                 pin_memory: bool | None = None, serial: bool = False) -> None:
        super().__init__(graph, fanouts, batch_size, seeds, shuffle, drop_last, seed)
        target = graph.node_type(graph.target_type)
        outside = self.seeds[(self.seeds < target.start) | (self.seeds >= target.stop)]
        if outside.numel():
            raise ValueError(f"seeds: node {int(outside[0])} is not of the target type {graph.target_type!r} (ids "
                             f"[{target.start}, {target.stop})); pass seeds of the target type")
        self.serial = bool(serial)
        self.num_threads = check_positive("num_threads", num_threads if num_threads is not None else usable_cores())
        self.queue_size = check_positive("queue_size", queue_size if queue_size is not None else 2 * self.num_threads)
        self.pin_memory = torch.cuda.is_available() if pin_memory is None else bool(pin_memory)
        types = {name: index for index, name in enumerate(graph.type_names)}
        # Features on disk (HeteroGraphStore.load(features_on_disk=True)): those types' rows come through their stores.
        stores = graph.feature_stores
        self._native = native.load().HeteroCpuBatcher(
            graph.type_offsets(), [types[r.src] for r in graph.relations], [types[r.dst] for r in graph.relations],
            [graph.indptr[r].contiguous() for r in graph.relations],
            [graph.indices[r].contiguous() for r in graph.relations],
            [graph.features[name].contiguous() if name in graph.features and name not in stores else None
             for name in graph.type_names],
            graph.labels.contiguous(), self.fanouts, self.num_threads, self.queue_size, self.pin_memory,
            [stores[name].native if name in stores else None for name in graph.type_names])

    def checked_fanouts(self, fanouts: TypedFanouts) -> list[list[int]]:
        return relation_fanouts(self.graph, fanouts)

    @property
    def num_layers(self) -> int:
        return len(self.fanouts)

    def epoch(self, epoch: int) -> Iterator[MiniBatch]:
        """Starts epoch `epoch` (stopping any epoch in progress) and yields its batches in order; a serial batcher
        builds each one on the calling thread when it is asked for."""
        return self.epoch_from(epoch, 0)

    def epoch_from(self, epoch: int, first: int) -> Iterator[MiniBatch]:
        """As `epoch`, from batch `first` on."""
        if not self.serial:
            return super().epoch_from(epoch, first)
        first = self.check_first(first)
        token = object()
        self._active_epoch = token
        return self._build_each(token, self.epoch_order(epoch), epoch_seed(self.seed, epoch), first)

    def _build_each(self, token: object, order: torch.Tensor, seed: int, first: int) -> Iterator[MiniBatch]:
        for index in range(first, len(self)):
            if self._active_epoch is not token:
                raise RuntimeError("HeteroCpuBatcher: this epoch was superseded by a newer one; iterate the new epoch")
            yield self._minibatch(self._native.build(batch_seeds(order, index, self.batch_size), index, seed))

    def _minibatch(self, parts: tuple) -> MiniBatch:
        """Wraps the native (batch_index, seeds, input_nodes, indptrs, indices, counts, x, y, build_seconds) tuple."""
        batch_index, seeds, input_nodes, indptrs, indices, counts, x, y, build_seconds = parts
        names = self.graph.type_names
        layers = []
        for layer, (layer_indptrs, layer_indices) in enumerate(zip(indptrs, indices)):
            num_src = dict(zip(names, counts[layer]))
            num_dst = dict(zip(names, counts[layer + 1]))
            blocks = {relation: Block(indptr, index, num_src[relation.src], num_dst[relation.dst])
                      for relation, indptr, index in zip(self.graph.relations, layer_indptrs, layer_indices)}
            layers.append(HeteroBlock(blocks, num_src, num_dst))
        return MiniBatch(seeds=seeds, input_nodes=input_nodes, blocks=layers, x=dict(zip(names, x)), y=y,
                         batch_index=batch_index, route=self.route, build_s=build_seconds)

