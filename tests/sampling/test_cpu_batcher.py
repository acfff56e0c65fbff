"""Correctness of the C++ neighbour sampler and the threaded CPU batcher (Route 0)."""
from __future__ import annotations

import hashlib
import itertools
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from scipy import stats

from morphpipe import native
from morphpipe.sampling import CpuBatcher, MiniBatch, sample_neighbors
from morphpipe.sampling import torch_sampler
from tests.conftest import make_graph
from tests.sampling.conftest import FANOUTS, check_batch, neighbours_of


def torch_path_sample(graph, seeds, fanouts, seed: int = 0) -> MiniBatch:
    """One batch by Route 1's torch path on the host tensors (what a GPU runs on zero-copy views)."""
    tensors = torch_sampler.GraphTensors(graph.indptr, graph.indices, graph.features, graph.labels)
    return torch_sampler.make_batch(tensors, torch.as_tensor(seeds, dtype=torch.int64), fanouts, seed)


# Samplers of one batch that must pass the same checks: the C++ op (Route 0) and Route 1's torch path.
SAMPLERS = {"cpp": sample_neighbors, "torch": torch_path_sample}


@pytest.mark.parametrize("sampler", list(SAMPLERS))
def test_single_batch_structure(graph, sampler):
    seeds = torch.tensor([5, 0, 17, 3, 499, 250])
    for fanouts in (FANOUTS, [-1, 2], [100, 1]):
        check_batch(graph, SAMPLERS[sampler](graph, seeds, fanouts, seed=3), fanouts)


def test_batcher_batches_are_valid(graph):
    with CpuBatcher(graph, FANOUTS, batch_size=32, num_threads=3, seed=1) as batcher:
        for batch in batcher:
            check_batch(graph, batch, FANOUTS)


