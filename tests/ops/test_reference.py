"""The aggregation interface and its reference backend against naive per-destination Python loops.

The loop tests run on the reference backend (`use_backend("reference")`, not the default, which is
the fused one where it is built); the cheap hand-made cases run on both backends.
"""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from morphpipe import ops
from morphpipe.ops import reference as reference_kernels
from morphpipe.sampling.minibatch import Block
from tests.ops.conftest import features, make_block

F64 = torch.float64
REFERENCE = "reference"
BACKENDS = ["reference", "fused"]


@st.composite
def blocks(draw: st.DrawFn, max_dst: int = 6, max_extra_src: int = 4, max_degree: int = 5):
    """Small random neighbourhoods: empty lists, repeated sources and unused sources all occur."""
    num_dst = draw(st.integers(0, max_dst))
    num_src = num_dst + draw(st.integers(0, max_extra_src))
    source = st.integers(0, num_src - 1) if num_src else st.nothing()
    neighbours = [draw(st.lists(source, max_size=max_degree)) for _ in range(num_dst)]
    return neighbours, num_src, draw(st.integers(0, 2**16))


def naive_aggregate(neighbours, h, reduce, weight=None) -> torch.Tensor:
    out, edge = torch.zeros(len(neighbours), h.shape[1], dtype=h.dtype), 0
    for i, nbrs in enumerate(neighbours):
        messages = []
        for j in nbrs:
            messages.append(h[j] * (1.0 if weight is None else weight[edge]))
            edge += 1
        if messages:
            stacked = torch.stack(messages)
            out[i] = {"sum": stacked.sum(0), "mean": stacked.mean(0), "max": stacked.max(0).values}[reduce]
    return out


def naive_gcn(neighbours, num_src, h, add_self_loops) -> torch.Tensor:
    loop = int(add_self_loops)
    out_degree = [sum(n.count(j) for n in neighbours) + (loop if j < len(neighbours) else 0) for j in range(num_src)]
    out = torch.zeros(len(neighbours), h.shape[1], dtype=h.dtype)
    for i, nbrs in enumerate(neighbours):
        for j in nbrs + [i] * loop:
            out[i] += h[j] / math.sqrt((len(nbrs) + loop) * out_degree[j])
    return out


def naive_gat(neighbours, h, score_src, score_dst, slope, add_self_loops) -> torch.Tensor:
    out = torch.zeros(len(neighbours), *h.shape[1:], dtype=h.dtype)
    for i, nbrs in enumerate(neighbours):
        edges = nbrs + [i] * int(add_self_loops)
        for k in range(h.shape[1]):
            raw = [float(score_src[j, k] + score_dst[i, k]) for j in edges]
            scores = [s if s > 0 else slope * s for s in raw]
            total = sum(math.exp(s) for s in scores)
            for j, s in zip(edges, scores):
                out[i, k] += math.exp(s) / total * h[j, k]
    return out


@settings(max_examples=60, deadline=None)
@given(blocks(), st.sampled_from(ops.REDUCTIONS), st.booleans())
def test_aggregate_matches_loop(case, reduce, weighted):
    neighbours, num_src, seed = case
    block = make_block(neighbours, num_src)
    h = features(seed, num_src, 3)
    weight = features(seed + 1, block.nnz) if weighted else None
    with ops.use_backend(REFERENCE):
        out = ops.aggregate(block, h, reduce, edge_weight=weight)
    torch.testing.assert_close(out, naive_aggregate(neighbours, h, reduce, weight))


# Always tried, not left to the search: sources past the destinations (4, 5) feed destinations, with self loops.
@example(([[], [2, 2, 4], [], [0, 5]], 6, 0), True)
@settings(max_examples=40, deadline=None)
@given(blocks(), st.booleans())
def test_gcn_aggregate_matches_loop(case, add_self_loops):
    neighbours, num_src, seed = case
    h = features(seed, num_src, 3)
    with ops.use_backend(REFERENCE):
        out = ops.gcn_aggregate(make_block(neighbours, num_src), h, add_self_loops=add_self_loops)
    torch.testing.assert_close(out, naive_gcn(neighbours, num_src, h, add_self_loops))


