"""Helpers shared by the ops tests: hand-made blocks with edge cases, seeded features, the kernel choices to force."""
from __future__ import annotations

import itertools

import torch

from morphpipe.sampling.minibatch import Block

F64 = torch.float64

# destination 0: no in-edges; 1: source 2 twice (duplicate edge); 2: isolated; 3: two sources; 4: a self edge.
EDGE_CASES = [[], [2, 2, 4], [], [0, 5], [4, 1]]
NUM_SRC = 7

SUM_CHOICES = [
    {"aggregate.kernel": kernel, "aggregate.order": order, "aggregate.backward": backward}
    for kernel, order, backward in itertools.product(("rowwise", "dense"), ("natural", "degree_sorted"),
                                                     ("transpose", "scatter"))
]
GAT_CHOICES = [
    {"aggregate.order": order, "gat.backward": backward}
    for order, backward in itertools.product(("natural", "degree_sorted"), ("transpose", "scatter"))
]


def make_block(neighbours: list[list[int]], num_src: int) -> Block:
    """A Block whose destination `i` has in-neighbours `neighbours[i]` (local source ids, in order)."""
    indptr = torch.tensor([0] + [len(n) for n in neighbours]).cumsum(0)
    indices = torch.tensor([j for n in neighbours for j in n], dtype=torch.int64)
    return Block(indptr, indices, num_src, len(neighbours))


def features(seed: int, *shape: int, dtype: torch.dtype = F64) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def tie_free(rows: int, cols: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """float64 values exactly representable in `dtype`, non-zero and distinct within each column.

    At exact ties the fused max routes the gradient to the first edge attaining it, the reference
    splits it evenly (and, at a max of exactly 0, also with its zero initial value); both are
    subgradients, so the comparison avoids ties and zeros. The values are spread evenly over the
    binades of [2^-16, 1] and both signs: bfloat16 has 4,098 distinct ones there (a grid over
    [-1, 1] gave it only 2,695, fewer than a sampled block's sources).
    """
    magnitudes = torch.logspace(-16, 0, 400_001, base=2, dtype=F64).to(dtype).unique().to(F64)
    candidates = torch.cat([-magnitudes, magnitudes])
    if rows > candidates.numel():
        raise ValueError(f"{dtype} has only {candidates.numel()} distinct values in +-[2^-16, 1], fewer than "
                         f"rows={rows}")
    generator = torch.Generator().manual_seed(seed)
    keys = torch.rand(cols, candidates.numel(), generator=generator)
    return candidates[keys.argsort(dim=1)[:, :rows]].t().contiguous()
