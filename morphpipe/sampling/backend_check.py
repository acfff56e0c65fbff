"""The Route 1 self-check: before our CUDA kernels make batches on a device, they prove themselves there.

On the first use of a device (GpuBatcher backend "auto"), a small generated graph is batched by
both backends through the entry points the GPU batcher calls: the kernels' batches must pass
every structure check (edges exist, no repeats, fanout respected, prefix convention, features
and labels), their neighbour draws must agree in distribution with the torch path (chi-square,
Floyd and large-fanout paths) and show no trend towards either end of a neighbour list (a
z-test on the drawn positions, which sees a slight preference that a chi-square over all
neighbours misses), and the row gather must return exactly `table[ids]` for 65,536 ids over
tables of several dtypes and widths (a gather wrong for one id in a thousand cannot pass). Packages that
compute on the batches register their own checks with `register_self_check` (`morphpipe.ops`
does, on import: its fused ops must match the reference ops); they form the verdict's ops part.
Whatever fails or raises makes morphpipe use the torch path (and, through the registered
failure action, the reference ops on that device type), said once with the reason. The verdict
is recorded per device in the native build directory (`route1_self_check.json`, keyed by the
device and invalidated by source, torch or registered-check changes) and shown by `morphpipe info`.
"""
from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace

import torch

from morphpipe import native
from morphpipe.sampling.minibatch import Block, MiniBatch

log = logging.getLogger("morphpipe.sampling")

RESULTS_FILE = "route1_self_check.json"
P_VALUE_FLOOR = 1e-4  # a correct sampler fails one of the six tests (two fanouts) about once in 1,700 checks
HUB = 5
HUB_DEGREE = 120
TRIALS = 240
GATHER_ROWS = 4_099  # rows of each gather check table: a prime, so no block size divides it
GATHER_IDS = 1 << 16  # ids gathered from each table

# Makes one batch of `seeds` (host int64) over the check graph with `fanouts`, deterministic for `seed`.
BatchMaker = Callable[[torch.Tensor, Sequence[int], int], MiniBatch]
# Gathers the rows `ids` (host int64) of a host `table` with the kernels' gather; the rows come back in any place.
RowGather = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
# A registered check of what computes on the batches: the problem it finds on a device, or None.
DeviceCheck = Callable[[torch.device], str | None]
# What the registering package does when its check failed: called with the device type and the problem.
FailureAction = Callable[[str, str], None]


@dataclass(frozen=True)
class Verdict:
    """One device's self-check: whether the sampler kernels and the ops (the registered checks, named in
    `ops_checked`) may be used there, and why not."""

    device: str
    kernels_ok: bool
    kernels_reason: str
    ops_ok: bool
    ops_reason: str
    source_hash: str = ""
    torch_version: str = ""
    ops_checked: str = ""

    def summary(self) -> str:
        """One line for logs and `morphpipe info`."""
        kernels = "kernels passed" if self.kernels_ok else f"kernels FAILED ({self.kernels_reason}): torch path used"
        if not self.ops_ok:
            ops = f"{self.ops_checked or 'ops'} FAILED ({self.ops_reason}): reference ops used"
        else:
            ops = f"{self.ops_checked} passed" if self.ops_checked else "no ops check registered"
        return f"self-check on {self.device}: {kernels}; {ops}"


@dataclass(frozen=True)
class RegisteredCheck:
    """A check another package runs in every device's self-check, and what it does when the check fails."""

    check: DeviceCheck
    on_failure: FailureAction


_registered: dict[str, RegisteredCheck] = {}


def register_self_check(name: str, check: DeviceCheck, on_failure: FailureAction) -> None:
    """Runs `check` in every device's self-check from now on, beside the sampler's (the verdict's ops part);
    `on_failure(device_type, problem)` acts when a verdict's ops part failed. Registering a name again replaces it."""
    _registered[name] = RegisteredCheck(check, on_failure)


def registered_names() -> str:
    """The registered checks' names, as a verdict records them in `ops_checked`."""
    return ", ".join(_registered)


def registered_problem(device: torch.device) -> str | None:
    """What the registered checks find wrong on `device` (each one's problem, joined), or None."""
    problems = [problem for registered in _registered.values() if (problem := registered.check(device)) is not None]
    return "; ".join(problems) if problems else None


