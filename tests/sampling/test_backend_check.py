"""The Route 1 self-check, on the CPU: the torch path judges injected "kernels" that pass, break structure,
draw with a bias (a gross one, and one slight enough that only the position test sees it), gather a wrong row
once in a thousand or raise; fused ops are judged against the reference, and ops off by 0.1%, wrong only at an
odd width, or wrong only in their gradients fail; verdicts are recorded and shown."""
from __future__ import annotations

import contextlib
import importlib
import logging

import pytest
import torch

from morphpipe import ops
from morphpipe.ops.self_check import ops_problem
from morphpipe.sampling import GpuBatcher
from morphpipe.sampling import backend_check as check
from morphpipe.sampling.minibatch import Block, MiniBatch

CPU = torch.device("cpu")
aggregate = importlib.import_module("morphpipe.ops.aggregate")  # the module (the package exports a function too)


@pytest.fixture(scope="module")
def graph():
    return check.check_graph()


@pytest.fixture(scope="module")
def reference(graph):
    return check.host_maker(graph)


def passing(reference):
    """A correct sampler with another random stream than the reference."""
    return lambda seeds, fanouts, seed: reference(seeds, fanouts, seed + 7_777)


def repeats_a_neighbour(reference):
    """Returns every destination's first sampled neighbour twice (a structure defect)."""
    def make(seeds, fanouts, seed):
        batch = reference(seeds, fanouts, seed)
        block = batch.blocks[-1]
        indices = block.indices.clone()
        degrees = block.indptr[1:] - block.indptr[:-1]
        many = torch.nonzero(degrees >= 2).flatten()
        indices[block.indptr[many] + 1] = indices[block.indptr[many]]
        batch.blocks[-1] = Block(block.indptr, indices, block.num_src, block.num_dst)
        return batch
    return make


def drawing_with(graph, pick):
    """A structurally perfect sampler that draws each sampled list's offsets with `pick(degree, fanout, generator)`
    (distinct offsets in [0, degree)); lists no longer than the fanout are taken whole."""
    def make(seeds, fanouts, seed):
        from morphpipe.sampling import torch_sampler

        tensors = torch_sampler.GraphTensors(graph.indptr, graph.indices, graph.features, graph.labels)
        generator = torch_sampler.seeded_generator(CPU, seed)
        nodes, blocks = seeds.to(torch.int64), []
        for fanout in fanouts:
            begin = graph.indptr[nodes]
            degree = graph.indptr[nodes + 1] - begin
            take = degree if fanout < 0 else torch.clamp(degree, max=fanout)
            indptr = torch.zeros(nodes.numel() + 1, dtype=torch.int64)
            torch.cumsum(take, 0, out=indptr[1:])
            rows = torch.repeat_interleave(torch.arange(nodes.numel()), take)
            offsets = torch.arange(int(indptr[-1])) - indptr[:-1][rows]
            sampled = torch.nonzero(degree > fanout).flatten().tolist() if fanout >= 0 else []
            for row in sampled:
                offsets[indptr[row]:indptr[row + 1]] = pick(int(degree[row]), fanout, generator)
            neighbours = graph.indices[begin[rows] + offsets].to(torch.int64)
            sources, local = torch_sampler.relabel(nodes, neighbours)
            blocks.append(Block(indptr, local, sources.numel(), nodes.numel()))
            nodes = sources
        return MiniBatch(seeds, nodes, blocks[::-1], tensors.features[nodes], tensors.labels[seeds])
    return make


def prefers_low_offsets(graph):
    """Draws the first `fanout` of a random window in the first two thirds of each list (a gross distribution
    defect)."""
    def pick(degree, fanout, generator):
        window = degree * 2 // 3
        start = int(torch.randint(0, window - fanout + 1, (1,), generator=generator)) if window > fanout else 0
        return torch.arange(start, start + fanout)
    return drawing_with(graph, pick)


