"""Per-input choices: forcing, caching per signature, logging once, and flips where the cost model says so."""
from __future__ import annotations

import dataclasses
import json
import logging
import math

import pytest
import torch

from morphpipe import ops
from morphpipe.nn import GATConv, GCNConv, GraphSAGE, SAGEConv
from morphpipe.ops import choice
from morphpipe.ops.cost_model import Calibration, calibrate, use_calibration
from morphpipe.ops.sparse_input import sparse_aware_linear
from morphpipe.ops.step_variant import FUSED_STEP, LEGACY_STEP, use_step_variant
from morphpipe.sampling.minibatch import Block
from tests.ops.conftest import features

# Constructed rates (seconds per unit), so that the expected choices below follow from the model alone.
RATES = Calibration(
    device_type="cpu", gemm_flop=1e-11, project_flop=1e-11, gather_edge=4e-9, gather_element=4e-10, scatter_edge=0.0,
    scatter_element=2e-9, transpose_edge=5e-9, attention_edge=1.5e-8, attention_element=4e-10,
    shared_attention_element=2e-10, dense_element=1e-9, scan_element=1e-10, call=1e-6, source="test",
)


@pytest.fixture(autouse=True)
def constructed_rates():
    """Every test sees the constructed rates and starts with no cached choices."""
    choice.clear_choices()
    with use_calibration(RATES), ops.use_backend("fused"):
        yield
    choice.clear_choices()


def uniform_block(num_dst: int, num_src: int, degree: int, seed: int = 0) -> Block:
    """`degree` random sources (repeats allowed) for every destination."""
    generator = torch.Generator().manual_seed(seed)
    indices = torch.randint(0, num_src, (num_dst * degree,), generator=generator)
    return Block(torch.arange(0, num_dst * degree + 1, degree), indices, num_src, num_dst)


def last_choice(decision: str) -> choice.ChoiceRecord:
    """The most recent record of `decision`; its chosen option is the cost model's argmin."""
    record = [r for r in choice.recorded_choices() if r.decision == decision][-1]
    if record.reason == "cost model":
        costs = dict(record.costs)
        assert record.chosen == min(costs, key=costs.get)
    return record


def test_forcing_is_validated_scoped_and_read_from_the_environment(monkeypatch):
    with pytest.raises(ValueError, match="'gcn.oder' is not a decision"):
        ops.force_choices({"gcn.oder": "project_first"}).__enter__()
    with pytest.raises(ValueError, match="'sideways' is not an option; use one of \\['aggregate_first'"):
        ops.set_forced_choices({"sage.order": "sideways"})
    assert choice.parse_forced(" sage.order=project_first, aggregate.kernel=dense ") == {
        "sage.order": "project_first", "aggregate.kernel": "dense"}
    with pytest.raises(ValueError, match="must be decision=option"):
        choice.parse_forced("sage.order")
    monkeypatch.setenv(choice.FORCE_ENV, "gat.backward=scatter")
    assert choice.forced_option("gat.backward") == "scatter"
    ops.set_forced_choices({"gat.backward": "transpose"})
    try:
        assert choice.forced_option("gat.backward") == "transpose"
        with ops.force_choices({"gat.backward": "scatter"}):
            assert choice.forced_option("gat.backward") == "scatter"
        assert choice.forced_option("gat.backward") == "transpose"
    finally:
        ops.set_forced_choices({})
    monkeypatch.delenv(choice.FORCE_ENV)
    assert choice.forced_option("gat.backward") is None


def test_choices_are_cached_per_signature_logged_once_and_counted(caplog):
    calls = []

    def costs():
        calls.append(1)
        return {"transpose": 2.0, "scatter": 1.0}

    with caplog.at_level(logging.INFO, logger="morphpipe.ops"):
        for _ in range(3):
            assert choice.choose("gat.backward", ("sig", 1), costs) == "scatter"
        assert choice.choose("gat.backward", ("sig", 2), costs) == "scatter"
        with ops.force_choices({"gat.backward": "transpose"}):
            assert choice.choose("gat.backward", ("sig", 1), costs) == "transpose"
            assert choice.choose("gat.backward", ("sig", 1), costs) == "transpose"
    assert len(calls) == 2
    messages = [r.getMessage() for r in caplog.records if "gat.backward" in r.getMessage()]
    assert len(messages) == 3 and "('sig', 1)" in messages[0] and "forced" in messages[2]
    assert choice.choice_counts() == {"gat.backward": {"scatter": 4, "transpose": 2}}
    records = choice.recorded_choices()
    assert [(r.signature, r.chosen, r.reason) for r in records] == [
        (("sig", 1), "scatter", "cost model"), (("sig", 2), "scatter", "cost model"),
        (("sig", 1), "transpose", "forced")]
    assert json.loads(json.dumps(records[0].as_dict()))["predicted_s"] == {"scatter": 1.0, "transpose": 2.0}