def check_graph(num_nodes: int = 300, seed: int = 0, index_dtype: torch.dtype = torch.int32) -> SimpleNamespace:
    """A small CSC graph with zero-degree nodes, low degrees and one hub, no duplicate edges."""
    generator = torch.Generator().manual_seed(seed)
    degrees = torch.randint(0, 12, (num_nodes,), generator=generator)
    degrees[::17] = 0
    degrees[HUB] = HUB_DEGREE
    lists = [torch.sort(torch.randperm(num_nodes, generator=generator)[:int(d)]).values for d in degrees]
    indptr = torch.zeros(num_nodes + 1, dtype=torch.int64)
    torch.cumsum(degrees, 0, out=indptr[1:])
    return SimpleNamespace(indptr=indptr, indices=torch.cat(lists).to(index_dtype),
                           features=torch.randn(num_nodes, 6, generator=generator),
                           labels=torch.randint(0, 4, (num_nodes,), generator=generator), num_nodes=num_nodes)


def structure_problem(graph, batch: MiniBatch, fanouts: Sequence[int]) -> str | None:
    """What is structurally wrong with `batch` sampled from `graph` with `fanouts`, or None."""
    batch = batch.to("cpu")
    n = graph.num_nodes
    seeds, nodes = batch.seeds.to(torch.int64), batch.input_nodes.to(torch.int64)
    if not torch.equal(nodes[:seeds.numel()], seeds):
        return "the seeds are not the prefix of input_nodes"
    if torch.unique(nodes).numel() != nodes.numel():
        return "input_nodes repeat a node"
    if len(batch.blocks) != len(fanouts):
        return f"{len(batch.blocks)} blocks for {len(fanouts)} fanouts"
    degrees = graph.indptr[1:] - graph.indptr[:-1]
    graph_edges = torch.repeat_interleave(torch.arange(n), degrees) * n + graph.indices.to(torch.int64)
    for layer, block in enumerate(batch.blocks):
        problem = _block_problem(block, layer, batch, fanouts[len(fanouts) - 1 - layer], degrees, graph_edges, n)
        if problem is not None:
            return f"layer {layer}: {problem}"
    if not torch.equal(batch.x, graph.features[nodes]):
        return "x is not features[input_nodes]"
    if not torch.equal(batch.y.to(torch.int64), graph.labels[seeds].to(torch.int64)):
        return "y is not labels[seeds]"
    return None


def _block_problem(block: Block, layer: int, batch: MiniBatch, fanout: int, degrees: torch.Tensor,
                   graph_edges: torch.Tensor, n: int) -> str | None:
    expected_src = batch.input_nodes.numel() if layer == 0 else batch.blocks[layer - 1].num_dst
    if block.num_src != expected_src:
        return f"num_src {block.num_src}, expected {expected_src}"
    if layer == len(batch.blocks) - 1 and block.num_dst != batch.seeds.numel():
        return f"num_dst {block.num_dst}, expected the {batch.seeds.numel()} seeds"
    indptr, indices = block.indptr.to(torch.int64), block.indices.to(torch.int64)
    if indptr.numel() != block.num_dst + 1 or int(indptr[0]) != 0 or int(indptr[-1]) != indices.numel():
        return "indptr does not bound indices"
    if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= block.num_src):
        return "a local id is outside [0, num_src)"
    dst = batch.input_nodes[:block.num_dst].to(torch.int64)
    counts = indptr[1:] - indptr[:-1]
    expected = degrees[dst] if fanout < 0 else torch.clamp(degrees[dst], max=fanout)
    if not torch.equal(counts, expected):
        return "a destination has the wrong neighbour count (fanout, or all for low degree)"
    keys = torch.repeat_interleave(dst, counts) * n + batch.input_nodes[indices].to(torch.int64)
    if not bool(torch.isin(keys, graph_edges).all()):
        return "a sampled edge is not in the graph"
    if torch.unique(keys).numel() != keys.numel():
        return "a destination repeats a neighbour"
    return None


