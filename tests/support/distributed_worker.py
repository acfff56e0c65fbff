"""One rank of the distributed tests (launched twice by tests/distributed/test_runs.py; not a test module).

usage: distributed_worker.py DATASET OUTDIR SPLIT EPOCHS [--model NAME] [--checkpoint DIR] [--fail-at STEP]
                             [--kill-at STEP]

GraphSAGE (or `--model`: RGAT on a heterogeneous dataset) with every neighbour sampled
(fanouts -1,-1) and no dropout, so a batch's gradient does not depend on how it is cut
between ranks; weights 2:1 for the weighted split; a
synthetic one-core CPU profile plans each rank. `--fail-at K` makes rank 1's loss raise on its
K-th training step (counted from the start of this run); `--kill-at K` makes rank 1 SIGKILL itself there. Each rank writes OUTDIR/rank{r}.pt:
its parameters and the seeds of each step of its last epoch.
"""
from __future__ import annotations

import argparse
import os
import signal
import time
from pathlib import Path

import torch

from morphpipe.data import GraphStore
from morphpipe.data.store import load_graph_dir
from morphpipe.distributed import SeedSplit, detect, local_profile
from morphpipe.distributed.runtime import run_rank, start_rank
from morphpipe.distributed.trainer import DistributedTrainer
from morphpipe.nn import NodeClassification
from morphpipe.profiler import Profile
from morphpipe.scheduler import plan_from_profile

GLOBAL_BATCH = 256
FANOUTS = [-1, -1]
SEED = 5
LR = 0.01
WEIGHTS = [2.0, 1.0]


def build(graph: GraphStore, model: str = "sage") -> torch.nn.Module:
    """The model every rank and the single-process reference start from."""
    torch.manual_seed(SEED)
    options = {"heads": 2} if model == "rgat" else {}
    return NodeClassification().build_model(model, graph, num_layers=len(FANOUTS), hidden=16, dropout=0.0, **options)


def main(args: argparse.Namespace) -> int:
    env = detect()
    start_rank(env, timeout_s=60)
    graph = load_graph_dir(Path(args.dataset))
    split = SeedSplit.make(len(graph.train_idx), GLOBAL_BATCH, WEIGHTS, args.split)
    profile = Profile.synthetic(t_cb=0.004, t_m=0.006, num_batches=split.steps, cores=1,
                                workload={"batch_size": GLOBAL_BATCH})
    plan = plan_from_profile(local_profile(profile, split.local_batches[env.rank], split.steps))
    calls = [0]

    def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        if env.rank == 1 and calls[0] == args.fail_at:
            (Path(args.outdir) / "failed_at").write_text(repr(time.time()))
            raise RuntimeError(f"injected failure at step {calls[0]} on rank 1")
        if env.rank == 1 and calls[0] == args.kill_at:
            (Path(args.outdir) / "failed_at").write_text(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        return torch.nn.functional.cross_entropy(logits, labels)

    with DistributedTrainer(graph, build(graph, args.model), plan, split, fanouts=FANOUTS, predicted_epoch_s=1.0,
                            lr=LR, seed=SEED, checkpoint_dir=args.checkpoint, loss_fn=loss_fn, log=print) as trainer:
        trainer.fit(args.epochs, validate=args.epochs == 1)
        accuracy = trainer.evaluate("test")
        torch.save({"params": {k: v.detach().clone() for k, v in trainer.module.state_dict().items()},
                    "steps": trainer.step.trained, "accuracy": accuracy, "history": len(trainer.history)},
                   Path(args.outdir) / f"rank{env.rank}.pt")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("dataset")
    parser.add_argument("outdir")
    parser.add_argument("split")
    parser.add_argument("epochs", type=int)
    parser.add_argument("--model", default="sage")
    parser.add_argument("--checkpoint", default=None)
    parser.add_argument("--fail-at", type=int, default=0)
    parser.add_argument("--kill-at", type=int, default=0)
    arguments = parser.parse_args()
    raise SystemExit(run_rank(lambda: main(arguments), detect(), program="distributed_worker"))
