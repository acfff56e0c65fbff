"""Benchmark: link prediction, morphpipe beside DGL 2.1 on the same graph files, in one run.

For 1 and for 100 negatives per positive: (a) edge batches per second (morphpipe's threaded
EdgeBatcher with `--threads` threads; DGL's `as_edge_prediction_sampler` + `NeighborSampler` with
reverse-edge exclusion and a uniform negative sampler, single-process loader, OMP/torch threads =
`--threads`), features gathered on both sides; (b) a training epoch of GraphSAGE (`--layers` x
`--hidden`, mean aggregation) + dot decoder with BCE on `--epoch-edges` training edges (32768 by
default; 0: all; `--epochs N` such epochs, their mean time reported), then validation MRR against the stored
negatives by exact full-graph inference; `--seeds 0,1,2` trains one row per seed (same seed on both sides) and
prints each side's MRR mean and spread over them.
morphpipe trains through its Trainer under a CPU-only plan made from this machine's measured
batch and step times; DGL loads batches and trains them in turn (what its single-process loader
does). Same graph (the dataset directory's .npy arrays), fanouts, batch size, seed, and the same initial
weights (DGL's model starts from ours, row by row); features stay in their stored dtype and are cast to float32
per batch on both sides.
With `--phases N`, also (c) the median seconds of each phase of a training step over N batches made and
trained in turn on both sides (batch, encoder forward, pair scoring, loss, backward, optimizer), morphpipe's
with its fused pair scorer and with the dot decoder over gathered rows (the dense scoring it replaced);
`--top-ops M` also lists each side's M ops of most self CPU time over those batches (torch.profiler, which then
runs during the timed phases: its small overhead is in their figures).
DGL runs as a subprocess of its own interpreter (`--dgl-python`), never imported here. Not a test.

`--split-from DATASET --dataset DIR` benchmarks an edge split of any dataset (bench-1m: 1M nodes,
20M edges): DIR gets a random split of DATASET (`--split-fractions`, `--split-negatives`) unless it
already holds one; `--val-edges N` ranks the first N validation edges only (both sides embed every
node by full-graph inference either way), `--val-edges -1` skips validation.

Usage: python scripts/bench_link.py [--dataset link] [--batches 30] [--epoch-edges 32768] [--epochs 1]
       [--seeds 0] [--phases 0] [--top-ops 0] [--out bench_link.json]
       python scripts/bench_link.py --split-from /work/bench_scratch/bench-1m --dataset DIR --negatives 1 \
           --batches 5 --epoch-edges 4096 --val-edges -1   (the bench-1m row: the split about 12 s of CPU, then
           both sides in about 5 minutes under load; 100 negatives on 1M nodes not run: see BENCHMARKS.md)
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import morphpipe  # noqa: F401  first, before torch: the OpenMP wait policy and huge pages, as `morphpipe train` sets them
import numpy as np
import torch

from dgl_peer import DGL_OUR_SAGE_WEIGHTS, DGL_PYTHON, dataset_directory, int_list, run_dgl_script, writable_file
from morphpipe.cores import usable_cores
from morphpipe.data import load_dataset
from morphpipe.data.edge_split import with_edge_split
from morphpipe.data.ondisk import EDGE_SPLIT_FILE, check_graph_output
from morphpipe.data.splits import SplitFractions
from morphpipe.executor import Trainer
from morphpipe.nn import LinkPrediction, TrainStep, make_optimizer
from morphpipe.nn.link_model import DotDecoder
from morphpipe.nn.link_task import pair_loss
from morphpipe.nn.task import EvalSettings
from morphpipe.profiler import Profile
from morphpipe.scheduler import plan_from_profile
from morphpipe.sampling.edge_batcher import EdgeBatcher, NegativeSampling, SerialEdgeBatcher

PHASES = ("batch", "encoder", "scoring", "loss", "backward", "optimizer")

# DGL's side: reads the graph directory's arrays, times edge batches, trains, prints one JSON line.
DGL_SCRIPT = DGL_OUR_SAGE_WEIGHTS + r'''
import json, sys, time
import numpy as np, torch, dgl
import torch.nn.functional as F
from dgl.nn import SAGEConv

args = json.loads(sys.argv[1])
torch.set_num_threads(args["threads"])
torch.manual_seed(args["seed"])
root = args["dataset"]
indptr = np.load(f"{root}/indptr.npy"); indices = np.load(f"{root}/indices.npy").astype(np.int64)
n = indptr.size - 1
dst = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
g = dgl.graph((torch.from_numpy(indices), torch.from_numpy(dst)), num_nodes=n)
g.ndata["feat"] = torch.from_numpy(np.load(f"{root}/features.npy"))  # in the stored dtype: cast per batch
keys = dst * n + indices  # eid order is CSC order: sorted by (dst, src)
train = np.load(f"{root}/train_edges.npy")
train_eids = torch.from_numpy(np.searchsorted(keys, train[1] * n + train[0]))
reverse = torch.from_numpy(np.searchsorted(keys, indices * n + dst))
assert bool((torch.from_numpy(keys)[train_eids] == torch.from_numpy(train[1] * n + train[0])).all())
fanouts = list(reversed(args["fanouts"]))  # DGL lists fanouts input layer first

def loader(negatives, eids):
    sampler = dgl.dataloading.NeighborSampler(fanouts, prefetch_node_feats=["feat"])
    sampler = dgl.dataloading.as_edge_prediction_sampler(
        sampler, exclude="reverse_id", reverse_eids=reverse,
        negative_sampler=dgl.dataloading.negative_sampler.Uniform(negatives))
    return dgl.dataloading.DataLoader(g, eids, sampler, batch_size=args["batch_size"], shuffle=True,
                                      drop_last=False, num_workers=0)

class Model(torch.nn.Module):
    def __init__(self, dim, hidden, layers):
        super().__init__()
        dims = [dim] + [hidden] * layers
        self.convs = torch.nn.ModuleList(SAGEConv(a, b, "mean") for a, b in zip(dims[:-1], dims[1:]))
    def forward(self, blocks, x):
        h = x
        for i, (conv, block) in enumerate(zip(self.convs, blocks)):
            h = conv(block, h)
            if i < len(self.convs) - 1:
                h = F.relu(h)
        return h
    def full(self, graph, x):
        h = x
        for i, conv in enumerate(self.convs):
            h = conv(graph, h)
            if i < len(self.convs) - 1:
                h = F.relu(h)
        return h

def score(h, graph):
    with graph.local_scope():
        graph.ndata["h"] = h
        graph.apply_edges(dgl.function.u_dot_v("h", "h", "s"))
        return graph.edata["s"].squeeze(-1)

def phases(negatives):
    """Median seconds of each step phase over args["phases"] batches made and trained in turn (the first left out)."""
    torch.manual_seed(args["seed"])
    model = Model(g.ndata["feat"].shape[1], args["hidden"], len(fanouts))
    optimizer = torch.optim.Adam(model.parameters(), lr=args["lr"])
    it = iter(loader(negatives, train_eids))
    times = []
    profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    for step in range(args["phases"] + 1):
        if step == 1 and args["top_ops"]:
            profiler.start()
        t0 = time.perf_counter()
        input_nodes, pair_graph, negative_graph, blocks = next(it)
        x = blocks[0].srcdata["feat"]
        t1 = time.perf_counter()
        h = model(blocks, x)
        t2 = time.perf_counter()
        pos, neg = score(h, pair_graph), score(h, negative_graph)
        t3 = time.perf_counter()
        loss = F.binary_cross_entropy_with_logits(torch.cat([pos, neg]),
                                                  torch.cat([torch.ones_like(pos), torch.zeros_like(neg)]))
        t4 = time.perf_counter()
        optimizer.zero_grad(); loss.backward()
        t5 = time.perf_counter()
        optimizer.step()
        times.append([t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, time.perf_counter() - t5])
    ops = []
    if args["top_ops"]:
        profiler.stop()
        ops = [[e.key, e.self_cpu_time_total / 1e6 / args["phases"], e.count // args["phases"]]
               for e in sorted(profiler.key_averages(), key=lambda e: -e.self_cpu_time_total)[:args["top_ops"]]]
    return [float(np.median([row[i] for row in times[1:]])) for i in range(6)], ops

def ours_initial(negatives, seed):
    """The model with our run's initial weights for this row."""
    model = Model(g.ndata["feat"].shape[1], args["hidden"], len(fanouts))
    copy_our_sage_weights(model.convs, args["weights"][f"{negatives}/{seed}"], prefix="encoder.")
    return model

