"""Planner benchmark: (a) planning time, (b) SimPy vs fast engine, (c) plans on paper-shaped machines.

(a) Saves synthetic profiles of 10,000 batches, then times Profile.load + plan_from_profile
    (SimPy reporting run included) several times each; prints the median and the worst.

(b) Times one simulated epoch of 10,000 batches with the SimPy model and with its fast twin.

(c) Builds profiles for three machine shapes with 12, 8 and 6 CPU cores per GPU (MorphGL's
    three machines have these CPU:GPU core ratios) and three graph workloads x two models, from a
    small cost model of each phase (constants below, stated in BENCHMARKS_planner.md), plans each
    one and compares the adaptive plan with the all-CPU (SALIENT-like) and all-GPU (DUCATI-like)
    baselines in the same simulator. These are simulated predictions for modelled machines, not
    measurements; the paper's Table V ratios are printed beside them for scale only.

Usage: python scripts/bench_planner.py [--json out.json] [--repeats 5]
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from morphpipe.partitioner import Partitioner, PhaseTimes
from morphpipe.profiler import HardwareFacts, PhaseTiming, Profile, ThreadScaling
from morphpipe.profiler.hardware import GpuFacts
from morphpipe.scheduler import Scheduler, plan_from_profile

PAPER = {"all-cpu": {"avg": 1.55, "max": 2.76, "system": "SALIENT"},
         "all-gpu": {"avg": 1.41, "max": 2.20, "system": "DUCATI"}}

# Cost model constants (per batch; see BENCHMARKS_planner.md for the reasoning).
CPU_SAMPLE_S_PER_EDGE = 40e-9      # one thread, random neighbour reads in host memory
CPU_GATHER_BYTES_PER_S = 2.0e9     # one thread gathering scattered feature rows
CPU_PARALLEL_EFFICIENCY = 0.85     # marginal speedup of each extra batching thread
DMA_EFFICIENCY = 0.8               # bulk pinned-memory copy, share of theoretical PCIe bandwidth
UVA_EFFICIENCY = 0.6               # zero-copy row gathers over PCIe, share of theoretical bandwidth
GPU_SAMPLE_S_PER_EDGE = 2e-9       # UVA neighbour sampling on the GPU
GPU_FLOP_EFFICIENCY = 0.35         # achieved share of peak FP32 for sparse GNN layers
PHASE_CV = 0.1                     # spread of every phase's per-batch time


@dataclass(frozen=True)
class Machine:
    """One GPU and the CPU cores that serve it."""

    name: str
    cores_per_gpu: int
    pcie_gen: int
    gpu_name: str
    gpu_tflops: float


@dataclass(frozen=True)
class Workload:
    """One epoch's batches: sizes per batch (3 layers, fanouts 15-10-5, 1024 seeds) and the model."""

    name: str
    num_batches: int
    input_nodes: int
    sampled_edges: int
    layer_dst: tuple[int, int, int]
    feature_dim: int
    feature_bytes: int
    hidden: int
    model: str

    @property
    def batch_bytes(self) -> int:
        return self.input_nodes * self.feature_dim * self.feature_bytes

    @property
    def train_flops(self) -> float:
        """Forward + backward (3x forward) of 3 layers; SAGE: 2 matmuls per layer, GAT: 4 heads + attention."""
        widths = [self.feature_dim, self.hidden, self.hidden]
        matmuls = 2 if self.model == "SAGE" else 4 * 1.25
        forward = sum(2 * dst * width * self.hidden * matmuls for dst, width in zip(self.layer_dst, widths))
        return 3 * forward


MACHINES = [
    Machine("12 cores/GPU, PCIe 3.0 x16, V100-class", 12, 3, "V100-class (15.7 TFLOPS FP32)", 15.7),
    Machine("8 cores/GPU, PCIe 4.0 x16, A100-class", 8, 4, "A100-class (19.5 TFLOPS FP32)", 19.5),
    Machine("6 cores/GPU, PCIe 4.0 x16, H100-PCIe-class", 6, 4, "H100-PCIe-class (51 TFLOPS FP32)", 51.0),
]
WORKLOADS = [
    Workload(f"{data}/{model}", batches, nodes, edges, dst, dim, nbytes, 256, model)
    for data, batches, nodes, edges, dst, dim, nbytes in [
        ("products-like", 196, 200_000, 900_000, (100_000, 14_000, 1024), 100, 4),
        ("papers100M-like", 1172, 450_000, 950_000, (150_000, 15_000, 1024), 128, 4),
        ("mag240M-like", 1088, 250_000, 900_000, (120_000, 15_000, 1024), 768, 2),
    ]
    for model in ("SAGE", "GAT")
]


