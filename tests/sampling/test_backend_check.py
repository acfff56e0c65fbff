"""The Route 1 self-check, on the CPU: the torch path judges injected "kernels" that pass, break structure,
draw with a bias or raise; fused ops are judged against the reference; verdicts are recorded and shown."""
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


def prefers_low_offsets(graph):
    """A structurally perfect sampler whose draws favour the start of each neighbour list (a distribution defect)."""
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
            for row in sampled:  # a biased subset: the first `fanout` of a random half-prefix window
                window = int(degree[row]) * 2 // 3
                start = int(torch.randint(0, window - fanout + 1, (1,), generator=generator)) if window > fanout else 0
                offsets[indptr[row]:indptr[row + 1]] = torch.arange(start, start + fanout)
            neighbours = graph.indices[begin[rows] + offsets].to(torch.int64)
            sources, local = torch_sampler.relabel(nodes, neighbours)
            blocks.append(Block(indptr, local, sources.numel(), nodes.numel()))
            nodes = sources
        return MiniBatch(seeds, nodes, blocks[::-1], tensors.features[nodes], tensors.labels[seeds])
    return make


def raises(seeds, fanouts, seed):
    raise RuntimeError("CUDA error: an illegal memory access was encountered")


def test_a_correct_backend_passes(graph, reference):
    verdict = check.run_self_check(CPU, passing(reference), reference, graph)
    assert verdict.kernels_ok and verdict.kernels_reason == ""
    assert verdict.ops_ok, verdict.ops_reason
    assert "kernels passed" in verdict.summary() and "fused ops passed" in verdict.summary()


@pytest.mark.parametrize("make_candidate, reason", [
    (lambda graph, reference: repeats_a_neighbour(reference), "repeats a neighbour"),
    (lambda graph, reference: prefers_low_offsets(graph), "chi-square"),
    (lambda graph, reference: raises, "raised RuntimeError: CUDA error"),
])
def test_a_failing_backend_is_caught_with_its_reason(graph, reference, make_candidate, reason):
    problem = check.sampler_problem(make_candidate(graph, reference), reference, graph)
    assert problem is not None and reason in problem


def broken_sum(block, h_src, reduce, edge_weight):
    return aggregate.REFERENCE.aggregate(block, h_src, reduce, edge_weight) * 1.01


def test_ops_that_differ_from_the_reference_fail_the_check():
    ops.register_backend(aggregate.Backend("broken-for-test", broken_sum, aggregate.REFERENCE.gcn_aggregate,
                                           aggregate.REFERENCE.gat_attention), replace=True)
    problem = ops_problem(CPU, candidate="broken-for-test")
    assert problem is not None and "sum forward differs" in problem


@contextlib.contextmanager
def injected(kernels, reference):
    yield kernels, reference


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
