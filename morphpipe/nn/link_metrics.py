"""Ranking metrics of link prediction against fixed negatives (OGB's conventions), and AUC.

Each positive is ranked among its own K negatives: rank = 1 + (negatives scored higher) + half the
negatives scored equal (the mean of the optimistic and pessimistic ranks, as OGB's ogbl-citation2
evaluator counts ties). MRR is the mean of 1/rank, Hits@K the share of positives ranked <= K. AUC is
the Mann-Whitney statistic over all positive and negative scores, ties counting one half.

With negatives shared by every positive of a split (ogbl-collab), Hits@K is OGB's: the share of
positives scored strictly above the K-th highest negative score (all of them when there are fewer
than K negatives); there is no MRR.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

HITS_AT = (10, 20, 50, 100)
# The metric a split with shared negatives is validated by: OGB's ogbl-collab leaderboard metric.
SHARED_HITS_K = 50


def ranks(positive: torch.Tensor, negatives: torch.Tensor) -> torch.Tensor:
    """float64 [E]: the rank of each positive score among its row of negative scores ([E] vs [E, K]), ties halved."""
    if positive.dim() != 1 or negatives.dim() != 2 or negatives.shape[0] != positive.shape[0]:
        raise ValueError(f"ranks: expected positive scores [E] and negative scores [E, K], got "
                         f"{tuple(positive.shape)} and {tuple(negatives.shape)}")
    above = (negatives > positive[:, None]).sum(dim=1).to(torch.float64)
    tied = (negatives == positive[:, None]).sum(dim=1).to(torch.float64)
    return 1.0 + above + 0.5 * tied


def shared_hits(positive: torch.Tensor, negative: torch.Tensor, k: int) -> float:
    """OGB's Hits@K against negatives shared by all positives ([E] vs [M] scores): the share of positives scored
    above the K-th highest negative (a tie with it is a miss); 1.0 when there are fewer than K negatives."""
    if positive.dim() != 1 or negative.dim() != 1:
        raise ValueError(f"shared_hits: expected positive scores [E] and shared negative scores [M], got "
                         f"{tuple(positive.shape)} and {tuple(negative.shape)}")
    if negative.numel() < k:
        return 1.0
    kth = torch.topk(negative, k).values[-1]
    return float((positive > kth).to(torch.float64).mean())


def auc(positive: torch.Tensor, negative: torch.Tensor) -> float:
    """P(a positive scores above a negative) over all pairs, ties counting 1/2 (average ranks)."""
    positive, negative = positive.reshape(-1).to(torch.float64), negative.reshape(-1).to(torch.float64)
    if positive.numel() == 0 or negative.numel() == 0:
        raise ValueError("auc needs at least one positive and one negative score")
    _, inverse, counts = torch.unique(torch.cat([positive, negative]), return_inverse=True, return_counts=True)
    ends = torch.cumsum(counts, 0).to(torch.float64)
    average_rank = (ends - counts.to(torch.float64) + 1 + ends) / 2
    rank_sum = average_rank[inverse[:positive.numel()]].sum()
    num_pos, num_neg = positive.numel(), negative.numel()
    return float((rank_sum - num_pos * (num_pos + 1) / 2) / (num_pos * num_neg))


@dataclass
class LinkMetrics:
    """MRR, Hits@K and AUC of one split (no MRR against shared negatives: `mrr` None)."""

    mrr: float | None
    hits: dict[int, float] = field(default_factory=dict)
    auc: float = float("nan")

    @classmethod
    def of(cls, positive: torch.Tensor, negatives: torch.Tensor, hits_at: Sequence[int] = HITS_AT) -> "LinkMetrics":
        """The metrics of positive scores [E] against their negatives' scores [E, K]."""
        rank = ranks(positive, negatives)
        return cls(float((1.0 / rank).mean()), {k: float((rank <= k).to(torch.float64).mean()) for k in hits_at},
                   auc(positive, negatives))

    @classmethod
    def of_shared(cls, positive: torch.Tensor, negative: torch.Tensor,
                  hits_at: Sequence[int] = HITS_AT) -> "LinkMetrics":
        """The metrics of positive scores [E] against the scores [M] of negatives they all share (OGB's Hits@K)."""
        return cls(None, {k: shared_hits(positive, negative, k) for k in hits_at}, auc(positive, negative))

    def line(self) -> str:
        hits = ", ".join(f"hits@{k} {value:.4f}" for k, value in self.hits.items())
        return f"{'' if self.mrr is None else f'mrr {self.mrr:.4f}, '}{hits}, auc {self.auc:.4f}"

    def to_dict(self) -> dict[str, object]:
        return {"mrr": self.mrr, "hits": {str(k): v for k, v in self.hits.items()}, "auc": self.auc}