@pytest.mark.parametrize("drop_last", [False, True])
def test_each_seed_exactly_once_per_epoch(graph, drop_last):
    batcher = CpuBatcher(graph, FANOUTS, batch_size=48, num_threads=2, drop_last=drop_last, seed=5)
    for _ in range(2):
        batches = list(batcher)
        assert len(batches) == len(batcher)
        assert [b.batch_index for b in batches] == list(range(len(batches)))
        seen = torch.cat([b.seeds for b in batches])
        assert torch.unique(seen).numel() == seen.numel()
        if drop_last:
            assert all(b.seeds.numel() == 48 for b in batches)
            assert seen.numel() == (graph.train_idx.numel() // 48) * 48
        else:
            assert torch.equal(torch.sort(seen).values, torch.sort(graph.train_idx).values)
    batcher.close()


def batches_as_tensors(batches):
    return [
        [b.seeds, b.input_nodes, b.x, b.y, *[t for blk in b.blocks for t in (blk.indptr, blk.indices)]]
        for b in batches
    ]


def assert_same_epochs(first, second):
    assert len(first) == len(second)
    for a, b in zip(batches_as_tensors(first), batches_as_tensors(second)):
        assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_deterministic_for_seed_and_thread_count(graph):
    def epoch(threads, seed, epoch_number=0):
        return list(CpuBatcher(graph, FANOUTS, 40, num_threads=threads, seed=seed).epoch(epoch_number))

    assert_same_epochs(epoch(2, 7), epoch(2, 7))
    assert_same_epochs(epoch(1, 7), epoch(4, 7))
    different = epoch(2, 8)
    assert not torch.equal(epoch(2, 7)[0].seeds, different[0].seeds)
    assert not torch.equal(epoch(2, 7, 0)[0].seeds, epoch(2, 7, 1)[0].seeds), "each epoch reshuffles"


def test_replaying_an_epoch_and_unshuffled_order(graph):
    batcher = CpuBatcher(graph, FANOUTS, 40, num_threads=2, seed=2)
    first = list(batcher)
    list(batcher)
    assert_same_epochs(first, list(batcher.epoch(0)))
    ordered = CpuBatcher(graph, FANOUTS, 40, num_threads=2, shuffle=False)
    assert torch.equal(torch.cat([b.seeds for b in ordered]), graph.train_idx)


def test_a_new_epoch_supersedes_an_unfinished_one(graph):
    batcher = CpuBatcher(graph, FANOUTS, 10, num_threads=2, queue_size=2)
    old = iter(batcher)
    next(old)
    fresh = iter(batcher)
    assert len(list(fresh)) == len(batcher)
    with pytest.raises(RuntimeError, match="superseded"):
        next(old)


@pytest.mark.parametrize("sampler", list(SAMPLERS))
def test_sampling_is_uniform_chi_square(sampler):
    """Every neighbour of a node is drawn equally often, and so is every pair (C++: Floyd and Fisher-Yates paths;
    torch: Floyd and random-key paths)."""
    sample_neighbors = SAMPLERS[sampler]
    graph = make_graph(400, seed=1)
    hub = 5
    degree = int(graph.indptr[hub + 1] - graph.indptr[hub])
    for fanout in (5, 100):
        trials = 600
        counts = np.zeros(degree)
        position = {n: i for i, n in enumerate(neighbours_of(graph, hub))}
        for trial in range(trials):
            batch = sample_neighbors(graph, [hub], [fanout], seed=trial)
            for node in batch.input_nodes[batch.blocks[0].indices].tolist():
                counts[position[node]] += 1
        assert counts.sum() == trials * fanout
        assert stats.chisquare(counts).pvalue > 1e-3

    small = SimpleNamespace(
        indptr=torch.tensor([0, 6, 6, 6, 6, 6, 6, 6]), indices=torch.tensor([1, 2, 3, 4, 5, 6], dtype=torch.int32),
        features=torch.zeros(7, 1), labels=torch.zeros(7, dtype=torch.long), num_nodes=7,
    )
    pairs = {p: 0 for p in itertools.combinations(range(1, 7), 2)}
    for trial in range(3000):
        batch = sample_neighbors(small, [0], [2], seed=trial)
        pairs[tuple(sorted(batch.input_nodes[batch.blocks[0].indices].tolist()))] += 1
    assert stats.chisquare(list(pairs.values())).pvalue > 1e-3


def test_edge_index_conversion(graph):
    batch = sample_neighbors(graph, torch.tensor([5, 6, 7]), FANOUTS, seed=0)
    for block, edge_index in zip(batch.blocks, batch.edge_indices()):
        assert edge_index.shape == (2, block.nnz)
        degrees = torch.bincount(edge_index[1], minlength=block.num_dst)
        assert torch.equal(degrees, block.indptr[1:] - block.indptr[:-1])
        assert torch.equal(edge_index[0], block.indices)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"fanouts": [0, 2]}, r"fanouts\[0\] = 0"),
        ({"fanouts": [3, -2]}, r"fanouts\[1\] = -2"),
        ({"fanouts": []}, "fanouts"),
        ({"batch_size": 0}, "batch_size"),
        ({"num_threads": 0}, "num_threads"),
        ({"seeds": torch.tensor([1, 500])}, "outside"),
        ({"seeds": torch.tensor([-1, 2])}, "outside"),
        ({"seeds": torch.tensor([3, 3])}, "repeated"),
        ({"seeds": torch.tensor([0.5])}, "integer"),
    ],
)
def test_bad_arguments_are_named(graph, kwargs, match):
    args = {"fanouts": FANOUTS, "batch_size": 8} | kwargs
    with pytest.raises(ValueError, match=match):
        CpuBatcher(graph, args.pop("fanouts"), args.pop("batch_size"), **args)


def test_worker_error_reaches_the_caller_with_its_message():
    """A corrupt graph that skipped validation makes a worker thread fail; next() re-raises it."""
    graph = make_graph(50)
    corrupt = graph.indices.clone()
    corrupt[graph.indptr[5]] = 10_000
    extension = native.load()
    batcher = extension.CpuBatcher(graph.indptr, corrupt, graph.features, graph.labels, [50], 3, 4, False)
    batcher.start_epoch(torch.arange(50), 4, False, 0)
    with pytest.raises(RuntimeError, match="outside"):
        while batcher.next() is not None:
            pass
    batcher.start_epoch(torch.tensor([0, 50]), 1, False, 0)
    with pytest.raises(RuntimeError, match=r"seeds\[0\] = 50"):
        while batcher.next() is not None:
            pass
    batcher.stop()


