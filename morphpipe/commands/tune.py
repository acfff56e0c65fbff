"""`morphpipe tune`: profile this machine on a workload, plan the CPU:GPU split, print and save it."""
from __future__ import annotations

import argparse
from pathlib import Path

from morphpipe.commands import arguments, tiering
from morphpipe.commands.workload import (add_workload_arguments, format_profile, workload_profiler, workload_settings,
                                         workload_task)
from morphpipe.outputs import check_output_file
from morphpipe.profiler.profiler import DEVICES
from morphpipe.scheduler import Plan, plan_from_profile


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("tune", help="profile the phases, plan the CPU:GPU split, print and save the plan")
    add_workload_arguments(parser, from_plan=False)
    parser.add_argument("--device", default="auto", choices=DEVICES)
    parser.add_argument("--threads", default=None,
                        help="CPU thread counts to profile, e.g. 1,2,4 (default: powers of two up to the usable cores)")
    parser.add_argument("--steps", type=arguments.positive_int, default=8, help="timed steps per measurement (default 8)")
    parser.add_argument("--warmup", type=arguments.non_negative_int, default=2, help="untimed steps before each measurement (default 2)")
    parser.add_argument("--gbs", type=arguments.positive_int, default=10, help="GPU buffer size in batches (default 10, as the paper)")
    parser.add_argument("--seed", type=arguments.seed, default=0, help="random seed (default 0)")
    parser.add_argument("-o", "--output", default="plan.json", help="where to write the plan (default plan.json)")
    parser.add_argument("--profile-output", default="profile.json",
                        help="where to write the measured profile (default profile.json)")
    parser.add_argument("--gantt", default=None, help="also draw the planned schedule as a Gantt chart PNG here")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from morphpipe import native
    from morphpipe.data import load_dataset

    for option, path in (("-o", args.output), ("--profile-output", args.profile_output), ("--gantt", args.gantt)):
        if path is not None:
            check_output_file(path, option)
    native.prepare()
    graph = load_dataset(args.dataset, **arguments.feature_tier(args, fill_cache=False))
    tiering.place_features(graph, args)
    settings = workload_settings(args)
    task = workload_task(settings)
    task.check_graph(graph)
    print(f"dataset {graph.name}: {graph.num_nodes:,} nodes, {graph.num_edges:,} edges, "
          f"{graph.feature_dim} x {str(graph.feature_dtype).removeprefix('torch.')} features, "
          f"{len(task.seeds(graph)):,} training {'edges' if task.name == 'link' else 'seeds'}")
    profile = workload_profiler(graph, args, settings, progress=True, warmup=args.warmup).run()
    profile.save(args.profile_output)
    print(format_profile(profile))
    plan: Plan = plan_from_profile(profile, gbs=args.gbs, seed=args.seed,
                                   cache_bytes=tiering.planned_cache_bytes(args))
    plan.save(args.output)
    print(f"plan ({plan.engine} simulation, {plan.evaluations} evaluations):")
    print("  " + plan.describe().replace("\n", "\n  "))
    print(tiering.describe_tiers(graph, plan))
    print(f"wrote {args.output} and {args.profile_output}")
    if args.gantt:
        from morphpipe.scheduler.simulate_plan import draw_plan

        print(f"wrote {draw_plan(profile, plan, Path(args.gantt))}")
    return 0
