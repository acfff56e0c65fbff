"""Community decomposition (AdaptGear): equal to the CSR kernels both ways, partitions cached, selector choices."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from morphpipe import ops
from morphpipe.ops import community, graph_kernel
from morphpipe.ops.community import GraphBlock, cached_partition, decompose, decomposed_sum, partition
from morphpipe.sampling.minibatch import Block

F64 = torch.float64


@pytest.fixture(autouse=True)
def community_cache(tmp_path, monkeypatch):
    """Partitions go to a per-test directory, choices start fresh; one intra-op thread (tiny ops on a loaded
    2-core machine otherwise wait a scheduler slice for the second thread on every call)."""
    monkeypatch.setenv(community.CACHE_DIR_ENV, str(tmp_path / "communities"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    ops.clear_choices()
    yield
    ops.clear_choices()
    torch.set_num_threads(threads)


def csc(src: torch.Tensor, dst: torch.Tensor, num_nodes: int) -> tuple[torch.Tensor, torch.Tensor]:
    order = torch.argsort(dst * num_nodes + src, stable=True)
    indptr = torch.zeros(num_nodes + 1, dtype=torch.int64)
    indptr[1:] = torch.cumsum(torch.bincount(dst, minlength=num_nodes), 0)
    return indptr, src[order].contiguous()


def random_graph(num_nodes: int, edges: int, seed: int, isolated: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Directed random multigraph (duplicates, self edges); the last `isolated` nodes have no edge."""
    generator = torch.Generator().manual_seed(seed)
    src = torch.randint(0, num_nodes - isolated, (edges,), generator=generator)
    dst = torch.randint(0, num_nodes - isolated, (edges,), generator=generator)
    return csc(src, dst, num_nodes)


