"""Route 1: the GPU batcher over UVA, host pinning and the dual GPU cache.

The cache planning, hotness counting and the errors without CUDA run everywhere; so does every
batcher check, against the torch backend on CPU tensors (`route1` fixture, "torch-cpu"). Runs of
the same checks with the CUDA kernels or the torch path on a GPU are marked `cuda` and skip
cleanly on machines without a CUDA device.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from morphpipe import native
from morphpipe.data import GeneratorSpec, generate, load_dataset
from morphpipe.sampling import CacheConfig, CpuBatcher, GpuBatcher
from morphpipe.sampling.cuda_support import CudaUnavailableError, cuda_problem
from morphpipe.sampling.gpu_batcher import batch_seed
from morphpipe.sampling.gpu_cache import (SLOT_BYTES, CachePlan, GpuCache, batch_hotness, degree_hotness,
                                          list_read_bytes, plan_cache)
from morphpipe.sampling.pinning import REGISTRATIONS, HostPinning, mapped_file
from tests.conftest import make_graph
from tests.sampling.conftest import FANOUTS, check_batch, neighbours_of

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def plan_for(graph, budget: int, fraction: float | None = None, fanouts=FANOUTS) -> CachePlan:
    hotness = degree_hotness(graph.indices, graph.num_nodes)
    return plan_cache(hotness, hotness, graph.indptr[1:] - graph.indptr[:-1],
                      row_bytes=graph.features.shape[1] * graph.features.element_size(),
                      index_bytes=graph.indices.element_size(), fanouts=fanouts, budget_bytes=budget,
                      adjacency_fraction=fraction)


# --- everywhere: planning, hotness, configuration, errors without CUDA ---------------------------------------


def test_degree_hotness_counts_list_memberships():
    graph = make_graph(300)
    expected = np.bincount(graph.indices.numpy(), minlength=300)
    assert np.array_equal(degree_hotness(graph.indices, 300, chunk=97).numpy(), expected)


@pytest.mark.parametrize("budget", [0, 100, 1_200, 1_500, 4_000, 20_000, 10**7])
@pytest.mark.parametrize("fraction", [None, 0.0, 0.3, 1.0])
def test_cache_plan_respects_the_budget_exactly(budget, fraction):
    graph = make_graph(300)
    plan = plan_for(graph, budget, fraction)
    assert plan.total_bytes <= budget
    row_bytes = graph.features.shape[1] * 4
    assert plan.feature_bytes == plan.feature_nodes.numel() * row_bytes
    degrees = graph.indptr[1:] - graph.indptr[:-1]
    lists = plan.adjacency_nodes
    expected_lists = int(degrees[lists].sum()) * 4 + 8 * (lists.numel() + 1) if lists.numel() else 0
    assert plan.adjacency_bytes == expected_lists
    kinds = int(plan.feature_nodes.numel() > 0) + int(lists.numel() > 0)
    assert plan.slot_bytes == kinds * SLOT_BYTES * 300
    assert torch.unique(plan.feature_nodes).numel() == plan.feature_nodes.numel()
    if fraction is not None:
        assert plan.adjacency_bytes + (SLOT_BYTES * 300 if lists.numel() else 0) <= int(budget * fraction)


def test_cache_plan_budget_below_a_lookup_table_caches_nothing():
    plan = plan_for(make_graph(300), SLOT_BYTES * 300 - 1)
    assert plan.total_bytes == 0 and plan.feature_nodes.numel() == 0 and plan.adjacency_nodes.numel() == 0


def test_cache_plan_takes_hottest_rows_first_and_everything_when_it_fits():
    graph = make_graph(300)
    hotness = degree_hotness(graph.indices, 300)
    plan = plan_for(graph, SLOT_BYTES * 300 + 10 * 28, fraction=0.0)
    assert plan.feature_nodes.numel() == 10
    assert hotness[plan.feature_nodes].min() >= torch.sort(hotness, descending=True).values[9]
    everything = plan_for(graph, 10**8)
    assert everything.feature_nodes.numel() == int((hotness > 0).sum())
    assert everything.adjacency_nodes.numel() == int((hotness > 0).sum())


def test_auto_split_saves_at_least_as_much_as_either_kind_alone():
    num_nodes = 1000
    degrees = torch.full((num_nodes,), 4)
    hot = torch.arange(num_nodes, 0, -1)
    for row_bytes, index_bytes, budget in ((4096, 4, 50_000), (2, 8, 30_000), (64, 4, 20_000)):
        def plan(fraction):
            return plan_cache(hot, hot, degrees, row_bytes=row_bytes, index_bytes=index_bytes, fanouts=[10],
                              budget_bytes=budget, adjacency_fraction=fraction)

        auto, features_only, lists_only = plan(None), plan(0.0), plan(1.0)
        assert auto.total_bytes <= budget
        assert auto.expected_saved_bytes >= max(features_only.expected_saved_bytes, lists_only.expected_saved_bytes)
        assert features_only.adjacency_nodes.numel() == 0 and lists_only.feature_nodes.numel() == 0


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_cache_layout_holds_the_planned_rows_and_lists(index_dtype):
    """The cache's tables, rows and compact CSC (built here in host memory) match the graph and the plan's bytes."""
    graph = make_graph(300, index_dtype=index_dtype)
    plan = plan_for(graph, 12_000, fraction=0.5)
    cache = GpuCache(plan, graph.indptr, graph.indices, graph.features, torch.device("cpu"), chunk_nodes=7)
    assert plan.feature_nodes.numel() and plan.adjacency_nodes.numel()
    assert cache.bytes_used == plan.total_bytes <= 12_000
    rows = cache.feature_slot[plan.feature_nodes].long()
    assert torch.equal(cache.feature_rows[rows], graph.features[plan.feature_nodes])
    assert int((cache.feature_slot >= 0).sum()) == plan.feature_nodes.numel()
    for node in plan.adjacency_nodes.tolist():
        slot = int(cache.adjacency_slot[node])
        cached = cache.adjacency_indices[cache.adjacency_indptr[slot]:cache.adjacency_indptr[slot + 1]]
        assert np.array_equal(cached.numpy(), neighbours_of(graph, node))
    empty = GpuCache(CachePlan.empty(), graph.indptr, graph.indices, graph.features, torch.device("cpu"))
    assert empty.bytes_used == 0


def test_list_read_model_counts_sectors():
    degrees = torch.tensor([0, 3, 20, 100])
    assert list_read_bytes(degrees, 4, 10).tolist() == [32, 64, 32 + 10 * 32, 32 + 10 * 32]
    assert list_read_bytes(degrees, 4, -1).tolist() == [32, 64, 32 + 96, 32 + 416]


def test_batch_hotness_counts_feature_and_list_reads():
    graph = make_graph(200)
    with CpuBatcher(graph, [3, 2], 16, num_threads=1, seed=0) as batcher:
        batches = list(batcher)
    features, adjacency = batch_hotness(batches, 200)
    assert int(features.sum()) == sum(b.input_nodes.numel() for b in batches)
    assert int(adjacency.sum()) == sum(block.num_dst for b in batches for block in b.blocks)


@pytest.mark.parametrize("kwargs, match", [
    ({"budget_bytes": -1}, "budget_bytes"),
    ({"adjacency_fraction": 1.5}, "adjacency_fraction"),
    ({"hotness": "random"}, "hotness"),
    ({"presample_batches": 0}, "presample_batches"),
])
def test_cache_config_names_the_bad_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CacheConfig(**kwargs)


def test_batch_seeds_are_deterministic_and_distinct():
    seeds = [batch_seed(12345, index) for index in range(1000)]
    assert seeds == [batch_seed(12345, index) for index in range(1000)]
    assert len(set(seeds)) == 1000 and all(0 <= s < 2**63 for s in seeds)


def test_mapped_file_finds_a_memory_mapped_array(tmp_path):
    path = tmp_path / "features.npy"
    np.save(path, np.ones((64, 8), dtype=np.float32))
    mapped = torch.from_numpy(np.load(path, mmap_mode="c"))
    assert mapped_file(mapped) == str(path)
    assert mapped_file(torch.ones(1024)) is None


def test_gpu_batching_has_a_profiler_operator():
    from morphpipe.profiler.operators import OPERATORS

    assert ("gpu_batching", "cuda") in OPERATORS


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on machines without CUDA")
def test_without_cuda_the_gpu_batcher_says_why_and_what_to_use():
    graph = make_graph(100)
    with pytest.raises(CudaUnavailableError, match="GpuBatcher.*CpuBatcher"):
        GpuBatcher(graph, FANOUTS, 16)
    assert cuda_problem() is not None
    with pytest.raises(CudaUnavailableError, match="needs a CUDA GPU"):
        HostPinning({"features": graph.features})


# --- on a GPU ------------------------------------------------------------------------------------------------


def on_host(batch):
    return batch.to("cpu")


ROUTE1 = [pytest.param(("cpu", "torch"), id="torch-cpu"),
          pytest.param(("cuda", "kernels"), id="kernels-cuda", marks=cuda),
          pytest.param(("cuda", "torch"), id="torch-cuda", marks=cuda)]


@pytest.fixture(params=ROUTE1)
def route1(request):
    """Makes GpuBatchers on one (device, backend): the torch path on CPU runs everywhere."""
    device, backend = request.param

    def make(graph, *args, **kwargs):
        return GpuBatcher(graph, *args, device=device, backend=backend, **kwargs)

    make.device = torch.device(device)
    return make


@pytest.mark.parametrize("fanouts", [FANOUTS, [-1, 2], [100, 1], [70]])
def test_batches_are_valid(graph, fanouts, route1):
    """Edges exist, no repeats, fanout respected (all for low degree), prefix convention, x and y (Floyd,
    reservoir / random-key and take-all paths: node 5 has degree 300)."""
    with route1(graph, fanouts, batch_size=32, seed=1) as batcher:
        for batch in batcher:
            assert batch.x.device.type == route1.device.type and batch.route == 1
            check_batch(graph, on_host(batch), fanouts)


@pytest.mark.parametrize("drop_last", [False, True])
def test_each_seed_exactly_once_per_epoch(graph, drop_last, route1):
    with route1(graph, FANOUTS, batch_size=48, drop_last=drop_last, seed=5) as batcher:
        for _ in range(2):
            batches = list(batcher)
            assert len(batches) == len(batcher)
            assert [b.batch_index for b in batches] == list(range(len(batches)))
            seen = torch.cat([b.seeds.cpu() for b in batches])
            assert torch.unique(seen).numel() == seen.numel()
            if drop_last:
                assert seen.numel() == (graph.train_idx.numel() // 48) * 48
            else:
                assert torch.equal(torch.sort(seen).values, torch.sort(graph.train_idx).values)


def same(first, second) -> bool:
    parts = [(a.input_nodes, b.input_nodes) for a, b in zip(first, second)]
    parts += [(a.x, b.x) for a, b in zip(first, second)] + [(a.y, b.y) for a, b in zip(first, second)]
    parts += [(ba.indices, bb.indices) for a, b in zip(first, second) for ba, bb in zip(a.blocks, b.blocks)]
    parts += [(ba.indptr, bb.indptr) for a, b in zip(first, second) for ba, bb in zip(a.blocks, b.blocks)]
    return len(first) == len(second) and all(torch.equal(x.cpu(), y.cpu()) for x, y in parts)


def test_deterministic_for_a_seed_and_same_batches_as_the_cpu_batcher(graph, route1):
    with route1(graph, FANOUTS, 40, seed=7) as batcher, route1(graph, FANOUTS, 40, seed=7) as twin:
        assert same(list(batcher.epoch(0)), list(twin.epoch(0)))
        assert same(list(batcher.epoch(1)), list(batcher.epoch(1)))
        assert not same(list(batcher.epoch(0)), list(batcher.epoch(1)))
        cpu = list(CpuBatcher(graph, FANOUTS, 40, num_threads=1, seed=7).epoch(0))
        gpu = list(batcher.epoch(0))
        assert all(torch.equal(c.seeds, g.seeds.cpu()) for c, g in zip(cpu, gpu))


def test_a_new_epoch_supersedes_an_unfinished_one(graph, route1):
    with route1(graph, FANOUTS, 10) as batcher:
        old = iter(batcher)
        next(old)
        assert len(list(iter(batcher))) == len(batcher)
        with pytest.raises(RuntimeError, match="superseded"):
            next(old)


def test_cpu_and_gpu_batchers_agree_in_distribution(route1):
    """Mean block sizes per layer over an epoch agree within sampling error (4 standard errors)."""
    graph = make_graph(3000, seed=3)
    fanouts = [5, 3]

    def sizes(batches):
        return np.array([[b.blocks[layer].nnz for layer in range(2)] + [b.input_nodes.numel()] for b in batches])

    with CpuBatcher(graph, fanouts, 64, num_threads=2, seed=0) as cpu_batcher:
        cpu = np.concatenate([sizes(cpu_batcher.epoch(e)) for e in range(4)])
    with route1(graph, fanouts, 64, seed=0) as gpu_batcher:
        gpu = np.concatenate([sizes(gpu_batcher.epoch(e)) for e in range(4)])
    error = np.sqrt(cpu.var(axis=0) / len(cpu) + gpu.var(axis=0) / len(gpu))
    assert np.all(np.abs(cpu.mean(axis=0) - gpu.mean(axis=0)) <= 4 * error + 1e-9)


@cuda
def test_gpu_sampling_is_uniform_chi_square():
    """Every neighbour of the hub is drawn equally often, by Floyd's algorithm (5) and by reservoir (100)."""
    graph = make_graph(400, seed=1)
    hub = 5
    position = {n: i for i, n in enumerate(neighbours_of(graph, hub))}
    ops = native.ops()
    with HostPinning({"indptr": graph.indptr, "indices": graph.indices}) as pinned:
        seeds = torch.tensor([hub], device="cuda")
        for fanout in (5, 100):
            counts = np.zeros(len(position))
            for trial in range(600):
                input_nodes, _, indices = ops.sample_neighbors(pinned["indptr"], pinned["indices"], seeds, [fanout],
                                                               trial)
                for node in input_nodes[indices[0]].tolist():
                    counts[position[node]] += 1
            assert counts.sum() == 600 * fanout
            assert stats.chisquare(counts).pvalue > 1e-3


