"""Profiling with features on disk: the CPU batching time is the CPU's alone (the timed batches read nothing from
the disk), the disk's cost is what the feature store's own read timer measured, and the predicted epoch of a
disk-bound workload follows the disk's speed, not the CPU's."""
from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

from morphpipe.data import GraphStore
from morphpipe.executor.replan import rescaled_profile
from morphpipe.profiler.disk import resident_bytes
from morphpipe.profiler.operators import OPERATORS, no_sync, timed_steps
from morphpipe.profiler.profile import PhaseTiming
from morphpipe.profiler.profiler import MIN_GPU_SHARE, Profiler
from morphpipe.sampling.access_hotness import expected_batch_reads
from morphpipe.scheduler import plan_from_profile
from morphpipe.scheduler.whatif import what_if
from tests.conftest import make_graph

ROW_BYTES = 1024  # 512 float16: rows sampled at random from 20k rarely share a read


@pytest.fixture(scope="module")
def on_disk(tmp_path_factory):
    """A 20k-node graph whose features (20 MB) are read through a cache-less feature store."""
    graph = make_graph(20_000, index_dtype=torch.int64)
    features = torch.randn(20_000, ROW_BYTES // 2, generator=torch.Generator().manual_seed(5)).to(torch.float16)
    store = GraphStore(indptr=graph.indptr, indices=graph.indices, features=features, labels=graph.labels,
                       train_idx=graph.train_idx[:150], val_idx=torch.tensor([1]), test_idx=torch.tensor([3]),
                       num_classes=5, name="disk-profile")
    directory = tmp_path_factory.mktemp("graph")
    store.save(directory)
    return GraphStore.load(directory, features_on_disk=True, io_threads=2)


@pytest.fixture(scope="module")
def profiled(on_disk):
    # 150 training nodes in batches of 64: an epoch of 3 batches, so the 5 timed ones run into epoch 1 too.
    profiler = Profiler(on_disk, fanouts=[5, 3], batch_size=64, hidden=8, device="cpu", thread_counts=[1, 2],
                        warmup=1, steps=4, budget_s=0.5, progress=False, attempts=1, disk_seconds=0.05,
                        memory_budget=4 << 20)
    return profiler, profiler.run()


def test_the_timed_cpu_batches_read_nothing_from_the_disk(on_disk, profiled):
    profiler, profile = profiled
    reads = profiler.timed_batching_reads
    assert reads is not None and reads.hits > 0  # they gathered every row through the store, from its cache
    assert (reads.misses, reads.reads, reads.read_seconds) == (0, 0, 0.0)
    disk = profile.disk
    # The disk's cost is the store's own: its reads of the sampled batches were timed, at a rate of their own.
    assert disk.store_reads_per_s is not None
    assert len(disk.reads_per_miss_curve) == len(disk.hit_curve) and disk.reads_per_miss == disk.reads_per_miss_curve[0]
    assert len(disk.read_bytes_curve) == len(disk.hit_curve) and min(disk.read_bytes_curve) >= 4096  # a page at least
    if on_disk.feature_store.direct:  # timed reading each cache size's misses, and with each I/O thread count
        assert len(disk.reads_per_s_curve) == len(disk.hit_curve)
        assert disk.io_threads == 2 and 2 in disk.io_thread_counts() and disk.io_thread_counts()[0] == 1
        assert all(point.reads_per_s > 0 and point.cpu_s_per_read > 0 for point in disk.io_curve)
        assert disk.io_read_sizes() and set(disk.io_read_sizes()) <= set(disk.read_bytes_curve)  # sizes the misses take
        assert disk.reads_per_s_at(0, 2) == disk.reads_per_s_at(0)  # at the count the rates were measured at
    else:
        assert disk.reads_per_s_curve == () and disk.reads_per_s_at(0) == disk.store_reads_per_s
        assert disk.io_curve == () and disk.read_cpu_s_per_batch(0) == 0.0
    assert profile.to_dict()["disk"] == type(profile).from_dict(profile.to_dict()).to_dict()["disk"]


def test_the_hit_curve_is_that_of_the_ranking_the_store_caches_by(on_disk, profiled):
    # the workload's expected reads rank the cache the profile's hit curve predicts, and that planned caches hold
    assert on_disk.cache_ranked_by.startswith("expected access (fanouts 5,3, batch 64")
    reads = expected_batch_reads(on_disk.indptr, on_disk.indices, on_disk.train_idx, [5, 3], 64)
    assert torch.equal(on_disk.cache_hotness(), reads.float())


def test_a_disk_bound_epoch_follows_the_disk_not_the_cpu(profiled):
    _, profile = profiled
    work = profile.cpu_batch_time(1, profile.cores) + profile.cpu_training.per_batch_time(1, profile.cores)
    disk = profile.disk
    # Reads of a batch's misses taking 100x its CPU work (batching and training) over 50 batches: a disk-bound epoch.
    # Without the I/O-thread curve: its measured CPU per read (charged to the batching cores) is the load's at
    # profiling time, and is tested apart (tests/scheduler/test_disk_plan.py).
    slow = dataclasses.replace(disk, store_reads_per_s=disk.rows_per_batch * disk.reads_per_miss / (100 * work),
                               reads_per_s_curve=(), io_curve=())
    profile = profile.replaced(disk=slow, num_batches=50)
    base = plan_from_profile(profile, cache_bytes=0, engine="fast").predicted_epoch_s
    faster_disk = plan_from_profile(what_if(profile, disk_speed=2.0).profile, cache_bytes=0,
                                    engine="fast").predicted_epoch_s
    faster_cpu = plan_from_profile(rescaled_profile(profile, {"cpu_batch": 0.5}), cache_bytes=0,
                                   engine="fast").predicted_epoch_s
    assert faster_disk == pytest.approx(base / 2, rel=0.05)
    assert faster_cpu == pytest.approx(base, rel=0.02)


def test_the_memory_budget_holds_the_batches_in_flight_and_a_step_beside_the_cache(on_disk, profiled):
    profiler, profile = profiled
    disk = profile.disk
    in_flight = (profiler.buffer_batches + 2) * profile.batch_bytes
    assert disk.resident_bytes >= resident_bytes(on_disk) + in_flight * 0.99  # batch_bytes is a rounded mean
    assert disk.cache_budget_bytes == max(0, profiler.memory_budget - disk.resident_bytes)


def test_route_1_reads_through_the_store_are_taken_out_of_t_gb(on_disk, monkeypatch):
    """GPU batching timed through the feature store (here the Route 1 batcher's torch path on the CPU, standing in
    for the GPU operator this machine lacks): the profile's T_GB is the timing less the store's read time per
    batch, and the disk profile holds the rows a Route-1 batch gathered (every input row: no GPU cache)."""
    rows, raw = [], {}

    def gpu_batching(session):
        with session.task.batcher(session.graph, session.fanouts, session.batch_size, route=1, seed=session.seed,
                                  device="cpu") as batcher:
            batches = itertools.chain.from_iterable(batcher.epoch(epoch) for epoch in itertools.count())
            raw["timing"] = timed_steps(session, lambda: rows.append(next(batches).input_nodes.numel()), no_sync)
        raw["reads"] = session.graph.feature_store.counters()
        return raw["timing"]

    monkeypatch.setitem(OPERATORS, ("gpu_batching", "cuda"), gpu_batching)
    monkeypatch.setitem(OPERATORS, ("dma", "cuda"), lambda session: PhaseTiming.from_mean(0.001))
    monkeypatch.setitem(OPERATORS, ("training", "cuda"), lambda session: PhaseTiming.from_mean(0.002))
    profiler = Profiler(on_disk, fanouts=[5, 3], batch_size=64, hidden=8, device="cpu", thread_counts=[1],
                        warmup=1, steps=4, budget_s=0.5, progress=False, attempts=1, disk_seconds=0.05,
                        memory_budget=4 << 20)
    profiler.device = "cuda"
    profile = profiler.measure()
    reads = raw["reads"]
    assert reads.misses == sum(rows) and reads.read_seconds > 0  # a cache-less store: every row a miss
    assert profile.disk.gpu_rows_per_batch == pytest.approx(sum(rows) / len(rows))
    # the timing less the reads, unless a slow warm-up read pushed that below the GPU's least share (a loaded machine)
    timed_s = raw["timing"].mean_s
    assert profile.gpu_batching.mean_s == pytest.approx(max(timed_s - reads.read_seconds / len(rows),
                                                            timed_s * MIN_GPU_SHARE))
    assert profile.gpu_batching.samples == raw["timing"].samples


def test_a_link_workloads_disk_is_profiled_behind_its_edge_batches_ranking(tmp_path):
    """What `tune --task link` and `train --auto --task link` plan from: the hit curve of the cache ranked by the
    edge batches' expected reads."""
    from morphpipe.data import GeneratorSpec, load_dataset
    from morphpipe.data.link_generator import EdgeSplitSpec, generate_link
    from morphpipe.nn.link_task import LinkPrediction
    from morphpipe.sampling.access_hotness import expected_link_batch_reads

    spec = GeneratorSpec(kind="power-law", num_nodes=2_000, avg_degree=5, feature_dim=256, feature_dtype="float16",
                         undirected=False)
    graph = load_dataset(generate_link(spec, EdgeSplitSpec(), tmp_path / "g", progress=False), features_on_disk=True)
    task = LinkPrediction(2, negative_kind="degree")
    profile = Profiler(graph, fanouts=[4, 3], batch_size=256, hidden=8, device="cpu", thread_counts=[1], warmup=1,
                       steps=2, budget_s=0.5, progress=False, attempts=1, disk_seconds=0.05, task=task).run()
    edges = graph.edge_split.train.shape[1]
    assert graph.cache_ranked_by == (f"expected access of link batches (fanouts 4,3, batch 256, {edges:,} training "
                                     "edges, 2 degree negatives each)")
    src, dst = graph.edge_split.train
    expected = expected_link_batch_reads(graph.indptr, graph.indices, src, dst, [4, 3], 256, 2,
                                         task.sampling.draw_probability(graph))
    assert torch.equal(graph.cache_hotness(), expected.float())
    assert profile.disk is not None and profile.disk.hit_curve[-1][1] > 0
