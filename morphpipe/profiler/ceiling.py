"""The machine's ceilings for CPU batching and training, measured here: what a benchmark's figure is a share of.

Memory: the copy bandwidth of all cores (STREAM's copy: bytes read plus bytes written per second, by a
parallel `Tensor.copy_` of a buffer far larger than the caches) and the rate of random row gathers of a
given row size (rows per second, the best of the native `gather_rows` op into a new tensor, the native
`gather_rows_out` into a reused one (streaming stores, as the CPU batcher writes its recycled batches) and
`torch.index_select` into a reused one, all parallel over all threads, from a table far larger than the caches). Compute: the GEMM rate of torch's
`mm` at a training step's own shapes, recorded from one real step (forward and backward), in float32
and bfloat16. Benchmarks print their figures beside these (`share`).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch

from morphpipe import native

# Large enough to leave every cache level behind on current server CPUs (LLC up to a few hundred MiB).
DEFAULT_BUFFER_BYTES = 1 << 30
GATHER_ROWS_PER_RUN = 1 << 20
GEMM_OPS = {"aten::mm", "aten::addmm", "aten::addmm_"}


# The /proc/cpuinfo flags that decide the kernels' level and the GEMMs' (bf16) rate.
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16", "amx_bf16", "amx_tile")


# Flags of bfloat16 arithmetic in hardware: what bf16 training needs to be faster than float32 on a CPU.
BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def isa_flags(cpuinfo_path: str = "/proc/cpuinfo") -> list[str]:
    """Which of ISA_FLAGS this CPU reports (Linux /proc/cpuinfo; empty elsewhere), for benchmark headers."""
    try:
        with open(cpuinfo_path) as cpuinfo:
            flags = next((line.split(":", 1)[1].split() for line in cpuinfo if line.startswith("flags")), [])
    except OSError:
        return []
    return [flag for flag in ISA_FLAGS if flag in flags]


def best_seconds(run: Callable[[], object], repeats: int) -> float:
    """The fastest of `repeats` timed calls of `run`, after one untimed call (first touch, lazy setup)."""
    run()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


@dataclass(frozen=True)
class MemoryCeiling:
    """Copy bandwidth (GB/s, read + write) and random row-gather rates (rows/s by row size in bytes), all threads."""

    threads: int
    buffer_bytes: int
    copy_gb_per_s: float
    gather_rows_per_s: dict[int, float]

    def gather_gb_per_s(self, row_bytes: int) -> float:
        """The gather ceiling of `row_bytes` rows as bytes delivered per second (GB/s)."""
        return self.gather_rows_per_s[row_bytes] * row_bytes / 1e9

    def to_dict(self) -> dict:
        return asdict(self)


def measure_copy_bandwidth(buffer_bytes: int = DEFAULT_BUFFER_BYTES, repeats: int = 5) -> float:
    """GB/s of a parallel copy between two `buffer_bytes` buffers, counting the bytes read and written (STREAM)."""
    source = torch.ones(buffer_bytes // 8, dtype=torch.float64)
    target = torch.empty_like(source)
    seconds = best_seconds(lambda: target.copy_(source), repeats)
    return 2 * source.numel() * 8 / seconds / 1e9


def measure_row_gather(row_bytes: int, table_bytes: int = DEFAULT_BUFFER_BYTES, rows: int = GATHER_ROWS_PER_RUN,
                       repeats: int = 3) -> float:
    """Rows per second of uniformly random `row_bytes`-byte rows gathered from a `table_bytes` table into a
    contiguous output: the best of the native gather into a new and into a reused output, and of
    `torch.index_select` (float16 rows)."""
    if row_bytes % 2 or row_bytes <= 0:
        raise ValueError(f"row_bytes={row_bytes}: give a positive, even number of bytes (rows are float16)")
    width = row_bytes // 2
    table = torch.ones(max(table_bytes // row_bytes, 1), width, dtype=torch.float16)
    index = torch.randint(0, table.shape[0], (rows,), generator=torch.Generator().manual_seed(0))
    out = torch.empty(rows, width, dtype=torch.float16)
    ops = native.ops()
    native_s = best_seconds(lambda: ops.gather_rows(table, index), repeats)
    native_reused_s = best_seconds(lambda: ops.gather_rows_out(table, index, out), repeats)
    torch_s = best_seconds(lambda: torch.index_select(table, 0, index, out=out), repeats)
    return rows / min(native_s, native_reused_s, torch_s)


def measure_memory_ceiling(row_bytes: Sequence[int] = (256, 512),
                           buffer_bytes: int = DEFAULT_BUFFER_BYTES) -> MemoryCeiling:
    """Copy bandwidth and the gather rate of each row size, with torch's thread count (all cores by default)."""
    return MemoryCeiling(torch.get_num_threads(), buffer_bytes, measure_copy_bandwidth(buffer_bytes),
                         {size: measure_row_gather(size, buffer_bytes) for size in row_bytes})


