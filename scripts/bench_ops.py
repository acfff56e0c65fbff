"""Benchmark: fused ops and GNN layers versus torch_geometric and the plain-PyTorch reference backend, on CPU.

Workloads (float32, forward + backward with a fixed upstream gradient):
- mini-batch blocks sampled from the benchmark presets (`bench-1m`, `default`: batch 1024, fanouts
  15,10,5, seed 0): the input layer (L0) and the next one (L1);
- one full-graph layer: a generated 50k-node community graph (average degree 16, 128 features).
Per layer: morphpipe's SAGEConv / GCNConv / GATConv on the fused backend (its own choices) and on
the reference backend, and torch_geometric's SAGEConv / GCNConv / GATConv on the same block and
widths (GraphSAGE 128->256, GCN 128->16, GAT 128->4x64; L1 takes the previous layer's width).
Per op: aggregate (mean, max), gcn_aggregate and gat_attention, fused versus reference; and the
first-layer projection of a sparse bag-of-words-like input (1433 features, 1% non-zero, -> 256)
with the sparsity-aware transform versus a dense `nn.Linear`.
Fused at every CPU instruction-set level (`--cpu-levels`, default all this CPU supports: baseline, avx2,
avx512), forced in turn (`morphpipe.native.forced_cpu_capability`), interleaved with the rest.
Time: best and median of `--repeats` interleaved runs after a warm-up. Peak memory: growth of the
resident set over one run, measured in a fresh process per (case, implementation) with the
high-water mark reset first (`/proc/self/clear_refs`), so every allocation counts, inside ops too.
The probes run with glibc's mmap threshold fixed (`MALLOC_MMAP_THRESHOLD_`): with its default
dynamic threshold, whether a freed buffer is reused or fresh pages are touched depends on what ran
before, and the same probe read anywhere from 185 to 330 MiB.
Prints a markdown table and writes JSON. Not a test.
Usage: python scripts/bench_ops.py [--datasets bench-1m default] [--kinds sage gat op:mean ...] [--repeats 5]
       [--threads N] [--out bench_ops.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import date
from pathlib import Path

import torch

from morphpipe import native, ops
from morphpipe.data import GraphStore, load_dataset
from morphpipe.data.generators import COMMUNITY, GeneratorSpec, generate
from morphpipe.nn import GATConv, GCNConv, SAGEConv
from morphpipe.ops.choice import DECISIONS
from morphpipe.ops.sparse_input import InputDensity, sparse_aware_linear
from morphpipe.profiler.ceiling import isa_flags
from morphpipe.profiler.hardware import HardwareFacts
from morphpipe.sampling import sample_neighbors
from morphpipe.sampling.minibatch import Block

FULL_GRAPH = "full-50k"
FULL_SPEC = GeneratorSpec(COMMUNITY, num_nodes=50_000, avg_degree=16, feature_dim=128, num_classes=8)
LAYERS = ("sage", "gcn", "gat")
OPS = ("op:mean", "op:max", "op:gcn", "op:gat", "op:linear")
# Morphling's case: bag-of-words-like input features (Cora: 1433 words, ~1.3% non-zero)
SPARSE_INPUT_DIM, SPARSE_INPUT_DENSITY = 1433, 0.01
HEADS = 4
# Allocations from 128 KiB up are mmapped and unmapped on free, so a probe's peak is its live peak.
MMAP_THRESHOLD_BYTES = 128 * 1024
IMPLEMENTATIONS = {"layer": ("fused", "reference", "pyg"), "op": ("fused", "reference")}


@dataclass(frozen=True)
class Case:
    """One workload: `kind` (a layer or an op) on block `layer` of `source` (a preset or the full graph)."""

    source: str
    layer: int
    kind: str

    @property
    def name(self) -> str:
        where = self.source if self.source == FULL_GRAPH else f"{self.source} L{self.layer}"
        return f"{where} {self.kind}"


@dataclass
class Result:
    """Timings (ms) and peak memory (MiB) per implementation, and what the fused backend chose."""

    case: str
    block: dict[str, int]
    best_ms: dict[str, float] = field(default_factory=dict)
    median_ms: dict[str, float] = field(default_factory=dict)
    peak_mib: dict[str, float] = field(default_factory=dict)
    choices: dict[str, str] = field(default_factory=dict)
    max_abs_diff_vs_pyg: float | None = None
    order_ms: dict[str, float] = field(default_factory=dict)  # fused layer with each re-association forced
    level_ms: dict[str, float] = field(default_factory=dict)  # fused at each CPU instruction-set level forced


def load_workload(source: str, layer: int) -> tuple[Block, int]:
    """The block and the input width of block `layer` (mini-batch) or of the whole graph."""
    if source == FULL_GRAPH:
        graph = _full_graph()
        return Block(graph.indptr, graph.indices.long(), graph.num_nodes, graph.num_nodes), graph.feature_dim
    graph = load_dataset(source, progress=False)
    batch = sample_neighbors(graph, graph.train_idx[:1024], [15, 10, 5], seed=0)
    return batch.blocks[layer], graph.feature_dim


def _full_graph() -> GraphStore:
    """The generated full-graph case, cached under the system temp directory."""
    path = Path(tempfile.gettempdir()) / "morphpipe-bench-ops" / FULL_GRAPH
    if not (path / "meta.json").exists():
        generate(FULL_SPEC, path, name=FULL_GRAPH, progress=False, overwrite=True)
    return GraphStore.load(path)


def widths(kind: str, in_dim: int, layer: int) -> tuple[int, int]:
    """(in, out per head) of a layer kind: the paper's widths, L1 taking L0's output width."""
    out = {"sage": 256, "gcn": 16, "gat": 64}[kind]
    if layer == 0:
        return in_dim, out
    return (out * HEADS if kind == "gat" else out), out


Runner = tuple[Callable[[], torch.Tensor], Callable[[], None]]


def make_runner(case: Case, implementation: str, block: Block, in_dim: int, forced: dict[str, str] | None = None
                ) -> Runner:
    """(forward, forward + backward) closures for one implementation of the case on `block` (`forced` choices)."""
    generator = torch.Generator().manual_seed(0)
    if case.kind.startswith("op:"):
        return _op_runner(case.kind, implementation, block, generator)
    in_features, out_features = widths(case.kind, in_dim, case.layer)
    x = torch.randn(block.num_src, in_features, generator=generator).requires_grad_(case.layer > 0)
    torch.manual_seed(0)
    ours = {"sage": lambda: SAGEConv(in_features, out_features), "gcn": lambda: GCNConv(in_features, out_features),
            "gat": lambda: GATConv(in_features, out_features, heads=HEADS)}[case.kind]()
    if implementation == "pyg":
        module = _pyg_layer(case.kind, ours, in_features, out_features)
        edge_index, size = block.edge_index(), (block.num_src, block.num_dst)

        def forward() -> torch.Tensor:
            if case.kind == "gcn":  # PyG's GCNConv needs a square graph: run it on the sources, keep the destinations
                return module(x, edge_index)[: block.num_dst]
            return module((x, x[: block.num_dst]), edge_index, size=size)
    else:
        module = ours

        def forward() -> torch.Tensor:
            with ops.use_backend(implementation), ops.force_choices(forced or {}):
                return module(block, x)
    upstream = torch.randn(forward().shape, generator=generator)

    def step() -> None:
        module.zero_grad(set_to_none=True)
        x.grad = None
        forward().backward(upstream)

    return forward, step


def _pyg_layer(kind: str, ours: torch.nn.Module, in_features: int, out_features: int) -> torch.nn.Module:
    """torch_geometric's layer with the same weights as ours (so outputs can be compared)."""
    import torch_geometric.nn as pyg

    with torch.no_grad():
        if kind == "sage":
            layer = pyg.SAGEConv(in_features, out_features, aggr="mean")
            layer.lin_l.weight.copy_(ours.lin_neigh.weight)
            layer.lin_l.bias.copy_(ours.lin_neigh.bias)
            layer.lin_r.weight.copy_(ours.lin_self.weight)
        elif kind == "gcn":
            layer = pyg.GCNConv(in_features, out_features)
            layer.lin.weight.copy_(ours.lin.weight)
            layer.bias.copy_(ours.bias)
        else:
            layer = pyg.GATConv(in_features, out_features, heads=HEADS, add_self_loops=True)
            for name in ("att_src", "att_dst", "bias"):
                getattr(layer, name).copy_(getattr(ours, name))
            layer.lin.weight.copy_(ours.lin.weight)
    return layer


