"""The fused CUDA kernels against the plain-PyTorch reference on CPU: every op, reduction, dtype and choice.

Skipped without a CUDA device; on one, a missing CUDA build fails `test_cuda_kernels_are_built`
with the reason, and the other tests skip.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from morphpipe import ops
from morphpipe.nn import GAT, GCN, GraphSAGE
from morphpipe.ops import fused
from morphpipe.ops.cost_model import calibrate
from morphpipe.ops.sparse_input import sparse_aware_linear
from morphpipe.sampling import sample_neighbors
from morphpipe.sampling.minibatch import Block
from tests.ops.conftest import EDGE_CASES, GAT_CHOICES, NUM_SRC, SUM_CHOICES, features, make_block, tie_free

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
F64 = torch.float64
CUDA = torch.device("cuda")
needs_kernels = pytest.mark.skipif(torch.cuda.is_available() and fused.unavailable("cuda") is not None,
                                   reason="the CUDA kernels were not built (see test_cuda_kernels_are_built)")


def on_both(fn, *inputs: torch.Tensor, choices: dict[str, str] | None = None, dtype: torch.dtype = F64):
    """(fused on CUDA, reference on CPU): `fn(device, *inputs)` and its input gradients for a fixed output weighting."""
    results = []
    for device, backend in ((CUDA, "fused"), (torch.device("cpu"), "reference")):
        leaves = [t.detach().to(device).requires_grad_(t.requires_grad) for t in inputs]
        with ops.use_backend(backend), ops.force_choices(choices or {}):
            out = fn(device, *[leaf.to(dtype) for leaf in leaves])
            weights = features(99, *out.shape, dtype=out.dtype).to(device)
            (out * weights).sum().backward()
        results.append((out.detach().cpu().to(F64), [leaf.grad.cpu() for leaf in leaves if leaf.requires_grad]))
    return results


def assert_close(results, tol: float) -> None:
    (out, grads), (ref, ref_grads) = results
    torch.testing.assert_close(out, ref, atol=tol, rtol=tol)
    for grad, ref_grad in zip(grads, ref_grads):
        torch.testing.assert_close(grad, ref_grad, atol=tol, rtol=tol)


def test_cuda_kernels_are_built():
    assert fused.unavailable("cuda") is None
    with ops.use_backend(ops.AUTO):
        assert ops.current_backend(CUDA).name == "fused"


@needs_kernels
@pytest.mark.parametrize("choices", SUM_CHOICES, ids=lambda c: "-".join(c.values()))
@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
def test_aggregate_every_choice(choices, reduce):
    block = make_block(EDGE_CASES, NUM_SRC)
    h, weight = features(0, NUM_SRC, 3).requires_grad_(), features(1, block.nnz).requires_grad_()
    assert_close(on_both(lambda d, h, w: ops.aggregate(block.to(d), h, reduce, edge_weight=w), h, weight,
                         choices=choices), 1e-10)
    cuda_block = block.to(CUDA)
    with ops.use_backend("fused"), ops.force_choices(choices):
        assert torch.autograd.gradcheck(lambda h, w: ops.aggregate(cuda_block, h, reduce, edge_weight=w),
                                        (h.to(CUDA), weight.to(CUDA)))


@needs_kernels
@pytest.mark.parametrize("width", [1, 2, 3, 5, 8, 16, 31, 32, 33, 64, 200])
def test_every_feature_adaptive_group_size(width):
    block = make_block(EDGE_CASES, NUM_SRC)
    h = features(0, NUM_SRC, width).requires_grad_()
    for reduce in ops.REDUCTIONS:
        assert_close(on_both(lambda d, h: ops.aggregate(block.to(d), h, reduce), h,
                             choices={"aggregate.kernel": "rowwise"}), 1e-10)
    heads = features(1, NUM_SRC, 2, width).requires_grad_()
    scores = features(2, NUM_SRC, 2).requires_grad_()
    assert_close(on_both(lambda d, h, s: ops.gat_attention(block.to(d), h, s, s[:5]), heads, scores), 1e-10)


@needs_kernels
@pytest.mark.parametrize("choices", SUM_CHOICES, ids=lambda c: "-".join(c.values()))
@pytest.mark.parametrize("add_self_loops", [True, False])
def test_gcn_every_choice(choices, add_self_loops):
    block = make_block(EDGE_CASES, NUM_SRC)
    h = features(0, NUM_SRC, 4).requires_grad_()
    assert_close(on_both(lambda d, h: ops.gcn_aggregate(block.to(d), h, add_self_loops), h, choices=choices), 1e-10)


@needs_kernels
@pytest.mark.parametrize("choices", GAT_CHOICES, ids=lambda c: "-".join(c.values()))
@pytest.mark.parametrize("add_self_loops", [True, False])
@pytest.mark.parametrize("shared", [False, True], ids=["per-head", "shared"])
def test_gat_every_choice(choices, add_self_loops, shared):
    block = make_block(EDGE_CASES, NUM_SRC)
    base = features(1, NUM_SRC, 1 if shared else 3, 4).requires_grad_()
    score_src, score_dst = features(2, NUM_SRC, 3).requires_grad_(), features(3, 5, 3).requires_grad_()

    def attend(device, h, s, d):
        return ops.gat_attention(block.to(device), h, s, d, 0.2, add_self_loops)

    assert_close(on_both(attend, base, score_src, score_dst, choices=choices), 1e-10)
    cuda_block = block.to(CUDA)
    with ops.use_backend("fused"), ops.force_choices(choices):
        assert torch.autograd.gradcheck(
            lambda h, s, d: ops.gat_attention(cuda_block, h, s, d, 0.2, add_self_loops),
            (base.to(CUDA), score_src.to(CUDA), score_dst.to(CUDA)))


@pytest.fixture(scope="module")
def sampled_block() -> Block:
    generator = torch.Generator().manual_seed(0)
    num_nodes = 5000
    degrees = (torch.rand(num_nodes, generator=generator) ** -1.2).clamp(max=400).long()
    indptr = torch.cat([torch.zeros(1, dtype=torch.int64), degrees.cumsum(0)])
    graph = SimpleNamespace(indptr=indptr, indices=torch.randint(0, num_nodes, (int(indptr[-1]),), generator=generator),
                            num_nodes=num_nodes, features=torch.randn(num_nodes, 8),
                            labels=torch.zeros(num_nodes, dtype=torch.int64))
    return sample_neighbors(graph, torch.arange(256), [15, 10], seed=1).blocks[0]


@needs_kernels
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-5), (torch.float16, 2e-2), (torch.bfloat16, 5e-2)], ids=str)
def test_sampled_block_in_low_precision(sampled_block, dtype, tol):
    h = tie_free(sampled_block.num_src, 40, dtype, seed=0).requires_grad_()
    for reduce in ops.REDUCTIONS:
        for choices in (SUM_CHOICES[0], SUM_CHOICES[-1]):
            assert_close(on_both(lambda d, h: ops.aggregate(sampled_block.to(d), h, reduce), h, choices=choices,
                                 dtype=dtype), tol)
    heads = features(1, sampled_block.num_src, 4, 16).requires_grad_()
    scores = features(2, sampled_block.num_src, 4).requires_grad_()
    for choices in GAT_CHOICES:
        assert_close(on_both(lambda d, h, s: ops.gat_attention(sampled_block.to(d), h, s, s[: sampled_block.num_dst]),
                             heads, scores, choices=choices, dtype=dtype), tol * 10)


@needs_kernels
def test_no_edge_by_feature_tensor_on_the_device():
    num_nodes, degree, width = 64, 2000, 128
    indices = torch.randint(0, num_nodes, (num_nodes * degree,), device=CUDA)
    block = Block(torch.arange(0, num_nodes * degree + 1, degree, device=CUDA), indices, num_nodes, num_nodes)
    edge_bytes = block.nnz * width * 4
    h = torch.randn(num_nodes, width, device=CUDA, requires_grad=True)
    heads = torch.randn(num_nodes, 4, width // 4, device=CUDA, requires_grad=True)
    scores = torch.randn(num_nodes, 4, device=CUDA, requires_grad=True)
    with ops.use_backend("fused"), ops.force_choices({"aggregate.kernel": "rowwise"}):
        ops.aggregate(block, h).sum().backward()  # calibrates outside the measurement
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        baseline = torch.cuda.memory_allocated()
        for reduce in ops.REDUCTIONS:
            ops.aggregate(block, h, reduce).sum().backward()
        ops.gcn_aggregate(block, h).sum().backward()
        ops.gat_attention(block, heads, scores, scores).sum().backward()
        torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() - baseline < edge_bytes / 2


@needs_kernels
@pytest.mark.parametrize("model_type", [GraphSAGE, GCN, GAT])
def test_models_on_cuda_match_the_cpu_reference(sampled_block, model_type):
    torch.manual_seed(0)
    model = model_type(12, 3, num_layers=1, hidden=8).double()
    x = features(0, sampled_block.num_src, 12)
    results = []
    for device, backend in ((CUDA, "fused"), (torch.device("cpu"), "reference")):
        model.zero_grad()
        with ops.use_backend(backend):
            out = model.to(device)([sampled_block.to(device)], x.to(device))
        out.sum().backward()
        results.append((out.detach().cpu(), [p.grad.cpu() for p in model.parameters()]))
    assert_close(results, 1e-9)


@needs_kernels
def test_sparse_input_linear_on_cuda():
    x = features(0, 300, 40) * (torch.rand(300, 40) < 0.05)
    weight, bias = features(1, 16, 40).requires_grad_(), features(2, 16).requires_grad_()
    outs = []
    for transform in ("dense", "sparse"):
        with ops.force_choices({"input.transform": transform}):
            outs.append(sparse_aware_linear(x.to(CUDA), weight.to(CUDA), bias.to(CUDA), 0.05).cpu())
    torch.testing.assert_close(outs[0], outs[1])


@needs_kernels
def test_calibration_on_the_device():
    calibration = calibrate(CUDA)
    assert calibration.device_type == "cuda" and calibration.gemm_flop > 0
    assert 0.0 <= calibration.sparse_threshold(128, 256) <= 1.0
