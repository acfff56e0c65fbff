"""Node features on disk: rows read from the dataset's features.npy when a batch needs them, behind a static
host-RAM cache of the hottest rows, so a graph whose features exceed RAM still trains.

The native store keeps many reads in flight: as preads by a pool of I/O threads beside the caller (the default,
measured faster under load), or submitted at once to an io_uring by the gathering thread itself. It reads rows that lie close
together in one request, and checks before every gather that the file is still the one it opened: a file
truncated or replaced while in use is an error naming it, never a SIGBUS.
"""
from __future__ import annotations

import errno
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from morphpipe import native
from morphpipe.data.dtypes import FEATURE_DTYPES, FEATURE_STORAGE
from morphpipe.numeric import check_int

# Reads in flight besides the callers': this VM's disk gave 63k random 4 KiB reads/s at 18 in flight, 83k at 50,
# and the batcher over bench-10m under an 80% memory limit 1.4x the batches/s of 16 threads (BENCHMARKS.md).
DEFAULT_IO_THREADS = 48
# More I/O threads than this are refused (a plan file asking for them is wrong, not a deeper queue).
MAX_IO_THREADS = 1024

# Forces the reader of every feature store opened without one named: "io_uring" or "pread" (the thread pool).
READER_ENV = "MORPHPIPE_FEATURE_READER"
READERS = ("io_uring", "pread")
# The reader a store uses unless told (io_uring falls back to the pread pool where io_uring_setup fails). The pread
# pool: the CPU batcher over bench-10m under an 80% memory limit ran at 1.3-2.4x the batches/s with it than with
# io_uring in 5 of 5 runs (BENCHMARKS.md, taken under load 16-50 on 2 cores: one ring's reaping thread waits for a
# core at each completion, 48 pread threads wait side by side), though io_uring took 0.7x the CPU per batch.
# To be re-measured quiet; "io_uring" here makes it the default.
DEFAULT_READER = "pread"


@dataclass(frozen=True)
class NpyLayout:
    """Where the rows of a 2-D C-order .npy file lie: its data starts at `data_offset`."""

    data_offset: int
    shape: tuple[int, int]
    dtype: np.dtype


@dataclass(frozen=True)
class FeatureStoreCounters:
    """Rows served from the cache (hits) and from the file (misses), the reads and bytes the misses took, the wall
    time the store had reads in flight (`read_seconds`: gathers reading side by side count once, so it is the time
    the misses held the disk) and the gathers that read (`read_gathers`)."""

    hits: int
    misses: int
    reads: int
    bytes_read: int
    read_seconds: float = 0.0
    read_gathers: int = 0

    @property
    def hit_ratio(self) -> float:
        """Share of the rows asked for that the cache served (0 before any gather)."""
        total = self.hits + self.misses
        return self.hits / total if total else 0.0

    @property
    def reads_per_second(self) -> float | None:
        """The random-read rate the misses achieved: reads per second of reading (None before any timed read)."""
        return self.reads / self.read_seconds if self.reads and self.read_seconds > 0 else None

    def read_latency_s(self, io_threads: int) -> float | None:
        """Mean time one read took, by Little's law: a gather keeps min(io_threads + 1, its reads) reads in flight
        (the pool's threads and the caller, or a ring of that depth), so each took about that many times the
        reading time per read."""
        if not self.reads or self.read_seconds <= 0:
            return None
        in_flight = min(io_threads + 1, self.reads / max(self.read_gathers, 1))
        return self.read_seconds * max(in_flight, 1.0) / self.reads


def npy_layout(path: str | os.PathLike) -> NpyLayout:
    """Reads the header of a .npy file holding a 2-D C-order array of plain numbers in native byte order."""
    with open(path, "rb") as handle:
        try:
            version = np.lib.format.read_magic(handle)
            read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                           (2, 0): np.lib.format.read_array_header_2_0}.get(version)
            if read_header is None:
                raise ValueError(f"format version {version} is not read here (numpy.save writes 1.0 or 2.0)")
            shape, fortran_order, dtype = read_header(handle)
        except ValueError as error:
            raise ValueError(f"features file {path} is not a .npy file ({error}); regenerate or re-convert the "
                             "dataset") from error
        offset = handle.tell()
    if len(shape) != 2 or fortran_order or dtype.kind not in "fiu" or not dtype.isnative:
        raise ValueError(f"features file {path} holds a {'Fortran-order ' if fortran_order else ''}{dtype.str} "
                         f"array of shape {shape}; the feature store reads 2-D C-order arrays of numbers in native "
                         "byte order: re-save it with numpy.save(np.ascontiguousarray(array))")
    return NpyLayout(offset, (int(shape[0]), int(shape[1])), dtype)