@settings(max_examples=40, deadline=None)
@given(blocks(), st.booleans(), st.sampled_from([0.2, 0.01, 0.45]))
def test_gat_attention_matches_loop(case, add_self_loops, slope):
    neighbours, num_src, seed = case
    h, score_src = features(seed, num_src, 2, 3), features(seed + 1, num_src, 2)
    score_dst = features(seed + 2, len(neighbours), 2)
    with ops.use_backend(REFERENCE):
        out = ops.gat_attention(make_block(neighbours, num_src), h, score_src, score_dst, slope, add_self_loops)
    torch.testing.assert_close(out, naive_gat(neighbours, h, score_src, score_dst, slope, add_self_loops))


# destination 0: no in-edges; 1: source 2 twice; 2: isolated (no in-edges, feeds nothing); 3: two sources.
EDGE_CASES = [[], [2, 2, 4], [], [0, 5]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_edge_cases_by_hand(backend):
    block = make_block(EDGE_CASES, 6)
    h = features(0, 6, 4)
    with ops.use_backend(backend):
        check_edge_cases(block, h)


def check_edge_cases(block, h):
    torch.testing.assert_close(ops.aggregate(block, h, "sum")[1], 2 * h[2] + h[4])
    torch.testing.assert_close(ops.aggregate(block, h, "mean")[1], (2 * h[2] + h[4]) / 3)
    for reduce in ops.REDUCTIONS:
        assert ops.aggregate(block, h, reduce)[[0, 2]].eq(0).all()
    hs = features(1, 6, 2, 4)
    score_src, score_dst = features(2, 6, 2), features(3, 4, 2)
    with_loops = ops.gat_attention(block, hs, score_src, score_dst)
    torch.testing.assert_close(with_loops[[0, 2]], hs[[0, 2]])
    assert ops.gat_attention(block, hs, score_src, score_dst, add_self_loops=False)[[0, 2]].eq(0).all()
    assert ops.gcn_aggregate(block, h, add_self_loops=False)[[0, 2]].eq(0).all()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("num_dst,num_src", [(0, 0), (0, 3), (3, 3)])
def test_blocks_without_edges(num_dst, num_src, backend):
    with ops.use_backend(backend):
        check_blocks_without_edges(num_dst, num_src)


def check_blocks_without_edges(num_dst, num_src):
    block = make_block([[] for _ in range(num_dst)], num_src)
    h = features(0, num_src, 5)
    for reduce in ops.REDUCTIONS:
        assert ops.aggregate(block, h, reduce).shape == (num_dst, 5)
    torch.testing.assert_close(ops.gcn_aggregate(block, h), h[:num_dst])
    hs = features(1, num_src, 2, 5)
    out = ops.gat_attention(block, hs, features(2, num_src, 2), features(3, num_dst, 2))
    torch.testing.assert_close(out, hs[:num_dst])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_dtypes_forward_and_backward(dtype):
    block = make_block(EDGE_CASES, 6)
    tol = {torch.float16: 2e-2, torch.bfloat16: 2e-2, torch.float32: 1e-5, torch.float64: 1e-12}[dtype]
    h64, hs64 = features(0, 6, 4), features(1, 6, 2, 4)
    scores64 = features(2, 6, 2), features(3, 4, 2)
    h, hs = h64.to(dtype).requires_grad_(), hs64.to(dtype).requires_grad_()
    scores = [s.to(dtype) for s in scores64]
    results = [ops.aggregate(block, h, r) for r in ops.REDUCTIONS] + [
        ops.gcn_aggregate(block, h),
        ops.gat_attention(block, hs, *scores),
    ]
    expected = [ops.aggregate(block, h64, r) for r in ops.REDUCTIONS] + [
        ops.gcn_aggregate(block, h64),
        ops.gat_attention(block, hs64, *scores64),
    ]
    for out, ref in zip(results, expected):
        assert out.dtype == dtype
        torch.testing.assert_close(out.to(F64), ref, atol=tol, rtol=tol)
    sum(out.sum() for out in results).backward()
    assert h.grad.dtype == dtype and hs.grad.dtype == dtype


@pytest.mark.parametrize("reduce", ops.REDUCTIONS)
def test_aggregate_gradcheck(reduce):
    block = make_block(EDGE_CASES, 6)
    h, weight = features(0, 6, 3).requires_grad_(), features(1, block.nnz).requires_grad_()
    with ops.use_backend(REFERENCE):
        assert torch.autograd.gradcheck(lambda h, w: ops.aggregate(block, h, reduce, edge_weight=w), (h, weight))


@pytest.mark.parametrize("add_self_loops", [True, False])
def test_gcn_and_gat_gradcheck(add_self_loops):
    block = make_block(EDGE_CASES, 6)
    h = features(0, 6, 3).requires_grad_()
    inputs = (features(1, 6, 2, 3).requires_grad_(), features(2, 6, 2).requires_grad_(), features(3, 4, 2).requires_grad_())
    with ops.use_backend(REFERENCE):
        assert torch.autograd.gradcheck(lambda h: ops.gcn_aggregate(block, h, add_self_loops), (h,))
        assert torch.autograd.gradcheck(lambda *a: ops.gat_attention(block, *a, 0.3, add_self_loops), inputs)


def test_aggregate_keeps_trailing_feature_dims():
    block = make_block(EDGE_CASES, 6)
    h = features(0, 6, 2, 3)
    out = ops.aggregate(block, h, "max")
    assert out.shape == (4, 2, 3)
    torch.testing.assert_close(out.flatten(1), ops.aggregate(block, h.flatten(1), "max"))


def test_bad_inputs_name_the_field():
    block = make_block(EDGE_CASES, 6)
    h = features(0, 6, 3)
    with pytest.raises(ValueError, match="reduce='min'"):
        ops.aggregate(block, h, "min")
    with pytest.raises(ValueError, match="num_src=6"):
        ops.aggregate(block, h[:5])
    with pytest.raises(ValueError, match="h_src must be floating"):
        ops.aggregate(block, h.long())
    with pytest.raises(ValueError, match="edge_weight"):
        ops.aggregate(block, h, edge_weight=torch.ones(2, dtype=F64))
    with pytest.raises(ValueError, match="block.indices"):
        ops.aggregate(Block(block.indptr, block.indices.int(), 6, 4), h)
    with pytest.raises(ValueError, match="block.indptr"):
        ops.aggregate(Block(block.indptr[:-1], block.indices, 6, 4), h)
    with pytest.raises(ValueError, match="heads"):
        ops.gat_attention(block, features(1, 6, 2, 3), features(2, 6, 3), features(3, 4, 2))
    small = make_block([[0], [1], [0]], 2)
    with pytest.raises(ValueError, match="add_self_loops=False"):
        ops.gcn_aggregate(small, features(0, 2, 3))
    ops.gcn_aggregate(small, features(0, 2, 3), add_self_loops=False)


def test_backend_registry_routes_and_restores():
    calls: list[str] = []

    def counting_aggregate(block, h_src, reduce, edge_weight):
        calls.append(reduce)
        return reference_kernels.aggregate(block, h_src, reduce, edge_weight)

    default_name = ops.current_backend().name
    assert "reference" in ops.available_backends() and default_name in ops.available_backends()
    with ops.use_backend("reference") as reference:
        pass
    ops.register_backend(
        ops.Backend("test-counting", counting_aggregate, reference.gcn_aggregate, reference.gat_attention), replace=True
    )
    with pytest.raises(ValueError, match="already registered"):
        ops.register_backend(ops.Backend("test-counting", counting_aggregate, reference.gcn_aggregate, reference.gat_attention))
    block, h = make_block(EDGE_CASES, 6), features(0, 6, 3)
    with ops.use_backend("test-counting") as backend:
        assert backend.name == ops.current_backend().name == "test-counting"
        ops.aggregate(block, h, "mean")
    assert calls == ["mean"] and ops.current_backend().name == default_name
    ops.set_backend("test-counting")
    try:
        with ops.use_backend("reference"):
            ops.aggregate(block, h)
        ops.aggregate(block, h, "max")
    finally:
        ops.set_backend(ops.AUTO)
    assert calls == ["mean", "max"] and ops.current_backend().name == default_name
    with pytest.raises(ValueError, match="not registered"):
        ops.set_backend("no-such-backend")


def test_backend_on_unsupported_device_is_an_error():
    reference = ops.current_backend()
    cuda_only = ops.Backend(
        "test-cuda-only", reference.aggregate, reference.gcn_aggregate, reference.gat_attention, frozenset({"cuda"})
    )
    ops.register_backend(cuda_only, replace=True)
    with ops.use_backend("test-cuda-only"), pytest.raises(RuntimeError, match="test-cuda-only"):
        ops.aggregate(make_block(EDGE_CASES, 6), features(0, 6, 3))
