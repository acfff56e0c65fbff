"""Each epoch and each run seed samples new neighbourhoods; the same (seed, epoch) replays them exactly.

The "each epoch reshuffles" tests elsewhere compare which seeds are batched; these keep the seed
order fixed (`shuffle=False`) so only the sampled neighbourhoods can differ, and compare the
blocks themselves, for the threaded CPU batcher (Route 0) and the on-demand serial batcher.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from morphpipe.sampling import CpuBatcher, SerialBatcher
from morphpipe.sampling.batcher import Batcher
from morphpipe.sampling.epochs import epoch_seed

FANOUTS = [3, 2]


@pytest.fixture(scope="module")
def graph():
    """400 nodes of in-degree 20, so a fanout of 3 has many possible samples per node."""
    rng = np.random.default_rng(0)
    num_nodes, degree = 400, 20
    indices = np.concatenate([np.sort(rng.choice(num_nodes, degree, replace=False)) for _ in range(num_nodes)])
    from types import SimpleNamespace

    return SimpleNamespace(
        indptr=torch.arange(0, num_nodes * degree + 1, degree, dtype=torch.int64),
        indices=torch.from_numpy(indices).to(torch.int32),
        features=torch.randn(num_nodes, 4, generator=torch.Generator().manual_seed(0)),
        labels=torch.zeros(num_nodes, dtype=torch.int64),
        train_idx=torch.arange(0, 64),
        num_nodes=num_nodes,
    )


def neighbourhoods(batcher, epoch: int, first: int = 0) -> list[tuple]:
    """The sampled structure of every batch of `epoch` (from batch `first` on): seeds, input nodes, and each block's
    CSC."""
    out = []
    for batch in batcher.epoch_from(epoch, first):
        out.append((tuple(batch.seeds.tolist()), tuple(batch.input_nodes.tolist()),
                    tuple((tuple(b.indptr.tolist()), tuple(b.indices.tolist())) for b in batch.blocks)))
    return out


def cpu_batcher(graph, seed: int) -> CpuBatcher:
    return CpuBatcher(graph, FANOUTS, batch_size=16, num_threads=2, shuffle=False, seed=seed, pin_memory=False)


def serial_batcher(graph, seed: int) -> SerialBatcher:
    return SerialBatcher(graph, FANOUTS, batch_size=16, shuffle=False, seed=seed)


@pytest.mark.parametrize("make", [cpu_batcher, serial_batcher], ids=["cpu", "serial"])
def test_neighbourhoods_differ_across_epochs_and_seeds_and_repeat_for_the_same_pair(graph, make) -> None:
    with make(graph, 0) as first, make(graph, 0) as twin, make(graph, 1) as other_seed:
        epoch0, epoch1 = neighbourhoods(first, 0), neighbourhoods(first, 1)
        assert [b[0] for b in epoch0] == [b[0] for b in epoch1], "shuffle=False keeps the seed order"
        assert neighbourhoods(twin, 1) == epoch1 and neighbourhoods(first, 0) == epoch0, "same (seed, epoch)"
        seed1 = neighbourhoods(other_seed, 0)
        for name, other in (("epoch 1", epoch1), ("run seed 1", seed1)):
            same = sum(a[2] == b[2] for a, b in zip(epoch0, other))
            assert same == 0, f"{same} of {len(epoch0)} batches sampled the same neighbourhoods in {name}"
        batch_blocks = [b[2] for b in epoch0]
        assert len(set(batch_blocks)) == len(batch_blocks)


@pytest.mark.parametrize("make", [cpu_batcher, serial_batcher], ids=["cpu", "serial"])
def test_an_epoch_from_a_batch_on_is_the_rest_of_the_whole_epoch(graph, make) -> None:
    with make(graph, 0) as batcher:
        whole = neighbourhoods(batcher, 1)
        assert len(whole) == 4
        for first in range(5):
            assert neighbourhoods(batcher, 1, first) == whole[first:], f"from batch {first}"
        with pytest.raises(ValueError, match="first must be an integer >= 0 and <= 4, got -1"):
            batcher.epoch_from(1, -1)
        with pytest.raises(ValueError, match="first must be an integer >= 0 and <= 4, got 5"):
            batcher.epoch_from(1, 5)


def test_the_default_epoch_from_drops_the_batches_before_first(graph) -> None:
    class Replaying(Batcher):  # a batcher that can only replay whole epochs
        def __init__(self, inner):
            self.inner = inner

        def __len__(self):
            return len(self.inner)

        def epoch(self, epoch):
            return self.inner.epoch(epoch)

    with serial_batcher(graph, 3) as inner:
        assert neighbourhoods(Replaying(inner), 2, 3) == neighbourhoods(inner, 2)[3:]


def test_epoch_seed_separates_epochs_and_run_seeds() -> None:
    seeds = {epoch_seed(seed, epoch) for seed in range(4) for epoch in range(50)}
    assert len(seeds) == 200
    assert epoch_seed(3, 7) == epoch_seed(3, 7)
