"""The disk as a measured resource for features on disk: its random-read rate at the feature store's queue depth,
its sequential rate, and the hit ratio of a static hot-row cache as a function of its size (from presampled
batches), and the store's read rate and CPU time per read at several I/O thread counts (its queue depths);
`DiskProfile` holds them in the Profile, where the planner reads the time a batch's cache misses hold the disk and the
CPU time their reads take for any cache size and I/O thread count (scheduler/planning.py chooses both)."""
from __future__ import annotations

import itertools
import math
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace

import psutil
import torch

from morphpipe import native
from morphpipe.data.feature_store import FeatureStoreCounters, choose_reader, hotness_order
from morphpipe.documents import FieldReader
from morphpipe.numeric import check_float, check_int
from morphpipe.sampling.cpu_batcher import sample_neighbors
from morphpipe.sampling.epochs import epoch_order

PAGE = 4096  # what a buffered pread of one row fetches from the disk at least
# The share of the memory available now that a training run's data (topology, labels, feature cache) may take by
# default: the rest is left to batches in flight, the model and other processes.
TRAINING_MEMORY_SHARE = 0.8


@dataclass(frozen=True)
class DiskReadFacts:
    """O_DIRECT read rates measured on one file: random `block`-byte reads, `queue_depth` in flight, and
    sequential reads of `sequential_block` bytes."""

    path: str
    block: int
    queue_depth: int
    random_reads_per_s: float
    sequential_bytes_per_s: float
    sequential_block: int

    @property
    def random_bytes_per_s(self) -> float:
        return self.random_reads_per_s * self.block

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_fields(cls, reader: FieldReader) -> DiskReadFacts:
        """Reads and validates the facts from a profile's JSON."""
        return cls(reader.string("path"), reader.integer("block", minimum=1), reader.integer("queue_depth", minimum=1),
                   reader.number("random_reads_per_s", positive=True),
                   reader.number("sequential_bytes_per_s", positive=True), reader.integer("sequential_block", minimum=1))


# The I/O thread counts the profiler times the store's reads at (besides the store's own): its queue depth is one more.
IO_THREAD_COUNTS = (1, 4, 12, 24, 48, 96)
# Reads per timed gather when the I/O thread counts are timed, up to twice as many (a batch's misses, split where they
# take more): one gather times MIN_TIMED_READS reads, so a slow count stops within one gather of its time, and 96 I/O
# threads' queues still fill (a batch's misses are read at once).
IO_TIMING_READS = 256
# The read sizes the I/O thread counts are timed at: the shortest and the longest mean read of the caches' misses
# when it is this many times the shortest (sizes nearer than this are timed as one), and one between them this far
# from both where a cache's misses have one.
IO_SIZE_STEP = 2.0