def hub_counts(make: BatchMaker, graph, fanout: int, trials: int = TRIALS) -> torch.Tensor:
    """How often each of the hub's neighbours was drawn over `trials` one-hop batches of the hub alone."""
    neighbours = graph.indices[graph.indptr[HUB]:graph.indptr[HUB + 1]].to(torch.int64)
    counts = torch.zeros(neighbours.numel(), dtype=torch.int64)
    for trial in range(trials):
        batch = make(torch.tensor([HUB]), [fanout], 1_000 + trial).to("cpu")
        drawn = batch.input_nodes[batch.blocks[0].indices].to(torch.int64)
        counts += torch.isin(neighbours, drawn).to(torch.int64)
    return counts


def position_trend_pvalue(counts: torch.Tensor, fanout: int, trials: int) -> float:
    """Two-sided p-value that `counts` (draws per position of one neighbour list over `trials` uniform draws of
    `fanout` distinct positions) show no trend in position: a z-test on the sum of the drawn positions.

    Drawing `f` of the positions 0..d-1 uniformly without replacement, their sum has mean
    f (d - 1) / 2 and variance f (d - f) (d + 1) / 12, and trials are independent.
    """
    from scipy import stats

    d = counts.numel()
    total = float((torch.arange(d, dtype=torch.float64) * counts.to(torch.float64)).sum())
    mean = trials * fanout * (d - 1) / 2
    variance = trials * fanout * (d - fanout) * (d + 1) / 12
    return float(2 * stats.norm.sf(abs(total - mean) / variance ** 0.5))


def distribution_problem(candidate: BatchMaker, reference: BatchMaker, graph) -> str | None:
    """Whether `candidate` draws the hub's neighbours uniformly (chi-square, and no trend along the list) and like
    `reference` (chi-square)."""
    from scipy import stats  # a heavy import, needed only when a device is checked

    for fanout in (5, 60):
        ours, theirs = hub_counts(candidate, graph, fanout), hub_counts(reference, graph, fanout)
        if int(ours.sum()) != TRIALS * fanout:
            return f"fanout {fanout}: {int(ours.sum())} draws instead of {TRIALS * fanout}"
        uniform = stats.chisquare(ours.numpy()).pvalue
        if not uniform > P_VALUE_FLOOR:
            return f"fanout {fanout}: the hub's neighbours are not drawn uniformly (chi-square p = {uniform:.2g})"
        trend = position_trend_pvalue(ours, fanout, TRIALS)
        if not trend > P_VALUE_FLOOR:
            return (f"fanout {fanout}: draws lean towards one end of the neighbour list (position z-test "
                    f"p = {trend:.2g})")
        same = stats.chi2_contingency(torch.stack([ours, theirs]).numpy()).pvalue
        if not same > P_VALUE_FLOOR:
            return f"fanout {fanout}: draws differ in distribution from the torch path (chi-square p = {same:.2g})"
    return None


def gather_tables(seed: int = 0) -> dict[str, torch.Tensor]:
    """The gather check's host tables: every feature dtype, odd and wide rows, and labels as one int64 column."""
    generator = torch.Generator().manual_seed(seed)
    return {"float32 rows of 7": torch.randn(GATHER_ROWS, 7, generator=generator),
            "float16 rows of 33": torch.randn(GATHER_ROWS, 33, generator=generator).to(torch.float16),
            "bfloat16 rows of 128": torch.randn(GATHER_ROWS, 128, generator=generator).to(torch.bfloat16),
            "int64 labels": torch.randint(0, 1 << 40, (GATHER_ROWS, 1), generator=generator)}


def gather_problem(gather: RowGather, seed: int = 0) -> str | None:
    """Whether `gather` returns exactly `table[ids]` for `GATHER_IDS` random ids (repeats, the first and last row
    among them) from each of `gather_tables`, or what is wrong."""
    generator = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(0, GATHER_ROWS, (GATHER_IDS,), generator=generator)
    ids[:2] = torch.tensor([GATHER_ROWS - 1, 0])
    for name, table in gather_tables(seed).items():
        got, expected = gather(table, ids).cpu(), table.index_select(0, ids)
        if got.shape != expected.shape or got.dtype != expected.dtype:
            return (f"gather of {name}: got {tuple(got.shape)} {got.dtype}, expected {tuple(expected.shape)} "
                    f"{expected.dtype}")
        wrong = torch.nonzero((got != expected).any(dim=1)).flatten()
        if wrong.numel():
            first = int(wrong[0])
            return (f"gather of {name}: {wrong.numel()} of {ids.numel()} rows are not table[id] (first: row {first}, "
                    f"id {int(ids[first])})")
    return None


