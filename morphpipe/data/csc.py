"""Edge list -> CSC (in-neighbour lists) by one sort of packed int64 keys `dst * N + src`.

numpy 2.x sorts int64 with SIMD (x86-simd-sort), so one in-place sort groups edges by destination,
orders each neighbour list, and puts duplicate edges next to each other for deduplication.
"""
from __future__ import annotations

import mmap
from collections.abc import Iterator

import numpy as np
import torch
from tqdm.auto import tqdm

from morphpipe.data.dtypes import index_dtype_for
from morphpipe.data.validation import GraphValidationError

# Largest node count whose keys dst * N + src fit in int64.
KEY_NODE_LIMIT = 3_037_000_499
CHUNK_EDGES = 1 << 24


def build_csc(
    src,
    dst,
    num_nodes: int,
    *,
    make_undirected: bool = False,
    drop_self_loops: bool = False,
    dedupe: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """CSC of the edges src -> dst: in-neighbours of v are indices[indptr[v]:indptr[v+1]], sorted.

    Returns int64 `indptr [N+1]` and `indices [E']` (int32 when N < 2**31, else int64).
    """
    indptr, indices = build_csc_arrays(
        as_node_ids(src, "src"), as_node_ids(dst, "dst"), num_nodes,
        make_undirected=make_undirected, drop_self_loops=drop_self_loops, dedupe=dedupe)
    return torch.from_numpy(indptr), torch.from_numpy(indices)


def build_csc_arrays(
    src: np.ndarray,
    dst: np.ndarray,
    num_nodes: int,
    *,
    make_undirected: bool = False,
    drop_self_loops: bool = False,
    dedupe: bool = False,
    progress: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """numpy version of `build_csc` for integer arrays; `progress` shows a tqdm bar."""
    check_edge_ids(src, dst, num_nodes)
    keys = pack_edge_keys(src, dst, num_nodes, make_undirected=make_undirected)
    keys.sort()
    return csc_from_sorted_keys(keys, num_nodes, drop_self_loops=drop_self_loops, dedupe=dedupe, progress=progress)


def as_node_ids(values, field: str) -> np.ndarray:
    """A 1-D integer numpy array (zero-copy from tensors and arrays), or an error naming `field`."""
    array = values.detach().cpu().numpy() if isinstance(values, torch.Tensor) else np.asarray(values)
    if array.size == 0:
        return array.reshape(0).astype(np.int64, copy=False)
    if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
        raise GraphValidationError(field, f"has shape {array.shape} and dtype {array.dtype}, expected a 1-D "
                                   "integer array of node ids", "pass integer node ids, e.g. ids.astype(np.int64)")
    return array


def check_edge_ids(src: np.ndarray, dst: np.ndarray, num_nodes: int, first_edge: int = 0) -> None:
    """Both endpoint arrays have the same length and hold ids in [0, num_nodes); `first_edge` is the position of
    their first edge in the whole edge list (for the message)."""
    if not 0 <= num_nodes <= KEY_NODE_LIMIT:
        raise GraphValidationError("num_nodes", f"is {num_nodes}, expected 0 <= num_nodes <= {KEY_NODE_LIMIT}",
                                   "pass the number of nodes of the graph")
    if src.shape != dst.shape:
        raise GraphValidationError("dst", f"has {dst.size} entries but src has {src.size}",
                                   "give one source and one destination per edge")
    for field, ids in (("src", src), ("dst", dst)):
        if ids.size and (ids.min() < 0 or ids.max() >= num_nodes):
            position = int(np.flatnonzero((ids < 0) | (ids >= num_nodes))[0])
            raise GraphValidationError(field, f"node id {int(ids[position])} at edge {first_edge + position} is "
                                       f"outside [0, {num_nodes})", "remap ids to 0..num_nodes-1 or raise num_nodes")


def pack_edge_keys(src: np.ndarray, dst: np.ndarray, num_nodes: int, *, make_undirected: bool = False) -> np.ndarray:
    """int64 keys `dst * N + src` (followed by the reversed edges when `make_undirected`), filled in chunks."""
    num_edges = src.size
    keys = np.empty(2 * num_edges if make_undirected else num_edges, dtype=np.int64)
    for start in range(0, num_edges, CHUNK_EDGES):
        stop = min(start + CHUNK_EDGES, num_edges)
        fill_keys(keys[start:stop], src[start:stop], dst[start:stop], num_nodes)
        if make_undirected:
            fill_keys(keys[num_edges + start:num_edges + stop], dst[start:stop], src[start:stop], num_nodes)
    return keys


def edge_key_chunks(src: np.ndarray, dst: np.ndarray, num_nodes: int, *,
                    make_undirected: bool = False) -> Iterator[np.ndarray]:
    """The keys of `pack_edge_keys`, a chunk at a time through one reused buffer, the ids of each chunk checked as it
    is read (so memory-mapped endpoint arrays are read once, in order)."""
    if src.shape != dst.shape:
        check_edge_ids(src, dst, num_nodes)
    keys = np.empty(min(CHUNK_EDGES, src.size), dtype=np.int64)
    for start in range(0, src.size, CHUNK_EDGES):
        stop = min(start + CHUNK_EDGES, src.size)
        check_edge_ids(src[start:stop], dst[start:stop], num_nodes, start)
        chunk = keys[:stop - start]
        fill_keys(chunk, src[start:stop], dst[start:stop], num_nodes)
        yield chunk
        if make_undirected:
            fill_keys(chunk, dst[start:stop], src[start:stop], num_nodes)
            yield chunk
        release_mapped_pages(src[start:stop])
        release_mapped_pages(dst[start:stop])


def release_mapped_pages(view: np.ndarray) -> None:
    """Drops the pages lying wholly under a 1-D view of a read-only memory-mapped file from this process's resident set.

    They stay in the page cache (touching them again maps them back), so a mapped file read once,
    chunk by chunk, does not pile up in the process's RSS. Does nothing for arrays in memory.
    """
    mapping = view
    while isinstance(mapping, np.ndarray) and not isinstance(mapping, np.memmap):
        mapping = mapping.base
    # Read-only maps only: dropping pages of a copy-on-write map ("c") would discard the caller's changes.
    if not isinstance(mapping, np.memmap) or mapping.mode != "r" or getattr(mapping, "_mmap", None) is None or \
            view.size == 0:
        return
    region = mapping._mmap
    origin = np.frombuffer(region, dtype=np.uint8).ctypes.data
    low = view.ctypes.data - origin + min(0, (view.size - 1) * view.strides[0])
    high = low + abs((view.size - 1) * view.strides[0]) + view.itemsize
    first, last = -(-low // mmap.PAGESIZE) * mmap.PAGESIZE, high // mmap.PAGESIZE * mmap.PAGESIZE
    if last > first:
        region.madvise(mmap.MADV_DONTNEED, first, last - first)


def fill_keys(out: np.ndarray, src: np.ndarray, dst: np.ndarray, num_nodes: int) -> None:
    """out = dst * N + src, computed in int64 whatever the id dtype."""
    out[:] = dst
    out *= num_nodes
    out += src


def csc_from_sorted_keys(
    keys: np.ndarray,
    num_nodes: int,
    *,
    drop_self_loops: bool = False,
    dedupe: bool = False,
    progress: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Decodes sorted keys into (indptr, indices), dropping repeated keys and/or self loops on the way."""
    indices = np.empty(keys.size, dtype=index_dtype_for(num_nodes))
    decoder = SortedKeyDecoder(num_nodes, drop_self_loops=drop_self_loops, dedupe=dedupe, max_block=keys.size)
    written = 0
    starts = range(0, keys.size, CHUNK_EDGES)
    for start in tqdm(starts, desc="CSC", unit="chunk", disable=not progress or len(starts) < 2, leave=False):
        written += decoder.decode(keys[start:start + CHUNK_EDGES], indices[written:])
    indices.resize(written, refcheck=False)
    return decoder.indptr(), indices


class SortedKeyDecoder:
    """Turns ascending packed keys, given block after block, into neighbour ids and per-destination counts.

    Works in chunks through scratch buffers allocated once (first-touch page faults are a large
    part of the cost otherwise). A key is a self loop exactly when it is a multiple of N + 1; a
    repeated key is recognised across blocks too. The counts live in the indptr array itself
    (N + 1 int64, the one array of the CSC that stays in memory).
    """

    def __init__(self, num_nodes: int, *, drop_self_loops: bool = False, dedupe: bool = False,
                 max_block: int = CHUNK_EDGES):
        self.num_nodes = num_nodes
        self.drop_self_loops = drop_self_loops
        self.dedupe = dedupe
        self._indptr = np.zeros(num_nodes + 1, dtype=np.int64)
        self._previous: int | None = None  # last key of the previous block
        size = max(1, min(CHUNK_EDGES, max_block))
        self._dst, self._scratch = np.empty(size, dtype=np.int64), np.empty(size, dtype=np.int64)
        self._keep, self._mask = np.empty(size, dtype=bool), np.empty(size, dtype=bool)

    def decode(self, keys: np.ndarray, out: np.ndarray) -> int:
        """Writes the source ids of the kept keys of `keys` (the next keys in order) to `out`; returns how many."""
        written = 0
        for start in range(0, keys.size, self._dst.size):
            written += self._decode_chunk(keys[start:start + self._dst.size], out[written:])
        return written

    def _decode_chunk(self, chunk: np.ndarray, out: np.ndarray) -> int:
        length = chunk.size
        if not length:
            return 0
        kept = chunk
        keep, num_nodes = self._keep, self.num_nodes
        if self.dedupe or self.drop_self_loops:
            keep[:length] = True
            if self.dedupe:
                np.not_equal(chunk[1:], chunk[:-1], out=keep[1:length])
                keep[0] = self._previous is None or chunk[0] != self._previous
            if self.drop_self_loops:
                np.remainder(chunk, num_nodes + 1, out=self._scratch[:length])
                np.not_equal(self._scratch[:length], 0, out=self._mask[:length])
                keep[:length] &= self._mask[:length]
            kept = chunk[keep[:length]]
        self._previous = int(chunk[-1])
        count = kept.size
        dst, scratch = self._dst[:count], self._scratch[:count]
        np.floor_divide(kept, num_nodes, out=dst)
        np.multiply(dst, num_nodes, out=scratch)
        np.subtract(kept, scratch, out=out[:count], casting="unsafe")
        if count:
            first = int(dst[0])
            np.subtract(dst, first, out=dst)
            self._indptr[1 + first:2 + first + int(dst[-1])] += np.bincount(dst)
        return count

    def indptr(self) -> np.ndarray:
        """int64 [N + 1] offsets of the keys decoded so far; call once, after the last block."""
        np.cumsum(self._indptr, out=self._indptr)
        return self._indptr
