"""MLP baseline with the block models' interface: it uses only the seeds' own features."""
from __future__ import annotations

from collections.abc import Sequence

import torch.nn.functional as F
from torch import Tensor, nn

from morphpipe.nn.base import check_blocks, check_dropout, check_model_args, layer_dims
from morphpipe.ops.bias_act_dropout import bias_act_dropout
from morphpipe.ops.step_variant import current_step_variant
from morphpipe.sampling.minibatch import Block


class MLP(nn.Module):
    """`num_layers` Linear layers with ReLU + dropout between them (fused with the bias), on `x[:blocks[-1].num_dst]`."""

    reads_neighbours = False  # layer-wise inference needs no neighbour rows

    def __init__(self, in_dim: int, num_classes: int, num_layers: int = 3, hidden: int = 256, dropout: float = 0.5) -> None:
        super().__init__()
        check_model_args(in_dim, num_classes, num_layers, hidden)
        self.lins = nn.ModuleList(nn.Linear(i, o) for i, o in layer_dims(in_dim, hidden, num_classes, num_layers))
        self.dropout = check_dropout(dropout)

    @property
    def num_layers(self) -> int:
        return len(self.lins)

    def reset_parameters(self) -> None:
        """Re-initialise every layer."""
        for lin in self.lins:
            lin.reset_parameters()

    def forward(self, blocks: Sequence[Block], x: Tensor) -> Tensor:
        """Logits `[blocks[-1].num_dst, num_classes]`: the seeds are the prefix of the input nodes.

        Any number of blocks is accepted (the MLP has no hops); with none, `x` is the seeds' features.
        """
        check_blocks(type(self).__name__, blocks, x, None)
        h = x[: blocks[-1].num_dst] if blocks else x
        for i in range(self.num_layers):
            h = self.layer(i, None, h)
        return h

    def layer(self, i: int, block: Block | None, h_src: Tensor) -> Tensor:
        """Layer `i` on the destinations' own rows (`h_src[:block.num_dst]`, all rows without a block),
        with ReLU + dropout after every layer but the last (the per-layer entry point, as `BlockModel.layer`)."""
        lin = self.lins[i]
        h = h_src if block is None else h_src[: block.num_dst]
        if i == self.num_layers - 1:
            return lin(h)
        if current_step_variant().fused_activation:
            return bias_act_dropout(F.linear(h, lin.weight), lin.bias, "relu", self.dropout, self.training)
        return F.dropout(F.relu(lin(h)), p=self.dropout, training=self.training)