def sampler_problem(candidate: BatchMaker, reference: BatchMaker, graph=None,
                    gather: RowGather | None = None) -> str | None:
    """Structure on several fanouts (take-all, small, large), distribution against the reference and, given the
    kernels' `gather`, the gather check; None when all pass."""
    graph = graph if graph is not None else check_graph()
    seeds = torch.tensor([HUB, 0, 17, 3, 299, 150, 42, 8])
    try:
        for fanouts in ([4, 3, 2], [-1, 2], [100, 1], [60]):
            for seed in (0, 1):
                problem = structure_problem(graph, candidate(seeds, fanouts, seed), fanouts)
                if problem is not None:
                    return f"fanouts {fanouts}: {problem}"
        problem = gather_problem(gather) if gather is not None else None
        return problem or distribution_problem(candidate, reference, graph)
    except Exception as error:  # noqa: BLE001 - any failure of the candidate is the verdict
        return f"raised {type(error).__name__}: {error}"


def run_self_check(device: torch.device, kernels: BatchMaker, reference: BatchMaker, gather: RowGather | None = None,
                   graph=None) -> Verdict:
    """Checks the kernels' batches against the torch path and their gather (when given) against indexing, and runs
    the registered checks on `device`."""
    sampler = sampler_problem(kernels, reference, graph, gather)
    ops_reason = registered_problem(device)
    return Verdict(device_key(device), sampler is None, sampler or "", ops_reason is None, ops_reason or "",
                   *_build_identity(), registered_names())


def device_key(device: torch.device) -> str:
    """How verdicts are filed: the device's name and compute capability (CUDA), or its type."""
    if device.type != "cuda":
        return str(device)
    major, minor = torch.cuda.get_device_capability(device)
    return f"{torch.cuda.get_device_name(device)} sm_{major}{minor} ({device})"


def _build_identity() -> tuple[str, str]:
    return native.build_config().source_hash, torch.__version__


def results_path() -> Path:
    """The JSON file of recorded verdicts, beside the native build they judge."""
    return native.build_config().build_dir / RESULTS_FILE


def recorded_verdicts(path: Path | None = None) -> dict[str, Verdict]:
    """Every recorded verdict by device key (an unreadable file counts as none)."""
    path = path or results_path()
    try:
        raw = json.loads(path.read_text())
        return {key: Verdict(**value) for key, value in raw.items()}
    except (OSError, ValueError, TypeError):
        return {}


def record_verdict(verdict: Verdict, path: Path | None = None) -> None:
    """Adds or replaces `verdict` in the results file (written whole, then renamed into place)."""
    path = path or results_path()
    verdicts = recorded_verdicts(path)
    verdicts[verdict.device] = verdict
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps({key: asdict(value) for key, value in verdicts.items()}, indent=2))
    temporary.replace(path)


def apply_verdict(verdict: Verdict, device_type: str) -> None:
    """Acts on a verdict: a failed ops part calls every registered check's failure action; says so once."""
    if not verdict.ops_ok:
        for registered in _registered.values():
            registered.on_failure(device_type, verdict.ops_reason)
    if not (verdict.kernels_ok and verdict.ops_ok):
        log.warning("morphpipe Route 1 %s", verdict.summary())


_verdicts: dict[str, Verdict] = {}
_lock = threading.Lock()


def device_verdict(device: torch.device, path: Path | None = None,
                   makers: Callable[[torch.device], contextlib.AbstractContextManager] | None = None) -> Verdict:
    """The verdict for `device`: this process's, the recorded one if it judged this build with the checks registered
    now, else a fresh check with the backends `makers(device)` yields (default: the CUDA kernels, the torch path on
    the device and the kernels' gather; see `cuda_makers`)."""
    key = device_key(device)
    with _lock:
        if key in _verdicts:
            return _verdicts[key]
        verdict = recorded_verdicts(path).get(key)
        if verdict is None or (verdict.source_hash, verdict.torch_version, verdict.ops_checked) != (
                *_build_identity(), registered_names()):
            with (makers or cuda_makers)(device) as (kernels, reference, gather):
                verdict = run_self_check(device, kernels, reference, gather)
            record_verdict(verdict, path)
        apply_verdict(verdict, device.type)
        _verdicts[key] = verdict
        return verdict


