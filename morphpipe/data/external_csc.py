"""CSC of graphs larger than memory: an external sort of packed edge keys `dst * N + src` under a memory budget.

Pass 1 copies the incoming key chunks into a run buffer that fits the budget, sorts each full run
in memory (numpy's SIMD sort) and appends it to one spill file beside the output. Pass 2 merges
the runs block by block: each run contributes a block, every key up to the smallest last key of
the blocks that have more to come is taken, sorted and decoded (`SortedKeyDecoder`), and the
neighbour ids are streamed into indices.npy; only indptr (N + 1 int64) stays in memory. When all
keys fit one run nothing is spilled, and the build is the in-memory sort.
"""
from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil
from tqdm.auto import tqdm

from morphpipe.data.csc import CHUNK_EDGES, SortedKeyDecoder
from morphpipe.data.dtypes import index_dtype_for
from morphpipe.data.ondisk import NpyChunkWriter

KEY_BYTES = 8
# Memory per key decoded at once: dst and scratch int64, two masks, the kept keys, the int64 ids written.
DECODE_BYTES_PER_KEY = 8 + 8 + 1 + 1 + 8 + 8
# Memory per key of the merge: the runs' blocks and the merged block.
MERGE_BYTES_PER_KEY = 2 * KEY_BYTES
# Share of the available memory a build may use when no budget is given.
DEFAULT_MEMORY_SHARE = 0.5
SPILL_FILE = ".sorted-runs.tmp"
# Most runs a build accepts from its budget (the merge keeps a block of each in memory).
MAX_RUNS = 256


def default_memory_budget() -> int:
    """Bytes a build may use by default: half of the memory available now (other processes keep the rest)."""
    return int(psutil.virtual_memory().available * DEFAULT_MEMORY_SHARE)