def _op_runner(kind: str, implementation: str, block: Block, generator: torch.Generator) -> Runner:
    """(forward, forward + backward) of one aggregation op on `block` (128 features; GAT 4 heads x 64)."""
    if kind == "op:linear":
        mask = torch.rand(block.num_src, SPARSE_INPUT_DIM, generator=generator) < SPARSE_INPUT_DENSITY
        x = torch.randn(block.num_src, SPARSE_INPUT_DIM, generator=generator) * mask
        layer = torch.nn.Linear(SPARSE_INPUT_DIM, 256)
        density = InputDensity().measure(x)

        def forward() -> torch.Tensor:
            if implementation == "reference":
                return layer(x)
            return sparse_aware_linear(x, layer.weight, layer.bias, density)

        upstream = torch.randn(block.num_src, 256, generator=generator)

        def step() -> None:
            layer.zero_grad(set_to_none=True)
            forward().backward(upstream)

        return forward, step
    if kind == "op:gat":
        inputs = [torch.randn(block.num_src, HEADS, 64, generator=generator),
                  torch.randn(block.num_src, HEADS, generator=generator)]

        def op(h: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            return ops.gat_attention(block, h, scores, scores[: block.num_dst])
    else:
        inputs = [torch.randn(block.num_src, 128, generator=generator)]

        def op(h: torch.Tensor) -> torch.Tensor:
            return ops.gcn_aggregate(block, h) if kind == "op:gcn" else ops.aggregate(block, h, kind[3:])
    for tensor in inputs:
        tensor.requires_grad_()

    def forward() -> torch.Tensor:
        with ops.use_backend(implementation):
            return op(*inputs)

    upstream = torch.randn(forward().shape, generator=generator)

    def step() -> None:
        for tensor in inputs:
            tensor.grad = None
        forward().backward(upstream)

    return forward, step


def _status_bytes(key: str) -> int:
    """A `/proc/self/status` field (kB) in bytes."""
    return int(re.search(rf"{key}:\s+(\d+)", Path("/proc/self/status").read_text()).group(1)) * 1024


def probe_memory(case: Case, implementation: str) -> int:
    """Peak growth of the resident set during one forward + backward (run in a fresh process)."""
    block, in_dim = load_workload(case.source, case.layer)
    small = Block(block.indptr[:65], block.indices[: int(block.indptr[64])], block.num_src, 64)
    make_runner(case, implementation, small, in_dim)[1]()  # loads kernels, calibrates, warms the thread pools
    _, step = make_runner(case, implementation, block, in_dim)
    Path("/proc/self/clear_refs").write_text("5")
    baseline = _status_bytes("VmRSS")
    step()
    return _status_bytes("VmHWM") - baseline


def measure_memory(case: Case, implementation: str, threads: int) -> float:
    """`probe_memory` in a subprocess, in MiB."""
    spec = json.dumps({**asdict(case), "implementation": implementation})
    command = [sys.executable, __file__, "--probe", spec, "--threads", str(threads)]
    environment = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD_BYTES)}
    output = subprocess.run(command, check=True, capture_output=True, text=True, env=environment).stdout
    return json.loads(output.strip().splitlines()[-1])["peak_bytes"] / 2**20


