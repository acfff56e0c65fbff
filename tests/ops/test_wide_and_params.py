"""Every op, backend and kernel choice against naive per-edge loops at the feature widths real models use.

The CPU kernels walk features in tiles of 256 (csrc/cpu/aggregate_common.h, kFeatureTile), so
widths 255, 256, 257, 300 and 768 cross the tile edges; 1 and 3 are narrower than any vector
lane. The reference values here come from Python loops over each destination's edges (degrees
and GCN factors counted from the neighbour lists, not from `gcn_scales`), with autograd through
the loops for the gradients. GAT runs with non-default slopes and several heads.
"""
from __future__ import annotations

import math

import pytest
import torch

from morphpipe import ops
from tests.ops.conftest import GAT_CHOICES, SUM_CHOICES, features, make_block

F64 = torch.float64
WIDTHS = [1, 3, 255, 256, 257, 300, 768]

# destination 0: no in-edges; 1: source 2 twice; 2: isolated; 3: two sources; 4: a self edge; 5: a heavy row.
NEIGHBOURS = [[], [2, 2, 4], [], [0, 5], [4, 1], [6, 0, 3, 3, 7, 1]]
NUM_SRC = 8

MAX_CHOICES = [{"aggregate.order": o} for o in ("natural", "degree_sorted")]
# (backend, forced choices): the reference backend once, the fused one under every choice.
SUM_RUNS = [("reference", {})] + [("fused", c) for c in SUM_CHOICES]
MAX_RUNS = [("reference", {})] + [("fused", c) for c in MAX_CHOICES]
GAT_RUNS = [("reference", {})] + [("fused", c) for c in GAT_CHOICES]


def loop_aggregate(h: torch.Tensor, weight: torch.Tensor, reduce: str) -> torch.Tensor:
    rows, edge = [], 0
    for nbrs in NEIGHBOURS:
        messages = []
        for j in nbrs:
            messages.append(h[j] * weight[edge])
            edge += 1
        if not messages:
            rows.append(h.new_zeros(h.shape[1]))
        elif reduce == "sum":
            rows.append(sum(messages))
        elif reduce == "mean":
            rows.append(sum(messages) / len(messages))
        else:
            rows.append(torch.stack(messages).max(0).values)
    return torch.stack(rows)


def loop_gcn(h: torch.Tensor, add_self_loops: bool) -> torch.Tensor:
    """GCN by its definition: norm 1/sqrt(deg_in(i) deg_out(j)), degrees counted from the lists (+1 per self loop)."""
    loop = int(add_self_loops)
    out_degree = [loop * (j < len(NEIGHBOURS)) for j in range(NUM_SRC)]
    for nbrs in NEIGHBOURS:
        for j in nbrs:
            out_degree[j] += 1
    rows = []
    for i, nbrs in enumerate(NEIGHBOURS):
        row = h.new_zeros(h.shape[1])
        for j in nbrs + [i] * loop:
            row = row + h[j] / math.sqrt((len(nbrs) + loop) * out_degree[j])
        rows.append(row)
    return torch.stack(rows)


def loop_gat(h, score_src, score_dst, slope: float, add_self_loops: bool) -> torch.Tensor:
    """Per destination and head: softmax over in-edges of leaky_relu(s_j + d_i, slope), weighted sum of h_j."""
    heads = score_src.shape[1]
    rows = []
    for i, nbrs in enumerate(NEIGHBOURS):
        edges = nbrs + [i] * int(add_self_loops)
        per_head = []
        for k in range(heads):
            if not edges:
                per_head.append(h.new_zeros(h.shape[2]))
                continue
            raw = torch.stack([score_src[j, k] + score_dst[i, k] for j in edges])
            scores = torch.where(raw > 0, raw, slope * raw)
            alpha = torch.exp(scores - scores.max())
            alpha = alpha / alpha.sum()
            head_of_h = k if h.shape[1] > 1 else 0
            per_head.append(sum(alpha[n] * h[j, head_of_h] for n, j in enumerate(edges)))
        rows.append(torch.stack(per_head))
    return torch.stack(rows)


def run_with_grads(fn, inputs: list[torch.Tensor], backend: str | None, choices: dict):
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    if backend is None:
        out = fn(*leaves)
    else:
        with ops.use_backend(backend), ops.force_choices(choices):
            out = fn(*leaves)
    projection = features(99, *out.shape, dtype=out.dtype)
    grads = torch.autograd.grad((out * projection).sum(), leaves)
    return out.detach(), grads


