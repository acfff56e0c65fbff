"""The cost model behind every per-input choice: machine rates from a short measurement, costs in seconds.

A `Calibration` holds this machine's rates, measured once per process and device type by
`calibrate` (well under a second of micro-benchmarks on the fused kernels and a dense GEMM). On
CPU it measures on one thread and divides by the thread count: a shared, loaded machine
stretches multi-threaded timings by whole scheduler time slices, while one thread's are stable,
and the choices depend on ratios of these rates, which the thread count scales alike. The cost
functions below turn a shape into predicted seconds; choices compare them and keep the cheaper
(SENSEi's and AdaptGear's light models). They are pure functions of the calibration, so tests
inject constructed calibrations (`use_calibration`) and check where the choices flip.
"""
from __future__ import annotations

import logging
import dataclasses
import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import torch

log = logging.getLogger("morphpipe.ops")


@dataclass(frozen=True)
class Calibration:
    """Measured seconds per unit of work on one device type (float32); `source` says how it was obtained."""

    device_type: str
    gemm_flop: float  # dense matmul, per flop
    project_flop: float  # projecting aggregate rows inside their aggregation's pass, per flop (nan: no such kernel)
    gather_edge: float  # fused row-wise aggregation, per edge
    gather_element: float  # ... per edge x feature
    scatter_edge: float  # atomic scatter aggregation (backward), per edge
    scatter_element: float  # ... per edge x feature
    transpose_edge: float  # building the transposed structure, per edge
    attention_edge: float  # fused GAT forward, per edge x head (scores, softmax)
    attention_element: float  # ... per edge x head x feature
    shared_attention_element: float  # ... when every head reads one shared feature row (cache-hot after the first)
    dense_element: float  # writing one dense adjacency entry
    scan_element: float  # converting one dense input entry to CSR (density probe, sparse path)
    call: float  # fixed cost of one op call
    source: str = "measured"

    def gemm(self, m: int, k: int, n: int) -> float:
        """Dense `[m, k] @ [k, n]`."""
        return 2.0 * m * k * n * self.gemm_flop + self.call

    def project_in_pass(self, rows: int, in_features: int, out_features: int) -> float:
        """`[rows, in] @ [in, out]` on aggregate rows still in cache, inside their aggregation's pass (no call of
        its own, no read back of the aggregate)."""
        return 2.0 * rows * in_features * out_features * self.project_flop

    def gather(self, nnz: int, rows: int, width: int) -> float:
        """Row-wise fused sum over `nnz` edges into `rows` rows of `width` features."""
        return (nnz + rows) * (self.gather_edge + width * self.gather_element) + self.call

    def scatter(self, nnz: int, rows: int, width: int) -> float:
        """The same sum scattered with atomic adds (the transpose-free backward)."""
        return (nnz + rows) * (self.scatter_edge + width * self.scatter_element) + self.call

    def transposed(self, nnz: int, rows: int, width: int) -> float:
        """Building the transposed structure, then a row-wise sum over it (the atomic-free backward)."""
        return nnz * self.transpose_edge + self.gather(nnz, rows, width)

    def backward(self, nnz: int, rows: int, width: int) -> float:
        """The cheaper of the two backward kernels (the kernel choice picks it)."""
        return min(self.scatter(nnz, rows, width), self.transposed(nnz, rows, width))

    def dense(self, rows: int, cols: int, nnz: int, width: int) -> float:
        """Densified adjacency `[rows, cols]` times `[cols, width]` (tiny dense blocks)."""
        return rows * cols * self.dense_element + nnz * self.scatter_edge + self.gemm(rows, cols, width)

    def attention(self, edges: int, heads: int, width: int, shared: bool = False) -> float:
        """Fused GAT forward over `edges` edges (self loops included), `heads` heads of `width` features each
        (`shared`: one feature row read by every head)."""
        element = self.shared_attention_element if shared else self.attention_element
        return edges * heads * (self.attention_edge + width * element) + self.call

    def sparse_linear(self, rows: int, in_features: int, out_features: int, density: float) -> float:
        """`x @ W^T` with x converted to CSR and multiplied by the fused row-wise kernel."""
        nonzeros = int(density * rows * in_features)
        return rows * in_features * self.scan_element + self.gather(nonzeros, rows, out_features)

    def sparse_threshold(self, in_features: int, out_features: int) -> float:
        """Input density below which the sparse first-layer path is predicted to be faster than dense GEMM."""
        rows = 4096
        dense = self.gemm(rows, in_features, out_features)
        fixed = self.sparse_linear(rows, in_features, out_features, 0.0)
        per_density = rows * in_features * (self.gather_edge + out_features * self.gather_element)
        return min(1.0, max(0.0, (dense - fixed) / per_density))


