"""Route 1's torch path draws uniform subsets: every neighbour, and every pair of neighbours, as often as a uniform
draw of `fanout` of `degree` would, for the Floyd path (small fanouts) and the random-key path (large ones).

The torch path is the reference the CUDA kernels' self-check compares with, so it is checked here against the
definition alone, with far more draws than the self-check makes: 2,000 destinations that share one neighbour
list, sampled in one hop, ten times (four on the slower random-key path).
"""
from __future__ import annotations

import pytest
import torch
from scipy import stats

from morphpipe.sampling import torch_sampler

DESTINATIONS = 2_000
P_FLOOR = 1e-4


def shared_list_graph(degree: int) -> torch_sampler.GraphTensors:
    """Destinations 0..DESTINATIONS-1, each with the in-neighbours DESTINATIONS..DESTINATIONS+degree-1 (sorted)."""
    num_nodes = DESTINATIONS + degree
    indptr = torch.zeros(num_nodes + 1, dtype=torch.int64)
    indptr[1:DESTINATIONS + 1] = torch.arange(1, DESTINATIONS + 1) * degree
    indptr[DESTINATIONS + 1:] = DESTINATIONS * degree
    indices = (torch.arange(degree) + DESTINATIONS).repeat(DESTINATIONS)
    return torch_sampler.GraphTensors(indptr, indices, torch.zeros(num_nodes, 1), torch.zeros(num_nodes,
                                                                                                dtype=torch.int64))


def drawn_positions(degree: int, fanout: int, rounds: int = 10) -> torch.Tensor:
    """bool [rounds * DESTINATIONS, degree]: which positions of the shared list each destination drew."""
    graph = shared_list_graph(degree)
    seeds = torch.arange(DESTINATIONS)
    drawn = []
    for seed in range(rounds):
        indptr, neighbours = torch_sampler.sample_hop(graph, seeds, fanout, torch_sampler.seeded_generator(
            torch.device("cpu"), 100 + seed))
        assert torch.equal(indptr, torch.arange(DESTINATIONS + 1) * fanout)
        rows = torch.zeros(DESTINATIONS, degree, dtype=torch.bool)
        rows[torch.arange(DESTINATIONS).repeat_interleave(fanout), neighbours - DESTINATIONS] = True
        assert bool((rows.sum(dim=1) == fanout).all()), "a destination drew a neighbour twice"
        drawn.append(rows)
    return torch.cat(drawn)


@pytest.mark.parametrize("degree, fanout, rounds", [(20, 5, 10), (12, 11, 10), (50, 36, 4)])
def test_every_neighbour_and_every_pair_is_drawn_uniformly(degree, fanout, rounds):
    assert (fanout <= torch_sampler.FLOYD_MAX_FANOUT) == (fanout < 36), "both paths are covered"
    drawn = drawn_positions(degree, fanout, rounds).to(torch.float64)
    trials = drawn.shape[0]
    singles = drawn.sum(dim=0)
    assert stats.chisquare(singles.numpy()).pvalue > P_FLOOR, singles.tolist()
    # Each pair (i, j) is drawn together with probability f (f - 1) / (d (d - 1)); compare with a binomial's spread.
    pairs = (drawn.T @ drawn)[torch.triu_indices(degree, degree, 1).unbind()]
    p_pair = fanout * (fanout - 1) / (degree * (degree - 1))
    z = (pairs - trials * p_pair) / (trials * p_pair * (1 - p_pair)) ** 0.5
    worst = float(z.abs().max())
    assert 2 * stats.norm.sf(worst) * z.numel() > P_FLOOR, f"a pair is drawn {worst:.1f} sd off its share"
