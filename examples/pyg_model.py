"""A PyTorch Geometric model on morphpipe's mini-batches: `edge_index` per layer.

What it shows: morphpipe samples (the C++ CPU batcher), PyG computes. Each `Block` becomes a
bipartite PyG graph: `batch.edge_indices()[i]` is layer i's `[2, nnz]` edge_index (row 0 source,
row 1 destination, local ids, PyG's default flow source_to_target); the layer maps the
`num_src` source rows to `num_dst` destination rows, and the destinations are the first
`num_dst` sources, so `(h, h[:num_dst])` is PyG's bipartite input. Works with any PyG conv that
takes bipartite input (SAGEConv, GATConv, GraphConv, ...). Needs torch_geometric
(`pip install torch_geometric`); without it the script says so and exits.

    python examples/pyg_model.py --dataset tiny
    python examples/pyg_model.py --dataset default --conv gat --epochs 3
"""
from __future__ import annotations

import argparse
import sys

import torch
from torch import nn
from torch.nn import functional as F

from morphpipe.data import load_dataset
from morphpipe.sampling import CpuBatcher, MiniBatch

try:
    from torch_geometric import nn as pyg_nn
except ImportError:
    pyg_nn = None


class PygNet(nn.Module):
    """PyG convolutions over morphpipe blocks, one per sampled hop."""

    def __init__(self, conv: str, in_features: int, hidden: int, num_classes: int, num_layers: int) -> None:
        super().__init__()
        widths = [in_features] + [hidden] * (num_layers - 1) + [num_classes]
        if conv == "sage":
            self.convs = nn.ModuleList(pyg_nn.SAGEConv(a, b) for a, b in zip(widths[:-1], widths[1:]))
        else:  # GATConv with one head; add_self_loops=False: the self features come as the bipartite x_dst
            self.convs = nn.ModuleList(pyg_nn.GATConv((a, a), b, heads=1, add_self_loops=False)
                                       for a, b in zip(widths[:-1], widths[1:]))

    def forward(self, batch: MiniBatch) -> torch.Tensor:
        h = batch.x.float()
        for i, (conv, block, edge_index) in enumerate(zip(self.convs, batch.blocks, batch.edge_indices())):
            h = conv((h, h[: block.num_dst]), edge_index, size=(block.num_src, block.num_dst))
            if i < len(self.convs) - 1:
                h = F.dropout(F.relu(h), 0.3, self.training)
        return h


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="default", help="preset name or dataset directory (default: default)")
    parser.add_argument("--conv", choices=("sage", "gat"), default="sage", help="PyG convolution (default sage)")
    parser.add_argument("--fanouts", default="10,5", help="neighbours per hop from the seeds (default 10,5)")
    parser.add_argument("--batch-size", type=int, default=512, help="seeds per batch (default 512)")
    parser.add_argument("--hidden", type=int, default=64, help="hidden width (default 64)")
    parser.add_argument("--epochs", type=int, default=5, help="epochs to train (default 5)")
    parser.add_argument("--lr", type=float, default=5e-3, help="Adam learning rate (default 0.005)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict | None:
    """Trains the PyG model; returns the per-epoch losses and the test accuracy (None without torch_geometric)."""
    args = parse_args(argv)
    if pyg_nn is None:
        print("torch_geometric is not installed (pip install torch_geometric): nothing to run", file=sys.stderr)
        return None
    fanouts = [int(f) for f in args.fanouts.split(",")]
    torch.manual_seed(args.seed)
    graph = load_dataset(args.dataset)
    model = PygNet(args.conv, graph.feature_dim, args.hidden, graph.num_classes, len(fanouts))
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    losses = []
    with CpuBatcher(graph, fanouts, args.batch_size, seed=args.seed) as train, \
            CpuBatcher(graph, fanouts, 4096, seeds=graph.test_idx, shuffle=False, seed=args.seed) as test:
        for epoch in range(args.epochs):
            model.train()
            total, seeds = 0.0, 0
            for batch in train:
                loss = F.cross_entropy(model(batch), batch.y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                total += float(loss.detach()) * batch.y.numel()
                seeds += batch.y.numel()
            losses.append(total / seeds)
            print(f"epoch {epoch}: loss {losses[-1]:.4f}")
        model.eval()
        with torch.no_grad():
            correct = sum(int((model(batch).argmax(1) == batch.y).sum()) for batch in test)
        test_acc = correct / len(graph.test_idx)
    print(f"test accuracy {test_acc:.3f} ({args.conv}, torch_geometric)")
    return {"losses": losses, "test_acc": test_acc}


if __name__ == "__main__":
    main()