def test_a_forced_option_that_cannot_run_is_an_error():
    with ops.force_choices({"aggregate.kernel": "dense"}), pytest.raises(ValueError, match="cannot run on this input"):
        choice.choose("aggregate.kernel", ("sig",), lambda: {}, options=("rowwise",))


def test_kernel_flips_between_dense_and_rowwise_with_block_density():
    dense, sparse = uniform_block(32, 32, 64), uniform_block(32, 4000, 2)
    for block, expected in ((dense, "dense"), (sparse, "rowwise")):
        h = features(0, block.num_src, 16)
        out = ops.aggregate(block, h, "mean")
        assert last_choice("aggregate.kernel").chosen == expected
        other = "rowwise" if expected == "dense" else "dense"
        with ops.force_choices({"aggregate.kernel": other}):
            torch.testing.assert_close(ops.aggregate(block, h, "mean"), out)


def test_backward_flips_between_scatter_and_transpose_with_width():
    block = uniform_block(32, 32, 64)
    for width, expected in ((1, "scatter"), (64, "transpose")):
        h = features(0, block.num_src, width).requires_grad_()
        with ops.force_choices({"aggregate.kernel": "rowwise"}):
            ops.aggregate(block, h, "sum").backward(features(1, block.num_dst, width))
            assert last_choice("aggregate.backward").chosen == expected
            other = "transpose" if expected == "scatter" else "scatter"
            grad = h.grad
            h.grad = None
            with ops.force_choices({"aggregate.backward": other}):
                ops.aggregate(block, h, "sum").backward(features(1, block.num_dst, width))
        torch.testing.assert_close(h.grad, grad)


def test_order_flips_to_degree_sorted_when_one_destination_dominates():
    uniform = uniform_block(1000, 1000, 4)
    hub_degree = 100_000
    generator = torch.Generator().manual_seed(0)
    degrees = torch.full((1000,), 4)
    degrees[500] = hub_degree
    hub = Block(torch.cat([torch.zeros(1, dtype=torch.int64), degrees.cumsum(0)]),
                torch.randint(0, 1000, (int(degrees.sum()),), generator=generator), 1000, 1000)
    for block, expected in ((uniform, "natural"), (hub, "degree_sorted")):
        h = features(0, block.num_src, 16)
        out = ops.aggregate(block, h, "max")
        assert last_choice("aggregate.order").chosen == expected
        with ops.force_choices({"aggregate.order": "natural" if expected != "natural" else "degree_sorted"}):
            torch.testing.assert_close(ops.aggregate(block, h, "max"), out)


@pytest.mark.parametrize("conv_type,decision", [(SAGEConv, "sage.order"), (GCNConv, "gcn.order")])
def test_reassociation_flips_with_widths_and_sizes_and_both_orders_agree(conv_type, decision):
    square, fan_in = uniform_block(2048, 2048, 10), uniform_block(256, 2048, 10)
    cases = (
        (square, (256, 16), "project_first"),  # narrowing: aggregate the narrow projection
        (square, (16, 256), "aggregate_first"),  # widening: aggregate the narrow input
        (fan_in, (256, 16), "aggregate_first"),  # 8 sources per destination: projecting them all costs more
    )
    for block, (in_features, out_features), expected in cases:
        torch.manual_seed(0)
        conv = conv_type(in_features, out_features).double()
        x = features(0, block.num_src, in_features)
        results = {}
        for forced in (None, "aggregate_first", "project_first"):
            conv.zero_grad()
            with ops.force_choices({decision: forced} if forced else {}):
                out = conv(block, x)
            out.backward(features(1, *out.shape))
            results[forced] = (out.detach(), [p.grad.clone() for p in conv.parameters()])
            if forced is None:
                assert last_choice(decision).chosen == expected
        (out_a, grads_a), (out_p, grads_p) = results["aggregate_first"], results["project_first"]
        torch.testing.assert_close(out_a, out_p)
        for grad_a, grad_p in zip(grads_a, grads_p):
            torch.testing.assert_close(grad_a, grad_p)