def test_native_checks_topology_before_use():
    graph = make_graph(20)
    extension = native.load()
    with pytest.raises(RuntimeError, match="indptr"):
        extension.CpuBatcher(graph.indptr[:-1], graph.indices, graph.features, graph.labels, [2], 1, 1, False)
    with pytest.raises(RuntimeError, match="features"):
        extension.CpuBatcher(graph.indptr, graph.indices, graph.features[:5], graph.labels, [2], 1, 1, False)


def test_a_failed_native_build_is_not_retried_on_every_call(monkeypatch, tmp_path):
    """Ops ask for the extension on every call; a failed build is raised again, not recompiled each time."""
    from torch.utils import cpp_extension

    attempts = []

    def failing_load(**kwargs):
        attempts.append(kwargs["verbose"])
        raise OSError("no compiler")

    monkeypatch.setattr(native, "_module", None)
    monkeypatch.setattr(native, "_failure", None)
    monkeypatch.setenv("MORPHPIPE_BUILD_DIR", str(tmp_path))
    monkeypatch.setattr(native, "PREBUILT_INFO", tmp_path / "no_prebuilt_module.json")  # the just-in-time path
    monkeypatch.setattr(cpp_extension, "load", failing_load)
    for _ in range(3):
        with pytest.raises(native.NativeBuildError, match="no compiler"):
            native.load()
    assert attempts == [False]
    with pytest.raises(native.NativeBuildError):
        native.load(verbose=True)
    assert attempts == [False, True], "a verbose load tries again, to show the compiler log"


def test_gather_rows_op_matches_indexing():
    source = torch.randn(1000, 33).to(torch.bfloat16)
    index = torch.randint(0, 1000, (5000,))
    assert torch.equal(native.ops().gather_rows(source, index), source[index])
    with pytest.raises(RuntimeError, match="outside"):
        native.ops().gather_rows(source, torch.tensor([1000]))


# Widths across 64-byte lines (the non-temporal path takes rows of whole lines) and every dtype a feature table has.
GATHER_WIDTHS = [1, 3, 15, 16, 17, 32, 255, 256, 257, 768]
LEVEL_BIT = {"baseline": 1, "avx2": 2, "avx512": 4}
GATHER_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.uint8]


def test_gather_rows_is_bit_equal_to_indexing_at_every_cpu_level():
    """The gather kernel of each supported level copies every row bit for bit, past its prefetch distances and across
    its threads' chunks: into a new tensor (ordinary stores), into a reused line-aligned one (streaming stores for
    rows of whole cache lines) and into one 16 bytes past a line (ordinary stores: streaming needs aligned lines)."""
    ops = native.ops()
    generator = torch.Generator().manual_seed(5)
    index = torch.randint(0, 700, (600,), generator=generator)  # past 64 rows ahead, three 256-row chunks
    index[:10] = 699  # repeated rows
    levels = native.supported_cpu_capabilities()
    for dtype in GATHER_DTYPES:
        for width in GATHER_WIDTHS:
            item = torch.empty(0, dtype=dtype).element_size()
            source = torch.randint(0, 256, (700, width * item), generator=generator, dtype=torch.uint8).view(dtype)
            want = source[index].view(torch.uint8)
            aligned = torch.empty(index.numel(), width, dtype=dtype)
            unaligned = torch.empty(want.numel() + 64, dtype=torch.uint8)[16:16 + want.numel()].view(dtype)
            unaligned = unaligned.view(index.numel(), width)
            for level in levels:
                native.load().take_dispatched_capabilities()
                with native.forced_cpu_capability(level):
                    got = ops.gather_rows(source, index)
                    for out in (aligned, unaligned):
                        out.view(torch.uint8).fill_(0)
                        ops.gather_rows_out(source, index, out)
                        assert torch.equal(out.view(torch.uint8), want), f"{level} {dtype} width {width} out="
                assert native.load().take_dispatched_capabilities() == LEVEL_BIT[level], f"{level} ran other code"
                assert got.dtype == dtype and torch.equal(got.view(torch.uint8), want), f"{level} {dtype} width {width}"


