"""Link prediction as a `Task`: training edges as the epoch's units, edge batches with negatives, BCE or BPR over
pair scores, and MRR against the stored negatives as the metric (OGB's Hits@50 when the split's negatives are pairs
shared by all its positives, ogbl-collab style).

Edge ids are one id space over the graph's edge split: training edges 0..E_train-1 (the units an
epoch visits, split between routes and ranks), then the validation edges, then the test edges, so a
set of ids names its split. Evaluation embeds every node the split's pairs touch once (exactly by
layer-wise inference, or by sampled mini-batches), then scores positives and their stored negatives
(per positive, or the split's shared negative pairs) in chunks.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.nn import functional

from morphpipe.data import GraphStore
from morphpipe.nn.layerwise import layerwise_inference
from morphpipe.nn.link_metrics import SHARED_HITS_K, LinkMetrics
from morphpipe.nn.link_model import DECODERS, LinkModel, build_link_model
from morphpipe.nn.task import (SPLITS, EvalSettings, Task, TaskLoss, cast_features, check_eval_mode, check_split,
                               register_task)
from morphpipe.ops.community import GraphBlock
from morphpipe.sampling.batcher import Batcher
from morphpipe.sampling.cpu_batcher import CpuBatcher
from morphpipe.sampling.edge_batcher import EdgeBatcher, GpuEdgeBatcher, NegativeSampling, SerialEdgeBatcher
from morphpipe.sampling.minibatch import MiniBatch

LOSSES = ("bce", "bpr")
DEFAULT_EMBEDDING_DIM = 128
# Pair scores computed at once in evaluation: rows x (1 + K) x embedding width stays near this many values.
SCORE_CHUNK_VALUES = 1 << 24


def scores_and_targets(positive: torch.Tensor, negative: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The positives' [B] and negatives' [B, k] scores as one list [B * (1 + k)], positives first, and their BCE
    targets (1 for a positive, 0 for a negative)."""
    scores = torch.cat([positive, negative.reshape(-1)])
    targets = torch.zeros_like(scores)
    targets[:positive.numel()] = 1
    return scores, targets


