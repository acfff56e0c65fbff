"""The on-demand batcher of plans that take turns on the same cores: turns of several batches, the same batches.

A turn samples `num_threads` batches at once, one per thread, and gathers each batch's features on the caller's
thread when it is asked for; every batch must be the one `sample_neighbors` builds alone for the same seeds and
sampling seed (what the batcher built one at a time before turns), in order, resumed epochs included.
"""
from __future__ import annotations

import threading

import pytest
import torch

from morphpipe.sampling import SerialBatcher, sample_neighbors
from morphpipe.sampling import serial_batcher as serial_module
from morphpipe.sampling.epochs import batch_seeds, epoch_order, epoch_seed
from tests.conftest import make_graph
from tests.sampling.conftest import FANOUTS

BATCH = 23  # 250 training nodes: 11 batches, no multiple of 2 or 3, so the last turn is short


@pytest.fixture(scope="module")
def graph():
    return make_graph(500)


def one_at_a_time(graph, seed: int, epoch: int) -> list:
    """Each batch of the epoch built alone by `sample_neighbors`, as the batcher built them before turns."""
    order = epoch_order(graph.train_idx, seed, epoch)
    count = -(-graph.train_idx.numel() // BATCH)
    return [sample_neighbors(graph, batch_seeds(order, index, BATCH), FANOUTS,
                             seed=epoch_seed(epoch_seed(seed, epoch), index)) for index in range(count)]


def same(expected: list, got: list) -> bool:
    return all(torch.equal(a.seeds, b.seeds) and torch.equal(a.input_nodes, b.input_nodes)
               and torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
               and all(torch.equal(p.indptr, q.indptr) and torch.equal(p.indices, q.indices)
                       for p, q in zip(a.blocks, b.blocks, strict=True))
               for a, b in zip(expected, got, strict=True))


def test_turns_build_the_batches_built_one_at_a_time(graph) -> None:
    for epoch in (0, 1):
        expected = one_at_a_time(graph, 4, epoch)
        assert len(expected) % 2 and len(expected) % 3
        for threads in (1, 2, 3):
            batcher = SerialBatcher(graph, FANOUTS, BATCH, seed=4, num_threads=threads)
            got = list(batcher.epoch(epoch))
            assert same(expected, got), f"{threads} threads, epoch {epoch}"
            assert [batch.batch_index for batch in got] == list(range(len(expected)))
            resumed = list(batcher.epoch_from(epoch, 4))  # a resumed epoch: its turns start at the first batch left
            assert same(expected[4:], resumed) and resumed[0].batch_index == 4
    assert not same(one_at_a_time(graph, 4, 0), one_at_a_time(graph, 5, 0))  # the comparison can fail
    with pytest.raises(ValueError, match="num_threads"):
        SerialBatcher(graph, FANOUTS, BATCH, num_threads=0)


def test_a_turn_samples_on_its_threads_then_gathers_each_batch_on_the_callers_thread(graph, monkeypatch) -> None:
    """Nothing runs between calls (training has the cores), only the turn's sampled blocks wait, and the gathers
    run on the caller's thread (with its OpenMP threads)."""
    sampled, gathered = [], []
    sample_blocks, gather_features = serial_module.sample_blocks, serial_module.gather_features

    def sample_and_note(*args, **kwargs):
        sampled.append(threading.get_ident())
        return sample_blocks(*args, **kwargs)

    def gather_and_note(*args):
        gathered.append(threading.get_ident())
        return gather_features(*args)

    monkeypatch.setattr(serial_module, "sample_blocks", sample_and_note)
    monkeypatch.setattr(serial_module, "gather_features", gather_and_note)
    batches = SerialBatcher(graph, FANOUTS, BATCH, seed=4, num_threads=3).epoch(0)
    counts = []
    for _ in batches:
        counts.append((len(sampled), len(gathered)))
    assert counts == [(3 * (i // 3 + 1) if i < 9 else 11, i + 1) for i in range(11)]
    assert set(gathered) == {threading.get_ident()}
    assert threading.get_ident() not in sampled