def slightly_prefers_low_offsets(graph):
    """Draws without replacement with weight 1.1 for the first half of each list and 1 for the rest: every
    neighbour stays possible and each is drawn within about 5% of its fair share (a subtle defect)."""
    def pick(degree, fanout, generator):
        weights = torch.where(torch.arange(degree) < degree // 2, 1.1, 1.0)
        return torch.multinomial(weights, fanout, replacement=False, generator=generator)
    return drawing_with(graph, pick)


def fair_multinomial(graph):
    """The same drawing with equal weights: a correct sampler built like the biased one."""
    return drawing_with(graph, lambda degree, fanout, generator: torch.multinomial(
        torch.ones(degree), fanout, replacement=False, generator=generator))


def edited(reference, edit):
    """The reference's batches with `edit(batch)` applied (a structure defect that leaves the rest intact)."""
    def make(seeds, fanouts, seed):
        batch = reference(seeds, fanouts, seed)
        edit(batch)
        return batch
    return make


def neighbouring_feature_row(batch):
    """One input node's feature row is its neighbour id's row (as a gather off by one for one id would give)."""
    batch.x = batch.x.clone()
    batch.x[-1] = check.check_graph().features[(int(batch.input_nodes[-1]) + 1) % 300]


def one_edge_not_in_the_graph(batch):
    """One sampled neighbour of the first destination with two or more is replaced by a source that is not its
    in-neighbour (local ids stay valid and distinct)."""
    graph = check.check_graph()
    block = batch.blocks[-1]
    for row in range(block.num_dst):
        begin, end = int(block.indptr[row]), int(block.indptr[row + 1])
        if end - begin < 2:
            continue
        dst = int(batch.input_nodes[row])
        in_neighbours = set(graph.indices[graph.indptr[dst]:graph.indptr[dst + 1]].tolist())
        taken = set(block.indices[begin:end].tolist())
        outsider = next((local for local in range(block.num_src)
                         if local not in taken and int(batch.input_nodes[local]) not in in_neighbours), None)
        if outsider is not None:
            indices = block.indices.clone()
            indices[begin] = outsider
            batch.blocks[-1] = Block(block.indptr, indices, block.num_src, block.num_dst)
            return


def drops_the_last_neighbour(batch):
    """The last destination with a neighbour loses its last one (a loop bound one short)."""
    block = batch.blocks[-1]
    counts = block.indptr[1:] - block.indptr[:-1]
    row = int(torch.nonzero(counts).flatten()[-1])
    cut = int(block.indptr[row + 1]) - 1
    indptr = block.indptr.clone()
    indptr[row + 1:] -= 1
    indices = torch.cat([block.indices[:cut], block.indices[cut + 1:]])
    batch.blocks[-1] = Block(indptr, indices, block.num_src, block.num_dst)


def takes_at_most_eight_for_take_all(reference):
    """Correct for every fanout but -1 ("take all"), which it treats as a fanout of 8."""
    return lambda seeds, fanouts, seed: reference(seeds, [8 if f < 0 else f for f in fanouts], seed)


def raises(seeds, fanouts, seed):
    raise RuntimeError("CUDA error: an illegal memory access was encountered")


def test_a_correct_backend_passes(graph, reference):
    verdict = check.run_self_check(CPU, passing(reference), reference, exact_gather, graph)
    assert verdict.kernels_ok and verdict.kernels_reason == ""
    assert verdict.ops_ok, verdict.ops_reason
    assert "kernels passed" in verdict.summary() and "fused ops passed" in verdict.summary()


@pytest.mark.parametrize("make_candidate, reason", [
    pytest.param(lambda graph, reference: repeats_a_neighbour(reference), "repeats a neighbour", id="repeats"),
    pytest.param(lambda graph, reference: prefers_low_offsets(graph), "chi-square", id="gross-bias"),
    pytest.param(lambda graph, reference: slightly_prefers_low_offsets(graph), "lean towards one end",
                 id="slight-bias"),
    pytest.param(lambda graph, reference: edited(reference, neighbouring_feature_row),
                 "x is not features[input_nodes]", id="wrong-feature-row"),
    pytest.param(lambda graph, reference: edited(reference, one_edge_not_in_the_graph),
                 "a sampled edge is not in the graph", id="non-edge"),
    pytest.param(lambda graph, reference: edited(reference, drops_the_last_neighbour), "wrong neighbour count",
                 id="drops-an-edge"),
    pytest.param(lambda graph, reference: takes_at_most_eight_for_take_all(reference), "fanouts [-1, 2]",
                 id="take-all"),
    pytest.param(lambda graph, reference: raises, "raised RuntimeError: CUDA error", id="raises"),
])
def test_a_failing_backend_is_caught_with_its_reason(graph, reference, make_candidate, reason):
    problem = check.sampler_problem(make_candidate(graph, reference), reference, graph)
    assert problem is not None and reason in problem


def test_a_fair_sampler_built_like_the_biased_one_passes(graph, reference):
    assert check.sampler_problem(fair_multinomial(graph), reference, graph) is None


def test_the_position_test_is_calibrated_on_uniform_draws():
    """Simulated uniform draws (random permutations' prefixes): the test's p-values are uniform, so its z-statistic
    has the stated mean and variance, and at the floor a correct sampler fails about once in 10,000 checks."""
    generator = torch.Generator().manual_seed(3)
    degree, trials, repeats = check.HUB_DEGREE, check.TRIALS, 300
    for fanout in (5, 60):
        draws = torch.rand(repeats * trials, degree, generator=generator).argsort(dim=1)[:, :fanout]
        counts = torch.zeros(repeats, degree, dtype=torch.int64)
        counts.scatter_add_(1, draws.reshape(repeats, trials * fanout), torch.ones(repeats, trials * fanout,
                                                                                   dtype=torch.int64))
        p = torch.tensor([check.position_trend_pvalue(row, fanout, trials) for row in counts])
        assert 0.02 <= float((p < 0.05).double().mean()) <= 0.09, fanout
        assert 0.40 <= float((p < 0.5).double().mean()) <= 0.60, fanout
    even = torch.full((degree,), 10)
    assert check.position_trend_pvalue(even, 5, 240) == pytest.approx(1.0)
    # By hand: 11 draws at each of positions 0..59 and 9 at 60..119 sum to 67,800 against a mean of
    # 240 * 5 * 119 / 2 = 71,400, standard deviation sqrt(240 * 5 * 115 * 121 / 12) = 1,179.6: z = -3.052.
    leaning = torch.cat([torch.full((degree // 2,), 11), torch.full((degree // 2,), 9)])
    assert check.position_trend_pvalue(leaning, 5, 240) == pytest.approx(0.002273, rel=2e-3)


def exact_gather(table, ids):
    """A correct gather: the native CPU kernel."""
    from morphpipe import native

    return native.ops().gather_rows(table, ids)


def wrong_row_at_every_thousandth_position(table, ids):
    """Row 999, 1999, ... of the output is the next id's row (as a tail bug of a 1000-row block would give)."""
    rows = table.index_select(0, ids)
    rows[999::1000] = table[(ids[999::1000] + 1) % table.shape[0]]
    return rows


def wrong_row_for_one_id_in_a_thousand(table, ids):
    """Ids 999, 1999, ... get the next row."""
    rows = table.index_select(0, ids)
    hit = ids % 1000 == 999
    rows[hit] = table[(ids[hit] + 1) % table.shape[0]]
    return rows


def labels_truncated_to_int32(table, ids):
    """Right for features, wrong for int64 values that need more than 32 bits."""
    rows = table.index_select(0, ids)
    return rows.to(torch.int32).to(torch.int64) if rows.dtype == torch.int64 else rows


def test_a_correct_gather_passes():
    assert check.gather_problem(exact_gather) is None
    assert check.gather_problem(lambda table, ids: table[ids]) is None


@pytest.mark.parametrize("gather", [
    pytest.param(wrong_row_at_every_thousandth_position, id="every-thousandth-position"),
    pytest.param(wrong_row_for_one_id_in_a_thousand, id="one-id-in-a-thousand"),
    pytest.param(labels_truncated_to_int32, id="labels-truncated"),
])
def test_a_gather_wrong_for_one_row_in_a_thousand_fails_the_verdict(graph, reference, gather):
    verdict = check.run_self_check(CPU, passing(reference), reference, gather, graph)
    assert not verdict.kernels_ok and "gather of" in verdict.kernels_reason
    assert "torch path used" in verdict.summary()


def broken_sum(block, h_src, reduce, edge_weight):
    return aggregate.REFERENCE.aggregate(block, h_src, reduce, edge_weight) * 1.01


def test_ops_that_differ_from_the_reference_fail_the_check():
    ops.register_backend(aggregate.Backend("broken-for-test", broken_sum, aggregate.REFERENCE.gcn_aggregate,
                                           aggregate.REFERENCE.gat_attention), replace=True)
    problem = ops_problem(CPU, candidate="broken-for-test")
    assert problem is not None and "sum forward differs" in problem


class _ScaledGradient(torch.autograd.Function):
    """Identity forward; the backward scales the output gradient by 1.01."""

    @staticmethod
    def forward(ctx, out):
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad):
        return grad * 1.01


class _NeighbouringRowGradient(torch.autograd.Function):
    """Identity forward; the backward reads each destination's output gradient from the next destination's row."""

    @staticmethod
    def forward(ctx, out):
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad):
        return grad.roll(1, dims=0)


def off_by_a_tenth_of_a_percent(block, h_src, reduce, edge_weight):
    return aggregate.REFERENCE.aggregate(block, h_src, reduce, edge_weight) * 1.001


def drops_the_tail_columns_of_odd_widths(block, h_src, reduce, edge_weight):
    out = aggregate.REFERENCE.aggregate(block, h_src, reduce, edge_weight)
    tail = h_src.shape[1] % 4
    return torch.cat([out[:, :-tail], torch.zeros_like(out[:, -tail:])], dim=1) if tail else out


def gradient_off_by_a_percent(block, h_src, reduce, edge_weight):
    return _ScaledGradient.apply(aggregate.REFERENCE.aggregate(block, h_src, reduce, edge_weight))


def gradient_of_the_neighbouring_row(block, h_src, reduce, edge_weight):
    return _NeighbouringRowGradient.apply(aggregate.REFERENCE.aggregate(block, h_src, reduce, edge_weight))


@pytest.mark.parametrize("wrong_sum, reason", [
    pytest.param(off_by_a_tenth_of_a_percent, "width 16: sum forward differs", id="off-by-0.1%"),
    pytest.param(drops_the_tail_columns_of_odd_widths, "width 67: sum forward differs", id="odd-width-tail"),
    pytest.param(gradient_off_by_a_percent, "width 16: sum grad h differs", id="gradient-off-by-1%"),
    pytest.param(gradient_of_the_neighbouring_row, "width 16: sum grad h differs", id="gradient-of-next-row"),
])
def test_subtly_wrong_ops_fail_the_check(wrong_sum, reason):
    name = f"subtly-wrong-{wrong_sum.__name__}"
    ops.register_backend(aggregate.Backend(name, wrong_sum, aggregate.REFERENCE.gcn_aggregate,
                                           aggregate.REFERENCE.gat_attention), replace=True)
    problem = ops_problem(CPU, candidate=name)
    assert problem is not None and reason in problem


def test_the_compiled_cpu_ops_pass_the_check():
    assert ops_problem(CPU, candidate="fused") is None


@contextlib.contextmanager
def injected(kernels, reference, gather=None):
    yield kernels, reference, gather


def test_a_failed_verdict_is_recorded_shown_and_acted_on(graph, reference, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(check, "_verdicts", {})
    monkeypatch.setattr(aggregate, "_excluded", {})
    monkeypatch.setattr(aggregate, "_auto_resolved", {})
    path = tmp_path / check.RESULTS_FILE
    calls = []

    def makers(device):
        calls.append(device)
        return injected(raises, reference)

    with caplog.at_level(logging.WARNING, logger="morphpipe.sampling"):
        verdict = check.device_verdict(CPU, path, makers)
    assert not verdict.kernels_ok and "illegal memory access" in verdict.kernels_reason
    assert "torch path used" in caplog.text
    assert check.recorded_verdicts(path)["cpu"] == verdict
    assert check.device_verdict(CPU, path, makers) is verdict and len(calls) == 1, "checked once per process"
    monkeypatch.setattr(check, "_verdicts", {})
    assert check.device_verdict(CPU, path, makers) == verdict and len(calls) == 1, "the record is reused"
    rows = check.verdict_rows(path)
    assert rows == [("Route 1 self-check", verdict.summary())]


def test_a_record_made_before_a_check_was_registered_is_not_reused(graph, reference, tmp_path, monkeypatch):
    monkeypatch.setattr(check, "_verdicts", {})
    path = tmp_path / check.RESULTS_FILE
    check.record_verdict(check.Verdict("cpu", True, "", True, "", *check._build_identity(), ops_checked=""), path)
    calls = []

    def makers(device):
        calls.append(device)
        return injected(passing(reference), reference)

    verdict = check.device_verdict(CPU, path, makers)
    assert len(calls) == 1 and verdict.ops_checked == check.registered_names() != ""


def test_failed_fused_ops_leave_the_automatic_backend(monkeypatch, caplog):
    monkeypatch.setattr(aggregate, "_excluded", {})
    monkeypatch.setattr(aggregate, "_auto_resolved", {})
    verdict = check.Verdict("cpu", True, "", False, "gcn forward differs")
    with caplog.at_level(logging.WARNING):
        check.apply_verdict(verdict, "cpu")
        assert ops.current_backend("cpu").name == "reference"
    assert "reference ops used" in caplog.text and "self-check failed" in caplog.text


def test_no_record_yet_is_said(tmp_path):
    assert check.verdict_rows(tmp_path / "none.json")[0][1].startswith("none recorded")
    (tmp_path / "bad.json").write_text("{not json")
    assert check.recorded_verdicts(tmp_path / "bad.json") == {}


def test_backend_choice_on_the_cpu():
    graph = check.check_graph()
    graph.train_idx = torch.arange(0, 300, 3)
    with GpuBatcher(graph, [3], 16, device="cpu") as batcher:
        assert batcher.backend == "torch" and "CUDA only" in batcher.backend_reason
    with GpuBatcher(graph, [3], 16, device="cpu", backend="torch") as batcher:
        assert "no self-check" in batcher.backend_reason
        assert len(list(batcher)) == len(batcher)
    with pytest.raises(ValueError, match="backend='kernels' runs on a CUDA device"):
        GpuBatcher(graph, [3], 16, device="cpu", backend="kernels")
    with pytest.raises(ValueError, match="backend='fast'"):
        GpuBatcher(graph, [3], 16, device="cpu", backend="fast")
    with pytest.raises(ValueError, match="device='meta'"):
        GpuBatcher(graph, [3], 16, device="meta", backend="torch")
