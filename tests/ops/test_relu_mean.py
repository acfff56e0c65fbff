"""`relu_mean` (ReLU + dropout, then a mean and the own rows, as one autograd node) against the separate ops it
fuses: the same outputs and gradients (float32 bit for bit except the bias gradient's summation order), and a
GraphSAGE training step with it equal to the step without it."""
from __future__ import annotations

import pytest
import torch

from morphpipe import native
from morphpipe.nn import build_model
from morphpipe.nn.base import BlockModel
from morphpipe.ops import aggregate, force_choices
from morphpipe.ops.bias_act_dropout import bias_act_dropout
from morphpipe.ops.prefix_split import split_prefix
from morphpipe.ops.relu_mean import relu_mean
from morphpipe.sampling.minibatch import Block


@pytest.fixture(autouse=True)
def rowwise_mean():
    """relu_mean fuses into the row-wise mean only; the choice may densify these small blocks (by the calibration
    that earlier tests in the process left), so the row-wise kernel is forced."""
    with force_choices({"aggregate.kernel": "rowwise"}):
        yield


def random_block(num_src: int, num_dst: int, seed: int) -> Block:
    """CSC with empty rows, a duplicate edge and rows past the prefetch distance; sources read by no edge too."""
    generator = torch.Generator().manual_seed(seed)
    degrees = torch.randint(0, 9, (num_dst,), generator=generator)
    degrees[::11] = 0
    degrees[1] = 40
    indices = torch.randint(0, num_src - 5, (int(degrees.sum()),), generator=generator)
    indices[1] = indices[0]
    indptr = torch.zeros(num_dst + 1, dtype=torch.int64)
    indptr[1:] = degrees.cumsum(0)
    return Block(indptr, indices, num_src, num_dst)


def separate(pre, bias, block, p, seed):
    """The ops relu_mean replaces, as SAGE ran them: bias_act_dropout, split_prefix, the mean."""
    torch.manual_seed(seed)
    out = bias_act_dropout(pre, bias, "relu", p, True)
    h_src, h_dst = split_prefix(out, block.num_dst)
    return aggregate(block, h_src, "mean"), h_dst


def fused(pre, bias, block, p, seed):
    torch.manual_seed(seed)
    return relu_mean(pre, bias, block, p)


def gradients(run, dtype, num_src, num_dst, width, p):
    """relu_mean's or the separate ops' outputs and the gradients of pre and bias under a fixed upstream loss."""
    block = random_block(num_src, num_dst, width)
    generator = torch.Generator().manual_seed(1)
    pre = torch.randn(num_src, width, generator=generator).to(dtype).requires_grad_()
    bias = torch.randn(width, generator=generator).to(dtype).requires_grad_()
    weight_mean = torch.randn(num_dst, width, generator=generator).to(dtype)
    weight_own = torch.randn(num_dst, width, generator=generator).to(dtype)
    mean, own = run(pre, bias, block, p, 5)
    ((mean * weight_mean).sum() + (own * weight_own).sum()).backward()
    return mean.detach(), own.detach(), pre.grad, bias.grad


@pytest.mark.parametrize("num_src,num_dst,width,p", [(700, 300, 256, 0.5), (90, 40, 17, 0.0), (600, 600, 3, 0.3),
                                                     (1300, 20, 300, 0.5)])
def test_values_and_gradients_equal_the_separate_ops(num_src, num_dst, width, p):
    want = gradients(separate, torch.float32, num_src, num_dst, width, p)
    got = gradients(fused, torch.float32, num_src, num_dst, width, p)
    for name, have, expected in zip(("mean", "own rows", "grad pre"), got[:3], want[:3]):
        assert torch.equal(have, expected), f"{name} differs from the separate ops"
    # The bias gradient's double column sums run in 256-row blocks, then in block order (any thread count).
    torch.testing.assert_close(got[3], want[3], rtol=1e-6, atol=1e-6)


def test_bfloat16_within_one_rounding_of_the_separate_ops():
    want = gradients(separate, torch.bfloat16, 700, 300, 64, 0.5)
    got = gradients(fused, torch.bfloat16, 700, 300, 64, 0.5)
    for have, expected in zip(got, want):
        torch.testing.assert_close(have.float(), expected.float(), rtol=2.0 ** -7, atol=2.0 ** -7)


