"""Link metrics against hand-computed MRR, Hits@K and AUC, ties included."""
from __future__ import annotations

import pytest
import torch

from morphpipe.nn.link_metrics import LinkMetrics, auc, ranks, shared_hits


def test_ranks_count_ties_as_half():
    positive = torch.tensor([0.9, 0.5, 0.2])
    negatives = torch.tensor([[0.1, 0.2, 0.3],     # above all: rank 1
                              [0.5, 0.7, 0.1],     # one above, one tie: 1 + 1 + 0.5 = 2.5
                              [0.2, 0.2, 0.2]])    # three ties: 1 + 1.5 = 2.5
    assert ranks(positive, negatives).tolist() == [1.0, 2.5, 2.5]


def test_mrr_and_hits_by_hand():
    positive = torch.tensor([3.0, 1.0, 0.0, 2.0])
    negatives = torch.tensor([[0.0, 1.0], [2.0, 1.0], [5.0, 6.0], [2.0, 3.0]])
    # ranks: 1, 1 + 1 + 0.5 = 2.5, 3, 1 + 1 + 0.5 = 2.5
    metrics = LinkMetrics.of(positive, negatives, hits_at=(1, 2, 3))
    assert metrics.mrr == pytest.approx((1 + 1 / 2.5 + 1 / 3 + 1 / 2.5) / 4)
    assert metrics.hits == {1: 0.25, 2: 0.25, 3: 1.0}


def test_auc_by_hand_with_ties():
    # pairs (p, n): 0.8 beats 0.1, 0.5 and ties 0.8 (2.5 of 3); 0.5 beats 0.1, ties 0.5, loses to 0.8 (1.5 of 3)
    assert auc(torch.tensor([0.8, 0.5]), torch.tensor([0.1, 0.5, 0.8])) == pytest.approx(4 / 6)
    assert auc(torch.tensor([1.0, 1.0]), torch.tensor([1.0])) == pytest.approx(0.5)
    assert auc(torch.tensor([2.0]), torch.tensor([1.0, 0.0])) == 1.0


def test_auc_matches_pairwise_count_on_random_scores():
    generator = torch.Generator().manual_seed(0)
    positive = torch.randint(0, 5, (40,), generator=generator).float()
    negative = torch.randint(0, 5, (60,), generator=generator).float()
    pairwise = ((positive[:, None] > negative[None]).double() + 0.5 * (positive[:, None] == negative[None]).double())
    assert auc(positive, negative) == pytest.approx(float(pairwise.mean()))


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="negative scores \\[E, K\\]"):
        ranks(torch.zeros(3), torch.zeros(2, 4))


def test_shared_hits_follow_ogb_by_hand_with_ties():
    # OGB (ogbl-collab): a positive hits@K when scored strictly above the K-th highest of the shared negatives
    negatives = torch.tensor([0.1, 0.9, 0.5, 0.5, 0.3])          # sorted: 0.9, 0.5, 0.5, 0.3, 0.1
    positive = torch.tensor([1.0, 0.5, 0.6, 0.3, 0.2, 0.0])
    # K=1: K-th 0.9 -> only 1.0 above: 1/6; K=2 and K=3: K-th 0.5 -> 1.0 and 0.6 (0.5 ties: a miss): 2/6;
    # K=4: K-th 0.3 -> 1.0, 0.5, 0.6 (0.3 ties): 3/6; K=5: K-th 0.1 -> all but 0.0: 5/6; K=6 > 5 negatives: 1
    expected = {1: 1 / 6, 2: 2 / 6, 3: 2 / 6, 4: 3 / 6, 5: 5 / 6, 6: 1.0}
    assert {k: shared_hits(positive, negatives, k) for k in expected} == pytest.approx(expected)
    metrics = LinkMetrics.of_shared(positive, negatives, hits_at=(2, 5))
    assert metrics.mrr is None and metrics.hits == pytest.approx({2: 2 / 6, 5: 5 / 6})
    # AUC over all (positive, negative) pairs, ties 1/2: wins per positive 5, 2 + 1 (two 0.5 ties), 4, 1.5, 1, 0
    assert metrics.auc == pytest.approx((5 + 3 + 4 + 1.5 + 1 + 0) / 30)
    assert metrics.line() == f"hits@2 {2 / 6:.4f}, hits@5 {5 / 6:.4f}, auc {metrics.auc:.4f}"
    assert metrics.to_dict()["mrr"] is None


def test_shared_hits_refuse_per_positive_shapes():
    with pytest.raises(ValueError, match="shared negative scores \\[M\\]"):
        shared_hits(torch.zeros(3), torch.zeros(3, 4), 2)