def hotness_order(hotness: torch.Tensor) -> torch.Tensor:
    """Row ids from the hottest to the coldest (ties: the lower id first); a static cache of k rows holds the
    first k."""
    return torch.argsort(hotness, descending=True, stable=True)


def hottest_rows(hotness: torch.Tensor, count: int) -> torch.Tensor:
    """Ids of the `count` rows with the largest `hotness` (ties to the lower id), in increasing id order."""
    return torch.sort(hotness_order(hotness)[:count]).values


class FeatureStore:
    """The feature rows of a .npy file, gathered on demand (`gather(ids)`), the hottest rows cached in RAM.

    `dtype` names the feature dtype ("float32", "float16", "bfloat16"; bfloat16 is stored as uint16 bits, so it
    must be named); by default the file's own. `cache_bytes` of host RAM hold the rows with the largest
    `hotness` (one value per row, e.g. in-degree, or the expected reads of morphpipe.sampling.access_hotness),
    read once now. A gather keeps `io_threads` + 1 reads in
    flight. `reader` "io_uring" submits them at once to a ring of that depth, "pread" has `io_threads` pool
    threads issue them beside the caller; by default $MORPHPIPE_FEATURE_READER, else DEFAULT_READER (io_uring
    only where this process may set one up; `reader_note` says why not). `direct` reads with O_DIRECT, past the
    page cache (False: through it); by default it does so where the file system allows it (measured faster under
    memory pressure: BENCHMARKS.md, bench_giant), else says so once and reads through the page cache.
    `shares_io_with` (a pread store with as many I/O threads): read through that store's pool instead of starting
    another, so both keep `io_threads` + callers reads in flight together (a typed graph's stores share one).
    """

    def __init__(self, path: str | os.PathLike, dtype: str | None = None, *, cache_bytes: int = 0,
                 hotness: torch.Tensor | None = None, io_threads: int = DEFAULT_IO_THREADS,
                 direct: bool | None = None, reader: str | None = None,
                 shares_io_with: FeatureStore | None = None) -> None:
        layout = npy_layout(Path(path))
        num_rows, width = layout.shape
        if width < 1:
            raise ValueError(f"features file {path} has rows of width 0; nothing to gather")
        cache_bytes = check_int("cache_bytes", cache_bytes, 0)
        num_cached = min(num_rows, cache_bytes // (width * layout.dtype.itemsize))
        cached = torch.empty(0, dtype=torch.int64)
        if num_cached > 0:
            if hotness is None or hotness.dim() != 1 or hotness.numel() != num_rows:
                shape = None if hotness is None else tuple(hotness.shape)
                raise ValueError(f"hotness: a cache of {cache_bytes:,} bytes needs one hotness value per row "
                                 f"({num_rows} rows), got {shape}; pass e.g. the graph's in-degrees")
            if hotness.is_floating_point() and not bool(torch.isfinite(hotness).all()):
                raise ValueError(f"hotness: row {int((~torch.isfinite(hotness)).nonzero()[0])} has hotness "
                                 f"{float(hotness[~torch.isfinite(hotness)][0])}, which ranks nothing; pass finite "
                                 "values (e.g. the graph's in-degrees)")
            cached = hottest_rows(hotness, num_cached)
        self._open(path, dtype, cached, io_threads, direct, reader, shares_io_with)

    def _open(self, path: str | os.PathLike, dtype: str | None, cached: torch.Tensor, io_threads: int,
              direct: bool | None, reader: str | None, shares_io_with: FeatureStore | None = None) -> None:
        """Opens the file with `cached` (row ids) read into the cache. Pickling re-opens it with the same rows (a
        worker process gets its own threads and cache); the hotness they were chosen by is not kept: at
        papers100M scale it is 0.9 GB, the ids of a cache a third of that; nor is a shared pool (`shares_io_with`)."""
        self.path = Path(path)
        self._arguments = (path, dtype, cached, io_threads, direct, reader)
        self.reader, self.reader_note = choose_reader(reader)
        layout = npy_layout(self.path)
        self.dtype_name = _feature_dtype(self.path, layout.dtype, dtype)
        num_rows, width = layout.shape
        io_threads = check_int("io_threads", io_threads, 0)
        if io_threads > MAX_IO_THREADS:
            raise ValueError(f"io_threads: {io_threads} I/O threads is more than the {MAX_IO_THREADS} the feature "
                             "store allows; a few dozen keep this disk's queue full")
        direct = _direct_reads_allowed(self.path) if direct is None else bool(direct)
        self._native = native.load().FeatureStore(str(self.path), layout.data_offset, num_rows, width,
                                                  FEATURE_DTYPES[self.dtype_name], cached, io_threads, direct,
                                                  self.reader == "io_uring",
                                                  None if shares_io_with is None else shares_io_with.native)

    @property
    def native(self) -> object:
        """The native store, for the C++ batcher."""
        return self._native

    @property
    def shape(self) -> tuple[int, int]:
        return (self._native.num_rows, self._native.width)

    @property
    def dtype(self) -> torch.dtype:
        return self._native.dtype

    @property
    def num_rows(self) -> int:
        return self._native.num_rows

    @property
    def row_bytes(self) -> int:
        """Bytes of one row in the file."""
        return self._native.width * self.dtype.itemsize

    def rows_cached_by(self, cache_bytes: int) -> int:
        """Rows a cache of `cache_bytes` holds (the hottest that many)."""
        return min(self.num_rows, max(0, int(cache_bytes)) // self.row_bytes)

    def twin(self, *, io_threads: int | None = None, cached_rows: torch.Tensor | None = None,
             shares_io_with: FeatureStore | None = None, direct: bool | None = None) -> FeatureStore:
        """A store on the same file read the same way, caching `cached_rows` (row ids; None: no cache), with
        `io_threads` I/O threads (None: this store's) and O_DIRECT as `direct` says (None: as this store): what the
        profiler times the disk and the CPU apart with."""
        twin = type(self).__new__(type(self))
        rows = torch.empty(0, dtype=torch.int64) if cached_rows is None else torch.as_tensor(cached_rows).long()
        twin._open(self.path, self.dtype_name, rows, self.io_threads if io_threads is None else io_threads,
                   self.direct if direct is None else direct, self.reader, shares_io_with)
        return twin

    @property
    def num_cached(self) -> int:
        """Rows held in the host-RAM cache."""
        return self._native.num_cached

    @property
    def cache_bytes(self) -> int:
        """Host RAM the cached rows take."""
        return self.num_cached * self.shape[1] * self.dtype.itemsize

    @property
    def io_threads(self) -> int:
        return self._native.io_threads

    @property
    def direct(self) -> bool:
        return self._native.direct

    def describe_reader(self) -> str:
        """How the misses are read, in a few words, with why where it is not the default."""
        if self.reader == "io_uring":
            text = f"io_uring, {self.io_threads + 1} reads in flight per gather"
        else:
            text = f"pread pool of {self.io_threads} I/O threads"
        return text + (f" ({self.reader_note})" if self.reader_note else "")

    def gather(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` of the file, as a new [len(ids), width] tensor (what `features[ids]` gives in RAM)."""
        ids = torch.as_tensor(ids)
        if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool or ids.dim() != 1:
            raise TypeError(f"ids: expected a 1-D tensor of integer row ids, got {ids.dtype} of shape "
                            f"{tuple(ids.shape)}")
        return self._native.gather(ids.long())

    def counters(self) -> FeatureStoreCounters:
        """Hits, misses, reads, bytes and time read since the store opened or `reset_counters`."""
        hits, misses, reads, bytes_read, read_ns, read_gathers = self._native.counters()
        return FeatureStoreCounters(hits, misses, reads, bytes_read, read_ns * 1e-9, read_gathers)

    def count_reads(self, ids: torch.Tensor) -> tuple[int, int]:
        """The (reads, bytes) rows `ids` would take were none cached, coalesced as `gather` reads them; reads
        nothing, so the reads a miss costs can be counted at any cache size."""
        return tuple(self._native.count_reads(torch.as_tensor(ids).long()))

    def reset_counters(self) -> None:
        self._native.reset_counters()

    def __reduce__(self) -> tuple:
        return (_reopen, self._arguments)

    def __repr__(self) -> str:
        return (f"FeatureStore({str(self.path)!r}, {self.shape[0]}x{self.shape[1]} {self.dtype_name}, "
                f"{self.num_cached} rows cached ({self.cache_bytes:,} bytes), io_threads={self.io_threads}, "
                f"direct={self.direct}, reader={self.reader!r})")


_announced_buffered: set[str] = set()


def _direct_reads_allowed(path: Path) -> bool:
    """True when `path` opens with O_DIRECT; otherwise says once per file system that reads go through the page
    cache instead (tmpfs, some network file systems)."""
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_DIRECT))
        return True
    except OSError as error:
        if error.errno != errno.EINVAL:
            raise
    device = str(os.stat(path).st_dev)
    if device not in _announced_buffered:
        _announced_buffered.add(device)
        print(f"morphpipe: the file system of {path} refuses O_DIRECT; the feature store reads through the page "
              "cache there", file=sys.stderr)
    return False


def _reopen(path: str | os.PathLike, dtype: str | None, cached: torch.Tensor, io_threads: int,
            direct: bool | None, reader: str | None) -> FeatureStore:
    """A pickled FeatureStore, opened again with the same cached rows."""
    store = FeatureStore.__new__(FeatureStore)
    store._open(path, dtype, cached, io_threads, direct, reader)
    return store


def reader_line() -> str:
    """The reader a store opened now without one named would use, and why (for `morphpipe info`)."""
    reader, note = choose_reader()
    name = "io_uring" if reader == "io_uring" else "pread pool"
    if not note:
        unavailable = native.load().io_uring_unavailable_reason()
        other = "pread" if reader == "io_uring" else "io_uring"
        note = (f"the default; io_uring unavailable here: {unavailable}" if unavailable else
                f"the default; {READER_ENV}={other} switches to {'the pread pool' if other == 'pread' else other}")
    return f"{name} ({note})"


def choose_reader(requested: str | None = None) -> tuple[str, str]:
    """The reader a store uses and why, when that is not simply the default: `requested`, else the one
    $MORPHPIPE_FEATURE_READER names, else DEFAULT_READER (the pread pool where that is io_uring and io_uring_setup
    fails in this process). A reader asked for that cannot work here is refused with the reason."""
    forced = os.environ.get(READER_ENV, "").strip()
    if requested is None and forced:
        if forced not in READERS:
            raise ValueError(f"{READER_ENV}={forced!r} is not a feature store reader; set it to one of "
                             f"{', '.join(READERS)}, or unset it for the default ({DEFAULT_READER})")
        requested, note = forced, f"forced by {READER_ENV}"
    elif requested is not None:
        if requested not in READERS:
            raise ValueError(f"reader: {requested!r} is not a feature store reader; expected one of "
                             f"{', '.join(READERS)}, or None for the default ({DEFAULT_READER})")
        note = ""
    unavailable = native.load().io_uring_unavailable_reason()
    if requested is None:
        if DEFAULT_READER == "io_uring" and unavailable:
            return "pread", f"io_uring unavailable: {unavailable}"
        return DEFAULT_READER, ""
    if requested == "io_uring" and unavailable:
        source = f"{READER_ENV}=io_uring" if note else "reader='io_uring'"
        raise ValueError(f"{source}: io_uring cannot be used in this process ({unavailable}); read with the pread "
                         "pool (reader='pread') or leave the reader unset")
    return requested, note


def _feature_dtype(path: Path, stored: np.dtype, named: str | None) -> str:
    """The feature dtype of a file holding `stored` values: `named` when it matches, else the file's own."""
    if named is None:
        matches = [name for name, storage in FEATURE_STORAGE.items() if storage == stored and name != "bfloat16"]
        if not matches:
            raise ValueError(f"features file {path} holds {stored}; name its feature dtype (dtype='bfloat16' for "
                             f"uint16 bits) or store one of {', '.join(FEATURE_STORAGE)}")
        return matches[0]
    if named not in FEATURE_STORAGE:
        raise ValueError(f"dtype: {named!r} is not a feature dtype; expected one of {', '.join(FEATURE_STORAGE)}")
    if FEATURE_STORAGE[named] != stored:
        raise ValueError(f"features file {path} holds {stored}, but dtype {named!r} is stored as "
                         f"{FEATURE_STORAGE[named]}; pass the dtype the dataset's meta.json names")
    return named