def train(negatives, seed):
    """`args["epochs"]` epochs over the epoch edges from seed `seed`, from our initial weights: mean epoch seconds,
    then exact val MRR."""
    torch.manual_seed(seed)
    dgl.seed(seed)
    model = ours_initial(negatives, seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=args["lr"])
    eids = train_eids[:args["epoch_edges"]] if args["epoch_edges"] else train_eids
    epochs_s, batches, losses = [], 0, []
    for _ in range(args["epochs"]):
        start = time.perf_counter()
        total, count = torch.zeros(()), 0
        for input_nodes, pair_graph, negative_graph, blocks in loader(negatives, eids):
            h = model(blocks, blocks[0].srcdata["feat"].float())
            pos, neg = score(h, pair_graph), score(h, negative_graph)
            loss = F.binary_cross_entropy_with_logits(torch.cat([pos, neg]),
                                                      torch.cat([torch.ones_like(pos), torch.zeros_like(neg)]))
            optimizer.zero_grad(); loss.backward(); optimizer.step()
            total += loss.detach(); count += 1
        epochs_s.append(time.perf_counter() - start)
        batches = count
        losses.append(float(total) / max(count, 1))
    result = {"epoch_s": sum(epochs_s) / len(epochs_s), "epochs_s": epochs_s, "batches": batches, "losses": losses,
              "val_mrr": None}
    if args["val_edges"] < 0:
        return result
    model.eval()
    with torch.no_grad():
        h = model.full(g, g.ndata["feat"].float())
        rows = args["val_edges"] or None
        val = torch.from_numpy(np.load(f"{root}/val_edges.npy")[:, :rows])
        val_neg = torch.from_numpy(np.load(f"{root}/val_negatives.npy")[:rows])
        pos = (h[val[0]] * h[val[1]]).sum(-1)
        neg = (h[val[0]][:, None] * h[val_neg]).sum(-1)
        rank = 1 + (neg > pos[:, None]).sum(1).double() + 0.5 * (neg == pos[:, None]).sum(1).double()
    result["val_mrr"] = float((1 / rank).mean())
    return result

