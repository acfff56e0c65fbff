"""Data-parallel training on one machine with 2 ranks (gloo), from morphpipe's Python API.

What it shows: the steps of `morphpipe train --nproc 2 --auto` written out. Each rank joins the
process group and takes its share of the machine's cores, profiles that share, tells the others
its predicted throughput, and the seeds of every global step are split in proportion to those
throughputs (`SeedSplit`, `--split even` for equal shares). Each rank plans its own local batch;
the `DistributedTrainer` (DDP) normalises the loss by the global step's seeds, so the
all-reduced gradient is the union batch's, and checks after every epoch that every training
seed was trained exactly once across the ranks.

Run it as its own launcher (it starts the ranks, like `--nproc`), or under torchrun or mpirun:

    python examples/distributed.py --nproc 2 --dataset tiny
    torchrun --nproc-per-node 2 examples/distributed.py --dataset tiny
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from morphpipe.data import load_dataset
from morphpipe.distributed import DistEnv, SeedSplit, detect, local_profile
from morphpipe.distributed.cluster import throughput
from morphpipe.distributed.launcher import launch
from morphpipe.distributed.runtime import run_rank, start_rank
from morphpipe.distributed.trainer import DistributedTrainer
from morphpipe.nn import build_model
from morphpipe.profiler import Profiler
from morphpipe.scheduler import plan_from_profile


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=None, help="start this many ranks here (default: run as a rank "
                                                                "of torchrun / mpirun)")
    parser.add_argument("--dataset", default="default", help="preset name or dataset directory (default: default)")
    parser.add_argument("--fanouts", default="10,5", help="neighbours per hop from the seeds (default 10,5)")
    parser.add_argument("--batch-size", type=int, default=1024, help="global batch: seeds per step over all ranks")
    parser.add_argument("--split", choices=("weighted", "even"), default="weighted",
                        help="seeds per rank by predicted throughput (default) or equal")
    parser.add_argument("--epochs", type=int, default=3, help="epochs to train (default 3)")
    parser.add_argument("--profile-steps", type=int, default=4, help="timed steps per profiling measurement")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--out", type=Path, default=None, help="rank 0 writes the run's summary here as JSON")
    return parser.parse_args(argv)


def train_rank(args: argparse.Namespace, env: DistEnv) -> int:
    """One rank: profile its share, split the seeds by throughput, plan, train data-parallel, evaluate."""
    start_rank(env, timeout_s=120)  # gloo on the CPU (NCCL with cuda=True); pins this rank to its cores
    say = print if env.rank == 0 else (lambda *_: None)
    fanouts = [int(f) for f in args.fanouts.split(",")]
    graph = load_dataset(args.dataset, progress=False)  # every rank memory-maps the same directory
    profile = Profiler(graph, fanouts=fanouts, batch_size=args.batch_size, steps=args.profile_steps,
                       seed=args.seed, progress=False, log=lambda _: None).run()
    speeds: list = [None] * env.world_size
    dist.all_gather_object(speeds, throughput(profile, seed=args.seed))  # predicted seeds/s of each rank
    split = SeedSplit.make(len(graph.train_idx), args.batch_size, speeds, args.split)
    plan = plan_from_profile(local_profile(profile, split.local_batches[env.rank], split.steps), seed=args.seed)
    epochs: list = [None] * env.world_size
    dist.all_gather_object(epochs, plan.predicted_epoch_s)
    say(f"{env.world_size} ranks, local batches {list(split.local_batches)} of {args.batch_size}, "
        f"{split.steps} steps per epoch")
    print(f"rank {env.rank}: {plan.describe().splitlines()[0]}", flush=True)

    torch.manual_seed(args.seed)  # the same initial model on every rank
    model = build_model("sage", graph.feature_dim, graph.num_classes, num_layers=len(fanouts))
    with DistributedTrainer(graph, model, plan, split, fanouts=fanouts, predicted_epoch_s=max(epochs),
                            seed=args.seed, log=say) as trainer:
        history = trainer.fit(args.epochs)  # rank 0 prints each epoch: slowest rank's time, loss, val acc, prediction
        test_acc = trainer.evaluate("test")
    say(f"test accuracy {test_acc:.3f}")
    if env.rank == 0 and args.out is not None:
        args.out.write_text(json.dumps({
            "world_size": env.world_size, "local_batches": list(split.local_batches), "steps": split.steps,
            "seeds_per_epoch": [stats.seeds for stats in history], "losses": [stats.loss for stats in history],
            "test_acc": test_acc}))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Starts `--nproc` ranks of this script, or runs this process as one rank of its launcher."""
    args = parse_args(argv)
    env = detect()
    if env is None:
        if args.nproc is None:
            raise SystemExit("give --nproc N, or start this script with torchrun / mpirun")
        load_dataset(args.dataset)  # generate a preset once, before the ranks read it
        return launch([sys.executable, __file__, *(argv if argv is not None else sys.argv[1:])], args.nproc)
    run_rank(lambda: train_rank(args, env), env, program="examples/distributed.py")


if __name__ == "__main__":
    sys.exit(main())