def check_against_loops(op, loops, inputs, runs, *, atol=1e-10, rtol=1e-10) -> None:
    expected, expected_grads = run_with_grads(loops, inputs, None, {})
    for backend, choices in runs:
        out, grads = run_with_grads(op, inputs, backend, choices)
        where = f"{backend} {choices}"
        torch.testing.assert_close(out, expected, atol=atol, rtol=rtol, msg=lambda m: f"{where}: {m}")
        for grad, expected_grad in zip(grads, expected_grads):
            torch.testing.assert_close(grad, expected_grad, atol=atol, rtol=rtol, msg=lambda m: f"{where} grad: {m}")


BLOCK = make_block(NEIGHBOURS, NUM_SRC)
NNZ = BLOCK.nnz


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_weighted_sum_and_mean_at_every_width(width: int, reduce: str) -> None:
    inputs = [features(width, NUM_SRC, width), features(width + 1, NNZ)]
    check_against_loops(lambda h, w: ops.aggregate(BLOCK, h, reduce, edge_weight=w),
                        lambda h, w: loop_aggregate(h, w, reduce), inputs, SUM_RUNS)


@pytest.mark.parametrize("width", WIDTHS)
def test_max_at_every_width(width: int) -> None:
    # tie-free values: a random permutation of distinct values per column, and positive weights.
    h = torch.stack([torch.randperm(NUM_SRC, generator=torch.Generator().manual_seed(c)) for c in range(width)], 1)
    inputs = [(h.to(F64) - 3.5) / 7, features(width, NNZ).abs() + 0.5]
    check_against_loops(lambda h, w: ops.aggregate(BLOCK, h, "max", edge_weight=w),
                        lambda h, w: loop_aggregate(h, w, "max"), inputs, MAX_RUNS)


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("add_self_loops", [True, False])
def test_gcn_at_every_width(width: int, add_self_loops: bool) -> None:
    check_against_loops(lambda h: ops.gcn_aggregate(BLOCK, h, add_self_loops),
                        lambda h: loop_gcn(h, add_self_loops), [features(width, NUM_SRC, width)], SUM_RUNS)


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("heads, shared", [(3, False), (2, True)], ids=["3-heads", "shared-h"])
@pytest.mark.parametrize("slope", [0.01, 0.35])
def test_gat_at_every_width_heads_and_slope(width: int, heads: int, shared: bool, slope: float) -> None:
    add_self_loops = slope > 0.1  # both self-loop settings, without doubling the grid
    inputs = [features(width, NUM_SRC, 1 if shared else heads, width), 2 * features(width + 1, NUM_SRC, heads),
              2 * features(width + 2, len(NEIGHBOURS), heads)]
    check_against_loops(lambda h, s, d: ops.gat_attention(BLOCK, h, s, d, slope, add_self_loops),
                        lambda h, s, d: loop_gat(h, s, d, slope, add_self_loops), inputs, GAT_RUNS)


@pytest.mark.parametrize("width", [257, 768])
def test_float32_wide_rows(width: int) -> None:
    """float32 accumulates in float32: the bound is a few ulps times the longest row (6 edges)."""
    inputs = [features(width, NUM_SRC, width, dtype=torch.float32), features(width + 1, NNZ, dtype=torch.float32)]
    check_against_loops(lambda h, w: ops.aggregate(BLOCK, h, "sum", edge_weight=w),
                        lambda h, w: loop_aggregate(h, w, "sum"), inputs, SUM_RUNS, atol=1e-5, rtol=1e-5)


def test_gat_slope_changes_the_result() -> None:
    """The slope reaches the kernels: scores that are all negative give different weights at two slopes."""
    inputs = [features(0, NUM_SRC, 2, 4), -features(1, NUM_SRC, 2).abs() - 1, -features(2, len(NEIGHBOURS), 2).abs()]
    for backend in ("reference", "fused"):
        with ops.use_backend(backend):
            low = ops.gat_attention(BLOCK, *inputs, 0.01, True)
            high = ops.gat_attention(BLOCK, *inputs, 0.5, True)
        assert not torch.allclose(low[[1, 3, 4, 5]], high[[1, 3, 4, 5]])
