"""Exact full-graph inference, layer by layer: every node's layer-1 output over full neighbourhoods, then layer 2...

Sampled inference gives accuracies that move with the sampling seed; this computes the model's
exact outputs (DGL's and PyG's reference examples end the same way). Layer `i` runs over chunks
of destinations: each chunk is a Block of its destinations and all their in-neighbours (prefix
convention, local ids) whose sources' rows are gathered from the previous layer's N x width
table, so a chunk holds only its own share. GCN's normalisation reads the whole layer's
out-degrees (`Block.src_degrees`), so a chunk computes exactly what the whole-graph block does.
When one chunk covers the graph, each layer runs on one whole-graph block (`GraphBlock`), where
the AdaptGear selector may pick the community-decomposed kernel.

The intermediate tables live in memory, or in .npy files in a temporary directory when they do
not fit in the memory budget; which one is said in the log. A table on disk is written chunk by
chunk with plain writes (in order, so the page cache writes it back sequentially; never memory-mapped,
whose written pages would count in the resident set) and read back by the next layer through a
FeatureStore reading through the page cache, as features on disk are read through the graph's
(`GraphStore.feature_store`): a chunk's scattered source rows come from many reads in flight, not
one page fault at a time. Each layer's time, split into building blocks, reading rows, computing
and writing, goes to the log (`LayerStats`). Tables stay on the host; chunks run on `device`.
"""
from __future__ import annotations

import math
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import psutil
import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from morphpipe.data.dtypes import FEATURE_STORAGE, dtype_name
from morphpipe.data.feature_store import FeatureStore
from morphpipe.numeric import format_bytes
from morphpipe.ops.community import GraphBlock
from morphpipe.sampling.minibatch import Block

# Share of the available memory that layer-wise inference plans to use when no budget is given.
DEFAULT_MEMORY_SHARE = 0.5


@dataclass(frozen=True)
class LayerwiseSettings:
    """How the inference runs: destinations per chunk and the memory the tables and chunks may take."""

    chunk_size: int
    memory_budget: int
    whole_graph: bool  # one chunk covers the graph: whole-graph blocks (decomposition-eligible)


def layer_widths(model: nn.Module, in_dim: int) -> list[int]:
    """Output width of every layer (from the layers' out_features, heads concatenated), input width first."""
    widths = [in_dim]
    layers = getattr(model, "convs", None) or getattr(model, "lins")
    for layer in layers:
        if hasattr(layer, "heads"):
            widths.append(layer.heads * layer.out_features if layer.concat else layer.out_features)
        else:
            widths.append(layer.out_features)
    return widths


