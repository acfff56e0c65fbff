"""DGL 2.1's side of scripts/bench_hetero.py, run by DGL's own interpreter (never imported by morphpipe).

Reads the same dataset directory (meta.json and the per-relation CSC .npy files HeteroGraphStore writes),
builds a DGL heterograph from them, and measures typed batches per second with DGL's heterogeneous
NeighborSampler and training epochs of RGAT / R-GCN built from HeteroGraphConv, once per seed (`--seeds`:
seed s draws the initialisation, the epoch order and the samples). Prints one JSON object.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import dgl
import numpy as np
import torch
from dgl.nn import GATConv, GraphConv, HeteroGraphConv
from torch import nn
from torch.nn import functional as F


def load(directory: Path):
    meta = json.loads((directory / "meta.json").read_text())
    counts = {t["name"]: t["count"] for t in meta["node_types"]}
    starts = {t["name"]: t["start"] for t in meta["node_types"]}
    data = {}
    for r in meta["relations"]:
        key = f"{r['src']}__{r['name']}__{r['dst']}"
        indptr = torch.from_numpy(np.load(directory / f"indptr.{key}.npy")).long()
        indices = torch.from_numpy(np.load(directory / f"indices.{key}.npy")).long()
        data[(r["src"], r["name"], r["dst"])] = ("csc", (indptr, indices, torch.tensor([], dtype=torch.long)))
    graph = dgl.heterograph(data, num_nodes_dict=counts)
    features = {name: torch.from_numpy(np.load(directory / f"features.{name}.npy")) for name in meta["features"]}
    target = meta["target_type"]
    labels = torch.from_numpy(np.load(directory / "labels.npy"))[starts[target]:starts[target] + counts[target]]
    splits = {name: torch.from_numpy(np.load(directory / f"{name}.npy")) - starts[target]
              for name in ("train_idx", "val_idx", "test_idx")}
    return graph, features, labels, splits, target, meta["num_classes"]


class Model(nn.Module):
    """Embeddings for featureless types, then HeteroGraphConv layers (GAT per relation, or R-GCN: mean per relation
    with its own weight plus a self weight per type), summed per destination type."""

    def __init__(self, kind, graph, features, hidden, heads, num_classes, layers):
        super().__init__()
        dim = max(f.shape[1] for f in features.values())
        self.embeddings = nn.ModuleDict({t: nn.Embedding(graph.num_nodes(t), dim) for t in graph.ntypes
                                         if t not in features})
        self.kind, self.heads = kind, heads
        dims = {t: (features[t].shape[1] if t in features else dim) for t in graph.ntypes}
        self.convs, self.roots = nn.ModuleList(), nn.ModuleList()
        for i in range(layers):
            last = i == layers - 1
            out = num_classes if last else hidden
            if kind == "rgat":
                self.convs.append(HeteroGraphConv({r: GATConv((dims[s], dims[d]), out, heads, allow_zero_in_degree=True)
                                                   for s, r, d in graph.canonical_etypes}, aggregate="sum"))
                width = out if last else out * heads
            else:
                self.convs.append(HeteroGraphConv({r: GraphConv(dims[s], out, norm="right", bias=False,
                                                                allow_zero_in_degree=True)
                                                   for s, r, d in graph.canonical_etypes}, aggregate="sum"))
                self.roots.append(nn.ModuleDict({t: nn.Linear(dims[t], out) for t in graph.ntypes}))
                width = out
            dims = {t: width for t in graph.ntypes}
        self.reset_parameters(dim)

    def reset_parameters(self, dim):
        """morphpipe's initialisation (nn.hetero), so that one epoch's accuracy compares the architectures, not the
        libraries' defaults: DGL's GATConv draws xavier_normal with ReLU gain, nn.Embedding N(0, 1) (11x the norm of
        morphpipe's N(0, 1/dim) rows) and nn.Linear kaiming-uniform weights and biases."""
        for embedding in self.embeddings.values():
            nn.init.normal_(embedding.weight, std=dim ** -0.5)
        for conv in self.convs:
            for module in conv.mods.values():
                if isinstance(module, GATConv):  # PyG GATConv: glorot lin_src, lin_dst, att_src, att_dst; zero bias
                    for weight in (module.fc_src.weight, module.fc_dst.weight, module.attn_l, module.attn_r):
                        nn.init.xavier_uniform_(weight)
                    nn.init.zeros_(module.bias)
                else:  # R-GCN's W_r
                    nn.init.xavier_uniform_(module.weight)
        for roots in self.roots:  # R-GCN's W_0,T (xavier) and b_T (zero)
            for root in roots.values():
                nn.init.xavier_uniform_(root.weight)
                nn.init.zeros_(root.bias)

    def forward(self, blocks, inputs):
        h = {t: (self.embeddings[t](v) if t in self.embeddings else v) for t, v in inputs.items()}
        for i, (block, conv) in enumerate(zip(blocks, self.convs)):
            last = i == len(self.convs) - 1
            out = conv(block, h)
            if self.kind == "rgat":
                out = {t: (v.mean(1) if last else v.flatten(1)) for t, v in out.items()}
            else:
                roots = self.roots[i]
                out = {t: out.get(t, 0) + roots[t](h[t][: block.num_dst_nodes(t)]) for t in block.dsttypes
                       if block.num_dst_nodes(t)}
            h = out if last else {t: F.relu(v) for t, v in out.items()}
        return h


def batch_inputs(input_nodes, features):
    return {t: (features[t][ids] if t in features else ids) for t, ids in input_nodes.items()}


def train_and_test(kind, graph, features, labels, splits, target, num_classes, sampler, args, seed) -> dict:
    """`args.epochs` epochs of `kind` from seed `seed`: epoch times and test accuracy (sampled, training fanouts)."""
    torch.manual_seed(seed)
    dgl.seed(seed)
    model = Model(kind, graph, features, args.hidden, args.heads, num_classes, len(sampler.fanouts))
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    train = dgl.dataloading.DataLoader(graph, {target: splits["train_idx"]}, sampler, batch_size=args.batch_size,
                                       shuffle=True, num_workers=0)
    epochs = []
    for _ in range(args.epochs):
        start = time.perf_counter()
        model.train()
        for input_nodes, output_nodes, blocks in train:
            logits = model(blocks, batch_inputs(input_nodes, features))[target]
            loss = F.cross_entropy(logits, labels[output_nodes[target]])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        epochs.append(time.perf_counter() - start)
    model.eval()
    correct = 0
    test = dgl.dataloading.DataLoader(graph, {target: splits["test_idx"]}, sampler, batch_size=4096,
                                      shuffle=False, num_workers=0)
    with torch.no_grad():
        for input_nodes, output_nodes, blocks in test:
            logits = model(blocks, batch_inputs(input_nodes, features))[target]
            correct += int((logits.argmax(1) == labels[output_nodes[target]]).sum())
    return {"epoch_s": epochs, "test_accuracy": correct / splits["test_idx"].numel()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("directory", type=Path)
    parser.add_argument("--fanouts", required=True)
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--batches", type=int, required=True)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--epochs", type=int, required=True)
    parser.add_argument("--hidden", type=int, required=True)
    parser.add_argument("--heads", type=int, required=True)
    parser.add_argument("--models", required=True)
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--seeds", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    graph, features, labels, splits, target, num_classes = load(args.directory)
    fanouts = [int(f) for f in args.fanouts.split(",")][::-1]  # DGL lists the input layer's fanout first
    sampler = dgl.dataloading.NeighborSampler(fanouts)
    result = {"dgl": dgl.__version__, "torch": torch.__version__}

    seeds = splits["train_idx"][: args.batches * args.batch_size]
    loader = dgl.dataloading.DataLoader(graph, {target: seeds}, sampler, batch_size=args.batch_size, shuffle=True,
                                        num_workers=0)
    for input_nodes, _, _ in loader:  # a first pass warms the pages and DGL's thread pool, as morphpipe's side does
        batch_inputs(input_nodes, features)
    start, cpu = time.perf_counter(), time.process_time()
    count = 0
    for input_nodes, output_nodes, blocks in loader:
        batch_inputs(input_nodes, features)
        count += 1
    result["batches_per_s"] = count / (time.perf_counter() - start)
    result["cpu_s_per_batch"] = (time.process_time() - cpu) / count

    for kind in args.models.split(","):
        runs = [train_and_test(kind, graph, features, labels, splits, target, num_classes, sampler, args, seed)
                for seed in range(args.seeds)]
        result[kind] = {"epoch_s": [s for run in runs for s in run["epoch_s"]],
                        "test_accuracy": [run["test_accuracy"] for run in runs]}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
