"""One rank of the distributed link-prediction test (launched twice by tests/distributed/test_link_ranks.py; not a
test module).

usage: link_worker.py DATASET OUTDIR EPOCHS

GraphSAGE + dot on edge batches with 2 negatives, weights 2:1 between the ranks, a synthetic
one-core CPU profile per rank. The DistributedTrainer checks exactly-once over the ranks every
epoch; each rank also writes OUTDIR/rank{r}.pt: the training edges of each step of its last epoch,
and the validation MRR (the same on every rank: all-reduced).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

from morphpipe.data import GraphStore
from morphpipe.distributed import SeedSplit, detect, local_profile
from morphpipe.distributed.runtime import run_rank, start_rank
from morphpipe.distributed.trainer import DistributedTrainer
from morphpipe.nn import LinkPrediction
from morphpipe.profiler import Profile
from morphpipe.scheduler import plan_from_profile

GLOBAL_BATCH = 300
FANOUTS = [3, 3]
WEIGHTS = [2.0, 1.0]


def main(args: argparse.Namespace) -> int:
    env = detect()
    start_rank(env, timeout_s=60)
    torch.set_num_threads(1)
    graph = GraphStore.load(args.dataset)
    task = LinkPrediction(2)
    split = SeedSplit.make(len(task.seeds(graph)), GLOBAL_BATCH, WEIGHTS, "weighted")
    profile = Profile.synthetic(t_cb=0.004, t_m=0.006, num_batches=split.steps, cores=1,
                                workload={"batch_size": GLOBAL_BATCH})
    plan = plan_from_profile(local_profile(profile, split.local_batches[env.rank], split.steps))
    torch.manual_seed(0)
    model = task.build_model("sage", graph, num_layers=len(FANOUTS), hidden=8, dropout=0.0)
    with DistributedTrainer(graph, model, plan, split, fanouts=FANOUTS, predicted_epoch_s=1.0, lr=0.01, seed=3,
                            task=task, log=print) as trainer:
        trainer.fit(args.epochs, validate=False)
        mrr = trainer.evaluate("val")
        torch.save({"steps": trainer.step.trained, "mrr": mrr}, Path(args.outdir) / f"rank{env.rank}.pt")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("dataset")
    parser.add_argument("outdir")
    parser.add_argument("epochs", type=int)
    arguments = parser.parse_args()
    raise SystemExit(run_rank(lambda: main(arguments), detect(), program="link_worker"))
