"""`morphpipe train`: train a GNN under a saved plan (--plan) or one made here and now (--auto)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from morphpipe.distributed import commands as distributed_commands
from morphpipe.profiler.profile import Profile
from morphpipe.profiler.profiler import DEVICES, Profiler
from morphpipe.sampling.commands import parse_int_list
from morphpipe.scheduler import Plan, plan_from_profile
from morphpipe.tune import format_profile

DEFAULTS = {"model": "sage", "fanouts": "15,10,5", "batch_size": 1024, "hidden": None}


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds the `train` sub-command."""
    parser = subparsers.add_parser(
        "train", help="train a GNN with the dual-buffer executor under a plan",
        description="Train GraphSAGE / GCN / GAT / MLP with the dual-buffer executor. With --plan, the model, "
                    "fanouts, batch size and hidden width default to the ones the plan was made for.")
    parser.add_argument("dataset", nargs="?", default=None, help="preset name or dataset directory (default: default)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--plan", type=Path, help="plan JSON written by `morphpipe tune`")
    source.add_argument("--auto", action="store_true", help="profile this machine and plan first (as `morphpipe tune`)")
    source.add_argument("--profile", type=Path, help="plan from this saved profile (distributed: each node's own)")
    parser.add_argument("--model", default=None, choices=["sage", "gcn", "gat", "mlp"],
                        help="model (default: the plan's, else sage)")
    parser.add_argument("--hidden", type=int, default=None, help="hidden width (default: the paper's per model)")
    parser.add_argument("--heads", type=int, default=None, help="GAT attention heads (default 4)")
    parser.add_argument("--dropout", type=float, default=0.5)
    parser.add_argument("--fanouts", default=None, help="neighbours per hop from the seeds (default: the plan's, "
                                                         "else 15,10,5); one layer per hop")
    parser.add_argument("--batch-size", type=int, default=None, help="seeds per batch (default: the plan's, else 1024)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=3e-3, help="Adam learning rate (default 0.003)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="auto", choices=DEVICES, help="where --auto profiles and plans")
    parser.add_argument("--gbs", type=int, default=10, help="GPU buffer size for --auto (default 10)")
    parser.add_argument("--threads", default=None, help="CPU thread counts --auto profiles, e.g. 1,2,4")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per --auto measurement (default 8)")
    parser.add_argument("--save-plan", type=Path, default=None, help="with --auto: also write the plan here")
    parser.add_argument("--checkpoint-dir", type=Path, default=None,
                        help="write a checkpoint after every epoch here, and continue from the one found there")
    parser.add_argument("--eval-batch-size", type=int, default=4096)
    parser.add_argument("--stats-json", type=Path, default=None, help="write every epoch's stats and the test "
                                                                      "accuracy to this JSON file")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    distributed_commands.add_arguments(parser)
    parser.set_defaults(func=run)


def workload_settings(args: argparse.Namespace, plan: Plan | None) -> dict[str, object]:
    """Model, fanouts, batch size and hidden width: the command line's, else the plan's, else the defaults."""
    workload = plan.profile.get("workload", {}) if plan is not None else {}
    chosen = {}
    for key, default in DEFAULTS.items():
        given = getattr(args, key)
        chosen[key] = given if given is not None else workload.get(key, default)
    chosen["fanouts"] = parse_int_list(str(chosen["fanouts"]), "--fanouts")
    return chosen


def run(args: argparse.Namespace) -> int:
    """Loads the data, gets a plan, trains, reports test accuracy (as one rank when a launcher started us)."""
    if distributed_commands.wants_distributed(args):
        return distributed_commands.run(args)
    from morphpipe.data import load_dataset
    from morphpipe.executor.trainer import Trainer
    from morphpipe.nn import build_model
    from morphpipe.sampling.gpu_batcher import GpuBatcher

    graph = load_dataset(args.dataset)
    print(f"dataset {graph.name}: {graph.num_nodes:,} nodes, {graph.num_edges:,} edges, {graph.feature_dim} features, "
          f"{graph.num_classes} classes, {len(graph.train_idx):,} training seeds")
    plan = Plan.load(args.plan) if args.plan is not None else None
    if args.profile is not None:
        plan = plan_from_profile(Profile.load(args.profile), gbs=args.gbs, seed=args.seed)
    settings = workload_settings(args, plan)
    if plan is None:
        plan = auto_plan(graph, args, settings)
    print("plan:\n  " + plan.describe().replace("\n", "\n  "))
    torch.manual_seed(args.seed)
    model = build_model(str(settings["model"]), graph.feature_dim, graph.num_classes,
                        num_layers=len(settings["fanouts"]), hidden=settings["hidden"], heads=args.heads,
                        dropout=args.dropout)
    with Trainer(graph, model, plan, fanouts=settings["fanouts"], batch_size=int(settings["batch_size"]), lr=args.lr,
                 seed=args.seed, checkpoint_dir=args.checkpoint_dir, eval_batch_size=args.eval_batch_size,
                 progress=not args.no_progress, gpu_batcher=GpuBatcher if plan.n_gpu else None) as trainer:
        history = trainer.fit(args.epochs)
        test_acc = trainer.evaluate("test")
    print(f"test accuracy {test_acc:.4f}")
    if history:
        measured = sum(stats.epoch_s for stats in history) / len(history)
        print(f"mean epoch {measured:.2f} s measured vs {plan.predicted_epoch_s:.2f} s predicted "
              f"({measured / plan.predicted_epoch_s - 1:+.0%})")
    if args.stats_json is not None:
        document = {"plan": plan.to_dict(), "settings": {**settings, "epochs": args.epochs, "lr": args.lr,
                                                        "seed": args.seed, "dataset": graph.name},
                    "epochs": [stats.to_dict() for stats in history], "test_acc": test_acc}
        args.stats_json.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.stats_json}")
    return 0


def auto_plan(graph, args: argparse.Namespace, settings: dict[str, object]) -> Plan:
    """Profiles this machine on the workload and plans it (what `morphpipe tune` does, without its files)."""
    profiler = Profiler(
        graph, model=str(settings["model"]), fanouts=settings["fanouts"], batch_size=int(settings["batch_size"]),
        hidden=settings["hidden"], device=args.device,
        thread_counts=parse_int_list(args.threads, "--threads") if args.threads else None, steps=args.steps,
        seed=args.seed, progress=not args.no_progress,
    )
    profile = profiler.run()
    print(format_profile(profile))
    plan = plan_from_profile(profile, gbs=args.gbs, seed=args.seed)
    if args.save_plan is not None:
        plan.save(args.save_plan)
        print(f"wrote {args.save_plan}")
    return plan
