"""Exact full-graph inference for heterogeneous models, layer by layer, in chunks of destinations per node type.

The typed counterpart of `nn.layerwise`: layer `i` computes a table of every node's output for each
node type that a later layer reads (the target type alone in the last layer), in chunks of
destinations of one type. A chunk is a typed layer (`HeteroBlock`) holding, for every relation
into that type, the chunk's full in-neighbourhood (local ids per source type, the destinations
first among their own type's sources), so it gathers only its share of the previous layer's
tables. The first layer reads the stored features (through their type's FeatureStore when they are on
disk), or the local ids of a type without features (which the model embeds). Tables live in memory, or on
disk read back through a FeatureStore, within the memory budget (`layerwise.TableStore`); chunks run on
`device`.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import Tensor
from tqdm.auto import tqdm

from morphpipe.nn.hetero import HeteroModel
from morphpipe.nn.layerwise import (LayerTable, LocalIds, RowSource, TableStore, first_table, gather_neighbours,
                                   layer_widths, plan_settings, read_rows, resident_bytes)
from morphpipe.numeric import format_bytes
from morphpipe.sampling.hetero_block import HeteroBlock
from morphpipe.sampling.minibatch import Block


class TypedChunkBuilder:
    """Typed layers for chunks of destinations of one node type: every relation into it with full neighbourhoods."""

    def __init__(self, graph) -> None:
        self.relations = tuple(graph.relations)
        self.indptr = {relation: graph.indptr[relation].to(torch.int64) for relation in self.relations}
        self.indices = graph.indices
        self.local_ids = {node_type.name: LocalIds(node_type.count) for node_type in graph.node_types}

    def layer(self, dst_type: str, dst: Tensor) -> tuple[HeteroBlock, dict[str, Tensor]]:
        """The chunk's typed layer (empty blocks for the relations into other types) and, per source type, the local
        ids of its sources (`dst` first for `dst_type`)."""
        into = [relation for relation in self.relations if relation.dst == dst_type]
        gathered = {relation: gather_neighbours(self.indptr[relation], self.indices[relation], dst) for relation in into}
        src_ids: dict[str, Tensor] = {}
        local: dict = {}
        for src_type in dict.fromkeys([dst_type, *(relation.src for relation in into)]):
            reading = [relation for relation in into if relation.src == src_type]
            first = dst if src_type == dst_type else dst.new_empty(0)
            src_ids[src_type], relabelled = self.local_ids[src_type].relabel(first, [gathered[r][1] for r in reading])
            local.update(zip(reading, relabelled))
        empty = Block(torch.zeros(1, dtype=torch.int64), torch.zeros(0, dtype=torch.int64), 0, 0)
        blocks = {relation: Block(gathered[relation][0], local[relation], int(src_ids[relation.src].numel()),
                                  int(dst.numel())) if relation in gathered else empty for relation in self.relations}
        return HeteroBlock(blocks, {name: int(ids.numel()) for name, ids in src_ids.items()},
                           {dst_type: int(dst.numel())}), src_ids


def types_per_layer(num_layers: int, relations: Sequence, target_type: str, type_names: Sequence[str]) -> list[list[str]]:
    """The node types whose outputs each layer computes: the target type in the last layer, and before a layer every
    type it writes (their own rows) or reads through a relation; in the graph's type order."""
    needed = [{target_type}]
    for _ in range(num_layers - 1):
        later = needed[0]
        needed.insert(0, later | {relation.src for relation in relations if relation.dst in later})
    return [[name for name in type_names if name in types] for types in needed]


