"""The fused bias + activation + dropout op: equal to its plain-PyTorch definition with the same mask, gradcheck,
mask statistics, reproducibility from torch's seed, CUDA equal to CPU bit for bit, and the models using it."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from morphpipe import native
from morphpipe.nn import build_model
from morphpipe.ops.bias_act_dropout import bias_act_dropout, reference_bias_act_dropout, unpack_mask
from morphpipe.ops.step_variant import FUSED_STEP, LEGACY_STEP, StepVariant, use_step_variant
from morphpipe.sampling.minibatch import Block
from tests.reference_random import MASK32, splitmix64

WIDTHS = (1, 3, 255, 256, 257, 768)
ACTIVATIONS = ("relu", "identity")


def op():
    return native.ops()


def inputs(rows: int, width: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, width, generator=generator, dtype=dtype),
            torch.randn(width, generator=generator, dtype=dtype))


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("p", [0.0, 0.1, 0.5, 0.9])
def test_forward_and_backward_equal_the_reference_with_the_same_mask(width: int, activation: str, p: float) -> None:
    x, bias = inputs(301, width)  # rows * width crosses mask words and rows in every pattern
    out, mask = op().bias_act_dropout(x, bias, activation, p, 1234)
    keep = unpack_mask(mask, x.shape) if p > 0 else None
    assert mask.numel() == (math.ceil(x.numel() / 32) if p > 0 else 0)
    torch.testing.assert_close(out, reference_bias_act_dropout(x, bias, activation, p, keep), rtol=0, atol=0)
    grad = torch.randn_like(x)
    grad_x, grad_bias = op().bias_act_dropout_backward(grad, out, mask, activation, p, True)
    leaf_x, leaf_b = x.clone().double().requires_grad_(), bias.clone().double().requires_grad_()
    reference_bias_act_dropout(leaf_x, leaf_b, activation, p, keep).backward(grad.double())
    torch.testing.assert_close(grad_x, leaf_x.grad.float(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad_bias, leaf_b.grad.float(), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("p", [0.0, 0.3])
def test_float64_gradcheck(activation: str, p: float) -> None:
    x, bias = inputs(7, 5, torch.float64, seed=3)
    x = x.requires_grad_()
    bias = bias.requires_grad_()
    def fn(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        torch.manual_seed(11)  # gradcheck calls fn many times: the same mask each time
        return bias_act_dropout(x, bias, activation, p, training=True)

    # Keep ReLU inputs away from the kink so finite differences are valid.
    with torch.no_grad():
        x.add_(torch.where((x + bias).abs() < 0.1, 0.5, 0.0))
    assert torch.autograd.gradcheck(fn, (x, bias))


@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
def test_keep_rate_is_within_sampling_error_of_one_minus_p(p: float) -> None:
    x = torch.ones(1000, 257)
    _, mask = op().bias_act_dropout(x, None, "identity", p, 99)
    keep = unpack_mask(mask, x.shape).double()
    sigma = math.sqrt(p * (1 - p) / keep.numel())
    assert abs(keep.mean().item() - (1 - p)) < 5 * sigma
    # per column and per row: every position gets the same rate (no column/row pattern)
    column_rates = keep.mean(0)
    assert (column_rates - (1 - p)).abs().max() < 5 * math.sqrt(p * (1 - p) / keep.shape[0]) + 1e-9


def test_mask_bits_are_independent_across_elements_and_calls() -> None:
    p = 0.5
    x = torch.ones(512, 256)
    _, first = op().bias_act_dropout(x, None, "identity", p, 1)
    _, second = op().bias_act_dropout(x, None, "identity", p, 2)
    a = unpack_mask(first, x.shape).flatten().double()
    b = unpack_mask(second, x.shape).flatten().double()
    n = a.numel()
    limit = 5 / math.sqrt(n)  # correlation of independent bits is ~N(0, 1/n)

    def correlation(u: torch.Tensor, v: torch.Tensor) -> float:
        return float(torch.corrcoef(torch.stack([u, v]))[0, 1])

    assert abs(correlation(a, b)) < limit  # two calls (steps)
    for lag in (1, 2, 3, 4, 31, 32, 33, 256):  # neighbours, word and row boundaries
        assert abs(correlation(a[:-lag], a[lag:])) < 5 / math.sqrt(n - lag)
    # pairs of adjacent elements (consecutive counters of the hash) take all four patterns equally
    pairs = (a[0::2] * 2 + a[1::2]).long()
    counts = torch.bincount(pairs, minlength=4).double()
    expected = counts.sum() / 4
    assert float(((counts - expected) ** 2 / expected).sum()) < 16.3  # chi-square, 3 dof, p ~ 0.001


def mix32(x: int) -> int:
    x ^= x >> 16
    x = (x * 0x21F0AAAD) & MASK32
    x ^= x >> 15
    x = (x * 0x735A2D97) & MASK32
    return x ^ (x >> 15)


def specified_keep(seed: int, index: int, p: float) -> bool:
    """csrc/common/dropout_mask.h's definition, written out: element `index` is kept when its keyed hash is below
    round((1 - p) * 2^32)."""
    key = splitmix64(seed)
    round_key = (key >> 32) ^ (((index >> 32) * 0x9E3779B9) & MASK32)
    bits = mix32(mix32((index & MASK32) ^ (key & MASK32)) ^ round_key)
    return bits < round((1 - p) * 2**32)


@pytest.mark.parametrize("seed", [0, 7, 2**62 + 12345])
def test_the_mask_is_the_specified_counter_based_hash(seed: int) -> None:
    """Pins the generator, so the CPU kernel, the CUDA kernel and saved runs keep drawing the same bits."""
    x = torch.ones(37, 41)
    _, mask = op().bias_act_dropout(x, None, "identity", 0.3, seed)
    keep = unpack_mask(mask, x.shape).flatten().tolist()
    assert keep == [specified_keep(seed, i, 0.3) for i in range(x.numel())]


def test_torch_manual_seed_reproduces_the_mask_and_calls_differ() -> None:
    x, bias = inputs(64, 33)
    torch.manual_seed(5)
    first = bias_act_dropout(x, bias, "relu", 0.5)
    second = bias_act_dropout(x, bias, "relu", 0.5)
    torch.manual_seed(5)
    again = bias_act_dropout(x, bias, "relu", 0.5)
    assert torch.equal(first, again)
    assert not torch.equal(first, second)


def test_eval_mode_and_p_zero_draw_nothing_and_equal_relu_of_x_plus_bias() -> None:
    x, bias = inputs(50, 17)
    state = torch.get_rng_state()
    for out in (bias_act_dropout(x, bias, "relu", 0.5, training=False), bias_act_dropout(x, bias, "relu", 0.0)):
        torch.testing.assert_close(out, F.relu(x + bias), rtol=0, atol=0)
    assert torch.equal(state, torch.get_rng_state())
    assert torch.equal(bias_act_dropout(x, None, "identity", 0.0), x)


@pytest.mark.parametrize("p", [0.0, 0.5])
def test_nan_and_infinities_pass_through_relu_and_dropout_as_in_plain_pytorch(p: float) -> None:
    # A NaN hidden by the activation would let a poisoned feature row train on unseen by the finite guard.
    x, bias = inputs(9, 40)
    x[0, :7], x[1, :5], x[2, :5] = float("nan"), float("inf"), -float("inf")
    out, mask = op().bias_act_dropout(x, bias, "relu", p, 99)
    keep = unpack_mask(mask, x.shape) if p > 0 else None
    expected = reference_bias_act_dropout(x, bias, "relu", p, keep)
    assert torch.equal(out.isnan(), expected.isnan()) and int(out.isnan().sum()) >= (7 if p == 0 else 1)
    torch.testing.assert_close(out, expected, rtol=0, atol=0, equal_nan=True)
    grad_x, _ = op().bias_act_dropout_backward(torch.ones_like(x), out, mask, "relu", p, True)
    assert torch.equal(grad_x[0, :7], torch.zeros(7)), "like torch.relu's backward: no gradient through a NaN"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_other_dtypes_follow_the_reference(dtype: torch.dtype) -> None:
    x, bias = inputs(40, 24, dtype)
    out, mask = op().bias_act_dropout(x, bias, "relu", 0.25, 7)
    expected = reference_bias_act_dropout(x.float(), bias.float(), "relu", 0.25, unpack_mask(mask, x.shape))
    torch.testing.assert_close(out.float(), expected, rtol=1e-2, atol=1e-2)


def bfloat16_edge_cases() -> tuple[torch.Tensor, torch.Tensor]:
    """bfloat16 x and bias whose float32 sums land on rounding ties (odd and even), subnormals, the largest finite
    values (overflowing to inf), infinities and NaNs, beside random rows."""
    one_ulp = 2.0 ** -7  # a bfloat16 ulp at 1: x = 1 + k ulp plus bias = ulp / 2 is a tie
    ties = [1.0 + k * one_ulp for k in range(8)]
    specials = [2.0 ** -130, -(2.0 ** -130), 3.3895e38, float("inf"), -float("inf"), float("nan"), 0.0, -0.0]
    x = torch.tensor([ties, specials] * 2, dtype=torch.float32)
    x = torch.cat([x, torch.randn(6, 8, generator=torch.Generator().manual_seed(3))]).to(torch.bfloat16)
    bias = torch.tensor([one_ulp / 2, one_ulp / 2, 2.0 ** -131, -(2.0 ** -132), 3.3895e38, 1.0, -1.0, 0.5],
                        dtype=torch.bfloat16)
    return x, bias


def test_bfloat16_rounds_exactly_as_torch_at_every_cpu_level() -> None:
    # The kernels' own bfloat16 conversions (csrc/cpu/vector_convert.h, vectorised) must round as c10's do: to
    # nearest even, NaN kept NaN, overflow to inf; so the fused bf16 step keeps the reference's arithmetic.
    x, bias = bfloat16_edge_cases()
    grad = torch.randn(x.shape, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    for level in native.supported_cpu_capabilities():
        with native.forced_cpu_capability(level):
            for p in (0.0, 0.5):
                out, mask = op().bias_act_dropout(x, bias, "relu", p, 11)
                factor = unpack_mask(mask, x.shape).float() * (1 / (1 - p)) if p > 0 else torch.ones(x.shape)
                expected = (F.relu(x.float() + bias.float()) * factor).to(torch.bfloat16)
                torch.testing.assert_close(out, expected, rtol=0, atol=0, equal_nan=True, msg=f"{level} p={p}")
                grad_x, grad_bias = op().bias_act_dropout_backward(grad, out, mask, "relu", p, True)
                passed = torch.where(out.float() > 0, 1 / (1 - p), 0.0)
                want = (grad.float() * passed).to(torch.bfloat16)
                torch.testing.assert_close(grad_x, want, rtol=0, atol=0, msg=f"{level} p={p}: backward")
                torch.testing.assert_close(grad_bias, want.double().sum(0).to(torch.bfloat16))


def test_bad_arguments_are_named() -> None:
    x, bias = inputs(4, 3)
    with pytest.raises(ValueError, match="activation"):
        bias_act_dropout(x, bias, "tanh", 0.1)
    with pytest.raises(ValueError, match="p must be"):
        bias_act_dropout(x, bias, "relu", 1.0)
    with pytest.raises(ValueError, match="bias must have shape"):
        bias_act_dropout(x, bias[:2], "relu", 0.1)
    with pytest.raises(RuntimeError, match="activation must be"):
        op().bias_act_dropout(x, bias, "gelu", 0.1, 0)


def block_chain() -> tuple[list[Block], torch.Tensor]:
    """A three-layer chain of random blocks (prefix convention) and its input features."""
    generator = torch.Generator().manual_seed(4)
    sizes = [200, 90, 40, 10]
    blocks = []
    for num_src, num_dst in zip(sizes[:-1], sizes[1:]):
        degrees = torch.randint(0, 6, (num_dst,), generator=generator)
        indptr = torch.zeros(num_dst + 1, dtype=torch.int64)
        indptr[1:] = degrees.cumsum(0)
        indices = torch.randint(0, num_src, (int(indptr[-1]),), generator=generator)
        blocks.append(Block(indptr, indices, num_src, num_dst))
    return blocks, torch.randn(sizes[0], 12, generator=generator)


@pytest.mark.parametrize("name", ["sage", "gcn", "gat", "mlp"])
def test_models_fused_step_equals_legacy_step_without_dropout(name: str) -> None:
    blocks, x = block_chain()
    results = []
    for variant in (LEGACY_STEP, FUSED_STEP, StepVariant(fused_activation=True, fused_projection=False)):
        torch.manual_seed(0)
        model = build_model(name, 12, 5, dropout=0.0).double()
        with use_step_variant(variant):
            out = model(blocks, x.double())
            out.square().sum().backward()
        results.append((out.detach(), [p.grad for p in model.parameters()]))
    for out, grads in results[1:]:
        torch.testing.assert_close(out, results[0][0])
        for grad, expected in zip(grads, results[0][1]):
            torch.testing.assert_close(grad, expected)


@pytest.mark.parametrize("form", ["addmm", "concat"])
def test_sage_projection_forms_agree(form: str) -> None:
    from morphpipe.ops import force_choices

    blocks, x = block_chain()
    results = []
    for variant, choices in ((LEGACY_STEP, {}), (FUSED_STEP, {"sage.projection": form})):
        torch.manual_seed(0)
        model = build_model("sage", 12, 5, dropout=0.0).double()
        with use_step_variant(variant), force_choices(choices):
            out = model(blocks, x.double())
            out.sum().backward()
        results.append((out.detach(), [p.grad for p in model.parameters()]))
    torch.testing.assert_close(results[1][0], results[0][0])
    for grad, expected in zip(results[1][1], results[0][1]):
        torch.testing.assert_close(grad, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_gcn_projection_in_the_aggregation_pass_equals_the_legacy_step(dtype: torch.dtype) -> None:
    """Every layer aggregating first (forced), the fused step projects in the aggregation's pass (the autograd graph
    says so) and its output and every parameter's gradient equal the legacy step's, which projects apart."""
    from morphpipe.ops import force_choices

    def nodes(out: torch.Tensor) -> set[str]:
        seen, stack = set(), [out.grad_fn]
        while stack:
            node = stack.pop()
            if node is not None and type(node).__name__ not in seen:
                seen.add(type(node).__name__)
                stack.extend(next_node for next_node, _ in node.next_functions)
        return seen

    blocks, x = block_chain()
    results = []
    for variant in (LEGACY_STEP, FUSED_STEP):
        torch.manual_seed(0)
        model = build_model("gcn", 12, 5, dropout=0.0).to(dtype)
        with use_step_variant(variant), force_choices({"gcn.order": "aggregate_first", "aggregate.kernel": "rowwise"}):
            out = model(blocks, x.to(dtype))
            assert ("WeightedSumProjectBackward" in nodes(out)) == (variant is FUSED_STEP)
            out.square().sum().backward()
        results.append((out.detach(), [p.grad for p in model.parameters()]))
    tolerance = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {}
    torch.testing.assert_close(results[1][0], results[0][0], **tolerance)
    for grad, expected in zip(results[1][1], results[0][1]):
        torch.testing.assert_close(grad, expected, **tolerance)


def test_model_dropout_is_reproducible_and_eval_matches_the_legacy_step() -> None:
    blocks, x = block_chain()
    model = build_model("sage", 12, 5, dropout=0.5).train()
    torch.manual_seed(1)
    first = model(blocks, x)
    torch.manual_seed(1)
    assert torch.equal(first, model(blocks, x))
    model.eval()
    with use_step_variant(LEGACY_STEP):
        legacy_eval = model(blocks, x)
    torch.testing.assert_close(model(blocks, x), legacy_eval)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_cuda_draws_the_same_bits_and_values_as_cpu(width: int, activation: str) -> None:
    x, bias = inputs(301, width)
    out, mask = op().bias_act_dropout(x, bias, activation, 0.3, 77)
    out_cuda, mask_cuda = op().bias_act_dropout(x.cuda(), bias.cuda(), activation, 0.3, 77)
    assert torch.equal(mask_cuda.cpu(), mask)
    torch.testing.assert_close(out_cuda.cpu(), out, rtol=0, atol=0)
    grad = torch.randn_like(x)
    grad_x, grad_bias = op().bias_act_dropout_backward(grad, out, mask, activation, 0.3, True)
    grad_x_cuda, grad_bias_cuda = op().bias_act_dropout_backward(grad.cuda(), out_cuda, mask_cuda, activation, 0.3, True)
    torch.testing.assert_close(grad_x_cuda.cpu(), grad_x, rtol=0, atol=0)
    torch.testing.assert_close(grad_bias_cuda.cpu(), grad_bias, rtol=1e-5, atol=1e-4)