def pair_loss(name: str, positive: torch.Tensor, negative: torch.Tensor,
              scored: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """BCE over positives (target 1) and negatives (target 0), or BPR: -log sigmoid(positive - negative) per
    (positive, its negative) pair, averaged. `scored`: `scores_and_targets(positive, negative)` if made already."""
    if name == "bce":
        return functional.binary_cross_entropy_with_logits(*(scored or scores_and_targets(positive, negative)))
    if name == "bpr":
        return -functional.logsigmoid(positive[:, None] - negative).mean()
    raise ValueError(f"loss must be one of {LOSSES}, got {name!r}")


def split_of_edges(graph: GraphStore, edge_ids: torch.Tensor) -> tuple[str, torch.Tensor]:
    """(split, positions in that split's pairs) of edge ids that all name one split of the graph's edge split."""
    split = graph.require_edge_split()
    start = 0
    for name in SPLITS:
        count = split.pairs(name).shape[1]
        inside = (edge_ids >= start) & (edge_ids < start + count)
        if edge_ids.numel() and bool(inside.all()):
            return name, edge_ids - start
        if bool(inside.any()):
            raise ValueError(f"edge ids mix the {name} split with others; evaluate one split at a time")
        start += count
    raise ValueError(f"edge ids must name edges of one split in [0, {start}) (train, then val, then test), got "
                     f"{edge_ids.numel()} ids from {int(edge_ids.min()) if edge_ids.numel() else None}")


@register_task
class LinkPrediction(Task):
    """Predicts whether an edge joins two nodes: a GNN encoder embeds the endpoints, a decoder ("dot" or "mlp")
    scores pairs; trained on edge batches with `negatives` corrupted destinations per positive ("uniform" or
    in-degree^0.75 "degree" corruption) with `loss` "bce" or "bpr"; `exclude` keeps each batch's own positives
    out of its message passing. The metric is validation MRR against the stored negatives, or OGB's Hits@50 when
    they are pairs shared by the split's positives (`metric` is set by `check_graph`)."""

    name = "link"
    metric = "mrr"

    def __init__(self, negatives: int = 1, *, negative_kind: str = "uniform", decoder: str = "dot",
                 loss: str = "bce", exclude: bool = True, embedding_dim: int | None = None) -> None:
        self.sampling = NegativeSampling(negatives, negative_kind)
        if decoder not in DECODERS:
            raise ValueError(f"decoder must be one of {DECODERS}, got {decoder!r}")
        if loss not in LOSSES:
            raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")
        if loss == "bpr" and negatives < 1:
            raise ValueError("loss 'bpr' ranks each positive above its negatives: use negatives >= 1")
        self.decoder = decoder
        self.loss_name = loss
        self.exclude = bool(exclude)
        self.embedding_dim = embedding_dim

    def check_graph(self, graph: GraphStore) -> None:
        self.metric = headline_metric(graph.require_edge_split(self.name).shared_negatives)

    def seeds(self, graph: GraphStore, split: str = "train") -> torch.Tensor:
        edges = graph.require_edge_split(self.name)
        start = sum(edges.pairs(name).shape[1] for name in SPLITS[:SPLITS.index(check_split(split))])
        return torch.arange(start, start + edges.pairs(split).shape[1], dtype=torch.int64)

    def batcher(self, graph: GraphStore, fanouts: Sequence[int], batch_size: int, *, route: int = 0,
                seeds: torch.Tensor | None = None, seed: int = 0, shuffle: bool = True, serial: bool = False,
                num_threads: int | None = None, pin_memory: bool | None = None,
                device: torch.device | str | None = None) -> Batcher:
        if route == 1:
            return GpuEdgeBatcher(graph, fanouts, batch_size, negatives=self.sampling, exclude=self.exclude,
                                  edge_ids=seeds, shuffle=shuffle, seed=seed, device=device)
        if serial:
            return SerialEdgeBatcher(graph, fanouts, batch_size, negatives=self.sampling, exclude=self.exclude,
                                     num_threads=num_threads or 1, edge_ids=seeds, shuffle=shuffle, seed=seed)
        return EdgeBatcher(graph, fanouts, batch_size, negatives=self.sampling, exclude=self.exclude,
                           num_threads=num_threads, edge_ids=seeds, shuffle=shuffle, seed=seed, pin_memory=pin_memory)

    def embedding_size(self, hidden: int | None) -> int:
        """Width of the node embeddings: `embedding_dim`, else the hidden width, else DEFAULT_EMBEDDING_DIM."""
        return self.embedding_dim or hidden or DEFAULT_EMBEDDING_DIM

    def build_model(self, name: str, graph: GraphStore, *, num_layers: int, hidden: int | None = None,
                    **options: Any) -> nn.Module:
        return build_link_model(name, graph.feature_dim, self.embedding_size(hidden), decoder=self.decoder,
                                num_layers=num_layers, hidden=hidden, **options)

    def loss(self, model: nn.Module, batch: MiniBatch, dtype: torch.dtype) -> TaskLoss:
        if batch.pairs is None:
            raise ValueError("the link task trains on edge batches (MiniBatch.pairs), got a node batch")
        pairs = batch.pairs
        positive, negative = model(batch.blocks, cast_features(batch.x, dtype), pairs)
        scores, targets = scores_and_targets(positive, negative)  # the BCE's input, and the guard's outputs
        units = torch.cat([pairs.edge_ids, pairs.edge_ids.repeat_interleave(pairs.negative_dst.shape[1])])
        return TaskLoss(pair_loss(self.loss_name, positive, negative, (scores, targets)), scores.detach(), targets,
                        torch.ones((), dtype=torch.bool, device=positive.device), output_units=units)

    def evaluate(self, model: nn.Module, graph: GraphStore, seeds: torch.Tensor, settings: EvalSettings, *,
                 device: torch.device, graph_block: Callable[[], GraphBlock] | None = None) -> float:
        metrics = self.metrics(model, graph, seeds, settings, device=device, graph_block=graph_block)
        return metrics.mrr if metrics.mrr is not None else metrics.hits[SHARED_HITS_K]

    @torch.no_grad()
    def metrics(self, model: nn.Module, graph: GraphStore, seeds: torch.Tensor, settings: EvalSettings, *,
                device: torch.device, graph_block: Callable[[], GraphBlock] | None = None) -> LinkMetrics:
        """MRR, Hits@K and AUC of the held-out edges `seeds` (ids of one split: `seeds(graph, "val")`); against
        negatives shared by the split's positives, OGB's Hits@K and AUC."""
        split, rows = split_of_edges(graph, seeds)
        edges = graph.require_edge_split(self.name)
        positives, negatives = edges.pairs(split)[:, rows], edges.negatives(split)
        if not edges.shared_negatives:
            negatives = negatives[rows]
        nodes = torch.unique(torch.cat([positives.reshape(-1), negatives.reshape(-1)]))
        was_training = model.training
        model.eval()
        try:
            h = node_embeddings(model, graph, nodes, settings, device=device, graph_block=graph_block).to(device)
            position = lambda ids: torch.searchsorted(nodes, ids).to(device)  # noqa: E731 (nodes are sorted)
            positive_scores = pair_scores(model, h, position, positives[0], positives[1])
            if edges.shared_negatives:
                return LinkMetrics.of_shared(positive_scores, pair_scores(model, h, position, negatives[0],
                                                                          negatives[1]))
            negative_scores = pair_scores(model, h, position, positives[0], negatives)
        finally:
            model.train(was_training)
        return LinkMetrics.of(positive_scores, negative_scores)

    def meta(self) -> dict[str, Any]:
        return {"task": self.name, "negatives": self.sampling.k, "negative_kind": self.sampling.kind,
                "decoder": self.decoder, "loss": self.loss_name, "exclude": self.exclude}


def headline_metric(shared_negatives: bool) -> str:
    """The validation metric of an edge split: MRR against per-positive negatives, Hits@50 against shared ones."""
    return f"hits@{SHARED_HITS_K}" if shared_negatives else "mrr"


def pair_scores(model: LinkModel, h: torch.Tensor, position: Callable[[torch.Tensor], torch.Tensor],
                src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    """float32 CPU scores of the pairs (src[i], dst[i]) for dst [E], or of each src[i] with every dst[i, :] for
    dst [E, K]; `h` holds the embeddings of the nodes `position` maps to; scored in chunks of about
    SCORE_CHUNK_VALUES values."""
    per_source = 1 if dst.dim() == 1 else dst.shape[1]
    chunk = max(1, SCORE_CHUNK_VALUES // (per_source * max(h.shape[1], 1)))
    scores = []
    for start in range(0, src.numel(), chunk):
        h_src = h[position(src[start:start + chunk])]
        scores.append(model.score(h_src if dst.dim() == 1 else h_src[:, None, :],
                                  h[position(dst[start:start + chunk])]).float().cpu())
    return torch.cat(scores) if scores else torch.zeros(tuple(dst.shape), dtype=torch.float32)


def node_embeddings(model: LinkModel, graph: GraphStore, nodes: torch.Tensor, settings: EvalSettings, *,
                    device: torch.device, graph_block: Callable[[], GraphBlock] | None = None) -> torch.Tensor:
    """Embeddings [len(nodes), dim] of `model`'s encoder: exact (layer-wise, settings.mode "full") or over sampled
    neighbourhoods with the settings' fanouts, batch size and seed."""
    if check_eval_mode(settings.mode) == "full":
        block = graph_block() if graph_block is not None else GraphBlock.of(graph.indptr, graph.indices)
        return layerwise_inference(model.encoder, graph, nodes, device=device, graph_block=block,
                                   progress=settings.progress, log=settings.log)
    dtype = next(model.parameters()).dtype
    rows = []
    with CpuBatcher(graph, settings.fanouts, settings.batch_size, seeds=nodes, shuffle=False, seed=settings.seed,
                    pin_memory=device.type == "cuda") as batcher:
        for batch in batcher:
            batch = batch.to(device, non_blocking=True)
            rows.append(model(batch.blocks, cast_features(batch.x, dtype)).cpu())
    return torch.cat(rows)