@pytest.mark.parametrize("budget, fraction", [(4 * 500 + 2_000, 0.0), (30_000, None), (30_000, 0.5), (10**6, None)])
def test_cached_and_uncached_batches_are_identical(graph, budget, fraction, route1):
    """The cache changes where bytes come from, never what a batch holds; the budget is respected exactly."""
    with route1(graph, FANOUTS, 32, seed=3) as plain, \
            route1(graph, FANOUTS, 32, seed=3, cache_bytes=budget, cache_split=fraction) as cached:
        assert cached.cache_bytes_used == cached.cache_plan.total_bytes <= budget
        assert cached.cache_bytes_used > 0
        assert same(list(plain.epoch(0)), list(cached.epoch(0)))


def test_presampled_hotness_and_a_graph_larger_than_the_budget(graph, route1):
    graph_bytes = sum(t.numel() * t.element_size() for t in (graph.indptr, graph.indices, graph.features))
    budget = graph_bytes // 3
    with route1(graph, FANOUTS, 32, seed=4, cache_bytes=budget, hotness="presample") as batcher:
        assert 0 < batcher.cache_bytes_used <= budget < graph_bytes
        for batch in batcher:
            check_batch(graph, on_host(batch), FANOUTS)


@pytest.mark.parametrize("cache_bytes", [0, 20_000])
def test_features_on_disk_come_through_the_store_bit_for_bit(tmp_path, route1, cache_bytes):
    """With the features on disk, Route 1 reads the rows through the graph's feature store (its RAM cache, then the
    file) instead of pinning their memory map: the batches equal those of the same graph in memory, with or without
    a device cache of hot rows, and the store served them."""
    generate(GeneratorSpec(kind="community", num_nodes=600, avg_degree=5, feature_dim=16), tmp_path / "graph",
             progress=False)
    in_memory = load_dataset(tmp_path / "graph")
    on_disk = load_dataset(tmp_path / "graph", features_on_disk=True)
    store = on_disk.open_feature_store(64 * 30)  # float32 rows of 64 B: the 30 hottest in RAM, the rest read
    with route1(in_memory, FANOUTS, 32, seed=5, cache_bytes=cache_bytes) as plain, \
            route1(on_disk, FANOUTS, 32, seed=5, cache_bytes=cache_bytes) as through_store:
        store.reset_counters()
        batches = list(through_store.epoch(0))
        assert same(list(plain.epoch(0)), batches)
    served = store.counters()
    asked = sum(batch.input_nodes.numel() for batch in batches)
    assert served.misses > 0 and served.reads > 0, "rows came from the file"
    if cache_bytes:  # rows in the device cache are not asked of the store again
        assert 0 < served.hits + served.misses < asked
    else:
        assert served.hits + served.misses == asked


