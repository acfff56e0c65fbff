"""Your own `nn.Module` and training loop on morphpipe's mini-batches.

What it shows: a model written from scratch (a 2-hop GNN that concatenates each node's own
features with the max and the mean of its sampled in-neighbours', built on the fused op
`morphpipe.ops.aggregate`), trained by a plain PyTorch loop over `CpuBatcher` batches. A
`MiniBatch` holds `blocks` (one per layer, input layer first; in each block the first `num_dst`
source nodes are the destinations), `x = features[input_nodes]` and `y = labels[seeds]`.
Any module taking `(blocks, x)` also trains under a plan: `Trainer(graph, YourModel(...), plan, ...)`.

    python examples/custom_module.py --dataset tiny
    python examples/custom_module.py --dataset default --fanouts 15,10 --epochs 5
"""
from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.nn import functional as F

from morphpipe.data import load_dataset
from morphpipe.ops import aggregate
from morphpipe.sampling import Block, CpuBatcher


class MaxMeanConv(nn.Module):
    """h_dst' = W [h_dst ; max of in-neighbours ; mean of in-neighbours]."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.linear = nn.Linear(3 * in_features, out_features)

    def forward(self, block: Block, h_src: torch.Tensor) -> torch.Tensor:
        h_dst = h_src[: block.num_dst]  # the destinations are the first num_dst sources
        return self.linear(torch.cat([h_dst, aggregate(block, h_src, "max"), aggregate(block, h_src, "mean")], dim=1))


class MaxMeanGNN(nn.Module):
    """One MaxMeanConv per sampled hop, ReLU and dropout between them."""

    def __init__(self, in_features: int, hidden: int, num_classes: int, num_layers: int, dropout: float) -> None:
        super().__init__()
        widths = [in_features] + [hidden] * (num_layers - 1) + [num_classes]
        self.convs = nn.ModuleList(MaxMeanConv(a, b) for a, b in zip(widths[:-1], widths[1:]))
        self.dropout = dropout

    def forward(self, blocks: list[Block], x: torch.Tensor) -> torch.Tensor:
        h = x
        for i, (conv, block) in enumerate(zip(self.convs, blocks)):
            h = conv(block, h)
            if i < len(self.convs) - 1:
                h = F.dropout(F.relu(h), self.dropout, self.training)
        return h  # logits of the last block's destinations: the seeds


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="default", help="preset name or dataset directory (default: default)")
    parser.add_argument("--fanouts", default="10,5", help="neighbours per hop from the seeds (default 10,5)")
    parser.add_argument("--batch-size", type=int, default=512, help="seeds per batch (default 512)")
    parser.add_argument("--hidden", type=int, default=64, help="hidden width (default 64)")
    parser.add_argument("--epochs", type=int, default=5, help="epochs to train (default 5)")
    parser.add_argument("--lr", type=float, default=5e-3, help="Adam learning rate (default 0.005)")
    parser.add_argument("--threads", type=int, default=None, help="sampler threads (default: the usable cores)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    return parser.parse_args(argv)


@torch.no_grad()
def accuracy(model: nn.Module, batcher: CpuBatcher) -> float:
    """Sampled accuracy over the batcher's seeds."""
    model.eval()
    correct = total = 0
    for batch in batcher:
        correct += int((model(batch.blocks, batch.x.float()).argmax(dim=1) == batch.y).sum())
        total += batch.y.numel()
    return correct / total


def main(argv: list[str] | None = None) -> dict:
    """Trains the model; returns the per-epoch losses and the validation and test accuracies."""
    args = parse_args(argv)
    fanouts = [int(f) for f in args.fanouts.split(",")]
    torch.manual_seed(args.seed)
    graph = load_dataset(args.dataset)
    model = MaxMeanGNN(graph.feature_dim, args.hidden, graph.num_classes, len(fanouts), dropout=0.3)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    train = CpuBatcher(graph, fanouts, args.batch_size, num_threads=args.threads, seed=args.seed)
    val = CpuBatcher(graph, fanouts, 4096, seeds=graph.val_idx, shuffle=False, num_threads=args.threads,
                     seed=args.seed)
    test = CpuBatcher(graph, fanouts, 4096, seeds=graph.test_idx, shuffle=False, num_threads=args.threads,
                      seed=args.seed)
    losses, val_accs = [], []
    with train, val, test:  # close() stops the sampler threads
        for epoch in range(args.epochs):
            model.train()
            total, seeds = 0.0, 0
            for batch in train:  # one epoch; iterating again starts the next one
                loss = F.cross_entropy(model(batch.blocks, batch.x.float()), batch.y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                total += float(loss.detach()) * batch.y.numel()
                seeds += batch.y.numel()
            losses.append(total / seeds)
            val_accs.append(accuracy(model, val))
            print(f"epoch {epoch}: {len(train)} batches, loss {losses[-1]:.4f}, val acc {val_accs[-1]:.3f}")
        test_acc = accuracy(model, test)
    print(f"test accuracy {test_acc:.3f}")
    return {"losses": losses, "val_accs": val_accs, "test_acc": test_acc}


if __name__ == "__main__":
    main()