@torch.no_grad()
def typed_layerwise_inference(model: HeteroModel, graph, nodes: Tensor | None = None, *,
                              chunk_size: int | None = None, memory_budget: int | None = None,
                              device: torch.device | str = "cpu", tmp_dir: str | Path | None = None,
                              progress: bool = True, log: Callable[[str], None] | None = None) -> Tensor:
    """Exact logits `[len(nodes), classes]` of the target type's `nodes` (global ids; None: every node of the target
    type, in order) over every neighbour of every relation, layer by layer.

    `graph` is a HeteroGraphStore; `chunk_size` destinations per chunk (None: from `memory_budget`, default half
    the available memory), as `layerwise.layerwise_inference`.
    """
    device = torch.device(device)
    log = log or (lambda message: None)
    dtype = next(model.parameters()).dtype
    widths = layer_widths(model, max(model.input.dims.values()))
    settings = plan_settings(int(graph.num_nodes), int(graph.num_edges), widths,
                             torch.empty((), dtype=dtype).element_size(), chunk_size, memory_budget)
    target = graph.node_type(model.target_type)
    if nodes is not None:
        nodes = torch.as_tensor(nodes, dtype=torch.int64)
        if nodes.numel() and (int(nodes.min()) < target.start or int(nodes.max()) >= target.stop):
            raise ValueError(f"nodes must be ids of target type {target.name!r}, in [{target.start}, {target.stop}); "
                             f"got ids from {int(nodes.min())} to {int(nodes.max())}")
        nodes = nodes - target.start
    was_training = model.training
    model.eval()
    store = TableStore(settings.memory_budget, log, tmp_dir)
    try:
        return _chunked(model, graph, nodes, settings.chunk_size, device, dtype, store, progress, widths)
    finally:
        store.close()
        model.train(was_training)


def _chunked(model: HeteroModel, graph, nodes: Tensor | None, chunk_size: int, device: torch.device,
             dtype: torch.dtype, store: TableStore, progress: bool, widths: list[int]) -> Tensor:
    """Layer by layer, type by type, over chunks of destinations; the last layer only for the target's `nodes`."""
    counts = {node_type.name: node_type.count for node_type in graph.node_types}
    needed = types_per_layer(model.num_layers, graph.relations, model.target_type, graph.type_names)
    builder = TypedChunkBuilder(graph)
    last_rows = counts[model.target_type] if nodes is None else int(nodes.numel())
    total = sum(math.ceil(counts[name] / chunk_size) for types in needed[:-1] for name in types) + \
        math.ceil(last_rows / chunk_size)
    store.log(f"layer-wise inference: chunks of {chunk_size:,} destinations of one node type ({total} chunks, "
              f"memory budget {format_bytes(store.budget)})")
    # A type absent here is read as its local ids; features on disk are read through their type's store.
    stores = getattr(graph, "feature_stores", {})
    tables: dict[str, RowSource] = {name: first_table(features, stores.get(name))
                                    for name, features in graph.features.items()}
    with tqdm(total=total, desc="layer-wise inference", unit="chunk", leave=False, disable=not progress) as bar:
        for i, types in enumerate(needed):
            last = i == model.num_layers - 1
            live = sum(resident_bytes(table) for table in tables.values())
            out_tables: dict[str, RowSource] = {}
            for part, name in enumerate(types):
                targets = nodes if last and nodes is not None else None
                rows = last_rows if last else counts[name]
                out_table = LayerTable(torch.empty(rows, widths[i + 1], dtype=dtype)) if last else \
                    store.new(i + 1, rows, widths[i + 1], dtype, live, part, f"of {name!r}")
                live += 0 if last or out_table.file is not None else resident_bytes(out_table.rows)
                for start in range(0, rows, chunk_size):
                    stop = min(start + chunk_size, rows)
                    dst = targets[start:stop] if targets is not None else torch.arange(start, stop, dtype=torch.int64)
                    layer, src_ids = builder.layer(name, dst)
                    h = {src: _rows(tables.get(src), ids, device, dtype) for src, ids in src_ids.items()}
                    out = model.layer(i, layer.to(device), model.input(h) if i == 0 else h)[name]
                    out_table.write(start, out.to("cpu"))
                    bar.update(1)
                out_tables[name] = store.finish(out_table)
            tables = out_tables
    return tables[model.target_type]


def _rows(table: RowSource | None, ids: Tensor, device: torch.device, dtype: torch.dtype) -> Tensor:
    """Rows `ids` of a type's table on `device` in the model's dtype; a type without features (no table before the
    first layer) gives its local ids, which the model embeds."""
    if table is None:
        return ids.to(device)
    return read_rows(table, ids).to(device=device, dtype=dtype)
