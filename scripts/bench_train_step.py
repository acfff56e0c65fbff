"""Training-step benchmark: today's (legacy) step beside the fused one, in the same run (issue 13).

For each preset (default, bench-1m), model (SAGE, GCN, GAT) and thread count (1, 2): the
per-step time (median of the timed steps after one warm-up) and the step's peak memory of
  legacy: F.relu + F.dropout, SAGE's separate projections + add, torch's for-loop Adam
          (`morphpipe.ops.step_variant.LEGACY_STEP`, the step as it was), and
  fused:  the fused bias + ReLU + dropout op, SAGE's projections in one GEMM pass, fused Adam
          (`FUSED_STEP`, the default),
both on the same pre-sampled batches, with the fused step's GEMM floor (its own mm/addmm products, recorded
from a step, at torch mm's best float32 rate: `morphpipe.profiler.ceiling`) and its share of the step; the
fused step in bf16 (`TrainStep(precision="bf16")`: bfloat16 autocast, float32 master weights) and at every
CPU instruction-set level (`--cpu-levels`, default all this CPU supports), these taking turns step by step; a
torch.profiler per-op breakdown of one step of each (default preset, the largest thread count); and
`morphpipe train <preset> --auto --epochs 2` epoch times before and after (a fresh process each): "legacy" is
the product as it was (the legacy step, torch's allocator without huge pages), "fused" as it is
(`morphpipe.huge_pages`). The
per-step table runs both variants in this process, under its own environment: run it once more
with THP_MEM_ALLOC_ENABLE=0 to time both without huge pages.

Peak memory: the step's high-water mark of resident memory above what was resident before it
(/proc/self/clear_refs resets the mark), taken in a child process of this script run with
MALLOC_MMAP_THRESHOLD_=131072 and MORPHPIPE_CPU_MEMORY_REUSE=0 so that freed tensors go back to the OS and each
step's peak is its own. In this process both variants' steps run with the reusing CPU allocator
(`morphpipe.ops.cpu_memory`, process-wide once a step exists); the legacy `morphpipe train` run goes without it.
Step times are taken here, with glibc's own thresholds, as in a `morphpipe train` process (under that
setting every tensor of 128 KiB or more would be fresh memory, and page faults would inflate the times).

Usage: python scripts/bench_train_step.py [--presets default,bench-1m] [--models sage,gcn,gat]
         [--threads 1,2] [--steps default=4,bench-1m=2] [--train-epochs 2] [--no-train] [--json out.json]
         [--cpu-levels baseline,avx2,avx512] [--no-peaks]
"""
from __future__ import annotations

import os
import sys

# What the user set, before `import morphpipe` adds its defaults (the `morphpipe train` runs start from it).
USER_ENVIRONMENT = dict(os.environ)

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import morphpipe  # noqa: E402,F401  (sets the OpenMP wait policy before torch loads)
import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from morphpipe.data import load_dataset  # noqa: E402
from morphpipe.nn import build_model  # noqa: E402
from morphpipe.nn.train_step import TrainStep, make_optimizer  # noqa: E402
from morphpipe.huge_pages import HUGE_PAGES_ENV, huge_pages  # noqa: E402
from morphpipe.ops.cpu_memory import REUSE_ENV  # noqa: E402
from morphpipe.openmp_env import wait_policy  # noqa: E402
from morphpipe.ops.step_variant import FUSED_STEP, LEGACY_STEP, StepVariant, use_step_variant  # noqa: E402
from morphpipe import native  # noqa: E402
from morphpipe.profiler.ceiling import isa_flags, measure_gemm, recorded_gemm_shapes, share  # noqa: E402
from morphpipe.profiler.hardware import HardwareFacts  # noqa: E402
from morphpipe.sampling import CpuBatcher  # noqa: E402

VARIANTS: dict[str, StepVariant] = {"legacy": LEGACY_STEP, "fused": FUSED_STEP}
FANOUTS = [15, 10, 5]
BATCH_SIZE = 1024
TOP_OPS = 8