@cuda
def test_registration_is_undone_after_use(graph):
    assert not graph.features.is_pinned()
    batcher = GpuBatcher(graph, FANOUTS, 32)
    assert graph.features.is_pinned() and REGISTRATIONS.holds(graph.features)
    with GpuBatcher(graph, FANOUTS, 32) as second:  # shares the registration
        next(iter(second))
    assert graph.features.is_pinned(), "closing one batcher keeps memory the other reads pinned"
    next(iter(batcher))
    batcher.close()
    for tensor in (graph.indptr, graph.indices, graph.features, graph.labels):
        assert not tensor.is_pinned() and not REGISTRATIONS.holds(tensor)
    assert len(list(batcher.epoch(0))) == len(batcher), "a closed batcher pins again for a new epoch"
    batcher.close()
    assert not graph.features.is_pinned()


@cuda
def test_copy_pinning_leaves_the_graph_alone(graph):
    with GpuBatcher(graph, FANOUTS, 32, pinning="copy") as batcher:
        assert not graph.features.is_pinned()
        check_batch(graph, on_host(next(iter(batcher))), FANOUTS)


@cuda
def test_memory_mapped_preset_is_pinned_in_place():
    from morphpipe.data import load_dataset

    graph = load_dataset("tiny", progress=False)
    assert mapped_file(graph.features) is not None
    with GpuBatcher(graph, [10, 5], batch_size=128, seed=0, cache_bytes=200_000) as batcher:
        batches = list(batcher)
    assert sum(b.num_seeds for b in batches) == graph.train_idx.numel()
    for batch in batches[:3]:
        check_batch(graph, on_host(batch), [10, 5])