@dataclass(frozen=True)
class GemmShape:
    """One matrix product [m, k] @ [k, n] and how often a step runs it."""

    m: int
    k: int
    n: int
    count: int = 1

    @property
    def flops(self) -> int:
        return 2 * self.m * self.k * self.n * self.count


def training_step_gemm_shapes(graph, model: str = "sage", batch_size: int = 1024,
                              fanouts: Sequence[int] = (15, 10, 5)) -> list[GemmShape]:
    """The products of one training step of `model` (default widths, 3 layers) on `graph`'s first batch,
    sampled by the CPU batcher with `fanouts` and `batch_size`: the shapes a real step runs."""
    from morphpipe.nn import build_model
    from morphpipe.nn.train_step import TrainStep, make_optimizer
    from morphpipe.sampling import CpuBatcher

    with CpuBatcher(graph, list(fanouts), batch_size, num_threads=1, seed=0) as batcher:
        batch = next(iter(batcher))
    torch.manual_seed(0)
    network = build_model(model, graph.feature_dim, graph.num_classes)
    step = TrainStep(network, make_optimizer(network.parameters(), 3e-3, "cpu"))
    step(batch)  # the first step settles every per-shape choice the step makes
    return recorded_gemm_shapes(lambda: step(batch))


def recorded_gemm_shapes(run: Callable[[], object]) -> list[GemmShape]:
    """The mm/addmm products `run()` executes (forward and backward alike), recorded by torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as recorded:
        run()
    counts: dict[tuple[int, int, int], int] = {}
    for event in recorded.events():
        if event.name not in GEMM_OPS or not event.input_shapes:
            continue
        shapes = [shape for shape in event.input_shapes if len(shape) == 2]
        a, b = shapes[-2], shapes[-1]  # addmm's inputs are (bias/out, a, b); mm's are (a, b)
        key = (a[0], a[1], b[1])
        counts[key] = counts.get(key, 0) + 1
    return [GemmShape(m, k, n, count) for (m, k, n), count in sorted(counts.items())]


@dataclass(frozen=True)
class GemmCeiling:
    """torch `mm`'s rate over a step's products in one dtype: the seconds they take at best and GFLOP/s."""

    dtype: str
    threads: int
    seconds: float
    gflop_per_s: float

    def to_dict(self) -> dict:
        return asdict(self)


def measure_gemm(shapes: Sequence[GemmShape], dtype: torch.dtype, repeats: int = 5) -> GemmCeiling:
    """The best time of all `shapes` (each `count` times) as torch `mm` in `dtype`, and the rate it means."""
    if not shapes:
        raise ValueError("measure_gemm: no GEMM shapes given; record them from a step (recorded_gemm_shapes)")
    operands = [(torch.randn(s.m, s.k).to(dtype), torch.randn(s.k, s.n).to(dtype), s.count) for s in shapes]

    def run() -> None:
        for a, b, count in operands:
            for _ in range(count):
                torch.mm(a, b)

    seconds = best_seconds(run, repeats)
    flops = sum(shape.flops for shape in shapes)
    return GemmCeiling(str(dtype).removeprefix("torch."), torch.get_num_threads(), seconds, flops / seconds / 1e9)


def share(figure: float, ceiling: float) -> str:
    """`figure` as a percentage of `ceiling`, for tables ("44%")."""
    return f"{100 * figure / ceiling:.0f}%"