@pytest.mark.parametrize("rates,widths,fused_order,legacy_order", [
    # a GEMM after the pass (reading the aggregate back) dearer than projecting in it: only the pass makes
    # aggregating the wider input first pay
    (dataclasses.replace(RATES, gemm_flop=2e-10, project_flop=1e-11), (32, 16), "aggregate_first", "project_first"),
    # projecting in the pass dearer than a GEMM after it: widening, yet the fused step projects first
    (dataclasses.replace(RATES, gemm_flop=1e-11, project_flop=1e-9), (16, 32), "project_first", "aggregate_first"),
], ids=["cheap-pass", "dear-pass"])
def test_gcn_order_prices_the_projection_in_the_pass_under_the_fused_step(rates, widths, fused_order, legacy_order):
    """The fused step's GCN layer, aggregating first, projects in the aggregation's pass: the order prices that
    pass (`project_flop`), the legacy step's a GEMM after it (`gemm_flop`), so the same shape can go either way;
    both orders give the same output and gradients under either step."""
    block = uniform_block(2048, 2048, 10)
    torch.manual_seed(0)
    conv = GCNConv(*widths).double()
    x = features(0, block.num_src, widths[0])
    with use_calibration(rates):
        for variant, expected in ((FUSED_STEP, fused_order), (LEGACY_STEP, legacy_order)):
            with use_step_variant(variant):
                with torch.no_grad():
                    conv(block, x)
                assert last_choice("gcn.order").chosen == expected
                results = {}
                for forced in ("aggregate_first", "project_first"):
                    conv.zero_grad()
                    leaf = x.clone().requires_grad_()
                    with ops.force_choices({"gcn.order": forced}):
                        out = conv(block, leaf)
                    out.backward(features(1, *out.shape))
                    results[forced] = [out.detach(), leaf.grad] + [p.grad.clone() for p in conv.parameters()]
            for got, want in zip(results["aggregate_first"], results["project_first"]):
                torch.testing.assert_close(got, want)


def test_gat_projection_site_flips_and_both_sites_agree():
    block = uniform_block(256, 2048, 10)
    for (in_features, out_features), expected in (((8, 64), "aggregate_first"), ((256, 8), "project_first")):
        torch.manual_seed(0)
        conv = GATConv(in_features, out_features, heads=4).double()
        x = features(0, block.num_src, in_features)
        results = {}
        for forced in (None, "aggregate_first", "project_first"):
            conv.zero_grad()
            with ops.force_choices({"gat.order": forced} if forced else {}):
                out = conv(block, x)
            out.backward(features(1, *out.shape))
            results[forced] = (out.detach(), [p.grad.clone() for p in conv.parameters()])
            if forced is None:
                assert last_choice("gat.order").chosen == expected
        (out_a, grads_a), (out_p, grads_p) = results["aggregate_first"], results["project_first"]
        torch.testing.assert_close(out_a, out_p)
        for grad_a, grad_p in zip(grads_a, grads_p):
            torch.testing.assert_close(grad_a, grad_p)


def test_input_transform_flips_at_the_calibrated_density_threshold():
    threshold = RATES.sparse_threshold(100, 64)
    assert 0.01 < threshold < 0.5
    weight, bias = features(1, 64, 100).requires_grad_(), features(2, 64)
    generator = torch.Generator().manual_seed(0)
    for density, expected in ((0.001, "sparse"), (0.5, "dense")):
        x = features(0, 1000, 100) * (torch.rand(1000, 100, generator=generator) < density)
        out = sparse_aware_linear(x, weight, bias, density)
        assert last_choice("input.transform").chosen == expected
        other = "dense" if expected == "sparse" else "sparse"
        with ops.force_choices({"input.transform": other}):
            torch.testing.assert_close(sparse_aware_linear(x, weight, bias, density), out)


def test_a_model_makes_its_choices_visible():
    block = uniform_block(64, 512, 5)
    model = GraphSAGE(32, 4, num_layers=2, hidden=16).double()
    blocks = [block, uniform_block(8, 64, 3)]
    model(blocks, features(0, 512, 32)).sum().backward()
    decisions = {record.decision for record in ops.recorded_choices()}
    assert {"sage.order", "input.transform", "aggregate.kernel", "aggregate.backward"} <= decisions
    assert ops.choice_counts()["sage.order"]


def test_calibration_measures_this_machine():
    calibration = calibrate("cpu")
    rates = [value for value in vars(calibration).values() if isinstance(value, float)]
    assert all(math.isfinite(rate) and rate >= 0 for rate in rates)
    assert calibration.gemm_flop > 0 and calibration.project_flop > 0 and calibration.call > 0
    assert calibration.source == "measured"
    assert 0.0 <= calibration.sparse_threshold(128, 256) <= 1.0