def status_kib(field: str) -> int:
    """A field of /proc/self/status in KiB (VmRSS, VmHWM)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def reset_peak() -> None:
    """Resets the resident-memory high-water mark (VmHWM) to the current RSS."""
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")


def sample_batches(graph, count: int) -> list:
    """The first `count` batches of epoch 0 (the same for every variant)."""
    batches = []
    with CpuBatcher(graph, FANOUTS, BATCH_SIZE, num_threads=2, seed=0) as batcher:
        for batch in batcher:
            batches.append(batch)
            if len(batches) == count:
                break
    return batches


def new_step(name: str, graph, precision: str = "float32") -> TrainStep:
    torch.manual_seed(0)
    model = build_model(name, graph.feature_dim, graph.num_classes)
    return TrainStep(model, make_optimizer(model.parameters(), 3e-3, "cpu"), precision=precision)


def time_steps(name: str, graph, batches: list, variant: StepVariant, steps: int,
               gemm_ceiling: bool = True) -> dict[str, float]:
    """Median seconds per step and the largest step peak (MiB above the RSS before it), after one warm-up step;
    with `gemm_ceiling`, also the step's GEMM floor: its own products (recorded) at torch mm's best float32 rate."""
    with use_step_variant(variant):
        step = new_step(name, graph)
        step(batches[0])
        floor = {}
        if gemm_ceiling:
            ceiling = measure_gemm(recorded_gemm_shapes(lambda: step(batches[0])), torch.float32)
            floor = {"gemm_floor_s": ceiling.seconds, "gemm_gflop_per_s": ceiling.gflop_per_s}
        seconds, peaks = [], []
        for i in range(steps):
            batch = batches[1 + i % (len(batches) - 1)]
            gc.collect()
            before = status_kib("VmRSS")
            reset_peak()
            start = time.perf_counter()
            step(batch)
            seconds.append(time.perf_counter() - start)
            peaks.append((status_kib("VmHWM") - before) / 1024)
    return {"step_s": statistics.median(seconds), "peak_mib": max(peaks), **floor}


def time_configurations(name: str, graph, batches: list, cpu_levels: tuple[str, ...], steps: int) -> dict[str, float]:
    """Median seconds of the fused step at each CPU level of `cpu_levels` (float32) and in bf16 (at the level in use),
    the configurations taking turns step by step so that a changing machine load falls on all of them alike."""
    configurations = {level: (level, "float32") for level in cpu_levels}
    configurations["bf16"] = (native.load().cpu_capability(), "bf16")
    seconds: dict[str, list[float]] = {config: [] for config in configurations}
    with use_step_variant(FUSED_STEP):
        trainers = {config: new_step(name, graph, precision) for config, (_, precision) in configurations.items()}
        for i in range(steps + 1):  # the first round warms each up
            batch = batches[i % len(batches)]
            for config, (level, _) in configurations.items():
                with native.forced_cpu_capability(level):
                    start = time.perf_counter()
                    trainers[config](batch)
                    if i:
                        seconds[config].append(time.perf_counter() - start)
    return {config: statistics.median(times) for config, times in seconds.items()}


def op_breakdown(name: str, graph, batches: list, variant: StepVariant) -> list[tuple[str, float]]:
    """The top ops of one profiled step by self CPU time (ms)."""
    with use_step_variant(variant):
        step = new_step(name, graph)
        step(batches[0])
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            step(batches[1])
    events = sorted(prof.key_averages(), key=lambda event: event.self_cpu_time_total, reverse=True)
    return [(event.key, event.self_cpu_time_total / 1000) for event in events[:TOP_OPS]]


TRAIN = ("import sys; from morphpipe.ops.step_variant import set_step_variant, {0}; set_step_variant({0}); "
         "from morphpipe.commands.cli import main; sys.exit(main(sys.argv[1:]))")
EPOCH_LINE = re.compile(r"epoch (\d+)/\d+: ([0-9.]+) s")


def train_epochs(preset: str, variant: str, epochs: int) -> dict[str, object]:
    """`morphpipe train PRESET --auto --epochs N` in a fresh process, as a user runs it (glibc's own malloc
    thresholds); "legacy" is the product before issue 13 (the legacy step, no huge pages), "fused" as it is now."""
    constant = "LEGACY_STEP" if variant == "legacy" else "FUSED_STEP"
    command = [sys.executable, "-c", TRAIN.format(constant), "train", preset, "--auto", "--epochs", str(epochs)]
    environment = {key: value for key, value in os.environ.items()
                   if key not in ("MALLOC_MMAP_THRESHOLD_", HUGE_PAGES_ENV)}
    if HUGE_PAGES_ENV in USER_ENVIRONMENT:
        environment[HUGE_PAGES_ENV] = USER_ENVIRONMENT[HUGE_PAGES_ENV]
    elif variant == "legacy":
        environment[HUGE_PAGES_ENV] = "0"
    if variant == "legacy":
        environment[REUSE_ENV] = "0"  # torch's own allocator, as before the reusing one
    start = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, check=True, env=environment)
    epochs_s = [float(match.group(2)) for match in EPOCH_LINE.finditer(result.stdout + result.stderr)]
    return {"epochs_s": epochs_s, "wall_s": time.perf_counter() - start,
            "huge_pages": environment.get(HUGE_PAGES_ENV, "unset: morphpipe sets 1")}


def measure_steps(presets: list[str], models: list[str], threads: list[int], steps: dict[str, int],
                  report: dict[str, object] | None = None, cpu_levels: tuple[str, ...] = ()):
    """Yields (preset, model, threads, variant, time_steps result) for every combination, and the fused step at each
    of `cpu_levels` and in bf16 (variants "fused@LEVEL", "fused@bf16", taking turns: `time_configurations`); with
    `report`, also the per-op breakdown of each model on the first preset at the largest thread count and the GEMM
    floors."""
    for preset in presets:
        graph = load_dataset(preset)
        count = steps.get(preset, 2)
        batches = sample_batches(graph, count + 1)
        for name in models:
            for count_threads in threads:
                torch.set_num_threads(count_threads)
                for variant in VARIANTS:
                    yield preset, name, count_threads, variant, time_steps(name, graph, batches, VARIANTS[variant],
                                                                           count, gemm_ceiling=report is not None)
                if report is not None:
                    for config, seconds in time_configurations(name, graph, batches, cpu_levels, count).items():
                        yield preset, name, count_threads, f"fused@{config}", {"step_s": seconds}
            if report is not None and preset == presets[0]:
                torch.set_num_threads(max(threads))
                report["ops"][name] = {variant: op_breakdown(name, graph, batches, VARIANTS[variant])
                                       for variant in VARIANTS}


def measure_peaks(args: argparse.Namespace) -> dict[str, float]:
    """Step peaks from a child process in which freed tensors go back to the OS (MALLOC_MMAP_THRESHOLD_)."""
    with tempfile.TemporaryDirectory() as directory:
        out = os.path.join(directory, "peaks.json")
        command = [sys.executable, __file__, "--presets", args.presets, "--models", args.models, "--threads",
                   args.threads, "--steps", args.steps, "--peaks-only", "--json", out]
        subprocess.run(command, check=True, env={**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", REUSE_ENV: "0"})
        with open(out) as peaks:
            return json.load(peaks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="default,bench-1m")
    parser.add_argument("--models", default="sage,gcn,gat")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--steps", default="default=4,bench-1m=2", help="timed steps per preset")
    parser.add_argument("--train-epochs", type=int, default=2)
    parser.add_argument("--no-train", action="store_true", help="skip the `morphpipe train` runs")
    parser.add_argument("--json", default=None)
    parser.add_argument("--cpu-levels", default=None,
                        help="CPU instruction-set levels to time the fused step at, e.g. baseline,avx2,avx512 "
                             "(default: every level this CPU supports; '' to skip)")
    parser.add_argument("--no-peaks", action="store_true",
                        help="skip the step peaks (a child process repeating every step configuration first)")
    parser.add_argument("--peaks-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    presets = args.presets.split(",")
    models = args.models.split(",")
    threads = [int(t) for t in args.threads.split(",")]
    steps = {key: int(value) for key, value in (item.split("=") for item in args.steps.split(","))}
    if args.peaks_only:
        peaks = {f"{preset} {name} {count} {variant}": result["peak_mib"]
                 for preset, name, count, variant, result in measure_steps(presets, models, threads, steps)}
        with open(args.json, "w") as out:
            json.dump(peaks, out)
        return
    peaks = {} if args.no_peaks else measure_peaks(args)
    cpu_levels = tuple(native.supported_cpu_capabilities() if args.cpu_levels is None
                       else [level for level in args.cpu_levels.split(",") if level])
    report: dict[str, object] = {
        "machine": f"{platform.node()} {os.cpu_count()} cpus, torch {torch.__version__}",
        "omp_wait_policy": wait_policy().line(), "huge_pages": huge_pages().line(), "steps": [], "ops": {},
        "train": {}}
    report["cpu"] = f"{HardwareFacts.detect().cpu_model} ({' '.join(isa_flags())}); CPU kernels " \
                    f"{native.cpu_capability_info()}; load {os.getloadavg()[0]:.1f}"
    print(f"# {report['machine']}; {report['cpu']}; OpenMP wait policy {report['omp_wait_policy']}; "
          f"huge pages for large tensors {report['huge_pages']}")
    print("| preset | model | threads | legacy step s | fused step s | speedup | legacy peak MiB | fused peak MiB "
          "| fused GEMM floor s (share of step) |")
    print("|---|---|---|---|---|---|---|---|---|")
    rows: dict[tuple[str, str, int], dict[str, dict[str, float]]] = {}
    levels: dict[tuple[str, str, int], dict[str, float]] = {}
    for preset, name, count_threads, variant, result in measure_steps(presets, models, threads, steps, report,
                                                                      cpu_levels):
        if "@" in variant:
            levels.setdefault((preset, name, count_threads), {})[variant.split("@")[1]] = result["step_s"]
            continue
        result["peak_mib"] = peaks.get(f"{preset} {name} {count_threads} {variant}", float("nan"))
        row = rows.setdefault((preset, name, count_threads), {})
        row[variant] = result
        if len(row) < len(VARIANTS):
            continue
        speedup = row["legacy"]["step_s"] / row["fused"]["step_s"]
        report["steps"].append({"preset": preset, "model": name, "threads": count_threads, **row, "speedup": speedup})
        print(f"| {preset} | {name} | {count_threads} | {row['legacy']['step_s']:.3f} | "
              f"{row['fused']['step_s']:.3f} | {speedup:.2f}x | {row['legacy']['peak_mib']:.0f} | "
              f"{row['fused']['peak_mib']:.0f} | {row['fused']['gemm_floor_s']:.3f} "
              f"({share(row['fused']['gemm_floor_s'], row['fused']['step_s'])}) |", flush=True)
    report["cpu_levels"] = {" ".join(map(str, key)): value for key, value in levels.items()}
    print("\n| preset | model | threads | fused float32 step s | fused bf16 step s | bf16 speedup |")
    print("|---|---|---|---|---|---|")
    active = native.load().cpu_capability()
    for (preset, name, count_threads), by_config in levels.items():
        float32 = by_config[active] if active in by_config else rows[(preset, name, count_threads)]["fused"]["step_s"]
        print(f"| {preset} | {name} | {count_threads} | {float32:.3f} | {by_config['bf16']:.3f} | "
              f"{float32 / by_config['bf16']:.2f}x |")
    if cpu_levels:
        print(f"\n| preset | model | threads | " + " | ".join(f"fused step s, {level}" for level in cpu_levels)
              + " | " + " | ".join(f"{level} speedup" for level in cpu_levels[1:]) + " |")
        print("|---|---|---|" + "---|" * (2 * len(cpu_levels) - 1))
        for (preset, name, count_threads), by_level in levels.items():
            base = by_level[cpu_levels[0]]
            print(f"| {preset} | {name} | {count_threads} | "
                  + " | ".join(f"{by_level[level]:.3f}" for level in cpu_levels) + " | "
                  + " | ".join(f"{base / by_level[level]:.2f}x" for level in cpu_levels[1:]) + " |")
    for name, variants in report["ops"].items():
        for variant, ops in variants.items():
            listed = ", ".join(f"{op} {ms:.0f}" for op, ms in ops)
            print(f"ops ms ({presets[0]}, {name}, {variant}, {max(threads)} threads): {listed}")
    if not args.no_train:
        torch.set_num_threads(max(threads))
        for variant in VARIANTS:
            report["train"][variant] = train_epochs(presets[0], variant, args.train_epochs)
            epochs = ", ".join(f"{s:.2f}" for s in report["train"][variant]["epochs_s"])
            print(f"morphpipe train {presets[0]} --auto --epochs {args.train_epochs} ({variant}): epochs {epochs} s",
                  flush=True)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(report, out, indent=2)


if __name__ == "__main__":
    main()
