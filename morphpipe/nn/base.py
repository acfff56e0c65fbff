"""What every block model shares: argument checks and the layer stack with bias + ReLU + dropout between layers.

A model maps `(blocks, x)` to logits of the last block's destinations, `blocks` input layer
first. Full-graph inference is the same call with one whole-graph Block (`num_src == num_dst ==
N`) per layer: `model([graph] * model.num_layers, x)`.
"""
from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn
from torch.nn import functional as F

from morphpipe.numeric import check_float, check_int
from morphpipe.ops.bias_act_dropout import bias_act_dropout
from morphpipe.ops.step_variant import current_step_variant
from morphpipe.sampling.minibatch import Block


def check_positive_int(name: str, value: object) -> int:
    """`value` as an int >= 1, or a ValueError naming `name`."""
    return check_int(name, value, 1)


def check_dropout(value: object) -> float:
    """`value` as a dropout probability in [0, 1), or a ValueError."""
    return check_float("dropout", value, 0, 1, below=True)


def check_model_args(in_dim: object, num_classes: object, num_layers: object, hidden: object) -> None:
    """The sizes every model takes are ints >= 1, or a ValueError naming the bad one."""
    for name, value in (("in_dim", in_dim), ("num_classes", num_classes), ("num_layers", num_layers), ("hidden", hidden)):
        check_positive_int(name, value)


def check_blocks(model: str, blocks: Sequence[Block], x: Tensor, num_layers: int | None) -> None:
    """`blocks` chain (each layer's destinations are the next layer's sources), `x` feeds the first, one per layer."""
    if num_layers is not None and len(blocks) != num_layers:
        raise ValueError(
            f"{model} has num_layers={num_layers} but got {len(blocks)} blocks; "
            f"sample one hop per layer (len(fanouts) == num_layers)"
        )
    if x.dim() != 2:
        raise ValueError(f"x must be [num_input_nodes, in_dim], got shape {tuple(x.shape)}")
    if blocks and x.shape[0] != blocks[0].num_src:
        raise ValueError(
            f"x has {x.shape[0]} rows but blocks[0].num_src={blocks[0].num_src}; pass x = features[input_nodes]"
        )
    for i, block in enumerate(blocks):
        if block.num_src < block.num_dst:
            raise ValueError(
                f"blocks[{i}] has num_src={block.num_src} < num_dst={block.num_dst}; "
                f"the prefix convention needs the destinations to be the first sources"
            )
        if i + 1 < len(blocks) and block.num_dst != blocks[i + 1].num_src:
            raise ValueError(
                f"blocks[{i}].num_dst={block.num_dst} != blocks[{i + 1}].num_src={blocks[i + 1].num_src}; "
                f"blocks must be ordered input layer first"
            )


class BlockModel(nn.Module):
    """A stack of `conv(block, h_src) -> h_dst` layers, ReLU + dropout between them, one block per layer.

    Between layers a conv's output before its bias (`conv.propagate`) goes through the fused
    bias + ReLU + dropout op (`morphpipe.ops.bias_act_dropout`); the last layer is `conv(...)` itself.
    Under a step variant without the fused activation, `F.relu` and `F.dropout` of `conv(...)` run, as before it.
    """

    reads_neighbours = True  # layer `i` reads the block's in-neighbours, not only the destinations' own rows

    def __init__(self, convs: Sequence[nn.Module], dropout: float) -> None:
        super().__init__()
        self.convs = nn.ModuleList(convs)
        self.dropout = check_dropout(dropout)

    @property
    def num_layers(self) -> int:
        return len(self.convs)

    def reset_parameters(self) -> None:
        """Re-initialise every layer."""
        for conv in self.convs:
            conv.reset_parameters()

    def forward(self, blocks: Sequence[Block], x: Tensor) -> Tensor:
        """Logits `[blocks[-1].num_dst, num_classes]` from input features `x [blocks[0].num_src, in_dim]`."""
        check_blocks(type(self).__name__, blocks, x, self.num_layers)
        h = x
        for i, block in enumerate(blocks):
            h = self.layer(i, block, h)
        return h

    def layer(self, i: int, block: Block, h_src: Tensor) -> Tensor:
        """Layer `i` on one block, with what sits between it and the next layer (none after the last).

        The per-layer entry point: `forward` chains it over the blocks, layer-wise full-graph
        inference calls it on chunks of destinations.
        """
        conv = self.convs[i]
        if i == self.num_layers - 1:
            return conv(block, h_src)
        if current_step_variant().fused_activation:
            return bias_act_dropout(conv.propagate(block, h_src), conv.bias, "relu", self.dropout, self.training)
        return F.dropout(F.relu(conv(block, h_src)), p=self.dropout, training=self.training)


def layer_dims(in_dim: int, hidden: int, num_classes: int, num_layers: int) -> list[tuple[int, int]]:
    """`(in, out)` of each layer: in_dim -> hidden -> ... -> hidden -> num_classes."""
    dims = [in_dim] + [hidden] * (num_layers - 1) + [num_classes]
    return list(zip(dims[:-1], dims[1:]))