def at_cpu_level(level: str, runner: Runner) -> Runner:
    """`runner` with the native CPU kernels forced to instruction-set level `level` while it runs."""
    forward, step = runner

    def forced_step() -> None:
        with native.forced_cpu_capability(level):
            step()

    return forward, forced_step


def time_case(case: Case, repeats: int, cpu_levels: list[str]) -> Result:
    """Interleaved timings of every implementation of `case`, the fused one at each of `cpu_levels` too, the fused
    choices, and agreement with PyG."""
    block, in_dim = load_workload(case.source, case.layer)
    implementations = IMPLEMENTATIONS["op" if case.kind.startswith("op:") else "layer"]
    runners = {name: make_runner(case, name, block, in_dim) for name in implementations}
    if case.kind in LAYERS:
        for order in DECISIONS[f"{case.kind}.order"]:
            runners[order] = make_runner(case, "fused", block, in_dim, {f"{case.kind}.order": order})
    for level in cpu_levels:
        runners[f"cpu:{level}"] = at_cpu_level(level, make_runner(case, "fused", block, in_dim))
    ops.clear_choices()
    for _, step in runners.values():
        step()
    result = Result(case.name, {"num_src": block.num_src, "num_dst": block.num_dst, "nnz": block.nnz})
    result.choices = {record.decision: record.chosen for record in ops.recorded_choices()
                      if record.reason != "forced"}
    if "pyg" in runners and not (case.kind == "gcn" and case.source != FULL_GRAPH):
        with torch.no_grad():
            result.max_abs_diff_vs_pyg = float((runners["fused"][0]() - runners["pyg"][0]()).abs().max())
    samples: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(repeats):
        for name, (_, step) in runners.items():
            start = time.perf_counter()
            step()
            samples[name].append((time.perf_counter() - start) * 1e3)
    best = {name: min(times) for name, times in samples.items()}
    result.level_ms = {name.removeprefix("cpu:"): best.pop(name) for name in list(best) if name.startswith("cpu:")}
    result.order_ms = {name: best.pop(name) for name in list(best) if name not in implementations}
    result.best_ms = best
    result.median_ms = {name: statistics.median(samples[name]) for name in best}
    return result


