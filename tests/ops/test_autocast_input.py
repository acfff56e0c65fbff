"""`morphpipe.ops.autocast_input`: a layer's float32 input under bf16 autocast, cast once or read as stored."""
from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from morphpipe.ops.autocast_input import AS_STORED, CAST, DECISION, layer_input, narrower_autocast_dtype, project
from morphpipe.ops.choice import clear_choices, force_choices, recorded_choices
from morphpipe.ops.graph_kernel import use_timer

BF16 = torch.autocast("cpu", dtype=torch.bfloat16)


@pytest.fixture(autouse=True)
def fresh_choices():
    clear_choices()
    yield
    clear_choices()


def inputs() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return torch.randn(300, 24, generator=generator), torch.randn(8, 24, generator=generator, requires_grad=True)


def test_outside_autocast_or_when_no_wider_the_input_and_linear_are_untouched():
    x, weight = inputs()
    assert layer_input(x, weight) is x
    assert torch.equal(project(x, weight), F.linear(x, weight))
    with BF16:
        narrow = x.to(torch.bfloat16)
        assert narrower_autocast_dtype(narrow) is None and layer_input(narrow, weight) is narrow
        assert narrower_autocast_dtype(torch.arange(3)) is None
    assert recorded_choices() == []


def test_cast_gives_the_autocast_dtype_once_and_as_stored_projects_in_float32():
    x, weight = inputs()
    with BF16:
        with force_choices({DECISION: CAST}):
            assert torch.equal(layer_input(x, weight), x.to(torch.bfloat16))
        with force_choices({DECISION: AS_STORED}):
            stored = layer_input(x, weight)
            assert stored is x
            out = project(stored, weight, bias=torch.ones(8))
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, (F.linear(x, weight) + 1).to(torch.bfloat16))  # float32 arithmetic, output rounded once
    out.float().sum().backward()
    assert weight.grad.dtype == torch.float32
    assert torch.allclose(weight.grad, torch.ones(300, 8).t() @ x)


@pytest.mark.parametrize("faster", [CAST, AS_STORED])
def test_the_faster_timed_option_is_kept_per_shape(faster):
    x, weight = inputs()
    timed = []

    def timer(option, run):
        timed.append(option)
        run()
        return 1.0 if option == faster else 2.0

    with use_timer(timer), BF16:
        first = layer_input(x, weight)
        again = layer_input(x, weight)
    assert timed == [CAST, AS_STORED], "both timed once, the second call reuses the choice"
    assert first.dtype == again.dtype == (torch.bfloat16 if faster == CAST else torch.float32)
    record = next(r for r in recorded_choices() if r.decision == DECISION)
    assert record.chosen == faster and record.reason == "timed"