def test_the_same_gradients_at_one_and_two_threads():
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = gradients(fused, torch.float32, 3000, 900, 64, 0.5)
        torch.set_num_threads(2)
        two = gradients(fused, torch.float32, 3000, 900, 64, 0.5)
    finally:
        torch.set_num_threads(threads)
    for have, expected in zip(two, one):
        assert torch.equal(have, expected)


def test_the_kernel_refuses_mismatched_arguments_naming_them():
    ops = native.ops()
    block = random_block(90, 40, 3)
    t_indptr, t_dst, _ = ops.csr_transpose(block.indptr, block.indices, 90)
    grad, scale, out = torch.randn(40, 8), torch.ones(40), torch.randn(90, 8)
    with pytest.raises(RuntimeError, match="out must be 2-D"):
        ops.relu_mean_backward(t_indptr, t_dst, grad, scale, None, torch.randn(90, 7), 0.5)
    with pytest.raises(RuntimeError, match="self_grad must be 2-D"):
        ops.relu_mean_backward(t_indptr, t_dst, grad, scale, torch.randn(91, 8), out, 0.5)
    with pytest.raises(RuntimeError, match="scale must have 40 rows"):
        ops.relu_mean_backward(t_indptr, t_dst, grad, torch.ones(39), None, out, 0.5)


def sampled_blocks(seed: int) -> list[Block]:
    """Three chained blocks, input layer first (each layer's destinations are the next one's sources)."""
    sizes = [900, 400, 150, 40]
    return [random_block(sizes[i], sizes[i + 1], seed + i) for i in range(3)]


def sage_step(forward, seed: int):
    """Loss and every parameter's gradient of two training steps' worth of forward + backward (the first measures
    the layers' input density, the second fuses)."""
    torch.manual_seed(0)
    model = build_model("sage", 32, 5, hidden=64)
    model.train()
    blocks = sampled_blocks(seed)
    x = torch.randn(900, 32, generator=torch.Generator().manual_seed(seed))
    labels = torch.randint(0, 5, (40,), generator=torch.Generator().manual_seed(seed))
    results = []
    for _ in range(2):
        model.zero_grad(set_to_none=True)
        torch.manual_seed(7)
        loss = torch.nn.functional.cross_entropy(forward(model, blocks, x), labels)
        loss.backward()
        results.append((loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}))
    return results, loss.grad_fn


def graph_nodes(node) -> set[str]:
    """Names of every autograd node reachable from `node`."""
    seen, stack, names = set(), [node], set()
    while stack:
        current = stack.pop()
        if current is None or current in seen:
            continue
        seen.add(current)
        names.add(type(current).__name__)
        stack.extend(parent for parent, _ in current.next_functions)
    return names


def test_a_sage_training_step_equals_the_step_without_the_fusion():
    fused_steps, fused_graph = sage_step(lambda model, blocks, x: model(blocks, x), 11)
    plain_steps, plain_graph = sage_step(lambda model, blocks, x: BlockModel.forward(model, blocks, x), 11)
    assert "ReluMeanBackward" in graph_nodes(fused_graph), "the second step did not run the fused node"
    assert "ReluMeanBackward" not in graph_nodes(plain_graph)
    for (loss, grads), (want_loss, want_grads) in zip(fused_steps, plain_steps):
        assert torch.equal(loss, want_loss)
        for name, grad in grads.items():
            if name.endswith("lin_neigh.bias"):  # the fused bias gradient sums in another order
                torch.testing.assert_close(grad, want_grads[name], rtol=1e-6, atol=1e-7)
            else:
                assert torch.equal(grad, want_grads[name]), name


def test_a_forced_scatter_backward_leaves_the_ops_separate():
    block = random_block(90, 40, 3)
    pre, bias = torch.randn(90, 8, requires_grad=True), torch.zeros(8, requires_grad=True)
    with force_choices({"aggregate.backward": "scatter"}):
        assert relu_mean(pre, bias, block, 0.5) is None
    assert relu_mean(pre, bias, block, 0.5) is not None


def test_a_bf16_autocast_step_keeps_the_ops_separate():
    """Under bf16 autocast the fusion is not taken: the bf16 SAGE step ran 1.3x slower with it (2 threads, default
    preset, A/B against the step before it: BENCHMARKS.md), so it is used on float32 activations only."""
    def forward(model, blocks, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return model(blocks, x)

    _, graph = sage_step(forward, 11)
    assert "ReluMeanBackward" not in graph_nodes(graph)