def machine_profile(machine: Machine, workload: Workload) -> Profile:
    """A profile of `workload` on `machine` from the cost model above."""
    link = {3: 15.754, 4: 31.508}[machine.pcie_gen] * 1e9
    cpu_single = (workload.sampled_edges * CPU_SAMPLE_S_PER_EDGE
                  + workload.batch_bytes / CPU_GATHER_BYTES_PER_S)
    dma = workload.batch_bytes / (DMA_EFFICIENCY * link)
    uva_transfer = workload.batch_bytes / (UVA_EFFICIENCY * link)
    uva = workload.sampled_edges * GPU_SAMPLE_S_PER_EDGE + uva_transfer
    train = workload.train_flops / (GPU_FLOP_EFFICIENCY * machine.gpu_tflops * 1e12)
    hardware = HardwareFacts(
        cpu_model="modelled CPU", physical_cores=machine.cores_per_gpu, logical_cores=machine.cores_per_gpu,
        usable_cores=machine.cores_per_gpu, memory_bytes=512 << 30, memory_available_bytes=480 << 30,
        gpus=(GpuFacts(0, machine.gpu_name, 80 << 30, machine.pcie_gen, 16, machine.pcie_gen, 16),),
        notes=("modelled machine (scripts/bench_planner.py)",),
    )
    return Profile(
        hardware=hardware, device="cuda", num_batches=workload.num_batches, batch_bytes=workload.batch_bytes,
        cpu_batching=ThreadScaling.linear(cpu_single, machine.cores_per_gpu, CPU_PARALLEL_EFFICIENCY, PHASE_CV),
        gpu_batching=PhaseTiming.from_mean(uva, PHASE_CV), dma=PhaseTiming.from_mean(dma, PHASE_CV),
        training=PhaseTiming.from_mean(train, PHASE_CV), uva_transfer_s=uva_transfer,
        workload={"name": workload.name, "machine": machine.name},
    )


def bench_planning_time(repeats: int) -> list[dict]:
    """(a) Load + plan time for saved profiles of 10,000 batches."""
    shapes = [
        ("CPU-bound batching", dict(t_cb=0.08, t_gb=0.01, t_dma=0.004, t_m=0.006, cores=8)),
        ("PCIe-bound", dict(t_cb=0.05, t_gb=0.02, t_dma=0.03, t_m=0.01, cores=12)),
        ("training-bound", dict(t_cb=0.02, t_gb=0.01, t_dma=0.004, t_m=0.02, cores=6)),
    ]
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for name, numbers in shapes:
            for cv in (0.0, 0.2):
                path = Path(folder) / "profile.json"
                Profile.synthetic(num_batches=10_000, cpu_efficiency=0.8, cv=cv, batch_bytes=50_000_000,
                                  **numbers).save(path)
                seconds = []
                for _ in range(repeats):
                    start = time.perf_counter()
                    plan = plan_from_profile(Profile.load(path))
                    seconds.append(time.perf_counter() - start)
                rows.append({"profile": name, "cv": cv, "batches": 10_000, "median_s": statistics.median(seconds),
                             "max_s": max(seconds), "evaluations": plan.evaluations, "schedule": plan.kind,
                             "optimality_gap": plan.optimality_gap})
    return rows


def bench_engines(repeats: int) -> dict:
    """(b) Seconds per simulated epoch of 10,000 batches, SimPy model versus fast twin (same numbers)."""
    profile = Profile.synthetic(t_cb=0.08, t_gb=0.01, t_dma=0.004, t_m=0.006, cores=8, cpu_efficiency=0.8,
                                num_batches=10_000, cv=0.2)
    times = PhaseTimes.from_profile(profile)
    scheduler = Scheduler(times)
    split = Partitioner(times).initial_split()
    out: dict = {"batches": 10_000, "split": [split.n_cpu, split.n_gpu]}
    epochs = set()
    for engine in ("simpy", "fast"):
        seconds = []
        for _ in range(repeats):
            start = time.perf_counter()
            epochs.add(scheduler.simulate(split, engine=engine).epoch_s)
            seconds.append(time.perf_counter() - start)
        out[f"{engine}_median_s"] = statistics.median(seconds)
    out["same_epoch"] = len(epochs) == 1
    return out


