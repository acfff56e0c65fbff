"""The shared epoch contract (order, seed, batch count) and the throughput measurement the benchmarks use."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from morphpipe.sampling import CpuBatcher, batches_per_epoch, epoch_order, epoch_seed
from morphpipe.sampling.throughput import cpu_batcher_by_threads, measure_throughput, measurement_seeds


def make_graph(num_nodes: int = 500, degree: int = 6) -> SimpleNamespace:
    """A random graph with `degree` in-neighbours per node (duplicates allowed), 7 features, 5 classes."""
    generator = torch.Generator().manual_seed(0)
    return SimpleNamespace(
        indptr=torch.arange(0, (num_nodes + 1) * degree, degree, dtype=torch.int64),
        indices=torch.randint(0, num_nodes, (num_nodes * degree,), generator=generator),
        features=torch.randn(num_nodes, 7, generator=generator),
        labels=torch.randint(0, 5, (num_nodes,), generator=generator),
        train_idx=torch.arange(0, num_nodes, 2), num_nodes=num_nodes,
    )


@pytest.mark.parametrize("num_seeds, batch_size, drop_last, expected", [
    (100, 10, False, 10), (100, 10, True, 10), (101, 10, False, 11), (101, 10, True, 10),
    (9, 10, False, 1), (9, 10, True, 0), (0, 10, False, 0),
])
def test_batches_per_epoch(num_seeds, batch_size, drop_last, expected):
    assert batches_per_epoch(num_seeds, batch_size, drop_last) == expected


def test_epoch_order_is_a_seeded_permutation_that_changes_per_epoch():
    seeds = torch.arange(1000, 2000)
    first = epoch_order(seeds, seed=3, epoch=0)
    assert torch.equal(first.sort().values, seeds)
    assert torch.equal(first, epoch_order(seeds, seed=3, epoch=0))
    assert not torch.equal(first, epoch_order(seeds, seed=3, epoch=1))
    assert not torch.equal(first, epoch_order(seeds, seed=4, epoch=0))
    assert torch.equal(epoch_order(seeds, seed=3, epoch=0, shuffle=False), seeds)
    assert epoch_seed(3, 0) != epoch_seed(3, 1) != epoch_seed(4, 1)


def test_cpu_batcher_counts_batches_with_the_shared_rule():
    graph = make_graph()
    for drop_last in (False, True):
        batcher = CpuBatcher(graph, [3, 2], batch_size=48, num_threads=1, drop_last=drop_last)
        assert len(batcher) == batches_per_epoch(graph.train_idx.numel(), 48, drop_last)
        assert len(list(batcher)) == len(batcher)
        batcher.close()


def test_measurement_seeds_are_distinct_training_seeds_and_repeatable():
    train_idx = torch.arange(0, 1000, 3)
    seeds = measurement_seeds(train_idx, batches=4, batch_size=25)
    assert seeds.numel() == 100
    assert seeds.unique().numel() == 100
    assert torch.isin(seeds, train_idx).all()
    assert torch.equal(seeds, measurement_seeds(train_idx, batches=4, batch_size=25))
    assert not torch.equal(seeds, measurement_seeds(train_idx, batches=4, batch_size=25, seed=1))


def test_measurement_seeds_refuses_more_than_the_split_holds():
    with pytest.raises(ValueError, match=r"batches=5 of 100 need 500 seeds, but the train split has only 334"):
        measurement_seeds(torch.arange(0, 1000, 3), batches=5, batch_size=100)


def test_measure_throughput_counts_what_the_batches_hold():
    graph = make_graph()
    batches = list(CpuBatcher(graph, [3, 2], batch_size=40, num_threads=1, shuffle=False))
    result = measure_throughput(iter(batches), max_batches=3)
    measured = batches[:3]
    assert result.batches == 3
    assert result.seconds > 0
    assert result.edges_per_batch == pytest.approx(sum(b.num_sampled_edges() for b in measured) / 3)
    assert result.input_nodes_per_batch == pytest.approx(sum(b.input_nodes.numel() for b in measured) / 3)
    assert result.bytes_per_batch == pytest.approx(sum(b.nbytes for b in measured) / 3)
    assert result.batches_per_s == pytest.approx(3 / result.seconds)
    feature_bytes = sum(b.x.numel() * b.x.element_size() for b in measured)
    assert result.feature_bytes_per_s == pytest.approx(feature_bytes / result.seconds)


def test_measure_throughput_of_nothing_is_an_error():
    with pytest.raises(ValueError, match="produced no batch"):
        measure_throughput(iter([]))


def test_cpu_batcher_by_threads_times_one_full_epoch_per_thread_count():
    graph = make_graph()
    seeds = measurement_seeds(graph.train_idx, batches=5, batch_size=20)
    rows = cpu_batcher_by_threads(graph, [3, 2], 20, seeds, max_threads=2, pin_memory=False)
    assert [row["threads"] for row in rows] == [1, 2]
    assert all(row["batches"] == 5 and row["batches_per_s"] > 0 for row in rows)
    assert rows[0]["edges_per_batch"] == pytest.approx(rows[1]["edges_per_batch"]), "same seeds and seed, any threads"