def machine() -> dict[str, object]:
    """What the numbers were measured on."""
    import torch_geometric

    facts = HardwareFacts.detect()
    return {
        "cpu": facts.cpu_model,
        "cpu_flags": " ".join(isa_flags()),
        "cpu_kernels": native.cpu_capability_info(),
        "cores": facts.logical_cores,
        "threads": torch.get_num_threads(),
        "memory_gib": round(facts.memory_bytes / 2**30, 1),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_geometric": torch_geometric.__version__,
        "date": date.today().isoformat(),
    }


def table(results: list[Result]) -> str:
    """Markdown: best time and peak memory per implementation, and fused's ratio to PyG / reference."""
    lines = ["| case | block (src/dst/nnz) | fused ms | ref ms | PyG ms | PyG/fused time | fused MiB | ref MiB | "
             "PyG MiB | fused/PyG mem | choices |", "|" + "---|" * 11]
    for r in results:
        base = "pyg" if "pyg" in r.best_ms else "reference"
        time_ratio = r.best_ms[base] / r.best_ms["fused"]
        mem_ratio = (r.peak_mib["fused"] / r.peak_mib[base]) if r.peak_mib.get(base) else float("nan")
        cells = [r.case, f"{r.block['num_src']}/{r.block['num_dst']}/{r.block['nnz']}",
                 f"{r.best_ms['fused']:.1f}", f"{r.best_ms['reference']:.1f}",
                 f"{r.best_ms['pyg']:.1f}" if "pyg" in r.best_ms else "-",
                 f"{time_ratio:.2f}x" + ("" if base == "pyg" else " (vs ref)"),
                 f"{r.peak_mib.get('fused', float('nan')):.0f}", f"{r.peak_mib.get('reference', float('nan')):.0f}",
                 f"{r.peak_mib['pyg']:.0f}" if "pyg" in r.peak_mib else "-",
                 f"{mem_ratio:.2f}" + ("" if base == "pyg" else " (vs ref)"),
                 ", ".join(f"{k}={v}" for k, v in sorted(r.choices.items()))]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "| case | chosen order | aggregate_first ms | project_first ms | chosen is faster |",
              "|---|---|---|---|---|"]
    for r in results:
        if r.order_ms:
            chosen = r.choices[f"{r.case.split()[-1]}.order"]
            faster = min(r.order_ms, key=r.order_ms.get)
            lines.append(f"| {r.case} | {chosen} | {r.order_ms['aggregate_first']:.1f} | {r.order_ms['project_first']:.1f}"
                         f" | {'yes' if chosen == faster else 'no'} |")
    levels = list(results[0].level_ms) if results else []
    if levels:
        lines += ["", "| case (fused) | " + " | ".join(f"{level} ms" for level in levels) + " | "
                  + " | ".join(f"{level} speedup" for level in levels[1:]) + " |", "|" + "---|" * (2 * len(levels))]
        for r in results:
            base = r.level_ms[levels[0]]
            lines.append(f"| {r.case} | " + " | ".join(f"{r.level_ms[level]:.1f}" for level in levels) + " | "
                         + " | ".join(f"{base / r.level_ms[level]:.2f}x" for level in levels[1:]) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", default=["bench-1m", "default"], help="mini-batch presets")
    parser.add_argument("--layers", nargs="+", type=int, default=[0, 1], help="mini-batch block indices")
    parser.add_argument("--no-full-graph", action="store_true", help="skip the full-graph case")
    parser.add_argument("--kinds", nargs="+", default=list(LAYERS + OPS), choices=list(LAYERS + OPS),
                        help="layers and ops to run")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--no-memory", action="store_true", help="skip the per-process peak-memory probes")
    parser.add_argument("--out", default="bench_ops.json")
    parser.add_argument("--cpu-levels", nargs="*", default=None,
                        help="CPU instruction-set levels to time the fused case at (default: every level this CPU "
                             "supports; none: skip)")
    parser.add_argument("--probe", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.probe:
        spec = json.loads(args.probe)
        implementation = spec.pop("implementation")
        print(json.dumps({"peak_bytes": probe_memory(Case(**spec), implementation)}))
        return
    cases = [Case(d, layer, kind) for d in args.datasets for layer in args.layers for kind in LAYERS]
    cases += [Case(args.datasets[0], 0, kind) for kind in OPS]
    if not args.no_full_graph:
        cases += [Case(FULL_GRAPH, 0, kind) for kind in LAYERS + OPS]
    cases = [case for case in cases if case.kind in args.kinds]
    cpu_levels = native.supported_cpu_capabilities() if args.cpu_levels is None else args.cpu_levels
    load_before = os.getloadavg()
    results = []
    for case in cases:
        result = time_case(case, args.repeats, cpu_levels)
        if not args.no_memory:
            result.peak_mib = {name: measure_memory(case, name, args.threads) for name in result.best_ms}
        print(f"{case.name}: " + ", ".join(f"{k} {v:.1f} ms" for k, v in result.best_ms.items())
              + (", " + ", ".join(f"{k} {v:.0f} MiB" for k, v in result.peak_mib.items()) if result.peak_mib else ""),
              flush=True)
        results.append(result)
    report = {"machine": machine(), "command": " ".join([Path(sys.executable).name, *sys.argv]),
              "load_average_before": load_before, "load_average_after": os.getloadavg(),
              "results": [asdict(r) for r in results]}
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(table(results))
    print(f"\nmachine: {report['machine']}\nload average before {load_before}, after {report['load_average_after']}")


if __name__ == "__main__":
    main()
