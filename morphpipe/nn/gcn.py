"""GCN (Kipf & Welling, 2017) with symmetric normalisation computed on each sampled block."""
from __future__ import annotations

import torch
from torch import Tensor, nn

from morphpipe.nn.base import BlockModel, check_model_args, check_positive_int, layer_dims
from morphpipe.ops import gcn_aggregate, gcn_aggregate_project
from morphpipe.ops.autocast_input import layer_input, project
from morphpipe.ops.reassociate import PROJECT_FIRST, linear_layer_order
from morphpipe.ops.sparse_input import InputDensity, sparse_aware_linear
from morphpipe.ops.step_variant import current_step_variant
from morphpipe.sampling.minibatch import Block


class GCNConv(nn.Module):
    """`h_i' = b + W * dst_scale_i * (src_scale_i h_i + sum_{edges j->i} src_scale_j h_j)`.

    Normalisation (`morphpipe.ops.gcn_scales`), with degrees counted over the block's edges,
    duplicates separately: `dst_scale_i = (in_degree_i + 1)^-1/2`, `src_scale_j =
    (out_degree_j + [j < num_dst])^-1/2`; the `+1` / `[j < num_dst]` terms are the self loop
    `i -> i` that the prefix convention supplies (always added, never read from the block).
    This is DGL's `GraphConv(norm="both")` on the block with self loops added.

    PyG's `GCNConv` computes `D^-1/2 (A + I) D^-1/2 X W + b` on a square graph with `D` the
    in-degree plus self loop used on both sides, and adds a self loop only where none exists
    (`add_remaining_self_loops`). On a whole graph (a Block with `num_src == num_dst`) whose
    adjacency is symmetric and loop-free the two are identical. On a sampled block they differ:
    a source's factor here uses how many sampled destinations it feeds, while PyG run on
    the block's edge_index would give every non-destination source degree 1; and mini-batch
    outputs are not expected to equal full-graph outputs, because block degrees are sampled.

    The projection runs before or after the propagation (equal, it is linear), whichever the
    calibrated cost model predicts cheaper for the block's sizes and the widths (SENSEi,
    `morphpipe.ops.reassociate`); a projection of the layer's input runs sparse-times-dense when
    its measured density makes that cheaper (Morphling, `morphpipe.ops.sparse_input`). Aggregating first
    under the fused step's projection (`StepVariant.fused_projection`, outside autocast), the projection runs in
    the aggregation's pass (`morphpipe.ops.gcn_aggregate_project`), and the order's cost prices that pass.
    """

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.in_features = check_positive_int("in_features", in_features)
        self.out_features = check_positive_int("out_features", out_features)
        self.lin = nn.Linear(in_features, out_features, bias=False)
        self.bias = nn.Parameter(torch.empty(out_features))
        self.input_density = InputDensity()
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Glorot weight and zero bias, as PyG's GCNConv."""
        nn.init.xavier_uniform_(self.lin.weight)
        nn.init.zeros_(self.bias)

    def forward(self, block: Block, h_src: Tensor) -> Tensor:
        """`[num_src, in] -> [num_dst, out]`."""
        return self.propagate(block, h_src) + self.bias

    def propagate(self, block: Block, h_src: Tensor) -> Tensor:
        """The output before the bias is added (models fuse the bias into the activation that follows).

        Under autocast a float32 input is cast once for the whole layer or read as stored and projected in float32,
        whichever timed faster (`morphpipe.ops.autocast_input`: GCN's narrow projection rarely pays for the cast).
        """
        density = self.input_density.measure(h_src)
        h_src = layer_input(h_src, self.lin.weight)
        in_pass = current_step_variant().fused_projection and not torch.is_autocast_enabled(h_src.device.type)
        if linear_layer_order("gcn", block, h_src, self.out_features, density, self_loops=True,
                              project_in_pass=in_pass) == PROJECT_FIRST:
            return gcn_aggregate(block, sparse_aware_linear(h_src, self.lin.weight, None, density))
        if in_pass:
            return gcn_aggregate_project(block, h_src, self.lin.weight)
        return project(gcn_aggregate(block, h_src), self.lin.weight)


class GCN(BlockModel):
    """GCN: `num_layers` GCNConv layers, in_dim -> hidden -> ... -> num_classes (paper's hidden: 16)."""

    def __init__(self, in_dim: int, num_classes: int, num_layers: int = 3, hidden: int = 16, dropout: float = 0.5) -> None:
        check_model_args(in_dim, num_classes, num_layers, hidden)
        super().__init__(
            [GCNConv(i, o) for i, o in layer_dims(in_dim, hidden, num_classes, num_layers)], dropout
        )
