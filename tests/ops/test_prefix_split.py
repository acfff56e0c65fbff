"""`split_prefix`: the same values and gradients as `h_src` and `h_src[:num_dst]` used directly."""
from __future__ import annotations

import pytest
import torch

from morphpipe.ops.prefix_split import split_prefix


def _grads(split, dtype: torch.dtype, use_all: bool, use_prefix: bool, expand: bool) -> torch.Tensor:
    torch.manual_seed(0)
    h_src = torch.randn(7, 5, dtype=dtype, requires_grad=True)
    weight = torch.randn(5, 3, dtype=dtype)
    h_all, h_dst = split(h_src)
    loss = torch.zeros((), dtype=dtype)
    if use_all:
        # a broadcast gradient (sum's backward expands) reaches the sources without a fresh buffer
        loss = loss + (h_all.sum() if expand else (h_all @ weight).square().sum())
    if use_prefix:
        loss = loss + (h_dst @ weight).sin().sum()
    loss.backward()
    return h_src.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("use_all,use_prefix,expand", [(True, True, False), (True, True, True), (False, True, False),
                                                       (True, False, False)])
def test_gradients_equal_plain_slicing(dtype, use_all, use_prefix, expand):
    expected = _grads(lambda h: (h, h[:3]), dtype, use_all, use_prefix, expand)
    got = _grads(lambda h: split_prefix(h, 3), dtype, use_all, use_prefix, expand)
    assert torch.equal(got, expected)


def test_outputs_are_views_and_need_no_graph_without_a_gradient():
    h_src = torch.randn(6, 4)
    h_all, h_dst = split_prefix(h_src, 2)
    assert h_all is h_src and h_dst.data_ptr() == h_src.data_ptr() and h_dst.shape == (2, 4)
    with_grad = h_src.clone().requires_grad_()
    h_all, h_dst = split_prefix(with_grad, 2)
    assert h_all.grad_fn is not None and torch.equal(h_dst, with_grad[:2])