def bench_grid() -> list[dict]:
    """(c) Adaptive plan versus both baselines on every machine x workload."""
    rows = []
    for machine in MACHINES:
        for workload in WORKLOADS:
            profile = machine_profile(machine, workload)
            plan = plan_from_profile(profile)
            rows.append({
                "machine": machine.name, "workload": workload.name, "batches": workload.num_batches,
                "t_cb_ms": 1e3 * profile.cpu_batch_time(), "t_gb_ms": 1e3 * profile.gpu_batching.mean_s,
                "t_dma_ms": 1e3 * profile.dma.mean_s, "t_m_ms": 1e3 * profile.training.mean_s,
                "all_cpu_s": plan.baselines_s["all-cpu"], "all_gpu_s": plan.baselines_s["all-gpu"],
                "adaptive_s": plan.predicted_epoch_s, "lower_bound_s": plan.lower_bound_s,
                "speedup_vs_all_cpu": plan.baselines_s["all-cpu"] / plan.predicted_epoch_s,
                "speedup_vs_all_gpu": plan.baselines_s["all-gpu"] / plan.predicted_epoch_s,
                "cpu_share": plan.cpu_share, "schedule": plan.kind,
            })
    return rows


def summary(rows: list[dict]) -> dict:
    out = {}
    for baseline in ("all_cpu", "all_gpu"):
        values = [row[f"speedup_vs_{baseline}"] for row in rows]
        out[baseline] = {"avg": statistics.fmean(values), "geomean": statistics.geometric_mean(values),
                         "max": max(values), "min": min(values)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=None, help="also write all numbers as JSON")
    parser.add_argument("--repeats", type=int, default=5, help="planning-time repetitions per profile")
    args = parser.parse_args()

    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    facts = HardwareFacts.detect()
    print(f"# bench_planner  {started}  {facts.cpu_model}, {facts.usable_cores} usable cores, "
          f"{facts.memory_bytes / 2**30:.0f} GiB, python {platform.python_version()}")

    timing = bench_planning_time(args.repeats)
    print("\n(a) planning time from a saved profile (load + plan, SimPy reporting run included)")
    print(f"{'profile':<20} {'cv':>4} {'batches':>8} {'median s':>9} {'max s':>7} {'sims':>5} {'schedule':>9} "
          f"{'gap':>6}")
    for row in timing:
        print(f"{row['profile']:<20} {row['cv']:>4} {row['batches']:>8} {row['median_s']:>9.3f} {row['max_s']:>7.3f} "
              f"{row['evaluations']:>5} {row['schedule']:>9} {row['optimality_gap']:>6.1%}")

    engines = bench_engines(args.repeats)
    print(f"\n(b) one simulated epoch of {engines['batches']} batches (split {engines['split']}): SimPy "
          f"{engines['simpy_median_s']:.3f} s, fast twin {engines['fast_median_s']:.3f} s (median of "
          f"{args.repeats}); identical epoch: {engines['same_epoch']}")

    grid = bench_grid()
    print("\n(c) simulated epoch (s) on modelled machines: adaptive plan vs baselines (same simulator)")
    print(f"{'machine':<42} {'workload':<22} {'T_CB':>6} {'T_GB':>6} {'T_DMA':>6} {'T_M':>6} {'all-CPU':>8} "
          f"{'all-GPU':>8} {'adaptive':>8} {'vs CPU':>7} {'vs GPU':>7} {'CPU share':>9}")
    for row in grid:
        print(f"{row['machine']:<42} {row['workload']:<22} {row['t_cb_ms']:>6.1f} {row['t_gb_ms']:>6.1f} "
              f"{row['t_dma_ms']:>6.1f} {row['t_m_ms']:>6.1f} {row['all_cpu_s']:>8.3f} {row['all_gpu_s']:>8.3f} "
              f"{row['adaptive_s']:>8.3f} {row['speedup_vs_all_cpu']:>6.2f}x {row['speedup_vs_all_gpu']:>6.2f}x "
              f"{row['cpu_share']:>9.1%}")
    print("(phase times in ms per batch; T_CB with every core batching)")
    totals = summary(grid)
    print("\nspeedup of the adaptive plan        avg    geomean   max    min   | paper Table V (avg / max)")
    for baseline, label in (("all_cpu", "over all-CPU (SALIENT-like)"), ("all_gpu", "over all-GPU (DUCATI-like)")):
        paper = PAPER[baseline.replace("_", "-")]
        print(f"  {label:<32} {totals[baseline]['avg']:>5.2f}x {totals[baseline]['geomean']:>6.2f}x "
              f"{totals[baseline]['max']:>5.2f}x {totals[baseline]['min']:>5.2f}x | {paper['system']}: "
              f"{paper['avg']:.2f}x / {paper['max']:.2f}x")

    document = {"started": started, "machine": facts.to_dict(), "planning_time": timing, "engines": engines,
                "grid": grid,
                "summary": totals, "paper_table_v": PAPER}
    print("\n" + json.dumps({"summary": totals}, indent=None))
    if args.json is not None:
        args.json.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