@dataclass(frozen=True)
class SortPlan:
    """How `num_keys` keys are sorted within `budget` bytes: runs of `run_keys`, merged `block_keys` per run at a time,
    decoded `decode_keys` at a time."""

    num_keys: int
    budget: int
    run_keys: int
    block_keys: int
    decode_keys: int

    @classmethod
    def for_budget(cls, num_keys: int, budget: int) -> "SortPlan":
        """The largest runs the budget allows (a quarter of it, at most CHUNK_EDGES keys, goes to decoding)."""
        if budget < 1:
            raise ValueError(f"sort memory budget is {budget} bytes, expected >= 1")
        decode_keys = max(1, min(CHUNK_EDGES, num_keys, budget // (4 * DECODE_BYTES_PER_KEY)))
        sort_bytes = max(KEY_BYTES, budget - decode_keys * DECODE_BYTES_PER_KEY)
        run_keys = max(1, min(num_keys, sort_bytes // KEY_BYTES))
        num_runs = max(1, -(-num_keys // run_keys))
        block_keys = run_keys if num_runs == 1 else max(1, sort_bytes // (MERGE_BYTES_PER_KEY * num_runs))
        return cls(num_keys, budget, run_keys, block_keys, decode_keys)

    @property
    def num_runs(self) -> int:
        return max(1, -(-self.num_keys // self.run_keys))

    @property
    def spill_bytes(self) -> int:
        """Disk taken by the spilled runs (none when the keys fit one run)."""
        return 0 if self.num_runs == 1 else self.num_keys * KEY_BYTES

    @staticmethod
    def minimum_bytes(num_keys: int) -> int:
        """The least sort memory accepted: one in-memory sort for small inputs, else enough for at most MAX_RUNS
        runs and at least 1 MiB (smaller blocks make the merge crawl)."""
        return min(num_keys * (KEY_BYTES + DECODE_BYTES_PER_KEY),
                   max(1 << 20, 2 * (-(-num_keys // MAX_RUNS)) * KEY_BYTES))


def build_csc_on_disk(
    key_chunks: Iterable[np.ndarray],
    num_keys: int,
    num_nodes: int,
    directory: str | os.PathLike,
    *,
    memory_budget: int,
    drop_self_loops: bool = False,
    dedupe: bool = False,
    progress: bool = False,
    desc: str = "edges",
    timings: dict[str, float] | None = None,
    name: str = "indices",
) -> tuple[np.ndarray, int]:
    """Writes `<name>`.npy (indices.npy) of the CSC of the packed keys (exactly `num_keys` of them, in chunks) into `directory`.

    Returns (indptr, number of edges kept). A chunk is copied before the next one is asked for, so a
    producer may reuse its buffer. `memory_budget` bounds what the sort and the decoding allocate;
    `timings` receives the seconds of pass 1 ("runs") and pass 2 ("merge").
    """
    directory = Path(directory)
    plan = SortPlan.for_budget(num_keys, memory_budget)
    index_dtype = index_dtype_for(num_nodes)
    decoder = SortedKeyDecoder(num_nodes, drop_self_loops=drop_self_loops, dedupe=dedupe, max_block=plan.decode_keys)
    ids = np.empty(plan.decode_keys, dtype=index_dtype)
    spill = directory / SPILL_FILE
    started = time.perf_counter()
    try:
        runs = _sorted_runs(key_chunks, plan, spill, progress, desc)
        after_runs = time.perf_counter()
        with NpyChunkWriter(directory, name, (num_keys,), index_dtype, rows_at_most=True) as writer, \
                tqdm(total=num_keys, desc=f"{desc}: merge {plan.num_runs} runs" if plan.num_runs > 1 else
                     f"{desc}: CSC", unit="key", unit_scale=True, disable=not progress, leave=False) as bar:
            for block in runs:
                for start in range(0, block.size, plan.decode_keys):
                    count = decoder.decode(block[start:start + plan.decode_keys], ids)
                    writer.write(ids[:count])
                bar.update(block.size)
        num_edges = writer.rows_written
    finally:
        spill.unlink(missing_ok=True)
    if timings is not None:
        timings["runs"] = after_runs - started
        timings["merge"] = time.perf_counter() - after_runs
    return decoder.indptr(), num_edges


def _sorted_runs(key_chunks: Iterable[np.ndarray], plan: SortPlan, spill: Path, progress: bool,
                 desc: str) -> Iterator[np.ndarray]:
    """Pass 1 (eagerly): sorted runs, spilled when there are several; returns an iterator over the keys in order."""
    run = np.empty(plan.run_keys, dtype=np.int64)
    filled = total = 0
    runs: list[tuple[int, int]] = []  # (first key, number of keys) of each spilled run
    handle = open(spill, "wb") if plan.num_runs > 1 else None
    try:
        with tqdm(total=plan.num_keys, desc=f"{desc}: draw and sort" if plan.num_runs == 1 else
                  f"{desc}: sort {plan.num_runs} runs", unit="key", unit_scale=True, disable=not progress,
                  leave=False) as bar:
            for chunk in key_chunks:
                total += chunk.size
                if total > plan.num_keys:
                    raise ValueError(f"external sort: more keys given than the {plan.num_keys:,} announced")
                position = 0
                while position < chunk.size:
                    take = min(chunk.size - position, run.size - filled)
                    run[filled:filled + take] = chunk[position:position + take]
                    filled, position = filled + take, position + take
                    if filled == run.size and handle is not None:
                        runs.append(_spill(run, handle, runs))
                        filled = 0
                bar.update(chunk.size)
            if total != plan.num_keys:
                raise ValueError(f"external sort: {total:,} keys given, {plan.num_keys:,} announced")
            if handle is None:
                run[:filled].sort()
                return iter((run[:filled],))
            if filled:
                runs.append(_spill(run[:filled], handle, runs))
    finally:
        if handle is not None:
            handle.close()
    return _merge(spill, runs, plan.block_keys)


def _spill(run: np.ndarray, handle, runs: list[tuple[int, int]]) -> tuple[int, int]:
    """Sorts `run` in place and appends it to the spill file; returns its (first key, length)."""
    run.sort()
    run.tofile(handle)
    first = runs[-1][0] + runs[-1][1] if runs else 0
    return first, run.size


def _merge(spill: Path, runs: list[tuple[int, int]], block_keys: int) -> Iterator[np.ndarray]:
    """Pass 2: the keys of the sorted runs in ascending order, a merged block at a time (each key is read once).

    Every run keeps a block in memory; the keys up to the smallest last key among the blocks of runs
    with more on disk are all the keys that can come next, so they are taken from every block,
    sorted together and yielded; each block's rest moves to its front (memmove: no temporary copy) and is
    topped up from disk.
    """
    blocks = [np.empty(min(block_keys, length), dtype=np.int64) for _, length in runs]
    held = [0] * len(runs)  # keys of each block in memory
    read = [0] * len(runs)  # keys of each run read from disk so far
    merged = np.empty(sum(block.size for block in blocks), dtype=np.int64)
    with open(spill, "rb", buffering=0) as handle:
        descriptor = handle.fileno()
        while True:
            for index, (first, length) in enumerate(runs):
                count = min(blocks[index].size - held[index], length - read[index])
                if count:
                    _read_keys(descriptor, blocks[index][held[index]:held[index] + count], first + read[index])
                    held[index] += count
                    read[index] += count
            limits = [blocks[index][held[index] - 1] for index, (_, length) in enumerate(runs)
                      if read[index] < length]
            boundary = min(limits) if limits else None
            size = 0
            for index in range(len(runs)):
                block = blocks[index][:held[index]]
                take = block.size if boundary is None else int(np.searchsorted(block, boundary, side="right"))
                merged[size:size + take] = block[:take]
                size += take
                ctypes.memmove(block.ctypes.data, block[take:].ctypes.data, (block.size - take) * KEY_BYTES)
                held[index] -= take
            if not size:
                return
            out = merged[:size]
            out.sort()
            yield out


def _read_keys(descriptor: int, out: np.ndarray, first_key: int) -> None:
    """Fills `out` with the int64 keys of the spill file starting at key `first_key`."""
    view = memoryview(out).cast("B")
    offset, done = first_key * KEY_BYTES, 0
    while done < view.nbytes:
        count = os.preadv(descriptor, [view[done:]], offset + done)
        if count == 0:
            raise OSError(f"spill file of the external sort ended early at byte {offset + done}")
        done += count