@cuda
def test_ops_name_bad_inputs(graph):
    ops = native.ops()
    with pytest.raises(RuntimeError, match="pageable host memory"):
        ops.gather_rows(graph.features, torch.tensor([0, 1], device="cuda"))
    with HostPinning({"indptr": graph.indptr, "indices": graph.indices, "features": graph.features}) as pinned:
        with pytest.raises(RuntimeError, match="outside"):
            ops.gather_rows(pinned["features"], torch.tensor([0, 10_000], device="cuda"))
        with pytest.raises(RuntimeError, match="not a node id"):
            ops.sample_neighbors(pinned["indptr"], pinned["indices"], torch.tensor([0, 999], device="cuda"), [2], 0)
        with pytest.raises(RuntimeError, match="repeats"):
            ops.sample_neighbors(pinned["indptr"], pinned["indices"], torch.tensor([3, 3], device="cuda"), [2], 0)
        bad_indices = graph.indices.clone()
        bad_indices[0] = 10**6
        with HostPinning({"indices": bad_indices}) as bad_pinned:
            first = int(torch.nonzero(graph.indptr[1:] > 0)[0])
            with pytest.raises(RuntimeError, match="outside"):
                ops.sample_neighbors(pinned["indptr"], bad_pinned["indices"], torch.tensor([first], device="cuda"),
                                     [-1], 0)