def plan_settings(num_nodes: int, num_edges: int, widths: list[int], itemsize: int, chunk_size: int | None,
                  memory_budget: int | None) -> LayerwiseSettings:
    """Chunk size from the budget (or as given): a chunk gathers its destinations' neighbour rows at the widest layer."""
    budget = int(memory_budget if memory_budget is not None else psutil.virtual_memory().available * DEFAULT_MEMORY_SHARE)
    if budget < 1:
        raise ValueError(f"memory_budget must be >= 1 byte, got {memory_budget!r}")
    if chunk_size is not None:
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
            raise ValueError(f"chunk_size must be an int >= 1 (destinations per chunk), got {chunk_size!r}")
        chosen = chunk_size
    else:
        fan = 1 + num_edges / max(num_nodes, 1)
        per_row = (fan * max(widths) + 4 * max(widths)) * itemsize
        chosen = max(1, int(budget // 2 // per_row))
    return LayerwiseSettings(min(chosen, max(num_nodes, 1)), budget, chosen >= num_nodes)


def gather_neighbours(indptr: Tensor, indices: Tensor, dst: Tensor) -> tuple[Tensor, Tensor]:
    """The in-neighbours of `dst` in a CSC (int64 `indptr`): the chunk's own indptr and the neighbours' ids (int64),
    destination after destination."""
    starts, ends = indptr[dst], indptr[dst + 1]
    degrees = ends - starts
    local_indptr = torch.zeros(dst.numel() + 1, dtype=torch.int64)
    torch.cumsum(degrees, 0, out=local_indptr[1:])
    total = int(local_indptr[-1])
    positions = torch.repeat_interleave(starts - local_indptr[:-1], degrees, output_size=total) + \
        torch.arange(total, dtype=torch.int64)
    return local_indptr, indices[positions].to(torch.int64)


@dataclass
class LayerStats:
    """Where one layer's time went: building the chunks' blocks, reading their source rows (from memory or through
    a feature store), computing the layer and writing its output table (with the flush of a table on disk); the
    rows the chunks read and, from a feature store, the reads and bytes its misses asked for (from the page cache
    or the disk: a store reading through the page cache cannot tell which)."""

    layer: int
    chunks: int = 0
    rows_read: int = 0
    seconds: float = 0.0
    build_seconds: float = 0.0
    read_seconds: float = 0.0
    compute_seconds: float = 0.0
    write_seconds: float = 0.0
    store_reads: int | None = None
    store_bytes: int | None = None

    def line(self) -> str:
        """The layer's times in one line, as the log says them."""
        disk = "" if self.store_reads is None else \
            f"; {self.store_reads:,} store reads, {format_bytes(self.store_bytes)} asked for"
        return (f"layer-wise inference: layer {self.layer + 1} took {self.seconds:.1f} s over {self.chunks} chunks "
                f"(blocks {self.build_seconds:.1f} s, reading {self.rows_read:,} rows {self.read_seconds:.1f} s, "
                f"computing {self.compute_seconds:.1f} s, writing {self.write_seconds:.1f} s{disk})")


class LocalIds:
    """Local ids of a chunk's sources in an id space of `size` nodes: `first` (the destinations, if any) in order,
    then every other neighbour once, sorted; one scratch map, reset after each chunk."""

    def __init__(self, size: int) -> None:
        self._local = torch.full((size,), -1, dtype=torch.int64)

    def relabel(self, first: Tensor, neighbours: Sequence[Tensor]) -> tuple[Tensor, list[Tensor]]:
        """The sources' ids in this space (`first`, then the others) and each neighbour list in local ids."""
        self._local[first] = torch.arange(first.numel(), dtype=torch.int64)
        merged = neighbours[0] if len(neighbours) == 1 else torch.cat([first.new_empty(0), *neighbours])
        others = torch.unique(merged[self._local[merged] < 0])
        src_ids = torch.cat([first, others])
        self._local[others] = torch.arange(first.numel(), src_ids.numel(), dtype=torch.int64)
        local = [self._local[ids] for ids in neighbours]
        self._local[src_ids] = -1
        return src_ids, local


class ChunkBuilder:
    """Blocks for chunks of destinations over the whole graph: their full in-neighbourhoods, destinations first."""

    def __init__(self, indptr: Tensor, indices: Tensor, num_nodes: int) -> None:
        self.indptr = indptr.to(torch.int64)
        self.indices = indices
        self.num_nodes = num_nodes
        self.out_degrees = torch.bincount(indices.to(torch.int64), minlength=num_nodes)
        self.local_ids = LocalIds(num_nodes)

    def block(self, dst: Tensor) -> tuple[Block, Tensor]:
        """The chunk's Block and the global ids of its sources (`dst` first, then the other in-neighbours, sorted)."""
        local_indptr, neighbours = gather_neighbours(self.indptr, self.indices, dst)
        src_ids, (local_indices,) = self.local_ids.relabel(dst, [neighbours])
        block = Block(local_indptr, local_indices, int(src_ids.numel()), int(dst.numel()), self.out_degrees[src_ids])
        return block, src_ids


# A layer's input table: rows in memory (a tensor, or a memory map of features the graph holds), or a file read
# through a feature store.
RowSource = Tensor | FeatureStore


def read_rows(table: RowSource, ids: Tensor) -> Tensor:
    """Rows `ids` of `table`, in order."""
    return table.gather(ids) if isinstance(table, FeatureStore) else table[ids]


def resident_bytes(table: RowSource) -> int:
    """The host memory `table` holds while a layer reads it (a feature store: its cache)."""
    return table.cache_bytes if isinstance(table, FeatureStore) else table.numel() * table.element_size()


def first_table(features: Tensor, store: FeatureStore | None) -> RowSource:
    """The first layer's input: the features, or their store when they are on disk. A store that caches no rows and
    reads with O_DIRECT is read through a twin reading through the page cache, as the tables are (`TableStore.finish`):
    every chunk reads much of the file (on bench-1m layer 1's 191 chunks read 35 GB of the 256 MB features with
    O_DIRECT). A store with a cache is read as it is, its RAM serving the hottest rows."""
    if store is not None and store.direct and store.num_cached == 0:
        return store.twin(direct=False)
    return store if store is not None else features


@dataclass
class LayerTable:
    """A layer's output table while it is written, chunk by chunk (`write`): `rows` in memory, or a .npy `file` on
    disk whose rows start at byte `data_offset`."""

    rows: Tensor
    file: BinaryIO | None = None
    data_offset: int = 0

    def write(self, start: int, rows: Tensor) -> None:
        """Rows `start`.. of the table are `rows`. On disk by plain writes, not through a memory map: a mapped table's
        written pages count in the process's resident set until the whole table is (on bench-1m 1.2 GB of them against
        a 256 MB budget); written ones stay in the page cache only, which the kernel writes back and frees."""
        if self.file is None:
            self.rows[start:start + rows.shape[0]] = rows
            return
        data = rows.contiguous().view(torch.uint8).numpy()
        row_bytes = rows.shape[1] * rows.element_size()
        done = 0
        while done < data.nbytes:  # pwrite may write less than asked
            done += os.pwrite(self.file.fileno(), data.data[done:], self.data_offset + start * row_bytes + done)


class TableStore:
    """Where the N x width intermediate tables live: memory, or .npy files in one temporary directory, written
    chunk by chunk and read back through a FeatureStore reading through the page cache (see `finish`)."""

    def __init__(self, budget: int, log: Callable[[str], None], tmp_dir: str | Path | None = None) -> None:
        self.budget = budget
        self.log = log
        self.tmp_root = tmp_dir
        self._tmp: tempfile.TemporaryDirectory | None = None
        self._readers: list[FeatureStore] = []
        self._files: list[BinaryIO] = []

    def new(self, layer: int, rows: int, width: int, dtype: torch.dtype, live_bytes: int, part: int | None = None,
            what: str = "") -> LayerTable:
        """An empty `[rows, width]` table for layer `layer`'s output; on disk when it and `live_bytes` exceed the budget.
        A layer with several tables (one per node type) numbers them `part` and names them `what` in the log."""
        size = rows * width * torch.empty((), dtype=dtype).element_size()
        where = f"{what}{' ' if what else ''}{rows:,} x {width} {dtype_name(dtype)} ({format_bytes(size)})"
        if size + live_bytes <= self.budget:
            self.log(f"layer-wise inference: layer {layer} table {where} in memory")
            return LayerTable(torch.empty(rows, width, dtype=dtype))
        if self._tmp is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="morphpipe-layerwise-", dir=self.tmp_root)
        path = Path(self._tmp.name) / (f"layer{layer}.npy" if part is None else f"layer{layer}-{part}.npy")
        self.log(f"layer-wise inference: layer {layer} table {where} on disk at {path} (it does not fit in the "
                 f"{format_bytes(self.budget)} memory budget)")
        file = open(path, "wb+")
        self._files.append(file)
        header = {"descr": np.lib.format.dtype_to_descr(np.dtype(FEATURE_STORAGE[dtype_name(dtype)])),
                  "fortran_order": False, "shape": (rows, width)}
        np.lib.format.write_array_header_1_0(file, header)
        file.flush()
        data_offset = file.tell()
        file.truncate(data_offset + size)
        return LayerTable(torch.empty(0, width, dtype=dtype), file, data_offset)

    def finish(self, table: LayerTable) -> RowSource:
        """The written `table` as the next layer reads it: its tensor, or its file through a FeatureStore that reads
        through the page cache (no O_DIRECT): every chunk reads its sources' rows from much of the table (on
        bench-1m each of 191 chunks of 5,260 destinations read 89k of the 1M rows, from about 29% of the 1 GB
        table's pages; with O_DIRECT layer 2 read 65 GB), so what the page cache keeps of the table, all of it where
        memory allows, serves the next chunks from memory."""
        if table.file is None:
            return table.rows
        path = Path(table.file.name)
        table.file.close()
        reader = FeatureStore(path, dtype_name(table.rows.dtype), direct=False)
        self._readers.append(reader)
        self.log(f"layer-wise inference: {path.name} read back through a feature store ({reader.describe_reader()}, "
                 "through the page cache)")
        return reader

    def close(self) -> None:
        """Closes the tables' readers and removes the temporary directory (and every table in it)."""
        self._readers.clear()
        for file in self._files:
            file.close()
        self._files.clear()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None


@torch.no_grad()
def layerwise_inference(model: nn.Module, graph, nodes: Tensor | None = None, *, chunk_size: int | None = None,
                        memory_budget: int | None = None, device: torch.device | str = "cpu",
                        tmp_dir: str | Path | None = None, graph_block: GraphBlock | None = None,
                        progress: bool = True, log: Callable[[str], None] | None = None,
                        stats: list[LayerStats] | None = None) -> Tensor:
    """Exact logits `[len(nodes), classes]` (all nodes when None) of `model` over full neighbourhoods, layer by layer.

    `model` exposes `layer(i, block, h_src)` and `num_layers` (every morphpipe.nn model);
    `graph` is a GraphStore (or anything with indptr, indices, features, num_nodes, num_edges).
    `chunk_size` destinations per chunk (None: from `memory_budget`, default half the available
    memory); `graph_block` reuses a whole-graph block (and its decompositions) across calls. Each layer's times
    go to `log` and, as a LayerStats, to `stats` when given.
    """
    device = torch.device(device)
    log = log or (lambda message: None)
    dtype = next(model.parameters()).dtype
    num_nodes = int(graph.num_nodes)
    widths = layer_widths(model, int(graph.features.shape[1]))
    settings = plan_settings(num_nodes, int(graph.num_edges), widths, torch.empty((), dtype=dtype).element_size(),
                             chunk_size, memory_budget)
    nodes = None if nodes is None else torch.as_tensor(nodes, dtype=torch.int64)
    if nodes is not None and nodes.numel() and (int(nodes.min()) < 0 or int(nodes.max()) >= num_nodes):
        raise ValueError(f"nodes must be node ids in [0, {num_nodes}), got ids from {int(nodes.min())} to "
                         f"{int(nodes.max())}")
    was_training = model.training
    model.eval()
    store = TableStore(settings.memory_budget, log, tmp_dir)
    stats = [] if stats is None else stats
    try:
        if settings.whole_graph:
            return _whole_graph(model, graph, nodes, device, dtype, graph_block, progress, stats)
        return _chunked(model, graph, nodes, settings, device, dtype, store, progress, widths[-1], stats)
    finally:
        store.close()
        model.train(was_training)


def _whole_graph(model: nn.Module, graph, nodes: Tensor | None, device: torch.device, dtype: torch.dtype,
                 graph_block: GraphBlock | None, progress: bool, stats: list[LayerStats]) -> Tensor:
    """Every layer on one whole-graph block (the AdaptGear selector may decompose it)."""
    block = (graph_block or GraphBlock.of(graph.indptr, graph.indices)).to(device)
    if not model.reads_neighbours:
        block = None
    h = torch.as_tensor(graph.features).to(device=device, dtype=dtype)
    num_src = int(h.shape[0])
    for i in tqdm(range(model.num_layers), desc="layer-wise inference", unit="layer", leave=False,
                  disable=not progress):
        started = time.perf_counter()
        h = model.layer(i, block, h)
        seconds = time.perf_counter() - started
        stats.append(LayerStats(i, 1, num_src, seconds, compute_seconds=seconds))
    out = h if nodes is None else h[nodes.to(device)]
    return out.cpu()


def _chunked(model: nn.Module, graph, nodes: Tensor | None, settings: LayerwiseSettings, device: torch.device,
             dtype: torch.dtype, store: TableStore, progress: bool, out_width: int,
             stats: list[LayerStats]) -> Tensor:
    """Layer by layer over chunks of destinations; the last layer only for `nodes`."""
    num_nodes = int(graph.num_nodes)
    builder = ChunkBuilder(graph.indptr, graph.indices, num_nodes) if model.reads_neighbours else None
    last_rows = num_nodes if nodes is None else int(nodes.numel())
    chunks_per_layer = math.ceil(num_nodes / settings.chunk_size)
    total = chunks_per_layer * (model.num_layers - 1) + math.ceil(last_rows / settings.chunk_size)
    store.log(f"layer-wise inference: chunks of {settings.chunk_size:,} destinations "
              f"({chunks_per_layer} per layer, memory budget {format_bytes(settings.memory_budget)})")
    table = first_table(graph.features, getattr(graph, "feature_store", None))
    with tqdm(total=total, desc="layer-wise inference", unit="chunk", leave=False, disable=not progress) as bar:
        for i in range(model.num_layers):
            last = i == model.num_layers - 1
            targets = nodes if last and nodes is not None else None
            rows = last_rows if last else num_nodes
            out_table: LayerTable | None = None
            layer = LayerStats(i)
            before = table.counters() if isinstance(table, FeatureStore) else None
            layer_started = time.perf_counter()
            for start in range(0, rows, settings.chunk_size):
                stop = min(start + settings.chunk_size, rows)
                dst = targets[start:stop] if targets is not None else torch.arange(start, stop, dtype=torch.int64)
                started = time.perf_counter()
                if builder is not None:
                    block, src_ids = builder.block(dst)
                else:
                    block, src_ids = _no_edges(dst.numel()), dst
                built = time.perf_counter()
                h_src = read_rows(table, src_ids)
                read = time.perf_counter()
                out = model.layer(i, block.to(device), h_src.to(device=device, dtype=dtype)).to("cpu")
                computed = time.perf_counter()
                if out_table is None:
                    out_table = LayerTable(torch.empty(rows, out.shape[1], dtype=out.dtype)) if last else \
                        store.new(i + 1, rows, out.shape[1], out.dtype, resident_bytes(table))
                out_table.write(start, out)
                layer.build_seconds += built - started
                layer.read_seconds += read - built
                layer.compute_seconds += computed - read
                layer.write_seconds += time.perf_counter() - computed
                layer.chunks += 1
                layer.rows_read += int(src_ids.numel())
                bar.update(1)
            if before is not None:
                after = table.counters()
                layer.store_reads, layer.store_bytes = after.reads - before.reads, after.bytes_read - before.bytes_read
            finishing = time.perf_counter()
            table = store.finish(out_table) if out_table is not None else torch.empty(0, out_width, dtype=dtype)
            layer.write_seconds += time.perf_counter() - finishing
            layer.seconds = time.perf_counter() - layer_started
            stats.append(layer)
            store.log(layer.line())
    return table


def _no_edges(rows: int) -> Block:
    """A block of `rows` destinations and no edges (layers that read only the destinations' own rows)."""
    return Block(torch.zeros(rows + 1, dtype=torch.int64), torch.zeros(0, dtype=torch.int64), rows, rows)

