"""Benchmark: a GraphSAGE 3x256 node-classification training epoch, morphpipe beside DGL 2.1, same batches (issue 23).

For each dataset (default: the `default` preset and `bench-1m`) and training seed: `--batches` batches (default 20)
of `--batch-size` seeds drawn from the train split (`measurement_seeds`) make the epoch; each side trains one
warm-up epoch and then `--epochs` measured ones (wall clock of batching plus training), then measures validation
accuracy on the first `--val-nodes` validation nodes by sampled inference with the training fanouts (each side
draws its own neighbours), so both are compared after the same batches. One evaluation draw moves the count of
errors by several nodes (issue 23's finding in BENCHMARKS.md), so DGL's trained models are also scored by our
evaluator on the very neighbourhoods ours was scored on, or exactly with `--eval-mode full` ("our eval"), and the
gap between the sides so paired is printed with its standard error over the seeds.

- morphpipe trains as `morphpipe train --auto` does on a CPU-only machine, without re-planning: this machine is
  profiled on the workload (`Profiler`), planned (`plan_from_profile`), and the `Trainer` runs the plan (its batcher
  overlapping the training step, or the two in turn, as the plan says) once per `--precisions` entry (float32;
  bf16: bfloat16 autocast with float32 master weights). The training seeds of each step are recorded in the
  order they were trained.
- DGL trains those recorded batches in the same order (one DataLoader over them, not shuffled; every epoch's time
  is taken between its first and last batch's step, so workers may prefetch across epochs as a persistent loader
  would): `NeighborSampler` with the node features and labels prefetched, `dgl.nn.SAGEConv("mean")`, float32,
  once per `--dgl-workers` count (DataLoader `num_workers`). DGL runs as a subprocess of its own interpreter on
  the dataset directory's arrays (`dgl_peer`), never imported here.
- Same model on both sides: 3 SAGE-mean layers, hidden 256, ReLU and dropout 0.5 between layers (the trainer's
  default), cross entropy, Adam(lr 0.003) (ours torch's fused Adam, as `morphpipe train`); DGL's model starts
  from our initial weights (fc_neigh = lin_neigh, fc_self = lin_self with lin_neigh's bias). Features are cast to
  float32 per batch on both sides (bench-1m stores float16). torch and OMP threads = `--threads` on both sides.

Prints one table (epoch seconds are the mean of the measured epochs; ratio = DGL's best / ours) and writes JSON.
Not a test. Usage:
  python scripts/bench_sage_epoch.py [--datasets default,bench-1m] [--batches 20] [--epochs 2] [--seeds 0]
         [--precisions float32,bf16] [--dgl-workers 0,1] [--val-nodes 8192] [--out bench_sage_epoch.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import morphpipe  # noqa: F401  first, before torch: the OpenMP wait policy and huge pages, as `morphpipe train` sets them
import numpy as np
import torch

from dgl_peer import (DGL_OUR_SAGE_WEIGHTS, DGL_PRELUDE, DGL_PYTHON, dataset_directory, int_list, run_dgl_script,
                      writable_file)
from morphpipe.cores import usable_cores
from morphpipe.data import load_dataset
from morphpipe.executor import Trainer
from morphpipe.nn.evaluate import EVAL_MODES
from morphpipe.nn.task import EvalSettings, NodeClassification, TaskLoss
from morphpipe.profiler.profiler import Profiler
from morphpipe.sampling.minibatch import MiniBatch
from morphpipe.sampling.throughput import measurement_seeds
from morphpipe.scheduler import plan_from_profile

HIDDEN, LAYERS, DROPOUT, LR = 256, 3, 0.5, 3e-3  # `morphpipe train`'s defaults for SAGE
EVAL_BATCH = 4096  # `morphpipe train`'s --eval-batch-size default

# DGL's side (after the shared prelude): trains the recorded batches from our initial weights, once per worker
# count, prints one JSON line.
DGL_SCRIPT = DGL_PRELUDE + DGL_OUR_SAGE_WEIGHTS + r'''
import torch.nn.functional as F
from dgl.nn import SAGEConv

graph.ndata["feat"], graph.ndata["label"] = features, labels
orders = torch.from_numpy(np.load(args["orders"]))  # [epochs, batches * batch_size], training order
val = torch.from_numpy(np.load(args["val"]))
fanouts = list(reversed(args["fanouts"]))  # DGL lists the input layer first
epoch_batches = orders.shape[1] // args["batch_size"]

class SAGE(torch.nn.Module):
    def __init__(self, dims, dropout):
        super().__init__()
        self.convs = torch.nn.ModuleList(SAGEConv(a, b, "mean") for a, b in zip(dims[:-1], dims[1:]))
        self.dropout = dropout
    def forward(self, blocks, h):
        for i, (conv, block) in enumerate(zip(self.convs, blocks)):
            h = conv(block, h)
            if i < len(self.convs) - 1:
                h = F.dropout(F.relu(h), self.dropout, self.training)
        return h

def ours_initial():
    model = SAGE(args["dims"], args["dropout"])
    copy_our_sage_weights(model.convs, args["weights"])
    return model

def train(workers):
    torch.manual_seed(args["seed"])
    dgl.seed(args["seed"])
    model = ours_initial()
    optimizer = torch.optim.Adam(model.parameters(), lr=args["lr"])
    sampler = dgl.dataloading.NeighborSampler(fanouts, prefetch_node_feats=["feat"], prefetch_labels=["label"])
    loader = dgl.dataloading.DataLoader(graph, orders.reshape(-1), sampler, batch_size=args["batch_size"],
                                        shuffle=False, drop_last=False, num_workers=workers)
    marks, losses, total = [time.perf_counter()], [], torch.zeros(())
    model.train()
    for step, (input_nodes, output_nodes, blocks) in enumerate(loader):
        logits = model(blocks, blocks[0].srcdata["feat"].float())
        loss = F.cross_entropy(logits, blocks[-1].dstdata["label"])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total += loss.detach()
        if (step + 1) % epoch_batches == 0:
            marks.append(time.perf_counter())
            losses.append(float(total) / epoch_batches)
            total = torch.zeros(())
    epochs_s = [b - a for a, b in zip(marks[:-1], marks[1:])]
    model.eval()
    correct = 0
    eval_loader = dgl.dataloading.DataLoader(graph, val, dgl.dataloading.NeighborSampler(
        fanouts, prefetch_node_feats=["feat"], prefetch_labels=["label"]), batch_size=args["eval_batch"],
        shuffle=False, num_workers=0)
    with torch.no_grad():
        for input_nodes, output_nodes, blocks in eval_loader:
            logits = model(blocks, blocks[0].srcdata["feat"].float())
            correct += int((logits.argmax(1) == blocks[-1].dstdata["label"]).sum())
    save_as_our_sage_weights(model.convs, f"{args['trained']}/w{workers}.npz")
    return {"epochs_s": epochs_s, "losses": losses, "val_acc": correct / val.numel()}

out = {"dgl": dgl.__version__, "torch": torch.__version__,
       "by_workers": {str(workers): train(workers) for workers in args["workers"]}}
print(json.dumps(out))
'''


class RecordedSubset(NodeClassification):
    """Node classification over a fixed subset of the training seeds that records each step's seeds in the order
    they were trained (what DGL's side then trains)."""

    def __init__(self, units: torch.Tensor) -> None:
        super().__init__()
        self.units = units
        self.trained: list[torch.Tensor] = []

    def seeds(self, graph, split: str = "train") -> torch.Tensor:
        return self.units if split == "train" else super().seeds(graph, split)

    def loss(self, model: torch.nn.Module, batch: MiniBatch, dtype: torch.dtype | None) -> TaskLoss:
        self.trained.append(batch.seeds)
        return super().loss(model, batch, dtype)


def ours(graph, args: argparse.Namespace, seed: int, precision: str, val: torch.Tensor) -> dict:
    """Profile, plan and train through the Trainer: warm-up and measured epochs' seconds, losses, val accuracy, the
    initial weights and the trained order of the seeds."""
    units = measurement_seeds(graph.train_idx, args.batches, args.batch_size, seed)
    task = RecordedSubset(units)
    profile = Profiler(graph, model="sage", fanouts=args.fanouts, batch_size=args.batch_size, hidden=HIDDEN,
                       device="cpu", thread_counts=[args.threads], seed=seed, progress=False, task=task,
                       precision=precision, log=lambda line: None).run()
    plan = plan_from_profile(profile, seed=seed)
    task.trained.clear()  # the profiler's own steps
    torch.manual_seed(seed)
    model = task.build_model("sage", graph, num_layers=len(args.fanouts), hidden=HIDDEN, dropout=DROPOUT)
    initial = {name: tensor.detach().clone().numpy() for name, tensor in model.state_dict().items()}
    with Trainer(graph, model, plan, fanouts=args.fanouts, batch_size=args.batch_size, task=task, lr=LR, seed=seed,
                 progress=False, log=lambda line: None, precision=precision) as trainer:
        history = trainer.fit(1 + args.epochs, validate=False)
        val_acc = val_accuracy(trainer.model, graph, args, seed, val)
    order = torch.cat(task.trained).reshape(1 + args.epochs, -1)
    return {"epochs_s": [stats.epoch_s for stats in history], "losses": [stats.loss for stats in history],
            "val_acc": val_acc, "plan": plan.describe(), "shares_cores": plan.shares_cores,
            "initial": initial, "order": order}


def dgl_side(dataset: str, graph, args: argparse.Namespace, seed: int, first: dict, val: torch.Tensor) -> dict:
    """DGL's run of the batches our float32 run trained (`first["order"]`) from its initial weights; each worker
    count's trained model is also scored by our evaluator on the validation neighbourhoods ours was scored on
    (`val_acc_our_eval`), so the two sides' accuracies differ by training alone."""
    with tempfile.TemporaryDirectory() as scratch:
        paths = {name: str(Path(scratch) / f"{name}.npy") for name in ("orders", "val")}
        np.save(paths["orders"], first["order"].numpy())
        np.save(paths["val"], val.numpy())
        paths["weights"] = str(Path(scratch) / "weights.npz")
        np.savez(paths["weights"], **first["initial"])
        paths["trained"] = scratch
        settings = {"dataset": str(dataset_directory(dataset)), "threads": args.threads, "fanouts": args.fanouts,
                    "batch_size": args.batch_size, "lr": LR, "dropout": DROPOUT, "seed": seed,
                    "dims": [graph.feature_dim] + [HIDDEN] * (len(args.fanouts) - 1) + [graph.num_classes],
                    "workers": args.dgl_workers, "eval_batch": EVAL_BATCH, **paths}
        result = run_dgl_script(DGL_SCRIPT, settings, args.threads, args.dgl_python)
        for workers, run in result["by_workers"].items():
            with np.load(Path(scratch) / f"w{workers}.npz") as trained:
                run["val_acc_our_eval"] = our_evaluation(graph, args, seed, val, trained)
        return result


def val_accuracy(model: torch.nn.Module, graph, args: argparse.Namespace, seed: int, val: torch.Tensor) -> float:
    """Our evaluator's accuracy of `model` on `val` in `--eval-mode`: sampled with the training fanouts from `seed`
    (every model scored with one seed sees the same neighbourhoods), or exact over every neighbour."""
    return NodeClassification().evaluate(model, graph, val, EvalSettings(args.fanouts, EVAL_BATCH, seed,
                                                                         args.eval_mode, progress=False),
                                         device=torch.device("cpu"))


def our_evaluation(graph, args: argparse.Namespace, seed: int, val: torch.Tensor, weights) -> float:
    """`val_accuracy` of a SAGE model with `weights` (our state dict's names: a DGL model's, saved back)."""
    model = NodeClassification().build_model("sage", graph, num_layers=len(args.fanouts), hidden=HIDDEN,
                                             dropout=DROPOUT)
    model.load_state_dict({name: torch.from_numpy(weights[name]) for name in weights.files})
    return val_accuracy(model, graph, args, seed, val)


def say(line: str) -> None:
    """A progress line on stderr (the table goes to stdout)."""
    print(f"[{time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


def measured(epochs_s: list[float]) -> float:
    """Mean seconds of the measured epochs (the first, the warm-up, left out)."""
    return statistics.fmean(epochs_s[1:])


def accuracy_gap(dataset: str, rows: list[dict], args: argparse.Namespace) -> str:
    """Our float32 accuracy minus DGL's (its worker counts' mean), both scored by our evaluator on the same
    neighbourhoods, paired by seed: the mean in validation nodes with its standard error over the seeds."""
    gaps = [args.val_nodes * (row["ours"]["float32"]["val_acc"] - statistics.fmean(
        run["val_acc_our_eval"] for run in row["dgl"]["by_workers"].values())) for row in rows]
    spread = f" +- {statistics.stdev(gaps) / len(gaps) ** 0.5:.1f} (standard error)" if len(gaps) > 1 else ""
    return (f"{dataset}: ours float32 - DGL, same evaluator, over {len(gaps)} seeds: {statistics.fmean(gaps):+.1f}"
            f"{spread} of {args.val_nodes} val nodes")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", default="default,bench-1m", help="presets or graph directories, comma-separated")
    parser.add_argument("--fanouts", type=int_list, default="15,10,5")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--batches", type=int, default=20, help="training batches per epoch (default 20)")
    parser.add_argument("--epochs", type=int, default=2, help="measured epochs after the warm-up one (default 2)")
    parser.add_argument("--seeds", type=int_list, default="0", help="training seeds, one row each, e.g. 0,1")
    parser.add_argument("--precisions", default="float32,bf16",
                        help="our step's arithmetic, one run each (float32 first: DGL trains its batches)")
    parser.add_argument("--dgl-workers", type=int_list, default="0,1", help="DGL DataLoader num_workers counts, one DGL run each")
    parser.add_argument("--val-nodes", type=int, default=8192, help="validation nodes evaluated (the first N)")
    parser.add_argument("--eval-mode", choices=EVAL_MODES, default="sampled",
                        help="our evaluator's mode for both sides' models: sampled with the training fanouts (DGL's "
                             "own evaluation is always sampled), or full: exact, every neighbour")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dgl-python", default=DGL_PYTHON)
    parser.add_argument("--out", type=writable_file, default="bench_sage_epoch.json")
    args = parser.parse_args()
    args.precisions = args.precisions.split(",")
    if args.precisions[0] != "float32":
        raise SystemExit(f"--precisions must start with float32 (DGL trains float32's batches), got {args.precisions}")
    if args.batches < 1 or args.epochs < 1:
        raise SystemExit(f"--batches and --epochs must be at least 1, got {args.batches} and {args.epochs}")
    torch.set_num_threads(args.threads)

    rows, loads = [], [os.getloadavg()[0]]
    for dataset in args.datasets.split(","):
        graph = load_dataset(dataset)
        val = graph.val_idx[:args.val_nodes]
        for seed in args.seeds:
            runs = {}
            for precision in args.precisions:
                say(f"{dataset} seed {seed}: morphpipe {precision} (profile, plan, train, evaluate)")
                try:
                    runs[precision] = ours(graph, args, seed, precision, val)
                except ValueError as error:
                    raise SystemExit(f"{dataset}: {error}") from None
            say(f"{dataset} seed {seed}: DGL, num_workers {args.dgl_workers}")
            dgl = dgl_side(dataset, graph, args, seed, runs["float32"], val)
            loads.append(os.getloadavg()[0])
            rows.append({"dataset": dataset, "seed": seed, "nodes": graph.num_nodes, "edges": graph.num_edges,
                         "ours": {p: {k: v for k, v in run.items() if k not in ("initial", "order")}
                                  for p, run in runs.items()}, "dgl": dgl})

    dgl_version = rows[0]["dgl"]["dgl"]
    print(f"SAGE {LAYERS}x{HIDDEN} mean, dropout {DROPOUT}, Adam lr {LR}; fanouts {args.fanouts}, batch "
          f"{args.batch_size}, {args.batches} batches per epoch, 1 warm-up + {args.epochs} measured epochs (mean "
          f"shown), {args.threads} threads; val accuracy after {(1 + args.epochs) * args.batches} batches on "
          f"{args.val_nodes} val nodes (DGL's own: sampled with the training fanouts; ours and \"our eval\": "
          f"{args.eval_mode}); DGL {dgl_version}; load average "
          f"{min(loads):.1f}-{max(loads):.1f}")
    header = ["dataset", "seed"] + [f"ours {p} s" for p in args.precisions] + \
             [f"DGL w={w} s" for w in args.dgl_workers] + [f"DGL/ours {p}" for p in args.precisions] + \
             [f"acc ours {p}" for p in args.precisions] + [f"acc DGL w={w}" for w in args.dgl_workers] + \
             [f"acc DGL w={w}, our eval" for w in args.dgl_workers]
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for row in rows:
        ours_s = {p: measured(row["ours"][p]["epochs_s"]) for p in args.precisions}
        dgl_s = {w: measured(row["dgl"]["by_workers"][str(w)]["epochs_s"]) for w in args.dgl_workers}
        best = min(dgl_s.values())
        cells = [row["dataset"], str(row["seed"])] + [f"{ours_s[p]:.2f}" for p in args.precisions] + \
                [f"{dgl_s[w]:.2f}" for w in args.dgl_workers] + [f"{best / ours_s[p]:.2f}x" for p in args.precisions] + \
                [f"{row['ours'][p]['val_acc']:.4f}" for p in args.precisions] + \
                [f"{row['dgl']['by_workers'][str(w)]['val_acc']:.4f}" for w in args.dgl_workers] + \
                [f"{row['dgl']['by_workers'][str(w)]['val_acc_our_eval']:.4f}" for w in args.dgl_workers]
        print("| " + " | ".join(cells) + " |")
    for dataset in args.datasets.split(","):
        print(accuracy_gap(dataset, [row for row in rows if row["dataset"] == dataset], args))
    for row in rows:
        print(f"{row['dataset']} seed {row['seed']}: our plan {row['ours']['float32']['plan'].splitlines()[0]}")
    report = {"date": date.today().isoformat(), "load_average": loads,
              "machine": {"cpu": platform.processor() or platform.machine(), "usable_cores": usable_cores(),
                          "torch": torch.__version__, "python": sys.version.split()[0]},
              "settings": {key: value for key, value in vars(args).items() if key != "out"}, "rows": rows}
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
