"""GAT (Velickovic et al., 2018): multi-head attention over each block's in-edges plus self loops."""
from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.autograd.function import FunctionCtx, once_differentiable

from morphpipe.nn.base import BlockModel, check_model_args, check_positive_int
from morphpipe.ops import gat_attention
from morphpipe.ops.narrow_projection import narrow_projection
from morphpipe.ops.reassociate import PROJECT_FIRST, gat_layer_order
from morphpipe.ops.sparse_input import InputDensity, sparse_aware_linear
from morphpipe.ops.step_variant import current_step_variant
from morphpipe.sampling.minibatch import Block


class GATConv(nn.Module):
    """Multi-head graph attention; same as PyG `GATConv` (shared `lin`, `att_src`, `att_dst`, `bias`).

    Per head: `z = W h`, edge `j -> i` scores `leaky_relu(a_src . z_j + a_dst . z_i)`, softmax
    over the in-edges of `i` plus its self loop (prefix convention), output the weighted sum of
    `z_j`; heads are concatenated (`concat=True`) or averaged, then the bias is added.
    Differences from PyG: no attention dropout, and a self edge stored in the block is kept
    as an extra edge (PyG removes stored self loops before adding its own).

    The attention vectors are folded into the input space (`a . W h == (W^T a) . h`), so both
    score halves cost one `[num_src, in] @ [in, 2 * heads]` product and no `[num_src, heads, out]`
    temporary. Where it projects is chosen per block by the calibrated cost model (SENSEi,
    `morphpipe.ops.reassociate`): project first and attend over `z`, or attend over the inputs
    `h` shared by all heads and project each head's result after; both are equal. The projection
    of the layer's input runs sparse-times-dense when its measured density makes that cheaper
    (`morphpipe.ops.sparse_input`).
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
        self.input_density = InputDensity()
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Glorot weights and attention vectors, zero bias, as PyG's GATConv."""
        nn.init.xavier_uniform_(self.lin.weight)
        nn.init.xavier_uniform_(self.att_src)
        nn.init.xavier_uniform_(self.att_dst)
        nn.init.zeros_(self.bias)

    def forward(self, block: Block, h_src: Tensor) -> Tensor:
        """`[num_src, in] -> [num_dst, heads * out]` when concatenating, `[num_dst, out]` when averaging."""
        return self.propagate(block, h_src) + self.bias

    def propagate(self, block: Block, h_src: Tensor) -> Tensor:
        """The output before the bias is added (models fuse the bias into the activation that follows)."""
        density = self.input_density.measure(h_src)
        weight = self.lin.weight.view(self.heads, self.out_features, self.in_features)
        if torch.is_autocast_enabled(h_src.device.type):
            # One cast of the input and the weight serves the scores, the attention and the projection: autocast
            # would cast a float32 input once per product, and not at all for the attention or HeadwiseLinear.
            dtype = torch.get_autocast_dtype(h_src.device.type)
            h_src, weight = h_src.to(dtype), weight.to(dtype)
        attention = torch.stack([self.att_src[0], self.att_dst[0]])  # [2 (source, destination), heads, out]
        folded = torch.einsum("hoi,sho->ish", weight, attention).flatten(1)  # [in, 2 * heads]
        # [num_src, 2 * heads]; the fused step lays the skinny products out as BLAS runs them fast
        scores = narrow_projection(h_src, folded) if current_step_variant().fused_projection else h_src @ folded
        score_src, score_dst = scores[:, : self.heads], scores[: block.num_dst, self.heads :]
        if gat_layer_order(block, h_src, self.out_features, self.heads, density) == PROJECT_FIRST:
            z = sparse_aware_linear(h_src, self.lin.weight, None, density).view(-1, self.heads, self.out_features)
            out = gat_attention(block, z, score_src, score_dst, self.negative_slope, add_self_loops=True)
        else:
            attended = gat_attention(block, h_src.unsqueeze(1), score_src, score_dst, self.negative_slope,
                                     add_self_loops=True)
            out = HeadwiseLinear.apply(attended, weight)
        return out.flatten(1) if self.concat else out.mean(1)


class HeadwiseLinear(torch.autograd.Function):
    """`out[:, k] = x[:, k] @ weight[k]^T` per head k of `x [n, heads, in]`, `weight [heads, out, in]`.

    One GEMM per head on the strided head slices (BLAS takes the row stride, and writes the output's and
    the gradient's head slices in place), so neither x, its gradient nor the output is ever copied into or
    out of a head-major layout, as `torch.bmm` would need.
    """

    @staticmethod
    def forward(ctx: FunctionCtx, x: Tensor, weight: Tensor) -> Tensor:
        ctx.dtypes = (x.dtype, weight.dtype)
        if torch.is_autocast_enabled(x.device.type):  # mm(out=) is not autocast: cast the operands here
            dtype = torch.get_autocast_dtype(x.device.type)
            x, weight = x.to(dtype), weight.to(dtype)
        ctx.save_for_backward(x, weight)
        out = x.new_empty(x.shape[0], weight.shape[0], weight.shape[1])
        for k in range(weight.shape[0]):
            torch.mm(x[:, k], weight[k].t(), out=out[:, k])  # BLAS writes the strided head slice: no copy
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad: Tensor) -> tuple[Tensor | None, Tensor | None]:
        # Backward runs outside the forward's autocast: both products run in the gradient's dtype and each result
        # is returned in its input's dtype (no-ops in float32).
        x, weight = ctx.saved_tensors
        grad_x = grad_weight = None
        if ctx.needs_input_grad[0]:
            grad_x = grad.new_empty(x.shape)
            weight_g = weight.to(grad.dtype)
            for k in range(weight.shape[0]):
                torch.mm(grad[:, k], weight_g[k], out=grad_x[:, k])
            grad_x = grad_x.to(ctx.dtypes[0])
        if ctx.needs_input_grad[1]:
            x_g = x.to(grad.dtype)
            grad_weight = torch.stack([grad[:, k].t() @ x_g[:, k] for k in range(weight.shape[0])]).to(ctx.dtypes[1])
        return grad_x, grad_weight


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
