"""Route 1 for heterogeneous graphs: typed sampling in plain vectorised PyTorch, on any device.

The algorithm of the C++ typed batcher, vectorised over destinations with the torch path's pieces
(`morphpipe.sampling.torch_sampler`: uniform offsets without replacement, first-occurrence
relabelling): at each hop, relation after relation, every destination of the relation's type takes
up to its fanout of distinct neighbours; then, per node type, the sources are the destinations
followed by the new neighbours in order of first occurrence (relation order, destination order,
draw order), so the batches have the shape and relabelling of Route 0's (the draws differ: another
random source). Randomness is one generator on the device, seeded per batch.

On a CUDA device the typed graph is copied into device memory (no zero-copy host views yet), except the
features of a type on disk (HeteroGraphStore.load(features_on_disk=True)): a batch's rows of that type are read
through its FeatureStore and copied over (`StoreRows`, as the homogeneous Route 1 does).
"""
from __future__ import annotations

from collections.abc import Iterator

import torch

from morphpipe.data.hetero_store import HeteroGraphStore
from morphpipe.sampling.batcher import SeedBatcher
from morphpipe.sampling.epochs import batch_seeds, epoch_seed
from morphpipe.sampling.gpu_batcher import batch_seed
from morphpipe.sampling.hetero_batcher import TypedFanouts, relation_fanouts
from morphpipe.sampling.hetero_block import HeteroBlock
from morphpipe.sampling.minibatch import Block, MiniBatch
from morphpipe.sampling.store_rows import StoreRows
from morphpipe.sampling.torch_sampler import relabel, sample_offsets, seeded_generator


def sample_typed(graph: HeteroGraphStore, indptr: dict, indices: dict, seeds: torch.Tensor,
                 fanouts: list[list[int]], generator: torch.Generator) -> tuple[dict[str, torch.Tensor],
                                                                                list[HeteroBlock]]:
    """(global ids of the input layer's sources per type, layers input first) for distinct `seeds` (any types)."""
    nodes = {t.name: seeds[(seeds >= t.start) & (seeds < t.stop)] for t in graph.node_types}
    starts = {t.name: t.start for t in graph.node_types}
    layers: list[HeteroBlock] = []
    for hop_fanouts in fanouts:
        num_dst = {name: int(found.numel()) for name, found in nodes.items()}
        pieces: dict[str, list[tuple[object, torch.Tensor]]] = {name: [] for name in nodes}
        indptrs = {}
        for relation, fanout in zip(graph.relations, hop_fanouts):
            dst = nodes[relation.dst] - starts[relation.dst]
            relation_indptr = indptr[relation]
            begin = relation_indptr.index_select(0, dst)
            degree = relation_indptr.index_select(0, dst + 1) - begin
            block_indptr, rows, offsets = sample_offsets(degree, fanout, generator)
            neighbours = indices[relation].index_select(0, begin[rows] + offsets).to(torch.int64)
            indptrs[relation] = block_indptr
            pieces[relation.src].append((relation, neighbours + starts[relation.src]))
        local: dict = {}
        for name, typed in pieces.items():
            found = torch.cat([n for _, n in typed]) if typed else nodes[name].new_zeros(0)
            nodes[name], labelled = relabel(nodes[name], found)
            for (relation, neighbours), part in zip(typed, torch.split(labelled, [n.numel() for _, n in typed])):
                local[relation] = part
        num_src = {name: int(found.numel()) for name, found in nodes.items()}
        blocks = {r: Block(indptrs[r], local[r], num_src[r.src], num_dst[r.dst]) for r in graph.relations}
        layers.append(HeteroBlock(blocks, num_src, num_dst))
    return nodes, layers[::-1]


class HeteroTorchBatcher(SeedBatcher):
    """Epoch iterator over typed mini-batches of `seeds` built with torch ops on `device` (Route 1)."""

    route = 1

    def __init__(self, graph: HeteroGraphStore, fanouts: TypedFanouts, batch_size: int, *,
                 seeds: torch.Tensor | None = None, shuffle: bool = True, seed: int = 0,
                 device: torch.device | str | None = None) -> None:
        super().__init__(graph, fanouts, batch_size, seeds, shuffle, False, seed)
        self.device = torch.device(device if device is not None else "cpu")
        target = graph.node_type(graph.target_type)
        if bool(((self.seeds < target.start) | (self.seeds >= target.stop)).any()):
            raise ValueError(f"seeds: every seed must be of the target type {graph.target_type!r} (ids "
                             f"[{target.start}, {target.stop}))")
        self.indptr = {r: graph.indptr[r].to(self.device) for r in graph.relations}
        self.indices = {r: graph.indices[r].to(self.device) for r in graph.relations}
        self.features = {name: StoreRows(graph.feature_stores[name], self.device) if name in graph.feature_stores
                         else rows.to(self.device) for name, rows in graph.features.items()}
        self.labels = graph.labels.to(self.device)

    def checked_fanouts(self, fanouts: TypedFanouts) -> list[list[int]]:
        return relation_fanouts(self.graph, fanouts)

    def epoch(self, epoch: int) -> Iterator[MiniBatch]:
        order = self.epoch_order(epoch).to(self.device)
        sampling_seed = epoch_seed(self.seed, epoch)
        for index in range(len(self)):
            yield self.batch(batch_seeds(order, index, self.batch_size), batch_seed(sampling_seed, index), index)

    def batch(self, seeds: torch.Tensor, seed: int, index: int = -1) -> MiniBatch:
        """The typed batch of `seeds`, deterministic for `seed` on this device."""
        generator = seeded_generator(self.device, seed)
        nodes, layers = sample_typed(self.graph, self.indptr, self.indices, seeds, self.fanouts, generator)
        x = {}
        for node_type in self.graph.node_types:
            local = nodes[node_type.name] - node_type.start
            rows = self.features.get(node_type.name)
            x[node_type.name] = rows.index_select(0, local) if rows is not None else local
        return MiniBatch(seeds=seeds, input_nodes=torch.cat(list(nodes.values())), blocks=layers, x=x,
                         y=self.labels.index_select(0, seeds), batch_index=index, route=self.route)

    def close(self) -> None:
        """Nothing runs between batches."""
