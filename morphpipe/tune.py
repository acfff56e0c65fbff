"""`morphpipe tune`: profile this machine on a workload, plan the CPU:GPU split, print and save it."""
from __future__ import annotations

import argparse
from pathlib import Path

from morphpipe.outputs import check_output_file
from morphpipe.profiler.profile import PhaseTiming, Profile, ThreadScaling
from morphpipe.profiler.profiler import DEVICES, Profiler
from morphpipe.sampling.commands import parse_int_list
from morphpipe.scheduler import Plan, plan_from_profile


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("tune", help="profile the phases, plan the CPU:GPU split, print and save the plan")
    parser.add_argument("dataset", nargs="?", default=None, help="preset name or dataset directory (default: default)")
    parser.add_argument("--model", default="sage", choices=["sage", "gcn", "gat", "mlp"])
    parser.add_argument("--hidden", type=int, default=None, help="hidden width (default: the paper's per model)")
    parser.add_argument("--fanouts", default="15,10,5", help="neighbours per hop from the seeds (default 15,10,5)")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--device", default="auto", choices=DEVICES)
    parser.add_argument("--threads", default=None,
                        help="CPU thread counts to profile, e.g. 1,2,4 (default: powers of two up to the usable cores)")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per measurement (default 8)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps before each measurement (default 2)")
    parser.add_argument("--gbs", type=int, default=10, help="GPU buffer size in batches (default 10, as the paper)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("-o", "--output", default="plan.json", help="where to write the plan (default plan.json)")
    parser.add_argument("--profile-output", default="profile.json",
                        help="where to write the measured profile (default profile.json)")
    parser.add_argument("--gantt", default=None, help="also draw the planned schedule as a Gantt chart PNG here")
    parser.set_defaults(func=run)


def format_timing(timing: PhaseTiming) -> str:
    return f"{timing.mean_s * 1e3:9.2f} ms  (cv {timing.cv:.0%}, {timing.samples} samples)"


def format_scaling(name: str, scaling: ThreadScaling) -> list[str]:
    return [f"  {name} x{threads:<3} {format_timing(timing)}" for threads, timing in scaling.points.items()]


def format_profile(profile: Profile) -> str:
    """The measured phase times as a table (per delivered batch)."""
    lines = [f"measured phases (per batch; {profile.num_batches} batches of {profile.batch_bytes / 1e6:.1f} MB "
             f"per epoch, {profile.cores} usable cores):"]
    if profile.contention:
        contention = profile.contention
        lines.insert(1, f"  measured on a {'BUSY' if profile.taken_on_busy_machine else 'quiet'} machine: other "
                        f"processes used {contention['other_cores']:.2f} of {contention['cores']} cores, "
                        f"load {contention['load_average']:.2f}")
    lines += format_scaling("CPU batching    ", profile.cpu_batching)
    if profile.cpu_training is not None:
        lines += format_scaling("CPU training    ", profile.cpu_training)
    for name, timing in (("GPU batching    ", profile.gpu_batching), ("DMA to GPU      ", profile.dma),
                         ("GPU training    ", profile.training)):
        if timing is not None:
            lines.append(f"  {name}     {format_timing(timing)}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from morphpipe import native
    from morphpipe.data import load_dataset

    for option, path in (("-o", args.output), ("--profile-output", args.profile_output), ("--gantt", args.gantt)):
        if path is not None:
            check_output_file(path, option)
    native.prepare()
    graph = load_dataset(args.dataset)
    print(f"dataset {graph.name}: {graph.num_nodes:,} nodes, {graph.num_edges:,} edges, "
          f"{graph.feature_dim} x {str(graph.features.dtype).removeprefix('torch.')} features, "
          f"{len(graph.train_idx):,} training seeds")
    profiler = Profiler(
        graph, model=args.model, fanouts=parse_int_list(args.fanouts, "--fanouts"), batch_size=args.batch_size,
        hidden=args.hidden, device=args.device,
        thread_counts=parse_int_list(args.threads, "--threads") if args.threads else None,
        warmup=args.warmup, steps=args.steps, seed=args.seed,
    )
    profile = profiler.run()
    profile.save(args.profile_output)
    print(format_profile(profile))
    plan: Plan = plan_from_profile(profile, gbs=args.gbs, seed=args.seed)
    plan.save(args.output)
    print(f"plan ({plan.engine} simulation, {plan.evaluations} evaluations):")
    print("  " + plan.describe().replace("\n", "\n  "))
    print(f"wrote {args.output} and {args.profile_output}")
    if args.gantt:
        from morphpipe.scheduler.simulate_plan import draw_plan

        print(f"wrote {draw_plan(profile, plan, Path(args.gantt))}")
    return 0