@dataclass(frozen=True)
class IoThreadsRate:
    """The feature store's reads with `io_threads` I/O threads: preads per second of reading (its read timer) and
    the process CPU seconds each pread took (the I/O threads' and the caller's, summed over cores), timed on reads
    of `read_bytes` bytes on average (None: profiles from before the read size was timed, on short reads)."""

    io_threads: int
    reads_per_s: float
    cpu_s_per_read: float
    read_bytes: float | None = None

    def __post_init__(self) -> None:
        if isinstance(self.io_threads, bool) or not isinstance(self.io_threads, int) or self.io_threads < 0:
            raise ValueError(f"IoThreadsRate.io_threads must be an integer >= 0, got {self.io_threads!r}")
        if not (math.isfinite(self.reads_per_s) and self.reads_per_s > 0):
            raise ValueError(f"IoThreadsRate.reads_per_s must be a finite number > 0, got {self.reads_per_s!r}")
        if not (math.isfinite(self.cpu_s_per_read) and self.cpu_s_per_read >= 0):
            raise ValueError(f"IoThreadsRate.cpu_s_per_read must be a finite number >= 0, got "
                             f"{self.cpu_s_per_read!r}")
        if self.read_bytes is not None and not (math.isfinite(self.read_bytes) and self.read_bytes > 0):
            raise ValueError(f"IoThreadsRate.read_bytes must be a finite number > 0 (or None: not recorded), got "
                             f"{self.read_bytes!r}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_fields(cls, reader: FieldReader) -> IoThreadsRate:
        with reader.as_document_errors():
            return cls(reader.integer("io_threads", minimum=0), reader.number("reads_per_s", positive=True),
                       reader.number("cpu_s_per_read", minimum=0.0),
                       reader.number("read_bytes", positive=True, optional=True))


@dataclass(frozen=True)
class DiskProfile:
    """What the planner knows about features on disk: the disk's read rates (`facts`), the feature rows (`num_rows`
    of `row_bytes`), the rows a batch gathers (`rows_per_batch`), the preads a missed row costs (`reads_per_miss`
    without a cache, below 1 when neighbouring rows share a read), the share of rows a static cache of the hottest
    rows serves at each size of `hit_curve` ((cache bytes, hit ratio), increasing), `cache_budget_bytes`, the host
    RAM the cache may take, and `resident_bytes`, what the process needs in RAM besides: the topology, labels and
    splits, and what training holds (batches in flight, a step's peak) (their sum: the memory budget).

    `reads_per_miss_curve` holds the preads per missed row at each size of `hit_curve`, counted with that cache in
    place (the rows a hot cache misses lie sparser, so fewer share a read); empty: `reads_per_miss` at every size.
    `store_reads_per_s` is the rate the feature store's own reads achieved on the profiled batches (its read timer:
    preads per second of reading, at its queue depth and read sizes); None: the disk's random-read rate in `facts`
    stands in. `reads_per_s_curve` holds the rate the store's reads of each hit_curve size's misses achieved (the
    sparser misses of a larger cache take smaller reads, more of them a second); empty: the rate above at every
    size. A missed row holds the disk for reads per miss / that rate, both at the cache's size.

    `read_bytes_curve` holds the mean bytes of a pread of each hit_curve size's misses (counted as the store
    coalesces them: the dense misses of a small cache take long reads); empty (profiles from before it was counted):
    not known.

    `io_curve` holds the store's read rate and CPU time per read at several I/O thread counts, one of them
    `io_threads`, the count every rate above was measured at, at one or more read sizes (`read_bytes` of its points:
    the mean read of the misses timed), ordered by size, then by count (increasing; every size timed at the same
    counts). A cache's reads (of `read_bytes_curve`'s size there) are priced at that size: the curve at each count
    is interpolated between the timed sizes (time per read, linear in the size; the nearest size's beyond them), and
    at another count a read's queue wait, that curve's time per read at `io_threads`, becomes its time per read
    there, the rest of a read longer than the curve's (its bytes' transfer) unchanged, so reads many times longer
    than those timed gain little from more threads; each pread costs the curve's CPU time there. One size (profiles
    from before sizes were timed: short reads) prices every read at it. Empty (profiles from before it was
    measured): the store's own I/O threads only, and no CPU time charged for reading.

    `gpu_rows_per_batch` is the rows a Route 1 (GPU batcher) batch gathers through the store: its input rows the GPU
    cache does not hold, read from the host cache, else the disk. Their misses hold the disk like Route 0's, at the
    same hit ratio and rates (the same static cache serves both). None (profiles without a GPU, or from before
    Route 1's reads were measured apart): Route 1's reads, if any, are inside the profiled T_GB."""

    facts: DiskReadFacts
    row_bytes: int
    num_rows: int
    rows_per_batch: float
    reads_per_miss: float
    hit_curve: tuple[tuple[int, float], ...]
    cache_budget_bytes: int
    resident_bytes: int = 0
    reads_per_miss_curve: tuple[float, ...] = ()
    store_reads_per_s: float | None = None
    reads_per_s_curve: tuple[float, ...] = ()
    io_curve: tuple[IoThreadsRate, ...] = ()
    io_threads: int | None = None
    gpu_rows_per_batch: float | None = None
    read_bytes_curve: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.row_bytes < 1 or self.num_rows < 1:
            raise ValueError(f"DiskProfile needs row_bytes >= 1 and num_rows >= 1, got {self.row_bytes!r} and "
                             f"{self.num_rows!r}")
        if not (math.isfinite(self.rows_per_batch) and self.rows_per_batch >= 0):
            raise ValueError(f"DiskProfile.rows_per_batch must be a finite number >= 0, got {self.rows_per_batch!r}")
        if self.gpu_rows_per_batch is not None and not (math.isfinite(self.gpu_rows_per_batch)
                                                        and self.gpu_rows_per_batch >= 0):
            raise ValueError(f"DiskProfile.gpu_rows_per_batch must be a finite number >= 0 (or None: Route 1's reads "
                             f"not measured apart), got {self.gpu_rows_per_batch!r}")
        if not (math.isfinite(self.reads_per_miss) and self.reads_per_miss > 0):
            raise ValueError(f"DiskProfile.reads_per_miss must be a finite number > 0, got {self.reads_per_miss!r}")
        if self.cache_budget_bytes < 0 or self.resident_bytes < 0:
            raise ValueError(f"DiskProfile.cache_budget_bytes and resident_bytes must be >= 0, got "
                             f"{self.cache_budget_bytes!r} and {self.resident_bytes!r}")
        sizes = [size for size, _ in self.hit_curve]
        ratios = [ratio for _, ratio in self.hit_curve]
        if not sizes or sizes[0] != 0 or sizes != sorted(set(sizes)):
            raise ValueError(f"DiskProfile.hit_curve must start at cache size 0 and increase, got sizes {sizes}")
        if any(not 0.0 <= ratio <= 1.0 for ratio in ratios) or ratios != sorted(ratios):
            raise ValueError(f"DiskProfile.hit_curve: hit ratios must lie in [0, 1] and never fall as the cache "
                             f"grows, got {ratios}")
        for name in ("reads_per_miss_curve", "reads_per_s_curve", "read_bytes_curve"):
            values = getattr(self, name)
            if values and (len(values) != len(sizes) or not all(math.isfinite(value) and value > 0
                                                                 for value in values)):
                raise ValueError(f"DiskProfile.{name} needs one finite value > 0 per hit_curve size ({len(sizes)}), "
                                 f"got {list(values)}")
        if self.store_reads_per_s is not None and not (math.isfinite(self.store_reads_per_s)
                                                       and self.store_reads_per_s > 0):
            raise ValueError(f"DiskProfile.store_reads_per_s must be a finite number > 0 (or None: not measured), "
                             f"got {self.store_reads_per_s!r}")
        sizes_timed = [point.read_bytes for point in self.io_curve]
        if None in sizes_timed and any(size is not None for size in sizes_timed):
            raise ValueError(f"DiskProfile.io_curve must give read_bytes at every point or at none, got {sizes_timed}")
        grid = self._io_grid()
        if [size for size, _ in grid] != sorted({size for size, _ in grid}, key=lambda size: size or 0):
            raise ValueError(f"DiskProfile.io_curve: points must be ordered by read_bytes, each size's together, got "
                             f"read sizes {sizes_timed}")
        counts = [point.io_threads for point in grid[0][1]] if grid else []
        for size, points in grid:
            timed = [point.io_threads for point in points]
            if timed != sorted(set(timed)) or timed != counts:
                raise ValueError(f"DiskProfile.io_curve: I/O thread counts must increase, the same at every read size, "
                                 f"got {timed} at read_bytes {size!r} and {counts} at the first")
        if self.io_curve and self.io_threads not in counts:
            raise ValueError(f"DiskProfile.io_threads ({self.io_threads!r}), the I/O thread count the read rates were "
                             f"measured at, must be one of io_curve's {counts}")
        if len(grid) > 1 and not self.read_bytes_curve:
            raise ValueError("DiskProfile.io_curve timed at several read sizes needs read_bytes_curve (each cache "
                             "size's mean read) to price a cache's reads at their size")

    @property
    def features_bytes(self) -> int:
        return self.row_bytes * self.num_rows

    def reads_per_s_at(self, cache_bytes: int, io_threads: int | None = None) -> float:
        """The preads per second the misses of a cache of `cache_bytes` are served at with `io_threads` I/O threads
        (None: those the rates were measured with): the store's rate timed on such misses, else its rate on the
        profiled batches, else the disk's random-read rate; its queue wait (the time a read of the misses' size takes
        along `io_curve` at the profiled count) scaled along `io_curve` to `io_threads`, the rest of a longer read's
        time kept."""
        if self.reads_per_s_curve:
            rate = self._along_curve(self.reads_per_s_curve, cache_bytes)
        else:
            rate = self.store_reads_per_s if self.store_reads_per_s is not None else self.facts.random_reads_per_s
        if io_threads is None or not self.io_curve:
            return rate
        # The curve's time per read at the misses' size is the part of a read the queue depth shortens; the rest of a
        # read longer than those timed (more of its bytes, coalesced rows) is transfer, which more I/O threads do not
        # shorten. Only that share of a read's time scales along the curve (all of it when the reads are as short).
        size = self.read_bytes_at(cache_bytes)
        timed = self.io_rate(self.io_threads, size)
        queued = min(1.0, rate / timed)
        return rate / (1.0 - queued + queued * timed / self.io_rate(io_threads, size))

    def read_bytes_at(self, cache_bytes: int) -> float | None:
        """Mean bytes of a pread of the misses of a cache of `cache_bytes` (None: not counted in this profile)."""
        return self._along_curve(self.read_bytes_curve, cache_bytes) if self.read_bytes_curve else None

    def io_rate(self, io_threads: int, read_bytes: float | None = None) -> float:
        """Preads per second along `io_curve` with `io_threads` I/O threads, of reads of `read_bytes` bytes (None, or
        a curve of one size: its size)."""
        return self._along_io_curve("reads_per_s", io_threads, read_bytes)

    def io_cpu_s_per_read(self, io_threads: int, read_bytes: float | None = None) -> float:
        """CPU seconds a pread of `read_bytes` bytes takes along `io_curve` with `io_threads` I/O threads."""
        return self._along_io_curve("cpu_s_per_read", io_threads, read_bytes)

    def io_thread_counts(self) -> list[int]:
        """The I/O thread counts the planner compares: those timed (none: the profile does not say)."""
        grid = self._io_grid()
        return [point.io_threads for point in grid[0][1]] if grid else []

    def io_read_sizes(self) -> list[float | None]:
        """The read sizes `io_curve` was timed at, increasing ([None]: one, not recorded; []: no curve)."""
        return [size for size, _ in self._io_grid()]

    def _io_grid(self) -> list[tuple[float | None, list[IoThreadsRate]]]:
        """`io_curve`'s points by read size, in its order: [(read_bytes, its points)]."""
        grid: list[tuple[float | None, list[IoThreadsRate]]] = []
        for point in self.io_curve:
            if grid and grid[-1][0] == point.read_bytes:
                grid[-1][1].append(point)
            else:
                grid.append((point.read_bytes, [point]))
        return grid

    def _along_io_curve(self, name: str, io_threads: int, read_bytes: float | None) -> float:
        """`io_curve`'s `name` (reads_per_s or cpu_s_per_read) at `io_threads` and reads of `read_bytes`: at each timed
        size linear between the counts timed (the nearest end's value beyond them), then between the timed sizes
        linear in the size as a time per read (a rate's inverse: a read's latency plus its bytes' transfer), the
        nearest size's value beyond them (or for None)."""
        per_read = [(size, _linear([point.io_threads for point in points], [getattr(point, name) for point in points],
                                   io_threads)) for size, points in self._io_grid()]
        if len(per_read) == 1 or read_bytes is None:
            return per_read[0][1]
        invert = name == "reads_per_s"
        value = _linear([size for size, _ in per_read], [1.0 / value if invert else value for _, value in per_read],
                        read_bytes)
        return 1.0 / value if invert else value

    def reads_per_miss_at(self, cache_bytes: int) -> float:
        """Preads per missed row with a cache of `cache_bytes` (`reads_per_miss` at every size when none were
        counted)."""
        if not self.reads_per_miss_curve:
            return self.reads_per_miss
        return self._along_curve(self.reads_per_miss_curve, cache_bytes)

    def _along_curve(self, values: tuple[float, ...], cache_bytes: int) -> float:
        """`values` (one per hit_curve size) at `cache_bytes`: linear between sizes, the last value beyond them."""
        sizes = [size for size, _ in self.hit_curve]
        index = next((i for i, size in enumerate(sizes) if size >= cache_bytes), None)
        if index is None:
            return values[-1]
        if sizes[index] == cache_bytes or index == 0:
            return values[index]
        low, high = values[index - 1], values[index]
        return low + (high - low) * (cache_bytes - sizes[index - 1]) / (sizes[index] - sizes[index - 1])

    def seconds_per_miss(self, cache_bytes: int = 0, io_threads: int | None = None) -> float:
        """Time one row missed with a cache of `cache_bytes` holds the disk with `io_threads` I/O threads (None: the
        store's queue depth when profiled)."""
        return self.reads_per_miss_at(cache_bytes) / self.reads_per_s_at(cache_bytes, io_threads)

    def hit_ratio(self, cache_bytes: int) -> float:
        """The measured hit ratio at `cache_bytes`, linear between measured sizes and from the largest measured one
        to 1 at every row cached (below the true curve where it is concave, as a power law's is)."""
        if cache_bytes >= self.features_bytes:
            return 1.0
        sizes = [size for size, _ in self.hit_curve]
        index = next((i for i, size in enumerate(sizes) if size >= cache_bytes), None)
        if index is None:  # beyond the last measured size: towards 1 at every row cached
            (size, ratio), end = self.hit_curve[-1], (self.features_bytes, 1.0)
        elif sizes[index] == cache_bytes:
            return self.hit_curve[index][1]
        else:
            (size, ratio), end = self.hit_curve[index - 1], self.hit_curve[index]
        return ratio + (end[1] - ratio) * (cache_bytes - size) / (end[0] - size)

    def read_s_per_batch(self, cache_bytes: int, io_threads: int | None = None, route: int = 0) -> float:
        """Time a `route` batch's cache misses hold the disk with a cache of `cache_bytes` and `io_threads` I/O
        threads (Route 1: 0 when its reads were not measured apart)."""
        return (self.rows_fetched(route) * (1.0 - self.hit_ratio(cache_bytes))
                * self.seconds_per_miss(cache_bytes, io_threads))

    def read_cpu_s_per_batch(self, cache_bytes: int, io_threads: int | None = None, route: int = 0) -> float:
        """CPU time the preads of a `route` batch's cache misses take on the cores (0 when `io_curve` was not
        measured)."""
        if not self.io_curve:
            return 0.0
        reads = self.rows_fetched(route) * (1.0 - self.hit_ratio(cache_bytes)) * self.reads_per_miss_at(cache_bytes)
        count = self.io_threads if io_threads is None else io_threads
        return reads * self.io_cpu_s_per_read(count, self.read_bytes_at(cache_bytes))

    def rows_fetched(self, route: int) -> float:
        """Rows a batch of `route` gathers through the store: Route 0 all its input rows, Route 1 those the GPU cache
        does not hold (0 when not measured apart: its reads are then inside T_GB)."""
        if route == 0:
            return self.rows_per_batch
        return self.gpu_rows_per_batch or 0.0

    def cache_candidates(self) -> list[int]:
        """The cache sizes the planner compares: the measured ones within the budget, and the budget itself (or
        every row, when that is less)."""
        largest = min(self.cache_budget_bytes, self.features_bytes)
        return sorted({size for size, _ in self.hit_curve if size <= largest} | {largest})

    def scaled(self, *, memory: float = 1.0, disk: float = 1.0) -> DiskProfile:
        """The same workload on a machine whose memory budget is `memory` times this one's (the topology still takes
        its share, the cache the rest) and whose disk reads `disk` times as fast."""
        budget = (self.cache_budget_bytes + self.resident_bytes) * memory
        store_rate = self.store_reads_per_s * disk if self.store_reads_per_s is not None else None
        return replace(self, facts=replace(self.facts, random_reads_per_s=self.facts.random_reads_per_s * disk,
                                           sequential_bytes_per_s=self.facts.sequential_bytes_per_s * disk),
                       store_reads_per_s=store_rate,
                       reads_per_s_curve=tuple(rate * disk for rate in self.reads_per_s_curve),
                       io_curve=tuple(replace(point, reads_per_s=point.reads_per_s * disk) for point in self.io_curve),
                       cache_budget_bytes=max(0, int(budget) - self.resident_bytes))

    def to_dict(self) -> dict:
        return {"facts": self.facts.to_dict(), "row_bytes": self.row_bytes, "num_rows": self.num_rows,
                "rows_per_batch": self.rows_per_batch, "reads_per_miss": self.reads_per_miss,
                "hit_curve": [{"cache_bytes": size, "hit_ratio": ratio,
                               **({"reads_per_miss": self.reads_per_miss_curve[i]} if self.reads_per_miss_curve
                                  else {}),
                               **({"reads_per_s": self.reads_per_s_curve[i]} if self.reads_per_s_curve else {}),
                               **({"read_bytes": self.read_bytes_curve[i]} if self.read_bytes_curve else {})}
                              for i, (size, ratio) in enumerate(self.hit_curve)],
                "cache_budget_bytes": self.cache_budget_bytes, "resident_bytes": self.resident_bytes,
                "store_reads_per_s": self.store_reads_per_s,
                "io_curve": [point.to_dict() for point in self.io_curve], "io_threads": self.io_threads,
                "gpu_rows_per_batch": self.gpu_rows_per_batch}

    @classmethod
    def from_fields(cls, reader: FieldReader) -> DiskProfile:
        """Reads and validates a profile's `disk` section."""
        points = reader.sections("hit_curve")
        curve = tuple((point.integer("cache_bytes", minimum=0), point.number("hit_ratio", minimum=0.0))
                      for point in points)
        counted, rates, read_sizes = ([point.number(name, positive=True, optional=True) for point in points]
                                      for name in ("reads_per_miss", "reads_per_s", "read_bytes"))
        for name, values in (("reads_per_miss", counted), ("reads_per_s", rates), ("read_bytes", read_sizes)):
            if any(value is None for value in values) and any(value is not None for value in values):
                raise reader.error("hit_curve", f"must give {name} at every point or at none", values)
        io_points = reader.sections("io_curve") if reader.data.get("io_curve") is not None else []
        io_curve = tuple(IoThreadsRate.from_fields(point) for point in io_points)
        with reader.as_document_errors():
            return cls(DiskReadFacts.from_fields(reader.section("facts")), reader.integer("row_bytes", minimum=1),
                       reader.integer("num_rows", minimum=1), reader.number("rows_per_batch", minimum=0.0),
                       reader.number("reads_per_miss", positive=True), curve,
                       reader.integer("cache_budget_bytes", minimum=0), reader.integer("resident_bytes", minimum=0),
                       tuple(value for value in counted if value is not None),
                       reader.number("store_reads_per_s", positive=True, optional=True),
                       tuple(value for value in rates if value is not None), io_curve,
                       reader.integer("io_threads", minimum=0, optional=True),
                       reader.number("gpu_rows_per_batch", minimum=0.0, optional=True),
                       tuple(value for value in read_sizes if value is not None))


def _linear(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """ys at x: linear between the xs (increasing), the nearest end's value beyond them."""
    if x <= xs[0]:
        return ys[0]
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return ys[-1]


def measure_disk_reads(path: str | os.PathLike, queue_depth: int, seconds: float = 2.0, block: int = PAGE,
                       sequential_block: int = 4 << 20, reader: str | None = None) -> DiskReadFacts:
    """Measures the disk under `path` (best a file larger than the disk's own cache) for about 2 x `seconds`, the
    random reads kept in flight as the feature store's `reader` would (by default the one a store would use)."""
    queue_depth = check_int("queue_depth", queue_depth, 1)
    seconds = check_float("seconds", seconds, 0.0, above=True)
    io_uring = choose_reader(reader)[0] == "io_uring"
    extension = native.load()
    reads, _, elapsed = extension.measure_random_reads(str(path), check_int("block", block, PAGE), queue_depth,
                                                       seconds, io_uring)
    _, sequential_bytes, sequential_elapsed = extension.measure_sequential_reads(
        str(path), check_int("sequential_block", sequential_block, PAGE), seconds)
    return DiskReadFacts(str(path), block, queue_depth, reads / elapsed, sequential_bytes / sequential_elapsed,
                         sequential_block)


def hit_ratio_by_cache_size(hotness: torch.Tensor, gathered: Sequence[torch.Tensor],
                            cache_rows: Sequence[int]) -> list[float]:
    """Share of the rows in `gathered` (each batch's input nodes) that a static cache of the `k` hottest rows by
    `hotness` would serve, for every k in `cache_rows`."""
    rank = hotness_rank(hotness)
    ranks = torch.sort(torch.cat([rank[ids] for ids in gathered])).values
    total = ranks.numel()
    if total == 0:
        return [0.0 for _ in cache_rows]
    counts = torch.searchsorted(ranks, torch.tensor([check_int("cache_rows", k, 0) for k in cache_rows]))
    return [int(count) / total for count in counts]


def hotness_rank(hotness: torch.Tensor) -> torch.Tensor:
    """Each row's place in `hotness_order`: a static cache of the k hottest rows holds those of rank < k."""
    num_rows = hotness.numel()
    rank = torch.empty(num_rows, dtype=torch.int64)
    rank[hotness_order(hotness)] = torch.arange(num_rows)
    return rank


@dataclass(frozen=True)
class MissReads:
    """What a cache's misses in the profiled batches cost, counted (not read): `rows` missed, coalesced into `reads`
    preads of `bytes` in all as the store reads them."""

    rows: int
    reads: int
    bytes: int

    @property
    def reads_per_miss(self) -> float | None:
        """Preads per missed row (None where nothing misses)."""
        return self.reads / self.rows if self.rows else None

    @property
    def read_bytes(self) -> float | None:
        """Mean bytes of a pread (None where nothing misses)."""
        return self.bytes / self.reads if self.reads else None


def miss_reads_by_cache_size(store, hotness: torch.Tensor, gathered: Sequence[torch.Tensor],
                             cache_rows: Sequence[int]) -> list[MissReads]:
    """The MissReads when the `k` hottest rows by `hotness` are cached, for every k in `cache_rows`: each batch's
    misses (the rows of `gathered` not cached) coalesced into reads as FeatureStore `store` reads them."""
    rank = hotness_rank(hotness)
    ranks = [rank[ids] for ids in gathered]
    result = []
    for k in cache_rows:
        misses = [ids[batch_ranks >= k] for ids, batch_ranks in zip(gathered, ranks)]
        counted = [store.count_reads(ids) for ids in misses if ids.numel()]
        result.append(MissReads(sum(ids.numel() for ids in misses), sum(reads for reads, _ in counted),
                                sum(size for _, size in counted)))
    return result


def presampled_hit_ratios(graph, fanouts: Sequence[int], batch_size: int, num_batches: int,
                          cache_rows: Sequence[int], seed: int = 0) -> list[float]:
    """`hit_ratio_by_cache_size` of an in-degree cache over the first `num_batches` batches of epoch 0."""
    order = epoch_order(graph.train_idx, seed, 0)
    gathered = [sample_neighbors(graph, order[start:start + batch_size], fanouts, seed=seed + index).input_nodes
                for index, start in enumerate(range(0, min(order.numel(), num_batches * batch_size), batch_size))]
    return hit_ratio_by_cache_size(graph.indptr[1:] - graph.indptr[:-1], gathered, cache_rows)


def curve_sizes(features_bytes: int, budget_bytes: int, points: int = 12) -> list[int]:
    """Cache sizes to measure the hit ratio at: 0 and `points` sizes spaced geometrically from 1/1000 of the features
    (or of the budget, when smaller) up to the budget or all the features, whichever is less."""
    largest = min(features_bytes, budget_bytes)
    if largest <= 0:
        return [0]
    smallest = max(1, largest // 1000)
    step = (largest / smallest) ** (1.0 / max(points - 1, 1))
    return sorted({0, largest, *(int(smallest * step**i) for i in range(points - 1))})


# Fewer preads than this in the profiled batches time the store's reading too coarsely: the disk's rate stands in.
MIN_TIMED_READS = 256


def measure_disk_profile(store, gathered: Sequence[torch.Tensor], hotness: torch.Tensor, cache_budget_bytes: int,
                         seconds: float = 1.0, resident: int = 0,
                         store_reads: FeatureStoreCounters | None = None) -> DiskProfile:
    """The DiskProfile of a FeatureStore `store`: the disk under its file measured at its I/O threads' queue depth
    and its row size, the hit curve of a cache of the rows with the largest `hotness` (the store's own ranking, the
    graph's `cache_hotness`) over the rows of `gathered` batches and the preads per missed row at each size of it,
    and the read rate `store_reads` (the store's counters while it gathered those batches) achieved, when it timed
    at least MIN_TIMED_READS reads. `store` may be a typed graph's TypedFeatureStore (its rows every featured
    type's, `row_bytes` their mean, `rows_cached_by` the shared cache's, `hotness()` its order)."""
    num_rows, row_bytes = store.num_rows, store.row_bytes
    block = max(PAGE, -(-row_bytes // PAGE) * PAGE)
    size = os.path.getsize(store.path)
    if size < block:
        raise ValueError(f"features file {store.path} holds {size} bytes, less than one {block}-byte read: keep "
                         "features this small in RAM (drop --features-on-disk, or raise --memory-budget)")
    sequential_block = max(PAGE, min(4 << 20, size // PAGE * PAGE))
    try:
        facts = measure_disk_reads(store.path, max(1, store.io_threads), seconds, block, sequential_block,
                                   store.reader)
    except RuntimeError as error:
        if "O_DIRECT" not in str(error):
            raise
        facts = measure_store_reads(store, seconds, block, sequential_block)
    sizes = curve_sizes(num_rows * row_bytes, cache_budget_bytes)
    cache_rows = [store.rows_cached_by(size) for size in sizes]
    ratios = hit_ratio_by_cache_size(hotness, gathered, cache_rows)
    counted = miss_reads_by_cache_size(store, hotness, gathered, cache_rows)
    reads_per_miss, read_bytes = [], []
    for miss in counted:  # where nothing misses, the value at the next smaller cache (1 read a row, a row's at none)
        reads_per_miss.append(miss.reads_per_miss or (reads_per_miss[-1] if reads_per_miss else 1.0))
        read_bytes.append(miss.read_bytes or (read_bytes[-1] if read_bytes else float(block)))
    rows_per_batch = sum(ids.numel() for ids in gathered) / max(len(gathered), 1)
    rate = store_reads.reads_per_second if store_reads is not None and store_reads.reads >= MIN_TIMED_READS else None
    # Read through the page cache, a size's misses would be served from the rows an earlier size read: not timed.
    timed = read_rates_by_cache_size(store, hotness, gathered, cache_rows, seconds) if store.direct else []
    stand_in = rate if rate is not None else facts.random_reads_per_s
    rates = tuple(increasing_fit([value if value is not None else stand_in for value in timed])) if any(timed) else ()
    io_curve = read_rates_by_io_threads(store, hotness, gathered, cache_rows, counted, seconds) if store.direct else ()
    return DiskProfile(facts, row_bytes, num_rows, rows_per_batch, reads_per_miss[0], tuple(zip(sizes, ratios)),
                       int(cache_budget_bytes), int(resident), tuple(reads_per_miss), rate, rates, io_curve,
                       store.io_threads if io_curve else None, read_bytes_curve=tuple(read_bytes))


def io_timing_caches(counted: Sequence[MissReads]) -> list[int]:
    """Which caches' misses (indices into `counted`, one MissReads per cache size) the I/O thread counts are timed
    on: of those leaving MIN_TIMED_READS reads or more (else no cache), the one of the shortest mean read (the
    largest such cache on a tie), the one of the longest when it is IO_SIZE_STEP times as long or more, and the one
    nearest their geometric mean when that is IO_SIZE_STEP from both. Increasing in the read size."""
    timeable = [i for i, miss in enumerate(counted) if miss.reads >= MIN_TIMED_READS] or [0]
    size = {i: counted[i].read_bytes or 1.0 for i in timeable}
    shortest = min(timeable, key=lambda i: (size[i], -i))
    longest = max(timeable, key=lambda i: (size[i], -i))
    if size[longest] < IO_SIZE_STEP * size[shortest]:
        return [shortest]
    middle = min(timeable, key=lambda i: abs(math.log(size[i] ** 2 / (size[shortest] * size[longest]))))
    between = IO_SIZE_STEP * size[shortest] <= size[middle] <= size[longest] / IO_SIZE_STEP
    return [shortest, *([middle] if between else []), longest]


def read_rates_by_io_threads(store, hotness: torch.Tensor, gathered: Sequence[torch.Tensor],
                             cache_rows: Sequence[int], counted: Sequence[MissReads],
                             seconds: float) -> tuple[IoThreadsRate, ...]:
    """The read rate and CPU time per pread of cache-less twins of FeatureStore `store` with each of
    IO_THREAD_COUNTS and its own I/O threads, at the read sizes of `io_timing_caches` (`counted`: the MissReads of
    each cache of `cache_rows`): reading the misses `gathered` batches leave in each such cache, for about
    `seconds` in all: each batch's misses in gathers of IO_TIMING_READS to twice as many reads (row ranges of its
    sorted misses: the queue fills as a batch's fills it), each (size, count) until its
    share of the time is spent and MIN_TIMED_READS reads were timed (a pass over every batch's misses took minutes
    at papers100M scale with one I/O thread). CPU time is the process's (every thread's) while reading. A size at
    which a count timed fewer than MIN_TIMED_READS reads is left out; empty when every size is. Meant for O_DIRECT
    stores, as read_rates_by_cache_size."""
    rank = hotness_rank(hotness)
    counts = sorted({*IO_THREAD_COUNTS, store.io_threads})
    timed = io_timing_caches(counted)
    share = seconds / (len(timed) * len(counts))
    points: list[IoThreadsRate] = []
    for index in timed:
        miss = counted[index]
        # The counts take turns along the misses (not each from the first), split as they are reached.
        reading = itertools.cycle(_timing_gathers(gathered, rank, cache_rows[index], miss.reads / max(miss.rows, 1)))
        size_points = []
        for count in counts if miss.reads else ():
            probe = store.twin(io_threads=count)
            cpu_began, began = time.process_time(), time.perf_counter()
            for ids in reading:
                probe.gather(ids)
                elapsed = time.perf_counter() - began
                if (elapsed >= share and probe.counters().reads >= MIN_TIMED_READS) or elapsed >= 2 * seconds:
                    break
            cpu = time.process_time() - cpu_began
            reads = probe.counters()
            if reads.reads < MIN_TIMED_READS or reads.reads_per_second is None:
                break
            size_points.append(IoThreadsRate(count, reads.reads_per_second, cpu / reads.reads,
                                             counted[index].read_bytes))
        if len(size_points) == len(counts):
            points.extend(size_points)
    return tuple(points)


def _timing_gathers(gathered: Sequence[torch.Tensor], rank: torch.Tensor, k: int,
                    reads_per_row: float) -> Iterator[torch.Tensor]:
    """Each batch's misses with the `k` hottest rows cached, those of more than 2 x IO_TIMING_READS reads (at
    `reads_per_row`, the batches' mean) split into row ranges of IO_TIMING_READS reads or more."""
    for ids in gathered:
        if (left := ids[rank[ids] >= k]).numel():
            pieces = max(1, int(left.numel() * reads_per_row) // IO_TIMING_READS)
            yield from (torch.sort(left).values.tensor_split(pieces) if pieces > 1 else (left,))


def increasing_fit(values: Sequence[float]) -> list[float]:
    """The non-decreasing sequence nearest `values` in squared error (pool adjacent violators): the read rate grows
    with the cache (its misses take smaller reads), so a point timed low (another process's reads at that moment,
    one batch timed) is pooled with its neighbours instead of pricing that cache size alone."""
    blocks: list[list[float]] = []  # [mean, count]
    for value in values:
        blocks.append([float(value), 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            mean, count = blocks.pop()
            blocks[-1] = [(blocks[-1][0] * blocks[-1][1] + mean * count) / (blocks[-1][1] + count),
                          blocks[-1][1] + count]
    return [mean for mean, count in blocks for _ in range(int(count))]


def read_rates_by_cache_size(store, hotness: torch.Tensor, gathered: Sequence[torch.Tensor],
                             cache_rows: Sequence[int], seconds: float) -> list[float | None]:
    """The preads per second a cache-less twin of FeatureStore `store` achieves reading just the misses of a cache
    of the `k` hottest rows, for every k in `cache_rows`: the batches of `gathered` in turn for about
    seconds / len(cache_rows) each (one at least), timed by the store's read timer. None where fewer than
    MIN_TIMED_READS reads were timed. Meant for O_DIRECT stores: through the page cache, a later size's misses are
    rows an earlier size read."""
    rank = hotness_rank(hotness)
    probe = store.twin()
    share = seconds / max(len(cache_rows), 1)
    rates: list[float | None] = []
    for k in cache_rows:
        probe.reset_counters()
        began = time.perf_counter()
        for ids in gathered:
            misses = ids[rank[ids] >= k]
            if misses.numel():
                probe.gather(misses)
            if time.perf_counter() - began >= share and probe.counters().reads:
                break
        counted = probe.counters()
        rates.append(counted.reads_per_second if counted.reads >= MIN_TIMED_READS else None)
    return rates


def measure_store_reads(store, seconds: float, block: int, sequential_block: int) -> DiskReadFacts:
    """Read rates where the file system refuses O_DIRECT (tmpfs, some network file systems): random rows gathered
    through a cache-less feature store like `store` (its reads per second at its queue depth), and the file read
    through in `sequential_block`s (through the page cache, as the store reads there too)."""
    probe = store.twin()  # the store reads through the page cache here: O_DIRECT was refused
    generator = torch.Generator().manual_seed(0)
    began = time.perf_counter()
    while time.perf_counter() - began < seconds:
        probe.gather(torch.randint(0, probe.num_rows, (4096,), generator=generator))
    random_elapsed = time.perf_counter() - began
    sequential, began = 0, time.perf_counter()
    with open(store.path, "rb", buffering=0) as handle:
        while time.perf_counter() - began < seconds and (chunk := handle.read(sequential_block)):
            sequential += len(chunk)
    return DiskReadFacts(str(store.path), block, max(1, store.io_threads),
                         max(probe.counters().reads, 1) / random_elapsed,
                         max(sequential, 1) / max(time.perf_counter() - began, 1e-9), sequential_block)


def default_memory_budget() -> int:
    """Bytes a training run's data may hold by default: TRAINING_MEMORY_SHARE of the memory available now."""
    return int(psutil.virtual_memory().available * TRAINING_MEMORY_SHARE)


def resident_bytes(graph) -> int:
    """What a graph needs in RAM besides its features: the topology (read at random by sampling; a typed graph's
    every relation), labels, splits, and the ranking of its feature cache where one is kept (`rank_feature_cache`; a
    typed graph's per type)."""
    ranking = getattr(graph, "cache_ranking", None)
    parts = [part for arrays in (graph.indptr, graph.indices, *(() if ranking is None else (ranking[1],)))
             for part in (arrays.values() if isinstance(arrays, dict) else [arrays])]
    return sum(tensor.numel() * tensor.element_size()
               for tensor in (*parts, graph.labels, graph.train_idx, graph.val_idx, graph.test_idx))


def features_bytes(graph) -> int:
    """Bytes of a graph's feature rows (a typed graph's: every featured type's)."""
    parts = graph.features.values() if isinstance(graph.features, dict) else [graph.features]
    return sum(part.shape[0] * part.shape[1] * part.element_size() for part in parts)


def features_fit(graph, memory_budget: int | None = None) -> bool:
    """True when the graph's features fit in `memory_budget` (default: `default_memory_budget`) beside the rest."""
    budget = default_memory_budget() if memory_budget is None else memory_budget
    return resident_bytes(graph) + features_bytes(graph) <= budget


def cache_budget(graph, memory_budget: int | None = None, working_bytes: int = 0) -> int:
    """Host RAM a feature cache may take: the memory budget less what the graph needs besides its features and
    `working_bytes` training holds (batches in flight, a step's activations)."""
    budget = default_memory_budget() if memory_budget is None else memory_budget
    return max(0, budget - resident_bytes(graph) - working_bytes)