@contextlib.contextmanager
def cuda_makers(device: torch.device, graph=None) -> Iterator[tuple[BatchMaker, BatchMaker, RowGather]]:
    """(kernels, torch path) batch makers over the check graph pinned for `device`, and the kernels' row gather,
    for as long as the block runs. The kernels are called as the GPU batcher calls them (its cached entry points,
    here with an empty cache)."""
    from morphpipe.sampling import torch_sampler
    from morphpipe.sampling.cpu_batcher import blocks_from_native
    from morphpipe.sampling.gpu_cache import CachePlan, GpuCache
    from morphpipe.sampling.pinning import HostPinning
    from morphpipe.sampling.zero_copy import cuda_view

    graph = graph if graph is not None else check_graph()
    ops = native.ops()
    parts = {"indptr": graph.indptr, "indices": graph.indices, "features": graph.features, "labels": graph.labels}
    with torch.cuda.device(device), HostPinning(parts) as pinned:
        views = torch_sampler.GraphTensors(**{name: cuda_view(pinned[name], device) for name in parts})
        cache = GpuCache(CachePlan.empty(), graph.indptr, graph.indices, graph.features, device)
        no_cache = torch.empty(0, dtype=torch.int32, device=device)

        def kernels(seeds: torch.Tensor, fanouts: Sequence[int], seed: int) -> MiniBatch:
            on_device = seeds.to(device)
            input_nodes, indptrs, indices = ops.sample_neighbors_cached(
                pinned["indptr"], pinned["indices"], on_device, list(fanouts), seed,
                cache.adjacency_slot, cache.adjacency_indptr, cache.adjacency_indices)
            x = ops.gather_rows_cached(pinned["features"], input_nodes, cache.feature_slot, cache.feature_rows, False)
            y = ops.gather_rows_cached(pinned["labels"].view(-1, 1), on_device, no_cache, no_cache, False).view(-1)
            return MiniBatch(on_device, input_nodes, blocks_from_native(input_nodes.numel(), indptrs, indices), x, y)

        def reference(seeds: torch.Tensor, fanouts: Sequence[int], seed: int) -> MiniBatch:
            return torch_sampler.make_batch(views, seeds.to(device), fanouts, seed)

        def gather(table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
            with HostPinning({"table": table}) as pinned_table:
                return ops.gather_rows_cached(pinned_table["table"], ids.to(device), no_cache, no_cache, False).cpu()

        yield kernels, reference, gather
        torch.cuda.synchronize(device)


def host_maker(graph) -> BatchMaker:
    """The torch path on host tensors: the reference the kernels are compared with, runnable anywhere."""
    from morphpipe.sampling import torch_sampler

    tensors = torch_sampler.GraphTensors(graph.indptr, graph.indices, graph.features, graph.labels)
    return lambda seeds, fanouts, seed: torch_sampler.make_batch(tensors, seeds, fanouts, seed)


def verdict_rows(path: Path | None = None) -> list[tuple[str, str]]:
    """`morphpipe info` rows: every recorded self-check verdict, or a note that none ran yet (or that no native
    build exists to have recorded one)."""
    try:
        verdicts = recorded_verdicts(path)
        current = _build_identity() if verdicts else None
    except native.NativeBuildError:  # `morphpipe info`'s "native ops" row says why
        return [("Route 1 self-check", "unknown: the native ops are not built")]
    if not verdicts:
        return [("Route 1 self-check", "none recorded (runs on a GPU batcher's first use of a device)")]
    rows = []
    for verdict in verdicts.values():
        stale = "" if (verdict.source_hash, verdict.torch_version) == current else " [for an older build]"
        rows.append(("Route 1 self-check", verdict.summary() + stale))
    return rows


__all__ = ["Verdict", "check_graph", "cuda_makers", "device_verdict", "gather_problem", "host_maker",
           "register_self_check", "run_self_check", "sampler_problem", "structure_problem", "verdict_rows"]