# Rates used when the native kernels are missing (no measurement possible): a 2-core CPU's order of magnitude.
DEFAULT_CALIBRATION = Calibration(
    device_type="cpu", gemm_flop=4e-11, project_flop=5e-11, gather_edge=4e-9, gather_element=4e-10,
    scatter_edge=6e-9, scatter_element=1.5e-9, transpose_edge=5e-9, attention_edge=2e-8, attention_element=5e-10,
    shared_attention_element=3e-10, dense_element=2e-10, scan_element=1e-9, call=1e-5,
    source="default (native ops unavailable)",
)

_lock = threading.Lock()
_calibrations: dict[str, Calibration] = {}
_override: ContextVar[Calibration | None] = ContextVar("morphpipe_calibration", default=None)


def _timed(fn: Callable[[], object], device: torch.device, repeats: int = 7) -> float:
    """Best-of-`repeats` seconds of `fn()` after one warm-up call, synchronising CUDA."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fn()
    sync()
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - start)
    return best


def _two_point(time_small: float, time_large: float, count: int, small: int, large: int) -> tuple[float, float]:
    """Per-item and per-item-feature costs from timings at two widths (`count` items), both >= 0."""
    per_element = max(time_large - time_small, 0.0) / (count * (large - small))
    per_item = max(time_small / count - small * per_element, 0.0)
    return per_item, per_element


@contextmanager
def _one_thread(device: torch.device) -> Iterator[int]:
    """Run the block on one intra-op thread when measuring on CPU; yields the thread count to scale by."""
    threads = torch.get_num_threads()
    if device.type != "cpu" or threads == 1:
        yield 1
        return
    torch.set_num_threads(1)
    try:
        yield threads
    finally:
        torch.set_num_threads(threads)


def calibrate(device: torch.device | str = "cpu") -> Calibration:
    """Measure this machine's rates with the fused kernels on a synthetic block (well under a second)."""
    device = torch.device(device)
    with _one_thread(device) as threads:
        measured = _measure(device)
    per_unit = {field.name: getattr(measured, field.name) / threads for field in dataclasses.fields(measured)
                if isinstance(getattr(measured, field.name), float) and field.name != "call"}
    return dataclasses.replace(measured, **per_unit)


