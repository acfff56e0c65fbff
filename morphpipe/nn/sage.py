"""GraphSAGE with mean aggregation (Hamilton et al., 2017) on mini-batch blocks."""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from morphpipe.nn.base import BlockModel, check_blocks, check_model_args, check_positive_int, layer_dims
from morphpipe.ops import aggregate
from morphpipe.ops.autocast_input import layer_input, narrower_autocast_dtype, project
from morphpipe.ops.bias_act_dropout import bias_act_dropout
from morphpipe.ops.prefix_split import split_prefix
from morphpipe.ops.reassociate import PROJECT_FIRST, linear_layer_order
from morphpipe.ops.relu_mean import relu_mean, relu_mean_runs
from morphpipe.ops.sage_projection import sage_projection
from morphpipe.ops.sparse_input import InputDensity, sparse_aware_linear, transform_choice
from morphpipe.ops.step_variant import current_step_variant
from morphpipe.sampling.minibatch import Block


class SAGEConv(nn.Module):
    """`lin_self(h_dst) + lin_neigh(mean of in-neighbours)`; same as PyG `SAGEConv(aggr="mean")` (lin_r, lin_l).

    The neighbour projection runs before or after the mean (equal, the mean is linear), whichever
    the calibrated cost model predicts cheaper for the block's sizes and the widths (SENSEi,
    `morphpipe.ops.reassociate`). Projections of the layer's input run sparse-times-dense when its
    measured density makes that cheaper (Morphling, `morphpipe.ops.sparse_input`).
    """

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.in_features = check_positive_int("in_features", in_features)
        self.out_features = check_positive_int("out_features", out_features)
        self.lin_neigh = nn.Linear(in_features, out_features, bias=True)
        self.lin_self = nn.Linear(in_features, out_features, bias=False)
        self.input_density = InputDensity()

    def reset_parameters(self) -> None:
        """Re-initialise both projections."""
        self.lin_neigh.reset_parameters()
        self.lin_self.reset_parameters()

    @property
    def bias(self) -> Tensor:
        """The layer's bias (PyG's place for it: the neighbour projection's)."""
        return self.lin_neigh.bias

    def forward(self, block: Block, h_src: Tensor) -> Tensor:
        """`[num_src, in] -> [num_dst, out]`; destinations with no sampled neighbours see a zero mean.

        Under a step variant without the fused projection: two linears (the bias in the neighbour's)
        and an add, as before it.
        """
        if current_step_variant().fused_projection:
            return self.propagate(block, h_src) + self.bias
        density = self.input_density.measure(h_src)
        if linear_layer_order("sage", block, h_src, self.out_features, density, self_loops=False) == PROJECT_FIRST:
            projected = sparse_aware_linear(h_src, self.lin_neigh.weight, None, density)
            neigh = aggregate(block, projected, "mean") + self.lin_neigh.bias
        else:
            neigh = self.lin_neigh(aggregate(block, h_src, "mean"))
        return neigh + sparse_aware_linear(h_src[: block.num_dst], self.lin_self.weight, None, density)

    def propagate(self, block: Block, h_src: Tensor) -> Tensor:
        """The output before the bias is added (models fuse the bias into the activation that follows).

        With the step's fused projection on and a dense self projection, the two projections run as
        one step (`morphpipe.ops.sage_projection`), else as two linears and an add. Under autocast a float32 input is cast
        once for the whole layer or read as stored (`morphpipe.ops.autocast_input`). The destinations' own rows
        are split off the sources by `split_prefix`, so their gradient meets the neighbours' without a full-size
        zero fill.
        """
        density = self.input_density.measure(h_src)
        h_src, h_dst = split_prefix(layer_input(h_src, self.lin_neigh.weight), block.num_dst)
        project_first = linear_layer_order("sage", block, h_src, self.out_features, density,
                                           self_loops=False) == PROJECT_FIRST
        fused = current_step_variant().fused_projection and transform_choice(h_dst, self.out_features,
                                                                              density) == "dense"
        if project_first:
            neigh = aggregate(block, sparse_aware_linear(h_src, self.lin_neigh.weight, None, density), "mean")
            if fused:
                return sage_projection(neigh, h_dst, self.lin_neigh.weight, self.lin_self.weight, base=neigh)
        else:
            mean = aggregate(block, h_src, "mean")
            if fused:
                return sage_projection(mean, h_dst, self.lin_neigh.weight, self.lin_self.weight)
            neigh = project(mean, self.lin_neigh.weight)
        return neigh + sparse_aware_linear(h_dst, self.lin_self.weight, None, density)

    def propagate_activated(self, block: Block, pre: Tensor, bias: Tensor, p: float) -> Tensor:
        """`propagate(block, dropout(relu(pre + bias), p))` in training, `pre` being the previous layer's output
        before its bias.

        When this layer aggregates first through the fused projection on float32 activations (under bf16 autocast
        the fused pass made the step 1.3x slower, BENCHMARKS.md), the activation, the mean and the own rows
        run as one autograd node (`morphpipe.ops.relu_mean`: one backward pass over the activations instead of
        three); otherwise, and on the first call (the input's density is measured on the activations), the
        activation runs alone and `propagate` takes it.
        """
        density = self.input_density.density
        if bias.dtype != pre.dtype and torch.is_autocast_enabled(pre.device.type):
            bias = bias.to(pre.dtype)  # as bias_act_dropout applies the float32 master bias under autocast
        if (density is not None and pre.dtype == torch.float32 and narrower_autocast_dtype(pre) is None
                and relu_mean_runs(pre, bias, block)):
            own = pre[: block.num_dst]
            aggregate_first = linear_layer_order("sage", block, pre, self.out_features, density,
                                                 self_loops=False) != PROJECT_FIRST
            if aggregate_first and transform_choice(own, self.out_features, density) == "dense":
                fused = relu_mean(pre, bias, block, p)
                if fused is not None:
                    mean, h_dst = fused
                    return sage_projection(mean, h_dst, self.lin_neigh.weight, self.lin_self.weight)
        return self.propagate(block, bias_act_dropout(pre, bias, "relu", p, True))


class GraphSAGE(BlockModel):
    """GraphSAGE-mean: `num_layers` SAGEConv layers, in_dim -> hidden -> ... -> num_classes."""

    def __init__(self, in_dim: int, num_classes: int, num_layers: int = 3, hidden: int = 256, dropout: float = 0.5) -> None:
        check_model_args(in_dim, num_classes, num_layers, hidden)
        super().__init__(
            [SAGEConv(i, o) for i, o in layer_dims(in_dim, hidden, num_classes, num_layers)], dropout
        )

    def forward(self, blocks: Sequence[Block], x: Tensor) -> Tensor:
        """`BlockModel.forward`; in training with the fused step, each middle layer takes the previous one's output
        before its bias + ReLU + dropout, to fuse them with its mean (`SAGEConv.propagate_activated`). The last layer
        is called as a module, as `BlockModel` calls it (its hooks run)."""
        variant = current_step_variant()
        if not (self.training and torch.is_grad_enabled() and variant.fused_activation and variant.fused_projection
                and self.num_layers > 2):
            return super().forward(blocks, x)
        check_blocks(type(self).__name__, blocks, x, self.num_layers)
        last = self.num_layers - 1
        pre = self.convs[0].propagate(blocks[0], x)
        for i in range(1, last):
            pre = self.convs[i].propagate_activated(blocks[i], pre, self.convs[i - 1].bias, self.dropout)
        return self.convs[last](blocks[last], bias_act_dropout(pre, self.convs[last - 1].bias, "relu", self.dropout,
                                                               True))