def clique_graph(num_nodes: int, size: int, extra: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense communities: shuffled cliques of `size` nodes (self loops included) plus `extra` random edges."""
    generator = torch.Generator().manual_seed(seed)
    members = torch.randperm(num_nodes, generator=generator).view(-1, size)
    src = members.repeat_interleave(size, dim=1).flatten()
    dst = members.repeat(1, size).flatten()
    src = torch.cat([src, torch.randint(0, num_nodes, (extra,), generator=generator)])
    dst = torch.cat([dst, torch.randint(0, num_nodes, (extra,), generator=generator)])
    return csc(src, dst, num_nodes)


def plain(indptr: torch.Tensor, indices: torch.Tensor) -> Block:
    n = indptr.numel() - 1
    return Block(indptr, indices, n, n)


def fused_inter_sum(block: Block, h: torch.Tensor, src_scale, dst_scale) -> torch.Tensor:
    """The scaled CSR sum on the reference path: `dst_scale * (A (src_scale * h))`."""
    scaled = h if src_scale is None else h * src_scale.unsqueeze(1)
    out = ops.aggregate(block, scaled, "sum")
    return out if dst_scale is None else out * dst_scale.unsqueeze(1)


CASES = {
    "random": (lambda: random_graph(30, 120, seed=1), 8),
    "isolated nodes": (lambda: random_graph(30, 60, seed=2, isolated=6), 16),
    "single community": (lambda: random_graph(20, 80, seed=3), 64),
    "communities of size 1": (lambda: random_graph(20, 80, seed=4), 1),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("method", ["bfs", "metis"])
def test_decomposed_equals_csr_forward_and_gradcheck(case, method):
    if method == "metis" and not community.metis_available():
        pytest.skip("pymetis is not installed")
    make, size = CASES[case]
    indptr, indices = make()
    block = plain(indptr, indices)
    membership, _ = partition(indptr, indices, block.num_dst, size, method)
    assert np.bincount(membership).max() <= size
    decomposition = decompose(block, membership, size, method)
    if case == "single community":
        assert decomposition.num_communities == 1 and decomposition.inter_edges == 0
    if case == "communities of size 1":
        assert decomposition.intra_edges == int((indices == torch.repeat_interleave(
            torch.arange(block.num_dst), indptr[1:] - indptr[:-1])).sum()), "only stored self edges stay inside"
    h = torch.randn(block.num_dst, 2, dtype=F64, requires_grad=True)
    src_scale, dst_scale = ops.gcn_scales(block, True, F64)
    for scales, self_loop in (((None, None), False), ((src_scale, dst_scale), True)):
        got = decomposed_sum(decomposition, h, *scales, self_loop, fused_inter_sum)
        expected = ops.gcn_aggregate(block, h, True) if self_loop else ops.aggregate(block, h, "sum")
        torch.testing.assert_close(got, expected)
        assert torch.autograd.gradcheck(
            lambda x: decomposed_sum(decomposition, x, *scales, self_loop, fused_inter_sum), (h,))


def test_graph_without_intra_edges():
    """Edges only between even and odd nodes, communities of even pairs and odd pairs: everything is inter."""
    n = 20
    src = torch.arange(0, n, 2).repeat_interleave(3)
    dst = (src + torch.tensor([1, 3, 5]).repeat(n // 2)) % n
    indptr, indices = csc(src, dst, n)
    membership = np.arange(n) // 4 * 2 + np.arange(n) % 2
    decomposition = decompose(plain(indptr, indices), membership, 2, "given")
    assert decomposition.intra_edges == 0 and decomposition.inter_edges == indices.numel()
    h = torch.randn(n, 3, dtype=F64, requires_grad=True)
    torch.testing.assert_close(decomposed_sum(decomposition, h, None, None, False, fused_inter_sum),
                               ops.aggregate(plain(indptr, indices), h, "sum"))
    assert torch.autograd.gradcheck(lambda x: decomposed_sum(decomposition, x, None, None, False, fused_inter_sum),
                                    (h,))


@pytest.mark.parametrize("size", [64, 32])
def test_metis_finds_planted_cliques(size, tmp_path):
    """64: k-way METIS itself; 32: METIS at 64 (from the cache), then each community bisected."""
    if not community.metis_available():
        pytest.skip("pymetis is not installed")
    indptr, indices = clique_graph(512, size, extra=200, seed=5)
    membership, method = cached_partition(indptr, indices, 512, size, "metis", tmp_path)
    assert np.bincount(membership).max() <= size
    decomposition = decompose(plain(indptr, indices), membership, size, method)
    assert method == "metis" and decomposition.intra_fraction() > 0.9
    assert len(list(tmp_path.iterdir())) == (1 if size == 64 else 2), "the double-size partition is cached too"


def test_bfs_fallback_finds_cliques():
    indptr, indices = clique_graph(256, 16, extra=0, seed=6)
    membership, method = partition(indptr, indices, 256, 16, "bfs")
    assert method == "bfs"
    assert decompose(plain(indptr, indices), membership, 16, method).intra_fraction() == 1.0


def test_missing_pymetis_is_said_and_falls_back(monkeypatch, caplog):
    monkeypatch.setattr(community, "metis_available", lambda: False)
    monkeypatch.setattr(community, "_warned_no_metis", [])
    with pytest.raises(ValueError, match="pip install 'morphpipe\\[metis\\]'"):
        community.resolve_method("metis")
    with caplog.at_level("WARNING", logger="morphpipe.ops"):
        assert community.resolve_method("auto") == "bfs"
    assert "pymetis is not installed" in caplog.text
    with pytest.raises(ValueError, match="method='louvain'"):
        community.resolve_method("louvain")


def test_partition_cached_on_disk(tmp_path, monkeypatch):
    indptr, indices = random_graph(50, 200, seed=7)
    first, method = cached_partition(indptr, indices, 50, 8, "bfs", tmp_path)
    files = list(tmp_path.iterdir())
    assert len(files) == 1 and files[0].name.endswith(f"-{method}-s8.npy"), "one file, no temporary left behind"

    def fail(*args, **kwargs):
        raise AssertionError("the cached partition must be read, not recomputed")

    monkeypatch.setattr(community, "partition", fail)
    second, _ = cached_partition(indptr, indices, 50, 8, "bfs", tmp_path)
    np.testing.assert_array_equal(first, second)
    other_indptr, other_indices = random_graph(50, 200, seed=8)
    assert community.graph_fingerprint(other_indptr, other_indices) != community.graph_fingerprint(indptr, indices)
    monkeypatch.undo()
    files[0].write_bytes(b"not an npy file")
    third, _ = cached_partition(indptr, indices, 50, 8, "bfs", tmp_path)
    np.testing.assert_array_equal(first, third)
    for wrong in (np.zeros(49, dtype=np.int64), np.zeros((50, 2), dtype=np.int64), first.astype(np.int32)):
        np.save(files[0], wrong)  # a readable array that cannot be this graph's membership
        again, _ = cached_partition(indptr, indices, 50, 8, "bfs", tmp_path)
        np.testing.assert_array_equal(first, again)


def test_graph_block_survives_to_and_keeps_decompositions():
    indptr, indices = random_graph(40, 160, seed=9)
    block = GraphBlock.of(indptr, indices.to(torch.int32), method="bfs")
    decomposition = block.decomposition(16)
    moved = block.to("cpu")
    assert isinstance(moved, GraphBlock) and moved.fingerprint == block.fingerprint
    assert moved.decomposition(16).intra_edges == decomposition.intra_edges


def work_model_timer(block: GraphBlock, width: int):
    """Deterministic stand-in for timing: CSR pays per edge, a decomposition per dense block entry (10x cheaper
    per multiply-add than a gathered edge, as BLAS vs a gather) plus copying the table twice and its remainder."""
    def timer(option: str, run) -> float:
        if option == graph_kernel.CSR:
            return block.nnz * width
        size = int(option.removeprefix("community"))
        decomposition = block.decomposition(size)
        dense = decomposition.num_communities * size * size * width / 10
        return dense + 2 * block.num_dst * width + decomposition.inter_edges * width

    return timer


@pytest.mark.parametrize("graph, expected", [("dense communities", "community"), ("random", "csr")])
def test_selector_picks_by_timings_and_results_match(graph, expected):
    if graph == "dense communities":
        indptr, indices = clique_graph(1024, 16, extra=256, seed=10)
    else:
        indptr, indices = random_graph(1024, 8192, seed=11)
    block = GraphBlock.of(indptr, indices, method="bfs")
    h = torch.randn(1024, 32)
    with graph_kernel.use_timer(work_model_timer(block, 32)):
        got = ops.aggregate(block, h, "mean")
        ops.aggregate(block, h, "mean")
    record = [r for r in ops.recorded_choices() if r.decision == "graph.kernel"]
    assert len(record) == 1 and record[0].chosen.startswith(expected) and record[0].reason == "timed"
    assert ops.choice_counts()["graph.kernel"] == {record[0].chosen: 2}, "timed once, counted every call"
    torch.testing.assert_close(got, ops.aggregate(plain(block.indptr, block.indices), h, "mean"))
    for option in graph_kernel.OPTIONS:
        with ops.force_choices({"graph.kernel": option}):
            torch.testing.assert_close(ops.aggregate(block, h, "mean"), got, rtol=1e-5, atol=1e-5)


def test_decomposition_without_intra_edges_is_not_timed():
    n = 64
    src = torch.arange(0, n, 2)
    indptr, indices = csc(src, (src + 1) % n, n)
    block = GraphBlock.of(indptr, indices, method="bfs")
    for size in graph_kernel.COMMUNITY_SIZES:
        block.decompositions[size] = decompose(plain(block.indptr, block.indices), np.arange(n), size, "given")
    timed: list[str] = []
    with graph_kernel.use_timer(lambda option, run: timed.append(option) or 1.0):
        ops.aggregate(block, torch.randn(n, 4), "sum")
    assert timed == ["csr"]


@pytest.mark.parametrize("graph, expected", [("cliques", "community"), ("random", "csr")])
def test_selector_real_timing_on_clear_cut_graphs(graph, expected):
    """Real timings where the answer is not close (~3x on this machine, one thread): 8192 nodes in full cliques
    of 64, where the dense blocks do the CSR kernel's 64 gathered edges per row as one batched GEMM; and a
    random graph of average degree 16, where a decomposition only adds dense work and copies."""
    if graph == "cliques":
        indptr, indices = clique_graph(8192, 64, extra=0, seed=12)
    else:
        indptr, indices = random_graph(8192, 8192 * 16, seed=13)
    block = GraphBlock.of(indptr, indices, method="bfs")
    h = torch.randn(8192, 64)
    out = ops.aggregate(block, h, "sum")
    (record,) = [r for r in ops.recorded_choices() if r.decision == "graph.kernel"]
    assert record.chosen.startswith(expected), record
    torch.testing.assert_close(out, ops.aggregate(plain(block.indptr, block.indices), h, "sum"), rtol=1e-4,
                               atol=1e-4)
