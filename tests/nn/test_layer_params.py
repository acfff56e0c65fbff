"""Model layers with non-default parameters against loop-based definitions: GAT slope and heads, GCN, dropout p.

The loops here compute each layer from its paper definition with degrees counted from the
neighbour lists, independently of the ops' shared normalisation code, under both layer orders
(project first / aggregate first) and on both backends.
"""
from __future__ import annotations

import math

import pytest
import torch

from morphpipe import ops
from morphpipe.nn import build_model
from morphpipe.nn.gat import GATConv
from morphpipe.nn.gcn import GCNConv
from morphpipe.sampling.minibatch import Block

F64 = torch.float64
NEIGHBOURS = [[], [2, 2, 4], [5, 0], [4, 1, 6], [3]]
NUM_SRC = 7
ORDERS = ("project_first", "aggregate_first")


def make_block() -> Block:
    indptr = torch.tensor([0] + [len(n) for n in NEIGHBOURS]).cumsum(0)
    indices = torch.tensor([j for n in NEIGHBOURS for j in n], dtype=torch.int64)
    return Block(indptr, indices, NUM_SRC, len(NEIGHBOURS))


def loop_gat_conv(conv: GATConv, h: torch.Tensor) -> torch.Tensor:
    """GAT by definition: z = W h per head, e_ij = leaky_relu(a_src.z_j + a_dst.z_i), softmax over j in N(i) + i."""
    heads, out = conv.heads, conv.out_features
    z = (h @ conv.lin.weight.t()).detach().view(-1, heads, out)
    rows = []
    for i, nbrs in enumerate(NEIGHBOURS):
        edges = nbrs + [i]
        per_head = []
        for k in range(heads):
            raw = [float((conv.att_src[0, k] * z[j, k]).sum() + (conv.att_dst[0, k] * z[i, k]).sum()) for j in edges]
            scores = [s if s > 0 else conv.negative_slope * s for s in raw]
            peak = max(scores)
            weights = [math.exp(s - peak) for s in scores]
            total = sum(weights)
            per_head.append(sum(w / total * z[j, k] for w, j in zip(weights, edges)))
        rows.append(torch.stack(per_head))
    out_rows = torch.stack(rows)
    out_rows = out_rows.flatten(1) if conv.concat else out_rows.mean(1)
    return out_rows + conv.bias


def loop_gcn_conv(conv: GCNConv, h: torch.Tensor) -> torch.Tensor:
    out_degree = [int(j < len(NEIGHBOURS)) + sum(n.count(j) for n in NEIGHBOURS) for j in range(NUM_SRC)]
    rows = []
    for i, nbrs in enumerate(NEIGHBOURS):
        rows.append(sum(h[j] / math.sqrt((len(nbrs) + 1) * out_degree[j]) for j in nbrs + [i]))
    return torch.stack(rows) @ conv.lin.weight.t() + conv.bias


@pytest.mark.parametrize("backend", ["reference", "fused"])
@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("slope, heads, concat", [(0.05, 3, True), (0.4, 2, False), (0.2, 1, True)])
def test_gat_conv_with_its_slope_and_heads_matches_the_definition(backend, order, slope, heads, concat) -> None:
    torch.manual_seed(heads)
    conv = GATConv(5, 4, heads=heads, concat=concat, negative_slope=slope).to(F64)
    with torch.no_grad():
        conv.bias.uniform_(-1, 1)
        conv.att_src.mul_(3)  # wide score spread: many negative scores, where the slope matters
    h = torch.randn(NUM_SRC, 5, dtype=F64)
    with ops.use_backend(backend), ops.force_choices({"gat.order": order}):
        out = conv(make_block(), h)
    torch.testing.assert_close(out, loop_gat_conv(conv, h).detach(), atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("backend", ["reference", "fused"])
@pytest.mark.parametrize("order", ORDERS)
def test_gcn_conv_matches_the_definition(backend, order) -> None:
    torch.manual_seed(0)
    conv = GCNConv(6, 3).to(F64)
    with torch.no_grad():
        conv.bias.uniform_(-1, 1)
    h = torch.randn(NUM_SRC, 6, dtype=F64)
    with ops.use_backend(backend), ops.force_choices({"gcn.order": order}):
        out = conv(make_block(), h)
    torch.testing.assert_close(out, loop_gcn_conv(conv, h).detach(), atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("name", ["sage", "gcn", "gat"])
@pytest.mark.parametrize("p", [0.25, 0.6])
def test_dropout_drops_its_share_and_rescales(name: str, p: float) -> None:
    """Between layers, training zeroes a share p of the activations and scales the rest by 1/(1-p)."""
    torch.manual_seed(1)
    num = 400
    block = Block(torch.arange(0, 3 * num + 1, 3), torch.randint(0, num, (3 * num,)), num, num)
    extra = {"heads": 2} if name == "gat" else {}
    model = build_model(name, 8, 3, num_layers=2, hidden=16, dropout=p, **extra).to(F64)
    captured: list[torch.Tensor] = []
    model.convs[1].register_forward_pre_hook(lambda module, args: captured.append(args[1].detach().clone()))
    x = torch.randn(num, 8, dtype=F64)
    model.eval()
    model([block, block], x)
    model.train()
    model([block, block], x)
    kept, trained = captured
    active = kept > 0
    dropped = (trained[active] == 0).double().mean().item()
    assert dropped == pytest.approx(p, abs=0.04)
    survivors = trained[active] != 0
    torch.testing.assert_close(trained[active][survivors], kept[active][survivors] / (1 - p))