def _measure(device: torch.device) -> Calibration:
    """Seconds per unit of work of each kernel on the current thread count."""
    from morphpipe import native
    from morphpipe.ops.dense_to_csr import dense_to_csr

    ops = native.ops()
    generator = torch.Generator().manual_seed(0)
    # the feature table (32 MiB at the large width) exceeds the caches, as mini-batch inputs do
    num_dst, num_src, degree, heads, small, large = 8192, 131072, 10, 2, 8, 64
    nnz = num_dst * degree
    indptr = torch.arange(0, nnz + 1, degree, dtype=torch.int64).to(device)
    indices = torch.randint(0, num_src, (nnz,), generator=generator).to(device)
    features = {w: torch.randn(num_src, w, generator=generator).to(device) for w in (small, large)}
    grads = {w: torch.randn(num_dst, w, generator=generator).to(device) for w in (small, large)}
    gather = [_timed(lambda w=w: ops.spmm_sum(indptr, indices, features[w], None, None, None, False), device)
              for w in (small, large)]
    scatter = [_timed(lambda w=w: ops.spmm_sum_scatter(indptr, indices, grads[w], None, None, None, False, num_src),
                      device) for w in (small, large)]
    transpose = _timed(lambda: ops.csr_transpose(indptr, indices, num_src), device)
    scores = torch.randn(num_src, heads, generator=generator).to(device)
    per_head = {w: features[w].view(num_src, 1, w).expand(-1, heads, -1).contiguous() for w in (small, large)}
    attention = [_timed(lambda w=w: ops.gat_forward(indptr, indices, per_head[w], scores, scores[:num_dst], 0.2, False),
                        device) for w in (small, large)]
    shared = _timed(lambda: ops.gat_forward(indptr, indices, features[large].view(num_src, 1, large), scores,
                                            scores[:num_dst], 0.2, False), device)
    a, b = torch.randn(2048, 256, generator=generator).to(device), torch.randn(256, 256, generator=generator).to(device)
    gemm = _timed(lambda: a @ b, device)
    dense = _timed(lambda: torch.zeros(2048, 4096, device=device), device)
    mask = torch.rand(2048, 256, generator=generator) < 0.05
    x = (torch.randn(2048, 256, generator=generator) * mask).to(device)
    scan = _timed(lambda: dense_to_csr(x), device)
    call = _timed(lambda: ops.spmm_sum(indptr[:1], indices[:0], features[small], None, None, None, False), device)
    project_flop = _project_flop(ops, features[large][:num_dst], generator) if device.type == "cpu" else math.nan
    gather_edge, gather_element = _two_point(gather[0], gather[1], nnz + num_dst, small, large)
    scatter_edge, scatter_element = _two_point(scatter[0], scatter[1], nnz + num_dst, small, large)
    attention_edge, attention_element = _two_point(attention[0], attention[1], nnz * heads, small, large)
    shared_attention_element = max(shared / (nnz * heads) - attention_edge, 0.0) / large
    return Calibration(
        device_type=device.type, gemm_flop=gemm / (2.0 * 2048 * 256 * 256), project_flop=project_flop,
        gather_edge=gather_edge, gather_element=gather_element, scatter_edge=scatter_edge,
        scatter_element=scatter_element,
        transpose_edge=transpose / nnz, attention_edge=attention_edge, attention_element=attention_element,
        shared_attention_element=shared_attention_element,
        dense_element=dense / (2048 * 4096), scan_element=scan / x.numel(), call=call,
    )


def _project_flop(ops, x: torch.Tensor, generator: torch.Generator, out_features: int = 32) -> float:
    """Seconds per flop of the projection inside spmm_sum_project's pass (CPU only): one destination per row of `x`
    with its self loop and no edges, aggregated alone and aggregated and projected, the difference per flop. With
    no gather to hide behind, this is the projection's own cost, which is also what it adds to a real pass on this
    CPU (BENCHMARKS.md, branch gcn-order). `ops`: the native ops."""
    rows, width = x.shape
    indptr, indices = torch.zeros(rows + 1, dtype=torch.int64), torch.zeros(0, dtype=torch.int64)
    weight = torch.randn(out_features, width, generator=generator)
    alone = _timed(lambda: ops.spmm_sum(indptr, indices, x, None, None, None, True), x.device)
    projected = _timed(lambda: ops.spmm_sum_project(indptr, indices, x, None, None, None, True, weight), x.device)
    return max(projected - alone, 0.0) / (2.0 * rows * width * out_features)


def current_calibration(device: torch.device | str = "cpu") -> Calibration:
    """The calibration in force for `device`'s type: an injected one, else measured once per process."""
    override = _override.get()
    if override is not None:
        return override
    device_type = torch.device(device).type
    with _lock:
        if device_type not in _calibrations:
            _calibrations[device_type] = _measure_or_default(torch.device(device))
        return _calibrations[device_type]


def _measure_or_default(device: torch.device) -> Calibration:
    """`calibrate(device)`, or the default rates (said once, in the log) when the native ops cannot load."""
    from morphpipe.native import NativeBuildError

    try:
        calibration = calibrate(device)
    except NativeBuildError as error:
        log.warning("ops cost model: native ops unavailable (%s); using default rates, not measured ones", error)
        return DEFAULT_CALIBRATION
    log.info("ops cost model calibrated on %s: %s", device, calibration)
    return calibration


@contextmanager
def use_calibration(calibration: Calibration) -> Iterator[Calibration]:
    """Use `calibration` for every device inside the block, for this thread / task (tests, what-ifs)."""
    token = _override.set(calibration)
    try:
        yield calibration
    finally:
        _override.reset(token)