out = {"batching": {}, "training": {}, "phases": {}}
for negatives in args["negatives"]:
    if args["phases"]:
        out["phases"][str(negatives)], out.setdefault("ops", {})[str(negatives)] = phases(negatives)
    it = iter(loader(negatives, train_eids))
    next(it)
    start = time.perf_counter()
    for _ in range(args["batches"]):
        input_nodes, pair_graph, negative_graph, blocks = next(it)
        x = blocks[0].srcdata["feat"].float()
    out["batching"][str(negatives)] = args["batches"] / (time.perf_counter() - start)

    for seed in args["seeds"]:
        out["training"][f"{negatives}/{seed}"] = train(negatives, seed)
print(json.dumps(out))
'''


def morphpipe_batching(graph, fanouts: list[int], batch_size: int, negatives: int, threads: int, batches: int,
                       seed: int) -> float:
    """Edge batches per second of the threaded EdgeBatcher over the first `batches` batches of an epoch."""
    with EdgeBatcher(graph, fanouts, batch_size, negatives=NegativeSampling(negatives), num_threads=threads,
                     seed=seed, pin_memory=False) as batcher:
        epoch = batcher.epoch(0)
        next(epoch)
        start = time.perf_counter()
        for _ in range(batches):
            next(epoch)
        return batches / (time.perf_counter() - start)


class GatheredDot(DotDecoder):
    """The dot decoder over gathered rows (h[src] * h[dst] summed): the dense scoring the fused pair scorer replaced."""

    def score_indexed(self, h: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
        return self(h[src], h[dst])


def morphpipe_phases(graph, args: argparse.Namespace, negatives: int,
                     gathered: bool) -> tuple[list[float], list[list]]:
    """Median seconds of each step phase (PHASES) over `args.phases` batches made (serially) and trained in turn,
    and (fused scorer only) the `args.top_ops` ops of most self CPU time over those batches ([name, seconds per
    batch, calls per batch]; empty when not asked)."""
    task = LinkPrediction(negatives)
    torch.manual_seed(args.seed)
    model = task.build_model("sage", graph, num_layers=len(args.fanouts), hidden=args.hidden, dropout=0.0)
    if gathered:
        model.decoder = GatheredDot()
    optimizer = make_optimizer(model.parameters(), args.lr, "cpu")
    batches = iter(SerialEdgeBatcher(graph, args.fanouts, args.batch_size, negatives=task.sampling,
                                     seed=args.seed).epoch(0))
    times = []
    top_ops = 0 if gathered else args.top_ops  # the fused scorer's step is the one listed
    profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    for step in range(args.phases + 1):
        if step == 1 and top_ops:
            profiler.start()
        t0 = time.perf_counter()
        batch = next(batches)
        t1 = time.perf_counter()
        h = model.encoder(batch.blocks, batch.x)
        t2 = time.perf_counter()
        positive, negative = model.score_pairs(h, batch.pairs)
        t3 = time.perf_counter()
        loss = pair_loss("bce", positive, negative)
        t4 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        t5 = time.perf_counter()
        optimizer.step()
        times.append([t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, time.perf_counter() - t5])
    ops = []
    if top_ops:
        profiler.stop()
        ops = [[event.key, event.self_cpu_time_total / 1e6 / args.phases, event.count // args.phases]
               for event in sorted(profiler.key_averages(), key=lambda e: -e.self_cpu_time_total)[:top_ops]]
    return torch.tensor(times[1:]).median(dim=0).values.tolist(), ops


def print_top_ops(args: argparse.Namespace, ours: dict, dgl: dict) -> None:
    """Per side and row, the ops of most self CPU time over the phase batches (seconds and calls per batch)."""
    for negatives in map(str, args.negatives):
        for side, ops in (("ours, fused", ours["ops"][negatives]), ("DGL", dgl["ops"][negatives])):
            print(f"top {args.top_ops} ops by self CPU time, {negatives} negatives, {side} (s per batch, calls):")
            for name, seconds, calls in ops:
                print(f"  {name[:60]:<60} {seconds:>8.4f} {calls:>5}")


def print_phases(args: argparse.Namespace, ours: dict, dgl: dict) -> None:
    """The per-phase table: seconds per step, median over the timed batches."""
    print(f"step phases, median s over {args.phases} batches made and trained in turn:")
    print(f"{'negatives':>9} {'side':>18} | " + " ".join(f"{phase:>9}" for phase in PHASES) + f" | {'step':>7}")
    for negatives in map(str, args.negatives):
        rows = [("ours, fused", ours["phases"][negatives]["fused"]),
                ("ours, gathered dot", ours["phases"][negatives]["gathered"]), ("DGL", dgl["phases"][negatives])]
        for side, times in rows:
            print(f"{negatives:>9} {side:>18} | " + " ".join(f"{t:>9.4f}" for t in times) + f" | {sum(times):>7.3f}")


def morphpipe_training(graph, args: argparse.Namespace, negatives: int,
                       seed: int) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """`args.epochs` epochs from seed `seed` through the Trainer (plan from this machine's measured batch and step
    times): mean epoch seconds, then exact val MRR; and the model's initial weights, which DGL's side starts from."""
    fanouts = args.fanouts
    task = LinkPrediction(negatives)
    units = task.seeds(graph)
    if args.epoch_edges:
        units = units[:args.epoch_edges]
    torch.manual_seed(seed)
    model = task.build_model("sage", graph, num_layers=len(fanouts), hidden=args.hidden, dropout=0.0)
    step = TrainStep(model, make_optimizer(model.parameters(), args.lr, "cpu"), task)
    with EdgeBatcher(graph, fanouts, args.batch_size, negatives=task.sampling, num_threads=1, edge_ids=units,
                     pin_memory=False) as batcher:
        sample = [batch for _, batch in zip(range(4), batcher.epoch(0))]
    timed = sample[1:] or sample  # an epoch of one batch times that batch
    start = time.perf_counter()
    for batch in timed:
        step(batch)
    step_s = (time.perf_counter() - start) / len(timed)
    batch_s = 1.0 / morphpipe_batching(graph, fanouts, args.batch_size, negatives, 1, 3, seed)
    num_batches = -(-units.numel() // args.batch_size)
    plan = plan_from_profile(Profile.synthetic(t_cb=batch_s, t_m=step_s, num_batches=num_batches,
                                               cores=args.threads))

    class Subset(LinkPrediction):
        def seeds(self, graph, split="train"):
            return units if split == "train" else super().seeds(graph, split)

    subset = Subset(negatives)
    torch.manual_seed(seed)
    model = subset.build_model("sage", graph, num_layers=len(fanouts), hidden=args.hidden, dropout=0.0)
    initial = {name: tensor.detach().clone().numpy() for name, tensor in model.state_dict().items()}
    val = subset.seeds(graph, "val")
    with Trainer(graph, model, plan, fanouts=fanouts, batch_size=args.batch_size, task=subset, lr=args.lr,
                 seed=seed, progress=False, eval_mode="full", log=lambda line: None) as trainer:
        history = trainer.fit(args.epochs, validate=False)
        mrr = None if args.val_edges < 0 else \
            subset.evaluate(trainer.model, graph, val[:args.val_edges] if args.val_edges else val,
                            EvalSettings(fanouts, mode="full", progress=False), device=torch.device("cpu"))
    epochs_s = [stats.epoch_s for stats in history]
    return {"epoch_s": sum(epochs_s) / len(epochs_s), "epochs_s": epochs_s, "batches": history[-1].batches,
            "losses": [stats.loss for stats in history], "val_mrr": mrr, "plan": plan.kind,
            "shares_cores": plan.shares_cores}, initial


def run_dgl(dataset: Path, args: argparse.Namespace, initial: dict[str, dict[str, np.ndarray]]) -> dict:
    """DGL's side, its training rows starting from our rows' initial weights (`initial`, by "negatives/seed")."""
    with tempfile.TemporaryDirectory(prefix="bench_link_") as scratch:
        weights = {}
        for row, state in initial.items():
            weights[row] = str(Path(scratch) / f"{row.replace('/', '_')}.npz")
            np.savez(weights[row], **state)
        settings = {"dataset": str(dataset), "fanouts": args.fanouts, "batch_size": args.batch_size,
                    "negatives": args.negatives, "threads": args.threads, "batches": args.batches,
                    "seed": args.seeds[0], "seeds": args.seeds, "epochs": args.epochs,
                    "hidden": args.hidden, "lr": args.lr, "epoch_edges": args.epoch_edges, "phases": args.phases,
                    "val_edges": args.val_edges, "top_ops": args.top_ops, "weights": weights}
        return run_dgl_script(DGL_SCRIPT, settings, args.threads, args.dgl_python)


def mrr(training: dict) -> str:
    """A row's val MRR as printed ("-" when validation was skipped)."""
    return "-" if training["val_mrr"] is None else f"{training['val_mrr']:.4f}"


def print_mrr_spread(args: argparse.Namespace, ours: dict, dgl: dict) -> None:
    """Per negatives, each side's val MRR over the seeds: mean and sample standard deviation."""
    print(f"val MRR over seeds {args.seeds} (mean +- sample std):")
    for negatives in map(str, args.negatives):
        cells = []
        for side, result in (("ours", ours), ("DGL", dgl)):
            values = torch.tensor([result["training"][f"{negatives}/{seed}"]["val_mrr"] for seed in args.seeds],
                                  dtype=torch.float64)
            cells.append(f"{side} {float(values.mean()):.4f} +- {float(values.std()):.4f}")
        print(f"{negatives:>9} negatives: " + ", ".join(cells))


def make_split(args: argparse.Namespace) -> None:
    """Writes a random edge split of `--split-from` to the directory `--dataset` unless it holds one already."""
    out = Path(args.dataset)
    if (out / EDGE_SPLIT_FILE).is_file():
        print(f"{out} holds an edge split: benchmarking it as it is")
        return
    start = time.perf_counter()
    split = with_edge_split(load_dataset(args.split_from), fractions=args.split_fractions,
                            negatives=args.split_negatives, seed=args.seed)
    split.save(check_graph_output(out, overwrite=False))
    print(f"split {args.split_from} into {out} ({split.edge_split!r}) in {time.perf_counter() - start:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="link", help="a preset or graph directory with an edge split")
    parser.add_argument("--fanouts", type=int_list, default="15,10,5")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--negatives", type=int_list, default="1,100", help="negatives per positive, one row each")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batches", type=int, default=30, help="edge batches timed per row")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--epoch-edges", type=int, default=32768,
                        help="training edges of the timed epoch (default 32768, 32 batches: the run stays under ~5 "
                             "minutes on 2 cores; 0: all)")
    parser.add_argument("--phases", type=int, default=0,
                        help="also time each phase of a training step over this many batches per side (0: not)")
    parser.add_argument("--top-ops", type=int, default=0,
                        help="with --phases: also list this many ops of most self CPU time over the phase batches, "
                             "per side (torch.profiler; 0: not)")
    parser.add_argument("--val-edges", type=int, default=0,
                        help="validation edges ranked for the MRR (default 0: all; -1: no validation, which "
                             "saves both sides' full-graph inference on a large graph)")
    parser.add_argument("--split-from", help="a preset or graph directory to split into --dataset (a directory) "
                                             "when that holds no edge split yet")
    parser.add_argument("--split-fractions", type=SplitFractions.parse, default=SplitFractions(0.98, 0.01, 0.01),
                        help="with --split-from: train,val,test shares of the edges (default 0.98,0.01,0.01)")
    parser.add_argument("--split-negatives", type=int, default=100,
                        help="with --split-from: fixed negatives per held-out edge (default 100)")
    parser.add_argument("--seeds", type=int_list, default="0",
                        help="training seeds, one epoch row per seed and negatives (the first also seeds batching, "
                             "the phases and --split-from's split)")
    parser.add_argument("--epochs", type=int, default=1,
                        help="epochs over the --epoch-edges edges per training row (the epoch column is their mean, "
                             "the val MRR is after the last): more lets both models learn for an MRR comparison")
    parser.add_argument("--dgl-python", default=DGL_PYTHON)
    parser.add_argument("--out", type=writable_file, default="bench_link.json")
    args = parser.parse_args()
    args.seed = args.seeds[0]
    if args.epochs < 1:
        raise SystemExit(f"--epochs must be at least 1, got {args.epochs}")

    if args.split_from:
        make_split(args)
    graph = load_dataset(args.dataset)
    dataset = dataset_directory(args.dataset)
    torch.set_num_threads(args.threads)
    ours: dict[str, dict] = {"batching": {}, "training": {}, "phases": {}}
    initial: dict[str, dict[str, np.ndarray]] = {}
    for negatives in args.negatives:
        if args.phases:
            fused, ops = morphpipe_phases(graph, args, negatives, gathered=False)
            ours["phases"][str(negatives)] = {"fused": fused,
                                              "gathered": morphpipe_phases(graph, args, negatives, gathered=True)[0]}
            ours.setdefault("ops", {})[str(negatives)] = ops
        ours["batching"][str(negatives)] = morphpipe_batching(graph, args.fanouts, args.batch_size, negatives,
                                                              args.threads, args.batches, args.seed)
        for seed in args.seeds:
            ours["training"][f"{negatives}/{seed}"], initial[f"{negatives}/{seed}"] = \
                morphpipe_training(graph, args, negatives, seed)
    dgl = run_dgl(dataset, args, initial)

    load = os.getloadavg()
    print(f"graph {graph.name}: {graph.num_nodes:,} nodes, {graph.num_edges:,} edges, "
          f"{graph.edge_split.train.shape[1]:,} training edges; fanouts {args.fanouts}, batch {args.batch_size}, "
          f"{args.threads} threads; SAGE {len(args.fanouts)}x{args.hidden} + dot, BCE; {args.epochs} epoch(s) of "
          f"{ours['training'][f'{args.negatives[0]}/{args.seed}']['batches']} batches per row; load {load[0]:.1f}")
    print(f"{'negatives':>9} {'seed':>4} | {'batches/s ours':>14} {'DGL':>8} {'ratio':>6} | {'epoch s ours':>12} "
          f"{'DGL':>8} {'ratio':>6} | {'val MRR ours':>12} {'DGL':>7}")
    for negatives in map(str, args.negatives):
        b_ours, b_dgl = ours["batching"][negatives], dgl["batching"][negatives]
        for seed in args.seeds:
            t_ours, t_dgl = ours["training"][f"{negatives}/{seed}"], dgl["training"][f"{negatives}/{seed}"]
            print(f"{negatives:>9} {seed:>4} | {b_ours:>14.2f} {b_dgl:>8.2f} {b_ours / b_dgl:>6.2f} | "
                  f"{t_ours['epoch_s']:>12.2f} {t_dgl['epoch_s']:>8.2f} {t_dgl['epoch_s'] / t_ours['epoch_s']:>6.2f} | "
                  f"{mrr(t_ours):>12} {mrr(t_dgl):>7}")
    if len(args.seeds) > 1 and args.val_edges >= 0:
        print_mrr_spread(args, ours, dgl)
    if args.phases:
        print_phases(args, ours, dgl)
    if args.phases and args.top_ops:
        print_top_ops(args, ours, dgl)
    report = {"date": date.today().isoformat(), "load_average": load,
              "machine": {"cpu": platform.processor() or platform.machine(), "usable_cores": usable_cores(),
                          "torch": torch.__version__, "python": sys.version.split()[0]},
              "settings": {key: value for key, value in vars(args).items() if key != "out"},
              "morphpipe": ours, "dgl": dgl}
    Path(args.out).write_text(json.dumps(report, indent=2, default=str) + "\n")  # SplitFractions as text
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
