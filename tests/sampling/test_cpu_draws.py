"""The CPU sampler's draws, written out: xoshiro256** seeded by splitmix64, Lemire's unbiased bounded draw, and
Floyd's algorithm per destination in order. Pins the unrolled Floyd of every small fanout (csrc/cpu/choose_offsets.h)
to the general one, and every pick to the stream a saved run replays."""
from __future__ import annotations

import pytest
import torch

from morphpipe import native
from tests.reference_random import Xoshiro256, splitmix64


def floyd(degree: int, count: int, rng: Xoshiro256) -> list[int]:
    chosen: list[int] = []
    for upper in range(degree - count, degree):
        draw = rng.below(upper + 1)
        chosen.append(upper if draw in chosen else draw)
    return chosen


def star_graph(degrees: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Destination i (of len(degrees)) has degrees[i] in-neighbours, all distinct nodes numbered after the
    destinations, so a neighbour's id says which list and which offset it came from."""
    num_dst, num_edges = len(degrees), sum(degrees)
    ends = torch.tensor(degrees).cumsum(0).tolist()
    indptr = torch.tensor([0, *ends, *[num_edges] * num_edges], dtype=torch.int64)  # the neighbours have none
    indices = torch.arange(num_dst, num_dst + num_edges, dtype=torch.int64)
    return indptr, indices


# Each count up to 16 has its own unrolled Floyd; 17 and 64 take the general loop; the lists of degree 3 and 17
# take every neighbour at small counts, without a draw, between the ones that draw.
@pytest.mark.parametrize("fanout", [*range(1, 18), 64])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=["int32", "int64"])
def test_every_pick_is_floyds_draw_from_the_seeded_stream(fanout: int, index_dtype: torch.dtype) -> None:
    degrees = [40, 3, 1000, 17, 65, 200]
    indptr, indices = star_graph(degrees)
    num_dst = len(degrees)
    seeds = torch.arange(num_dst)
    for seed in (0, 11, 2**40 + 3):
        nodes, _, blocks = native.ops().sample_neighbors(indptr, indices.to(index_dtype), seeds, [fanout], seed)
        picked = nodes[blocks[0]]  # each edge's neighbour, as a global id, in destination then pick order
        rng = Xoshiro256(splitmix64(seed))
        expected = []
        for dst, degree in enumerate(degrees):
            offsets = range(degree) if degree <= fanout else floyd(degree, fanout, rng)
            expected += [int(indices[indptr[dst] + offset]) for offset in offsets]
        assert picked.tolist() == expected, f"fanout {fanout}, seed {seed}"
