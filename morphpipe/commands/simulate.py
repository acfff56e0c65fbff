"""`morphpipe simulate`: what-if predictions from one profile for other core counts and PCIe links.

With `--node PROFILE:COUNT[:CORES] ...`: a cluster's epoch with even and weighted seed splits. Each
--node names one node type: a profile, how many nodes of it, and optionally a what-if core count
(the profile re-read for that many cores, as `--cores` does). One rank per node. Both splits are
planned rank by rank from the same simulator (morphpipe.distributed.cluster).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from morphpipe.commands import arguments
from morphpipe.distributed.cluster import (
    ClusterPrediction,
    NodeType,
    cluster_profiles,
    predict_cluster,
    profiled_batch_size,
)
from morphpipe.outputs import check_output_file, write_text_atomic
from morphpipe.profiler.profile import Profile
from morphpipe.scheduler import whatif
from morphpipe.scheduler.plan import Plan
from morphpipe.scheduler.plots import plot_cores_sweep
from morphpipe.scheduler.simulate_plan import draw_plan

_EPILOG = """\
what-if model:
  --cores N      the machine has N usable cores and the CPU batcher runs N threads; the CPU
                 batching time per batch T_CB(N) comes from the profile's thread-count
                 measurements (interpolated in throughput; beyond the largest measured count
                 each thread adds the marginal gain measured last; never better past N cores).
                 GPU phases are unchanged. A CPU-only profile splits the N cores between
                 batching and training threads instead.
  --pcie-gbps X  with r = (this machine's link GB/s) / X, DMA takes r times as long, and so does
                 the transfer part of UVA batching (the profile's uva_transfer_s if measured,
                 else min(T_GB, T_DMA)); the rest of T_GB is unchanged. This machine's link is
                 its theoretical bandwidth from the hardware facts, else batch_bytes / T_DMA.
  --ram-scale X  (features on disk) X times the memory budget for data: the topology keeps its
                 share, the feature cache may take the rest and the planner sizes it again;
                 beyond the largest measured cache size the hit ratio rises linearly to 1.
  --disk-speed X (features on disk) random and sequential reads X times as fast.

columns: predicted epoch (s) of the all-CPU pipeline (SALIENT-like), all-GPU (DUCATI-like) and
the adaptive plan; speedup of the plan over the better baseline; the plan's CPU share of batches.
"""


def parse_cores(text: str) -> list[int]:
    """'2,4,8' or '2,4,...,16' (an arithmetic progression) -> a list of core counts >= 1."""
    parts = [part.strip() for part in text.split(",") if part.strip()]
    try:
        if "..." in parts:
            at = parts.index("...")
            if at < 2 or at != len(parts) - 2:
                raise ValueError
            first, second, last = int(parts[at - 2]), int(parts[at - 1]), int(parts[at + 1])
            step = second - first
            if step <= 0 or last < second:
                raise ValueError
            counts = [int(p) for p in parts[: at - 2]] + list(range(first, last + 1, step))
        else:
            counts = [int(part) for part in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--cores must be a comma-separated list like 2,4,8 or a progression like 2,4,...,16, got {text!r}"
        ) from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"--cores values must be integers >= 1, got {text!r}")
    return counts


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds the `simulate` sub-command."""
    parser = subparsers.add_parser(
        "simulate",
        help="what-if predictions from a profile for other core counts / PCIe bandwidth",
        description="Predict epoch times of the all-CPU, all-GPU and adaptive plans from one saved profile, "
                    "for other core counts and PCIe bandwidths (the paper's Figure 9).",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("profile", type=Path, nargs="?", default=None,
                        help="profile JSON written by `morphpipe tune` (or give a cluster with --node)")
    parser.add_argument("--cores", type=parse_cores, default=None,
                        help="core counts to predict, e.g. 2,4,8,16 or 2,4,...,16 (default: the profile's own)")
    parser.add_argument("--pcie-gbps", type=arguments.positive_float, default=None,
                        help="PCIe bandwidth of the what-if machine in GB/s (default: this machine's)")
    parser.add_argument("--ram-scale", type=arguments.positive_float, default=None,
                        help="features on disk: the what-if machine has this many times the memory budget, e.g. 2")
    parser.add_argument("--disk-speed", type=arguments.positive_float, default=None,
                        help="features on disk: the what-if machine's disk reads this many times as fast, e.g. 4")
    parser.add_argument("--gbs", type=arguments.positive_int, default=10, help="GPU buffer size in batches (default 10)")
    parser.add_argument("--seed", type=arguments.seed, default=0, help="seed of the stochastic phase durations (default 0)")
    parser.add_argument("--plot", type=Path, default=None, help="write epoch time vs cores (Figure 9) as PNG")
    parser.add_argument("--gantt", type=Path, default=None,
                        help="write a Gantt chart PNG of the first batches of the plan at the last core count")
    parser.add_argument("--json", type=Path, default=None, help="write the plans as a JSON list")
    add_cluster_arguments(parser)
    parser.set_defaults(func=run_simulate)


def run_simulate(args: argparse.Namespace) -> int:
    """Runs the what-if sweep (or, with --node, the cluster prediction) and prints the table."""
    for option, path in (("--plot", args.plot), ("--gantt", args.gantt), ("--json", args.json)):
        if path is not None:
            check_output_file(path, option)
    if args.node:
        return run_cluster(args)
    if args.profile is None:
        raise ValueError("give a profile (morphpipe simulate PROFILE.json) or a cluster (--node PROFILE:COUNT ...)")
    profile = Profile.load(args.profile)
    cores = args.cores or [profile.cores]
    scales = {"memory": args.ram_scale, "disk_speed": args.disk_speed}
    for note in whatif.what_if(profile, None, args.pcie_gbps, **scales).notes:
        print(f"what-if: {note}")
    plans = whatif.sweep(profile, cores, args.pcie_gbps, args.gbs, args.seed, **scales)
    print(format_table(cores, plans))
    if plans[-1].tiering is not None:
        print(f"at {cores[-1]} cores: {plans[-1].tiering.describe()}")
    if args.plot is not None:
        print(f"wrote {plot_cores_sweep(cores, plans, args.plot, title=_title(profile, args.pcie_gbps))}")
    if args.gantt is not None:
        print(f"wrote {_gantt(profile, cores[-1], args, plans[-1])}")
    if args.json is not None:
        write_text_atomic(args.json, json.dumps([plan.to_dict() for plan in plans], indent=2) + "\n", "--json")
        print(f"wrote {args.json}")
    return 0


def format_table(cores: list[int], plans: list[Plan]) -> str:
    """The what-if table: one row per core count."""
    cpu_only = plans[0].kind == "cpu-only"
    if cpu_only:
        header = f"{'cores':>5}  {'even split':>11}  {'adaptive':>11}  {'speedup':>7}  {'batch/train threads':>19}"
        rows = [
            f"{count:>5}  {plan.baselines_s['even-split']:>11.4g}  {plan.predicted_epoch_s:>11.4g}  "
            f"{plan.speedup:>6.2f}x  {threads_column(plan):>19}"
            for count, plan in zip(cores, plans)
        ]
    else:
        header = (f"{'cores':>5}  {'all-CPU (s)':>11}  {'all-GPU (s)':>11}  {'adaptive (s)':>12}  {'speedup':>7}  "
                  f"{'CPU share':>9}  {'plan':>8}")
        rows = [
            f"{count:>5}  {plan.baselines_s['all-cpu']:>11.4g}  {plan.baselines_s['all-gpu']:>11.4g}  "
            f"{plan.predicted_epoch_s:>12.4g}  {plan.speedup:>6.2f}x  {plan.cpu_share:>9.1%}  {plan.kind:>8}"
            for count, plan in zip(cores, plans)
        ]
    return "\n".join([header, *rows])


def threads_column(plan: Plan) -> str:
    """'P/Q' batching/training threads of a CPU-only plan, marked when the phases take turns."""
    return f"{plan.cpu_threads}/{plan.train_threads}" + (" turns" if plan.shares_cores else "")


def _title(profile: Profile, pcie_gbps: float | None) -> str:
    name = profile.workload.get("dataset") or profile.workload.get("name") or "profile"
    link = f", PCIe {pcie_gbps:g} GB/s" if pcie_gbps else ""
    return f"Predicted epoch time vs CPU cores ({name}, {profile.num_batches} batches{link})"


def _gantt(profile: Profile, cores: int, args: argparse.Namespace, plan: Plan) -> Path:
    """Re-simulates the plan of the what-if machine with a trace (SimPy) and draws its first batches."""
    what_if = whatif.what_if(profile, cores, args.pcie_gbps, memory=args.ram_scale, disk_speed=args.disk_speed)
    return draw_plan(what_if.profile, plan, args.gantt)


def parse_node(text: str) -> NodeType:
    """'profile.json', 'profile.json:2' or 'profile.json:2:8' (path, node count, what-if cores)."""
    parts = text.rsplit(":", 2)
    numbers: list[int] = []
    while len(parts) > 1 and parts[-1].isdigit():
        numbers.insert(0, int(parts.pop()))
    path = ":".join(parts)
    if not path or len(numbers) > 2 or any(n < 1 for n in numbers):
        raise argparse.ArgumentTypeError(f"--node must be PROFILE[:COUNT[:CORES]] with COUNT, CORES >= 1, got {text!r}")
    count = numbers[0] if numbers else 1
    return NodeType(Path(path), count, numbers[1] if len(numbers) > 1 else None)


def add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    """The cluster options of `morphpipe simulate`."""
    parser.add_argument("--node", type=parse_node, action="append", default=None, metavar="PROFILE[:COUNT[:CORES]]",
                        help="a node type of a cluster (repeat): its profile, how many nodes, optionally a what-if "
                             "core count; predicts the cluster epoch with even and weighted seed splits")
    parser.add_argument("--batch-size", type=arguments.positive_int, default=None,
                        help="with --node: the global batch (default: the first profile's batch size)")
    parser.add_argument("--seeds", type=arguments.positive_int, default=None,
                        help="with --node: training seeds per epoch (default: the first profile's batches x batch size)")


def format_cluster(nodes: list[NodeType], even: ClusterPrediction, weighted: ClusterPrediction) -> str:
    """Per node type: throughput, and local batch and epoch under each split; then the cluster epochs."""
    header = (f"{'node type':<28}  {'nodes':>5}  {'seeds/s':>9}  {'even batch':>10}  {'even (s)':>9}  "
              f"{'weighted batch':>14}  {'weighted (s)':>12}")
    rows, rank = [], 0
    for node in nodes:
        rows.append(f"{node.label:<28}  {node.count:>5}  {even.throughputs[rank]:>9.0f}  "
                    f"{even.split.local_batches[rank]:>10}  {even.plans[rank].predicted_epoch_s:>9.3f}  "
                    f"{weighted.split.local_batches[rank]:>14}  {weighted.plans[rank].predicted_epoch_s:>12.3f}")
        rank += node.count
    summary = (f"cluster epoch ({rank} ranks, {even.split.steps} steps of {even.split.global_batch} seeds): even "
               f"{even.epoch_s:.4g} s, weighted {weighted.epoch_s:.4g} s -> {even.epoch_s / weighted.epoch_s:.2f}x "
               "(slowest rank; all-reduce not modelled)")
    return "\n".join([header, *rows, summary])


def run_cluster(args: argparse.Namespace) -> int:
    """Plans the cluster under both splits and prints the table."""
    profiles, _ = cluster_profiles(args.node)
    batch = args.batch_size or profiled_batch_size(profiles[0])
    seeds = args.seeds or profiles[0].num_batches * profiled_batch_size(profiles[0])
    even = predict_cluster(profiles, seeds, batch, "even", args.gbs, args.seed)
    weighted = predict_cluster(profiles, seeds, batch, "weighted", args.gbs, args.seed, throughputs=even.throughputs)
    print(format_cluster(args.node, even, weighted))
    return 0
