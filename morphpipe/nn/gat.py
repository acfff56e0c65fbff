"""GAT (Velickovic et al., 2018): multi-head attention over each block's in-edges plus self loops."""
from __future__ import annotations

import torch
from torch import Tensor, nn

from morphpipe.nn.base import BlockModel, check_model_args, check_positive_int
from morphpipe.ops import gat_attention
from morphpipe.sampling.minibatch import Block


class GATConv(nn.Module):
    """Multi-head graph attention; same as PyG `GATConv` (shared `lin`, `att_src`, `att_dst`, `bias`).

    Per head: `z = W h`, edge `j -> i` scores `leaky_relu(a_src . z_j + a_dst . z_i)`, softmax
    over the in-edges of `i` plus its self loop (prefix convention), output the weighted sum of
    `z_j`; heads are concatenated (`concat=True`) or averaged, then the bias is added.
    Differences from PyG: no attention dropout, and a self edge stored in the block is kept
    as an extra edge (PyG removes stored self loops before adding its own).
    """

    def __init__(
        self, in_features: int, out_features: int, heads: int = 1, concat: bool = True, negative_slope: float = 0.2
    ) -> None:
        super().__init__()
        self.in_features = check_positive_int("in_features", in_features)
        self.out_features = check_positive_int("out_features", out_features)
        self.heads = check_positive_int("heads", heads)
        self.concat = concat
        self.negative_slope = negative_slope
        self.lin = nn.Linear(in_features, heads * out_features, bias=False)
        self.att_src = nn.Parameter(torch.empty(1, heads, out_features))
        self.att_dst = nn.Parameter(torch.empty(1, heads, out_features))
        self.bias = nn.Parameter(torch.empty(heads * out_features if concat else out_features))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Glorot weights and attention vectors, zero bias, as PyG's GATConv."""
        nn.init.xavier_uniform_(self.lin.weight)
        nn.init.xavier_uniform_(self.att_src)
        nn.init.xavier_uniform_(self.att_dst)
        nn.init.zeros_(self.bias)

    def forward(self, block: Block, h_src: Tensor) -> Tensor:
        """`[num_src, in] -> [num_dst, heads * out]` when concatenating, `[num_dst, out]` when averaging."""
        z = self.lin(h_src).view(-1, self.heads, self.out_features)
        score_src = (z * self.att_src).sum(-1)
        score_dst = (z[: block.num_dst] * self.att_dst).sum(-1)
        out = gat_attention(block, z, score_src, score_dst, self.negative_slope, add_self_loops=True)
        out = out.flatten(1) if self.concat else out.mean(1)
        return out + self.bias


class GAT(BlockModel):
    """GAT: hidden layers of `heads` x `hidden` concatenated, last layer `heads` x num_classes averaged."""

    def __init__(
        self, in_dim: int, num_classes: int, num_layers: int = 3, hidden: int = 64, heads: int = 4, dropout: float = 0.5
    ) -> None:
        check_model_args(in_dim, num_classes, num_layers, hidden)
        check_positive_int("heads", heads)
        convs = [GATConv(in_dim if i == 0 else hidden * heads, hidden, heads) for i in range(num_layers - 1)]
        convs.append(GATConv(in_dim if num_layers == 1 else hidden * heads, num_classes, heads, concat=False))
        super().__init__(convs, dropout)
