"""NarrowProjection: `x @ weight` for a weight of a few columns, its products laid out for BLAS; the same values
and gradients as autograd's `mm` within float32 rounding, and used by GAT's fused step only."""
from __future__ import annotations

import pytest
import torch

from morphpipe.nn.gat import GATConv
from morphpipe.ops import narrow_projection as module
from morphpipe.ops.narrow_projection import narrow_projection
from morphpipe.ops.step_variant import FUSED_STEP, LEGACY_STEP, use_step_variant
from morphpipe.sampling.minibatch import Block


@pytest.mark.parametrize("rows,width,columns", [(1, 1, 1), (37, 5, 3), (2_000, 64, 8), (513, 130, 2)])
@pytest.mark.parametrize("x_grad", [True, False])
def test_values_and_gradients_match_autograd_mm(rows, width, columns, x_grad):
    generator = torch.Generator().manual_seed(rows + width)
    x = torch.randn(rows, width, generator=generator, requires_grad=x_grad)
    weight = torch.randn(width, columns, generator=generator, requires_grad=True)
    grad = torch.randn(rows, columns, generator=generator)
    out = narrow_projection(x, weight)
    out.backward(grad)
    x_ref = x.detach().clone().requires_grad_(x_grad)
    weight_ref = weight.detach().clone().requires_grad_(True)
    expected = x_ref @ weight_ref
    expected.backward(grad)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(weight.grad, weight_ref.grad, rtol=1e-5, atol=1e-4)
    if x_grad:
        torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-5, atol=1e-5)
    else:
        assert x.grad is None


def test_other_dtypes_take_the_plain_product():
    x, weight = torch.randn(6, 4, dtype=torch.float64), torch.randn(4, 2, dtype=torch.float64)
    assert narrow_projection(x, weight).grad_fn is None  # no autograd function for inputs that need no grad
    y = narrow_projection(x.requires_grad_(), weight)
    assert "NarrowProjection" not in type(y.grad_fn).__name__


def _block(num_src: int, num_dst: int, degree: int, seed: int) -> Block:
    generator = torch.Generator().manual_seed(seed)
    indptr = torch.arange(0, (num_dst + 1) * degree, degree, dtype=torch.int64)
    indices = torch.randint(0, num_src, (num_dst * degree,), generator=generator)
    return Block(indptr=indptr, indices=indices, num_src=num_src, num_dst=num_dst)


def test_gat_scores_take_it_under_the_fused_step_only(monkeypatch):
    calls = []
    real = module.NarrowProjection.apply
    monkeypatch.setattr(module.NarrowProjection, "apply", lambda *args: calls.append(1) or real(*args))
    torch.manual_seed(0)
    conv = GATConv(12, 5, heads=3)
    block = _block(40, 16, 4, seed=1)
    h = torch.randn(40, 12, requires_grad=True)
    outputs = {}
    for name, variant in (("legacy", LEGACY_STEP), ("fused", FUSED_STEP)):
        calls.clear()
        conv.zero_grad()
        h.grad = None
        with use_step_variant(variant):
            out = conv(block, h)
        out.square().sum().backward()
        outputs[name] = (out.detach(), h.grad.clone(), conv.att_src.grad.clone(), conv.lin.weight.grad.clone())
        assert len(calls) == (1 if name == "fused" else 0)
    for legacy, fused in zip(outputs["legacy"], outputs["fused"]):
        torch.testing.assert_close(fused, legacy, rtol=1e-5, atol=1e-5)
