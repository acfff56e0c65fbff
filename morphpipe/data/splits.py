"""Train/val/test splits: random splits for a seed, and split arrays or masks turned into id arrays."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from morphpipe.data.validation import GraphValidationError
from morphpipe.numeric import check_float


@dataclass(frozen=True)
class SplitFractions:
    """Shares of the labelled nodes in train, val and test; the rest stay in no split."""

    train: float = 0.6
    val: float = 0.2
    test: float = 0.2

    def __post_init__(self) -> None:
        values = (self.train, self.val, self.test)
        for name, value in zip(("train", "val", "test"), values):
            check_float(f"split fraction {name}", value, 0, 1)
        if min(values) < 0 or self.train <= 0 or sum(values) > 1 + 1e-9:
            raise ValueError(f"split fractions {values} must be >= 0 with train > 0 and a sum <= 1, e.g. 0.6,0.2,0.2")

    @classmethod
    def parse(cls, text: str) -> "SplitFractions":
        """'0.6,0.2,0.2' -> SplitFractions(0.6, 0.2, 0.2)."""
        try:
            train, val, test = (float(part) for part in text.split(","))
        except ValueError as error:
            raise ValueError(f"split fractions: expected three comma-separated numbers such as 0.6,0.2,0.2, "
                             f"got {text!r}") from error
        return cls(train, val, test)

    def as_tuple(self) -> tuple[float, float, float]:
        return (self.train, self.val, self.test)


def random_split(candidates: np.ndarray, fractions: SplitFractions, seed: int) -> tuple[np.ndarray, ...]:
    """Disjoint random (train, val, test) int64 id arrays drawn from `candidates`, each sorted."""
    order = np.random.default_rng(np.random.SeedSequence([seed, 0x5EED])).permutation(np.asarray(candidates))
    total = order.size
    num_train = max(1, int(round(fractions.train * total))) if total else 0
    num_val = min(int(round(fractions.val * total)), total - num_train)
    num_test = min(int(round(fractions.test * total)), total - num_train - num_val)
    bounds = np.cumsum([0, num_train, num_val, num_test])
    return tuple(np.sort(order[bounds[i]:bounds[i + 1]]).astype(np.int64) for i in range(3))


def as_split_ids(values, num_nodes: int, field: str) -> np.ndarray:
    """int64 node ids from an id array or a boolean mask of length num_nodes."""
    array = values.detach().cpu().numpy() if isinstance(values, torch.Tensor) else np.asarray(values)
    if array.dtype == bool:
        if array.shape != (num_nodes,):
            raise GraphValidationError(field, f"is a boolean mask of shape {array.shape}, expected ({num_nodes},)",
                                       "pass a mask with one entry per node, or an array of node ids")
        return np.flatnonzero(array).astype(np.int64)
    array = array.reshape(-1)
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise GraphValidationError(field, f"has dtype {array.dtype}, expected integer node ids or a boolean mask",
                                   "pass node ids as integers")
    return array.astype(np.int64)