def test_gather_rows_out_refuses_an_output_of_the_wrong_shape_or_dtype():
    source, index = torch.randn(10, 4), torch.tensor([1, 2, 3])
    for out in (torch.empty(3, 5), torch.empty(2, 4), torch.empty(3, 4, dtype=torch.float64), torch.empty(4, 3).t()):
        with pytest.raises(RuntimeError, match=r"gather_rows_out: out must be a contiguous CPU tensor \[3, 4\] of"):
            native.ops().gather_rows_out(source, index, out)
    with pytest.raises(RuntimeError, match="outside"):
        native.ops().gather_rows_out(source, torch.tensor([10]), torch.empty(1, 4))


def test_batcher_on_a_memory_mapped_preset():
    from morphpipe.data import load_dataset

    graph = load_dataset("tiny", progress=False)
    assert graph.indices.dtype == torch.int32
    fanouts = [10, 5]
    with CpuBatcher(graph, fanouts, batch_size=128, num_threads=2, seed=0) as batcher:
        batches = list(batcher)
    assert sum(b.num_seeds for b in batches) == graph.train_idx.numel()
    for batch in batches[:3]:
        check_batch(graph, batch, fanouts)


def test_graphs_past_the_dense_relabelling_limit_give_the_same_batches():
    """The sampler relabels through a dense per-node array up to 2**24 nodes and through a hash map beyond: the same
    edges padded with isolated nodes past that limit must give the same batch, node for node."""
    from morphpipe.data import build_csc

    generator = torch.Generator().manual_seed(0)
    num_nodes, num_edges = 500, 6000
    src = torch.randint(0, num_nodes, (num_edges,), generator=generator)
    dst = torch.randint(0, num_nodes, (num_edges,), generator=generator)
    indptr, indices = build_csc(src, dst, num_nodes)
    padded = torch.cat([indptr, indptr[-1:].expand((1 << 24) + 1 - num_nodes)])  # 2**24 + 1 nodes
    seeds = torch.randperm(num_nodes, generator=generator)[:64]
    dense = native.ops().sample_neighbors(indptr, indices, seeds, [5, 3], 7)
    hashed = native.ops().sample_neighbors(padded, indices, seeds, [5, 3], 7)
    assert torch.equal(dense[0], hashed[0])
    for dense_part, hashed_part in zip(dense[1:], hashed[1:]):
        assert len(dense_part) == len(hashed_part) == 2
        assert all(torch.equal(a, b) for a, b in zip(dense_part, hashed_part))


# sha256 of 4 batches of `sample_neighbors` (fanouts 70, 5, -1; seeds node 5, whose 300 neighbours take the
# shuffle path, and 40 others, which take Floyd's) on make_graph(500), recorded from main's build before the
# sampler's passes were split (random choices, id reads and relabelling in separate passes) and the relabelling
# made branch-free. Any change to the draws, their order or the relabelling changes it.
RECORDED_BATCHES_SHA256 = "3c7bfd059090433885f10ee210195efc8949e1143b7594b5d972eaf19728521f"


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=["int32", "int64"])
def test_sampled_batches_are_bit_for_bit_those_recorded_before_the_pass_split(index_dtype):
    graph = make_graph(500, index_dtype=index_dtype)
    seeds = torch.cat([torch.tensor([5]), graph.train_idx[:40]])
    digest = hashlib.sha256()
    for seed in range(4):
        nodes, indptrs, indices = native.ops().sample_neighbors(graph.indptr, graph.indices, seeds, [70, 5, -1], seed)
        for tensor in [nodes, *indptrs, *indices]:
            digest.update(tensor.numpy().tobytes())
    assert digest.hexdigest() == RECORDED_BATCHES_SHA256
