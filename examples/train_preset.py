"""Train GraphSAGE on a preset dataset with morphpipe's Python API: profile, plan, train, test.

What it shows: the four steps `morphpipe train DATASET --auto` takes, written out so you can
change any of them. The Profiler measures this machine's phases on the workload, the planner
turns the profile into a Plan (how many batches each route makes, buffers, threads), and the
Trainer runs epochs under that plan, checking that every training seed is trained exactly once
per epoch, and reports measured beside predicted epoch times.

    python examples/train_preset.py                       # the `default` preset (150k nodes)
    python examples/train_preset.py --dataset tiny --epochs 3
    python examples/train_preset.py --dataset graphs/mine  # any dataset directory
"""
from __future__ import annotations

import argparse

import torch

from morphpipe.data import load_dataset
from morphpipe.executor import Trainer
from morphpipe.nn import build_model
from morphpipe.profiler import Profiler
from morphpipe.scheduler import Plan, plan_from_profile


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="default", help="preset name or dataset directory (default: default)")
    parser.add_argument("--fanouts", default="15,10,5", help="neighbours per hop from the seeds (default 15,10,5)")
    parser.add_argument("--batch-size", type=int, default=1024, help="seeds per batch (default 1024)")
    parser.add_argument("--hidden", type=int, default=None, help="hidden width (default: the paper's for GraphSAGE)")
    parser.add_argument("--epochs", type=int, default=5, help="epochs to train (default 5)")
    parser.add_argument("--lr", type=float, default=3e-3, help="Adam learning rate (default 0.003)")
    parser.add_argument("--plan", default=None, help="a plan written by `morphpipe tune` (default: profile and plan)")
    parser.add_argument("--profile-steps", type=int, default=8, help="timed steps per profiling measurement (8)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    """Trains and returns the epochs' stats, the plan and the test accuracy."""
    args = parse_args(argv)
    fanouts = [int(f) for f in args.fanouts.split(",")]
    torch.manual_seed(args.seed)
    graph = load_dataset(args.dataset)
    print(f"{graph.name}: {graph.num_nodes:,} nodes, {graph.num_edges:,} edges, "
          f"{graph.feature_dim} features, {graph.num_classes} classes")

    if args.plan is not None:
        plan = Plan.load(args.plan)
    else:
        # Measure this machine on this workload (a few seconds to a minute), then plan the epoch.
        profile = Profiler(graph, model="sage", fanouts=fanouts, batch_size=args.batch_size, hidden=args.hidden,
                           steps=args.profile_steps, seed=args.seed).run()
        plan = plan_from_profile(profile, seed=args.seed)
    print(plan.describe())

    model = build_model("sage", graph.feature_dim, graph.num_classes, num_layers=len(fanouts), hidden=args.hidden)
    with Trainer(graph, model, plan, fanouts=fanouts, batch_size=args.batch_size, lr=args.lr, seed=args.seed,
                 progress=False) as trainer:
        history = trainer.fit(epochs=args.epochs)
        for stats in history:
            val = "n/a" if stats.val_acc is None else f"{stats.val_acc:.3f}"
            predicted = "" if stats.predicted_epoch_s is None else f" (predicted {stats.predicted_epoch_s:.2f} s)"
            print(f"epoch {stats.epoch}: {stats.epoch_s:.2f} s{predicted}, loss {stats.loss:.4f}, val acc {val}")
        test_acc = trainer.evaluate("test")
    print(f"test accuracy {test_acc:.3f}")
    return {"history": history, "plan": plan, "test_acc": test_acc}


if __name__ == "__main__":
    main()
