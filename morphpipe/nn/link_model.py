"""Link prediction models: a GNN encoder (any `nn.factory` model) that embeds nodes, and a decoder that scores pairs.

`LinkModel(blocks, x)` returns the embeddings of the last block's destinations (the batch's
endpoints), so it runs wherever a node model runs (profiler, layer-wise inference through
`encoder`); `LinkModel(blocks, x, pairs)` also scores the batch's positives and negatives in the same
forward (so a DistributedDataParallel wrapper sees the decoder's parameters used in its forward);
`score(h_src, h_dst)` turns pairs of embeddings into logits; in training the decoder scores pairs by index
into the embeddings (`score_indexed`), which the dot decoder does without gathering rows.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from morphpipe.nn.factory import build_model
from morphpipe.ops.pair_score import pair_dot
from morphpipe.sampling.minibatch import Block, EdgePairs

DECODERS = ("dot", "mlp")


class DotDecoder(nn.Module):
    """score(u, v) = <h_u, h_v>."""

    def forward(self, h_src: Tensor, h_dst: Tensor) -> Tensor:
        return (h_src * h_dst).sum(dim=-1)

    def score_indexed(self, h: Tensor, src: Tensor, dst: Tensor) -> Tensor:
        """Logits of the pairs (h[src[i]], h[dst[i]]) by the fused pair scorer: no gathered [pairs, dim] rows."""
        return pair_dot(h, src, dst)


class MLPDecoder(nn.Module):
    """score(u, v) = MLP(h_u * h_v): one hidden ReLU layer over the element-wise product (symmetric in u, v)."""

    def __init__(self, dim: int, hidden: int | None = None) -> None:
        super().__init__()
        hidden = hidden or dim
        self.hidden = nn.Linear(dim, hidden)
        self.out = nn.Linear(hidden, 1)

    def forward(self, h_src: Tensor, h_dst: Tensor) -> Tensor:
        return self.out(torch.relu(self.hidden(h_src * h_dst))).squeeze(-1)

    def score_indexed(self, h: Tensor, src: Tensor, dst: Tensor) -> Tensor:
        """Logits of the pairs (h[src[i]], h[dst[i]])."""
        return self(h[src], h[dst])


def make_decoder(name: str, dim: int) -> nn.Module:
    """The decoder named `name` ("dot" or "mlp") over `dim`-wide embeddings."""
    if name not in DECODERS:
        raise ValueError(f"decoder must be one of {DECODERS}, got {name!r}")
    return DotDecoder() if name == "dot" else MLPDecoder(dim)


class LinkModel(nn.Module):
    """An encoder (node embeddings from blocks) and a decoder (pair scores)."""

    def __init__(self, encoder: nn.Module, decoder: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder

    def forward(self, blocks: Sequence[Block], x: Tensor,
                pairs: EdgePairs | None = None) -> Tensor | tuple[Tensor, Tensor]:
        """Embeddings [blocks[-1].num_dst, dim] of the batch's endpoints; with `pairs`, the logits of its positives
        [B] and of their negatives [B, k] instead."""
        h = self.encoder(blocks, x)
        return h if pairs is None else self.score_pairs(h, pairs)

    def score_pairs(self, h: Tensor, pairs: EdgePairs) -> tuple[Tensor, Tensor]:
        """Logits of a batch's positives [B] and of their negatives [B, k] from its endpoints' embeddings h."""
        # One pair list (positives, then each positive's negatives in turn): one scoring pass and one backward.
        count, k = pairs.negative_dst.shape
        src = torch.cat([pairs.src, pairs.src.repeat_interleave(k)])
        scores = self.decoder.score_indexed(h, src, torch.cat([pairs.dst, pairs.negative_dst.reshape(-1)]))
        return scores[:count], scores[count:].view(count, k)

    def score(self, h_src: Tensor, h_dst: Tensor) -> Tensor:
        """Logits of the pairs (h_src[i], h_dst[i]); broadcasts over leading dimensions."""
        return self.decoder(h_src, h_dst)


def build_link_model(name: str, in_dim: int, embedding_dim: int, *, decoder: str = "dot", num_layers: int = 3,
                     hidden: int | None = None, heads: int | None = None, dropout: float = 0.5) -> LinkModel:
    """Encoder `name` (`nn.factory.MODELS`) with `embedding_dim` outputs, and decoder `decoder`."""
    encoder = build_model(name, in_dim, embedding_dim, num_layers=num_layers, hidden=hidden, heads=heads,
                          dropout=dropout)
    return LinkModel(encoder, make_decoder(decoder, embedding_dim))
