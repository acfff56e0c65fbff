"""`morphpipe train`: train a GNN under a saved plan (--plan, or ./plan.json) or one made here and now (--auto).

A saved plan is used only when it was made for this dataset, workload and machine; otherwise
`train` refuses it (or, with --plan-mismatch replan, profiles and plans first). With --replan
epoch (the default) the plan follows the phase times each epoch measures.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

from morphpipe import native
from morphpipe.commands import arguments, tiering, train_distributed
from morphpipe.commands.train_report import print_epoch_summary, run_settings, write_stats
from morphpipe.commands.workload import (
    add_workload_arguments,
    format_profile,
    model_from_spec,
    model_spec,
    workload_profiler,
    workload_settings,
    workload_task,
)
from morphpipe.executor.replan import REPLAN_MODES, Replanner
from morphpipe.executor.stopping import DEFAULT_GRACE_S
from morphpipe.nn.finite_guard import ON_NONFINITE
from morphpipe.outputs import check_output_dir, check_output_file
from morphpipe.profiler.cache_ranking import rank_cache_by_workload
from morphpipe.profiler.profile import Profile
from morphpipe.profiler.profiler import DEVICES
from morphpipe.scheduler import Plan, plan_from_profile
from morphpipe.scheduler.provenance import hardware_problems, plan_mismatches

DEFAULT_PLAN = Path("plan.json")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds the `train` sub-command."""
    parser = subparsers.add_parser(
        "train", help="train a GNN with the dual-buffer executor under a plan",
        description="Train GraphSAGE / GCN / GAT / MLP with the dual-buffer executor. With --plan, the model, "
                    "fanouts, batch size and hidden width default to the ones the plan was made for.")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--plan", type=Path, help="plan JSON written by `morphpipe tune` (default: ./plan.json when it "
                                                  "was made for this dataset and workload, else as --auto)")
    source.add_argument("--auto", action="store_true", help="profile this machine and plan first (as `morphpipe tune`)")
    source.add_argument("--full-graph", action="store_true",
                        help="no plan, no mini-batches: one step per epoch over the whole graph (graphs that fit), "
                             "with the AdaptGear-selected kernels; validation is exact")
    parser.add_argument("--plan-mismatch", default="refuse", choices=["refuse", "replan"],
                        help="when --plan was made for another dataset, workload or machine: refuse (default) or "
                             "profile and plan first")
    parser.add_argument("--replan", default="epoch", choices=REPLAN_MODES,
                        help="epoch (default): re-plan after every epoch from the measured phase times and switch "
                             "when the new plan is predicted clearly faster; off: keep the first plan")
    parser.add_argument("--profile", type=Path, default=None,
                        help="a saved profile: with --plan, the one the plan was made from, where re-planning starts "
                             "(default: profile.json beside the plan); without, plan from it (distributed runs: each "
                             "node's own)")
    add_workload_arguments(parser, from_plan=True)
    parser.add_argument("--heads", type=arguments.positive_int, default=None, help="GAT attention heads (default 4)")
    parser.add_argument("--dropout", type=arguments.dropout, default=0.5, help="dropout probability in [0, 1) (default 0.5)")
    parser.add_argument("--epochs", type=arguments.positive_int, default=3, help="epochs to train (default 3)")
    parser.add_argument("--lr", type=arguments.positive_float, default=3e-3, help="Adam learning rate (default 0.003)")
    parser.add_argument("--seed", type=arguments.seed, default=0, help="random seed (default 0)")
    parser.add_argument("--device", default="auto", choices=DEVICES, help="where --auto profiles and plans")
    parser.add_argument("--gbs", type=arguments.positive_int, default=10, help="GPU buffer size for --auto (default 10)")
    parser.add_argument("--threads", default=None, help="CPU thread counts --auto profiles, e.g. 1,2,4")
    parser.add_argument("--steps", type=arguments.positive_int, default=8, help="timed steps per --auto measurement (default 8)")
    parser.add_argument("--save-plan", type=Path, default=None,
                        help="write the plan in force at the end (after --auto or re-planning) here, and its "
                             "profile as <name>.profile.json beside it")
    parser.add_argument("--checkpoint-dir", type=Path, default=None,
                        help="write a checkpoint after every epoch here, and continue from the one found there")
    parser.add_argument("--eval-batch-size", type=arguments.positive_int, default=4096,
                        help="seeds per batch of sampled evaluation (default 4096)")
    parser.add_argument("--eval", dest="eval_mode", default="sampled", choices=["sampled", "full"],
                        help="accuracy by sampled mini-batch inference (default) or exact layer-wise full-graph "
                             "inference")
    parser.add_argument("--stats-json", type=Path, default=None, help="write every epoch's stats and the test "
                                                                      "accuracy to this JSON file")
    parser.add_argument("--on-nonfinite", default="stop", choices=ON_NONFINITE,
                        help="at a batch with labels outside the classes or a NaN/infinite loss or gradient: stop "
                             "with the epoch, batch and seeds (default), or skip-batch (no update for that batch; "
                             "skips are counted per epoch)")
    parser.add_argument("--stop-grace", type=arguments.number(0.0), default=DEFAULT_GRACE_S, metavar="SECONDS",
                        help="after SIGTERM mid epoch, finish and checkpoint the epoch if it ends within this many "
                             "seconds, else stop at the next step and checkpoint the steps applied so far (with "
                             "--checkpoint-dir; a rerun trains only the rest of that epoch) "
                             f"(default {DEFAULT_GRACE_S:g}; the scheduler's SIGTERM-to-SIGKILL wait, less the time a "
                             "checkpoint takes)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    train_distributed.add_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Loads the data, gets a plan, trains, reports test accuracy (as one rank when a launcher started us).

    During mini-batch training SIGTERM stops at the epoch's end when it comes within `--stop-grace`, else at the
    next step with a mid-epoch checkpoint (see `morphpipe.executor.stopping`): the message says where to resume
    from; the exit status is 143.
    """
    if args.precision not in (None, "float32") and (args.full_graph or train_distributed.wants_distributed(args)):
        raise ValueError(f"--precision {args.precision} applies to mini-batch training in one process; drop it for "
                         "--full-graph and distributed runs, which train in float32")
    if train_distributed.wants_distributed(args):
        return train_distributed.run(args)
    from morphpipe.data import load_dataset
    from morphpipe.executor.stopping import STOP_EXIT_STATUS, StopRequest, TrainingStopped
    from morphpipe.executor.trainer import Trainer, metric_label

    check_outputs(args)
    graph = load_dataset(args.dataset, **arguments.feature_tier(args, fill_cache=False))
    tiering.place_features(graph, args)
    if args.full_graph:
        if workload_settings(args)["task"] != "node":
            raise ValueError("--full-graph trains node classification only; drop it to train --task link on "
                             "mini-batches")
        return run_full_graph(graph, args, describe_dataset(graph, workload_task(workload_settings(args))))
    plan, profile, settings = choose_plan(graph, args)
    task = workload_task(settings)
    empty = describe_dataset(graph, task)  # checks the task's graph (a typed graph's relation fanouts) first
    rank_cache_by_workload(graph, task, settings["fanouts"], int(settings["batch_size"]),
                           progress=not args.no_progress)
    tiering.apply_tiering(graph, plan, args)
    metric = metric_label(task)
    print("plan:\n  " + plan.describe().replace("\n", "\n  "))
    replanner = None
    if args.replan == "epoch":
        if profile is None:
            print("re-planning off: no profile for this plan (pass --profile, or train with --auto)")
        else:
            replanner = Replanner(profile, gbs=max(plan.gbs, 1) if plan.n_gpu else args.gbs, seed=args.seed,
                                  reprofile=lambda: workload_profiler(graph, args, settings, progress=False).run(),
                                  cache_bytes=tiering.planned_cache_bytes(args))
    spec = model_spec(graph, args, settings)
    precision = str(settings["precision"])
    torch.manual_seed(args.seed)
    model = model_from_spec(spec)
    stop = StopRequest(args.stop_grace)
    with stop.on_sigterm(), Trainer(
            graph, model, plan, fanouts=settings["fanouts"], batch_size=int(settings["batch_size"]), lr=args.lr,
            seed=args.seed, checkpoint_dir=args.checkpoint_dir, eval_batch_size=args.eval_batch_size,
            progress=not args.no_progress, eval_mode=args.eval_mode, task=task,
            model_spec=spec, replanner=replanner, on_nonfinite=args.on_nonfinite, stop=stop,
            precision=precision) as trainer:
        try:
            history = trainer.fit(args.epochs)
        except TrainingStopped as stopped:
            print(f"morphpipe train: {stopped}", file=sys.stderr, flush=True)
            return STOP_EXIT_STATUS
        test_acc = trainer.evaluate("test") if "test" not in empty else None
        final_plan = trainer.plan
    if args.save_plan is not None:
        final_plan.save(args.save_plan)
        if replanner is not None:
            from morphpipe.executor.replan import rescaled_profile

            profile_path = args.save_plan.with_name(args.save_plan.stem + ".profile.json")
            rescaled_profile(replanner.profile, replanner.factors).save(profile_path)
            print(f"wrote {args.save_plan} and {profile_path}")
        else:
            print(f"wrote {args.save_plan}")
    if test_acc is not None:
        print(f"test {'accuracy' if metric == 'acc' else metric} {test_acc:.4f} ({args.eval_mode})")
    print_epoch_summary(history, plan.predicted_epoch_s)
    if args.stats_json is not None:
        write_stats(args.stats_json, {"plan": plan.to_dict()}, {**run_settings(settings, args, graph.name),
                                                                "precision": precision},
                    [stats.to_dict() for stats in history], test_acc)
    return 0


def describe_dataset(graph, task) -> list[str]:
    """Prints the dataset's sizes for `task` and a note on empty held-out splits; returns those splits."""
    from morphpipe.executor.trainer import metric_label

    task.check_graph(graph)
    units = "training edges" if task.name == "link" else "training seeds"
    print(f"dataset {graph.name}: {graph.num_nodes:,} nodes, {graph.num_edges:,} edges, {graph.feature_dim} features"
          f"{' (target type)' if getattr(graph, 'is_hetero', False) else ''}, {graph.num_classes} classes, "
          f"{len(task.seeds(graph)):,} {units}")
    empty = [split for split in ("val", "test") if task.seeds(graph, split).numel() == 0]
    if empty:
        print(f"note: the {' and '.join(empty)} split{'s are' if len(empty) > 1 else ' is'} empty: no "
              f"{' or '.join(empty)} {metric_label(task)} will be reported")
    return empty


def check_outputs(args: argparse.Namespace) -> None:
    """Refuses, before any work, output paths that could not be written after training."""
    for option, path in (("--stats-json", args.stats_json), ("--save-plan", args.save_plan)):
        if path is not None:
            check_output_file(path, option)
    if args.checkpoint_dir is not None:
        check_output_dir(args.checkpoint_dir, "--checkpoint-dir")


def resolve_device(device: str) -> str:
    """"auto" as CUDA when torch sees a device, else the CPU; "cuda" without one is an error."""
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda, but torch sees no CUDA device; use --device cpu or auto")
    return "cuda" if device in ("auto", "cuda") and torch.cuda.is_available() else "cpu"


def run_full_graph(graph, args: argparse.Namespace, empty: list[str]) -> int:
    """`train --full-graph`: one full-graph step per epoch, exact validation and test accuracy."""
    from morphpipe.executor.full_graph import FullGraphTrainer

    settings = workload_settings(args)
    torch.manual_seed(args.seed)
    spec = model_spec(graph, args, settings)
    model = model_from_spec(spec)
    device = resolve_device(args.device)
    trainer = FullGraphTrainer(graph, model, lr=args.lr, device=device, checkpoint_dir=args.checkpoint_dir,
                               model_spec=spec, progress=not args.no_progress, on_nonfinite=args.on_nonfinite)
    history = trainer.fit(args.epochs)
    test_acc = trainer.evaluate("test") if "test" not in empty else None
    if test_acc is not None:
        print(f"test accuracy {test_acc:.4f} (full)")
    if args.stats_json is not None:
        write_stats(args.stats_json, {}, {**run_settings(spec, args, graph.name), "full_graph": True},
                    [vars(stats) for stats in history], test_acc)
    return 0


def choose_plan(graph, args: argparse.Namespace) -> tuple[Plan, Profile | None, dict[str, object]]:
    """The plan to train with, its profile (None if unknown) and the workload settings; says where the plan came from."""
    if args.auto:
        settings = workload_settings(args)
        return *auto_plan(graph, args, settings), settings
    given = args.plan if args.plan is not None else args.profile
    path = given if given is not None else DEFAULT_PLAN if DEFAULT_PLAN.exists() else None
    if path is None:
        print("no --plan given and no ./plan.json here: profiling and planning first (as --auto)")
        settings = workload_settings(args)
        return *auto_plan(graph, args, settings), settings
    if args.plan is None and args.profile is not None:
        profile = Profile.load(args.profile)
        plan = plan_from_profile(profile, gbs=args.gbs, seed=args.seed,
                                 cache_bytes=tiering.planned_cache_bytes(args))
    else:
        plan = Plan.load(path)
    workload = plan.profile.get("workload", {})
    settings = workload_settings(args, workload)
    problems = plan_mismatches(workload, graph, settings) + hardware_problems(plan)
    batches = math.ceil(len(workload_task(settings).seeds(graph)) / int(settings["batch_size"]))
    if batches != plan.num_batches:
        problems.append(f"batches per epoch: plan {plan.num_batches}, now {batches}")
    if problems:
        differences = "; ".join(problems)
        if given is not None and args.plan_mismatch == "refuse":
            raise ValueError(f"{path}: the plan was made for another run ({differences}); re-plan with "
                             "`morphpipe train --auto` or `morphpipe tune`, or pass --plan-mismatch replan")
        print(f"{path} was made for another run ({differences}): profiling and planning first (as --auto)")
        settings = workload_settings(args)
        return *auto_plan(graph, args, settings), settings
    if args.plan is None and args.profile is not None:
        print(f"planned from {path} (made for this dataset and workload)")
        return plan, profile, settings
    if args.plan is None:
        print(f"using {path} (made for this dataset and workload; --auto re-profiles)")
    return plan, saved_profile(args.profile or path.with_name("profile.json"), plan), settings


def saved_profile(path: Path, plan: Plan) -> Profile | None:
    """The profile a saved plan was made from, if it is at `path` and matches the plan's batch count."""
    if not path.exists():
        return None
    profile = Profile.load(path)
    if profile.num_batches != plan.num_batches:
        raise ValueError(f"{path}: the profile has {profile.num_batches} batches per epoch, the plan "
                         f"{plan.num_batches}; pass the profile the plan was made from (--profile)")
    return profile


def auto_plan(graph, args: argparse.Namespace, settings: dict[str, object]) -> tuple[Plan, Profile]:
    """Profiles this machine on the workload and plans it (what `morphpipe tune` does, without its files); the
    precision in `settings` becomes the one profiled (precision "auto" settled)."""
    profiler = workload_profiler(graph, args, settings, progress=not args.no_progress)
    native.prepare()
    profile = profiler.run()
    settings["precision"] = profile.workload["precision"]  # "auto" settled by the profiler
    print(format_profile(profile))
    return plan_from_profile(profile, gbs=args.gbs, seed=args.seed,
                             cache_bytes=tiering.planned_cache_bytes(args)), profile
