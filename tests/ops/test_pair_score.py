"""The fused pair scorer (link prediction's dot decoder): equal to gathering both rows and summing their product,
forward and backward (gradcheck in float64), with repeated and self pairs, deterministic over thread counts, and
bad arguments refused by name."""
from __future__ import annotations

import pytest
import torch

from morphpipe import native
from morphpipe.ops.pair_score import pair_dot, reference_pair_dot

from .conftest import F64, features


def pairs(rows: int, count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`count` random pairs over `rows` rows, with a repeated pair, a self pair and a row used many times."""
    generator = torch.Generator().manual_seed(seed)
    src = torch.randint(rows, (count,), generator=generator)
    dst = torch.randint(rows, (count,), generator=generator)
    src[:5] = 0  # row 0 is the source of many pairs, as a positive's source is for its negatives
    src[5], dst[5] = src[6], dst[6] = 2, 3
    src[7] = dst[7] = 4
    return src, dst


@pytest.mark.parametrize("width", [1, 7, 256, 300])
@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_forward_and_backward_equal_the_dense_reference(width: int, dtype: torch.dtype) -> None:
    h = features(0, 40, width, dtype=dtype).requires_grad_()
    src, dst = pairs(40, 500, seed=1)
    grad = features(2, 500, dtype=dtype)
    scores = pair_dot(h, src, dst)
    (fused_grad,) = torch.autograd.grad(scores, h, grad)
    expected = reference_pair_dot(h, src, dst)
    (expected_grad,) = torch.autograd.grad(expected, h, grad)
    tolerance = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1e-12, "atol": 1e-12}
    torch.testing.assert_close(scores, expected, **tolerance)
    torch.testing.assert_close(fused_grad, expected_grad, **tolerance)


def test_gradcheck_in_float64() -> None:
    h = features(3, 9, 5).requires_grad_()
    src, dst = pairs(9, 30, seed=4)
    assert torch.autograd.gradcheck(lambda table: pair_dot(table, src, dst), (h,))


def test_index_shape_is_kept_and_half_precision_sums_in_float() -> None:
    h = features(5, 20, 64).to(torch.bfloat16)
    src, dst = pairs(20, 60, seed=6)
    scores = pair_dot(h, src.view(6, 10), dst.view(6, 10))
    assert scores.shape == (6, 10) and scores.dtype == torch.bfloat16
    exact = reference_pair_dot(h.double(), src, dst).view(6, 10)
    torch.testing.assert_close(scores.double(), exact, rtol=1e-2, atol=1e-2)


def link_batch_pairs(rows: int, positives: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A link batch's pair list: `positives` pairs, then each positive's source with `k` corrupted destinations."""
    generator = torch.Generator().manual_seed(seed)
    src = torch.randint(rows, (positives,), generator=generator)
    dst = torch.randint(rows, (positives,), generator=generator)
    negatives = torch.randint(rows, (positives * k,), generator=generator)
    return torch.cat([src, src.repeat_interleave(k)]), torch.cat([dst, negatives])


@pytest.mark.parametrize("layout", ["random", "link batch", "fewer rows than threads"])
def test_backward_is_the_same_for_any_thread_count(layout: str) -> None:
    """The rows' entries are grouped by teams that each own a range of rows: any team count gives the same bits,
    equal to the gathered reference's gradient."""
    rows = 5 if layout == "fewer rows than threads" else 300
    src, dst = {"random": lambda: pairs(300, 20_000, seed=8), "link batch": lambda: link_batch_pairs(300, 64, 100, 8),
                "fewer rows than threads": lambda: pairs(5, 500, seed=8)}[layout]()
    h = features(7, rows, 96, dtype=torch.float32)
    grad = features(9, src.numel(), dtype=torch.float32)
    threads = torch.get_num_threads()
    try:
        results = []
        for count in (1, 2, 3, 8):
            torch.set_num_threads(count)
            results.append(native.ops().pair_dot_backward(h, src, dst, grad))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(results[0], other) for other in results[1:])
    table = h.clone().requires_grad_()
    (expected,) = torch.autograd.grad(reference_pair_dot(table, src, dst), table, grad)
    torch.testing.assert_close(results[0], expected, rtol=1e-4, atol=1e-4)


def test_no_pairs_give_no_scores_and_a_zero_gradient() -> None:
    h = features(10, 6, 4).requires_grad_()
    empty = torch.empty(0, dtype=torch.int64)
    scores = pair_dot(h, empty, empty)
    assert scores.shape == (0,)
    scores.sum().backward()
    assert torch.equal(h.grad, torch.zeros_like(h))


@pytest.mark.parametrize("which", ["src", "dst"])
def test_an_index_outside_h_is_named(which: str) -> None:
    h = features(11, 5, 3)
    src, dst = torch.tensor([0, 1, 2]), torch.tensor([1, 2, 3])
    (src if which == "src" else dst)[1] = 5
    with pytest.raises(RuntimeError, match=rf"morphpipe::pair_dot: {which}\[1\] = 5 is outside \[0, 5\)"):
        native.ops().pair_dot(h, src, dst)
    with pytest.raises(RuntimeError, match=rf"morphpipe::pair_dot_backward: {which}\[1\] = 5 is outside"):
        native.ops().pair_dot_backward(h, src, dst, torch.ones(3, dtype=F64))


def test_bad_arguments_are_refused_by_name() -> None:
    h, index = features(12, 5, 3), torch.tensor([0, 1])
    with pytest.raises(ValueError, match="h must be 2-D"):
        pair_dot(h[0], index, index)
    with pytest.raises(ValueError, match="src and dst must have one shape"):
        pair_dot(h, index, index[:1])
    with pytest.raises(ValueError, match="must be int64 indices, got torch.int32"):
        pair_dot(h, index.int(), index)
    with pytest.raises(RuntimeError, match="src and dst must list one pair each"):
        native.ops().pair_dot(h, index, index[:1])
    with pytest.raises(RuntimeError, match=r"grad must be 1-D \[2\] \(one per pair\) of h's dtype"):
        native.ops().pair_dot_backward(h, index, index, torch.ones(2, dtype=torch.float32))
