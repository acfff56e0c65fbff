"""Relation-aware models for heterogeneous graphs: R-GCN, HeteroSAGE and RGAT, on typed batches.

A model maps `(layers, x)` to the logits of the last layer's target-type destinations: `layers` are
`HeteroBlock`s (a Block per relation, input layer first) and `x` a dict node type -> input rows
(features, or int64 local node ids for a type without features, which `TypedInput` embeds, as
OGB's mag baselines do). Each layer computes, for every node type `T`, the sum over the relations
`r = (S, name, T)` of a per-relation convolution of the `S` rows into the `T` destinations:

- R-GCN (Schlichtkrull et al., 2018): `W_0,T h_T + sum_r mean_{j in N_r(i)} W_r h_j + b_T`, with
  `W_r` optionally a combination of `num_bases` shared bases;
- HeteroSAGE: per relation PyG's bipartite `SAGEConv(mean)`: `lin_l,r(mean_r) + lin_r,r(h_T)`, summed
  (PyG's `HeteroConv(aggr="sum")` / `to_hetero(GraphSAGE)`);
- RGAT: per relation PyG's bipartite `GATConv(add_self_loops=False)`, summed (the MLPerf model); each
  relation projects its sources before attending, or attends over the inputs and projects only its
  destinations, whichever the calibrated cost model predicts cheaper (as `GATConv`).

Aggregation runs on the fused ops (`morphpipe.ops`), never on edge-by-feature tensors. R-GCN and HeteroSAGE
take, per destination type, the means of all relations into it by one call per relation or one call over the
relations stacked, whichever timed faster, once per shape signature, on the batch's own input
(`morphpipe.ops.relation_stack`, decision `hetero.relations`); each relation's mean is then projected by its
own weights, as per relation. RGAT stays one `gat_attention` per relation (attention vectors folded into the
input space): its softmax normalises over each relation's edges alone, with the relation's own scores. A type with no
relation into it gets zeros (plus the self term in R-GCN).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from morphpipe.nn.base import check_dropout, check_positive_int
from morphpipe.nn.gat import HeadwiseLinear
from morphpipe.ops import gat_attention
from morphpipe.ops.reassociate import PROJECT_FIRST, gat_layer_order
from morphpipe.ops.relation_stack import relation_aggregates
from morphpipe.sampling.hetero_block import HeteroBlock
from morphpipe.sampling.minibatch import Block

Relation = tuple[str, str, str]


def relation_key(relation: Relation) -> str:
    return "__".join(relation)


def relation_means(relations: Sequence[Relation], layer: HeteroBlock,
                   h: Mapping[str, Tensor]) -> list[tuple[Relation, Tensor]]:
    """`(relation, mean)` for every relation with destinations in this layer, in order: the mean of each destination's
    in-neighbour rows (zeros without edges). Per destination type, one aggregation per relation or one over the
    relations stacked, whichever timed faster for the shape (`morphpipe.ops.relation_stack`)."""
    means = []
    for dst in dict.fromkeys(relation[2] for relation in relations):
        into = [relation for relation in relations if relation[2] == dst and layer.blocks[relation].num_dst]
        blocks = [layer.blocks[relation] for relation in into]
        if blocks:
            values = relation_aggregates(blocks, [relation[0] for relation in into], h,
                                         max(block.num_dst for block in blocks), "mean")
            means.extend(zip(into, values))
    return means


class TypedInput(nn.Module):
    """The first layer's rows per node type: features as stored, and for a type without features a learnable
    embedding of its local ids (`embedding_dim` wide)."""

    def __init__(self, num_nodes: Mapping[str, int], feature_dims: Mapping[str, int], embedding_dim: int) -> None:
        super().__init__()
        check_positive_int("embedding_dim", embedding_dim)
        self.feature_dims = dict(feature_dims)
        self.embeddings = nn.ModuleDict({name: nn.Embedding(count, embedding_dim) for name, count in num_nodes.items()
                                         if name not in self.feature_dims})
        for embedding in self.embeddings.values():
            nn.init.normal_(embedding.weight, std=embedding_dim ** -0.5)

    @property
    def dims(self) -> dict[str, int]:
        """Width of every node type's input rows."""
        return {**self.feature_dims, **{name: e.embedding_dim for name, e in self.embeddings.items()}}

    def forward(self, x: Mapping[str, Tensor]) -> dict[str, Tensor]:
        rows = {}
        for name, value in x.items():
            if name in self.embeddings:
                if value.is_floating_point() or value.dim() != 1:
                    raise ValueError(f"x[{name!r}]: node type {name!r} has no features, so its input is its local node "
                                     f"ids (1-D int64), got {value.dtype} {tuple(value.shape)}")
                rows[name] = self.embeddings[name](value)
            elif name in self.feature_dims:
                if value.dim() != 2 or value.shape[1] != self.feature_dims[name]:
                    raise ValueError(f"x[{name!r}] has shape {tuple(value.shape)}, the model expects "
                                     f"[n, {self.feature_dims[name]}] features for node type {name!r}")
                rows[name] = value
            else:
                raise ValueError(f"x[{name!r}]: {name!r} is not a node type of this model ({sorted(self.dims)})")
        return rows


class RGCNConv(nn.Module):
    """One R-GCN layer; `num_bases` (optional) shares `num_bases` basis matrices between the relations."""

    def __init__(self, in_dims: Mapping[str, int], out_features: int, relations: Sequence[Relation],
                 num_bases: int | None = None) -> None:
        super().__init__()
        self.relations = [tuple(r) for r in relations]
        self.out_features = check_positive_int("out_features", out_features)
        self.num_bases = None if num_bases is None else check_positive_int("num_bases", num_bases)
        if self.num_bases is None:
            self.weight = nn.ParameterDict({relation_key(r): nn.Parameter(torch.empty(in_dims[r[0]], out_features))
                                            for r in self.relations})
        else:
            widths = {in_dims[r[0]] for r in self.relations}
            if len(widths) != 1:
                raise ValueError(f"num_bases={num_bases}: basis decomposition needs every relation's source rows to "
                                 f"have one width, got {sorted(widths)}; drop num_bases or give the featureless "
                                 "types an embedding as wide as the features")
            self.bases = nn.Parameter(torch.empty(self.num_bases, widths.pop(), out_features))
            self.coefficients = nn.Parameter(torch.empty(len(self.relations), self.num_bases))
        self.root = nn.ParameterDict({name: nn.Parameter(torch.empty(width, out_features))
                                      for name, width in in_dims.items()})
        self.bias = nn.ParameterDict({name: nn.Parameter(torch.zeros(out_features)) for name in in_dims})
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for parameter in [*self.root.values(), *(self.weight.values() if self.num_bases is None else [])]:
            nn.init.xavier_uniform_(parameter)
        if self.num_bases is not None:
            nn.init.xavier_uniform_(self.bases)
            nn.init.xavier_uniform_(self.coefficients)
        for bias in self.bias.values():
            nn.init.zeros_(bias)

    def relation_weights(self) -> dict[Relation, Tensor]:
        """`W_r` of every relation (combined from the bases under basis decomposition)."""
        if self.num_bases is None:
            return {r: self.weight[relation_key(r)] for r in self.relations}
        combined = torch.einsum("rb,bio->rio", self.coefficients, self.bases)
        return {r: combined[i] for i, r in enumerate(self.relations)}

    def forward(self, layer: HeteroBlock, h: Mapping[str, Tensor]) -> dict[str, Tensor]:
        out = {name: h[name][:count] @ self.root[name] + self.bias[name] for name, count in layer.num_dst.items()}
        weights = self.relation_weights()
        for relation, mean in relation_means(self.relations, layer, h):  # aggregate, then project, as before
            out[relation[2]] = out[relation[2]] + mean @ weights[relation]
        return out


class HeteroSAGEConv(nn.Module):
    """One HeteroSAGE layer: PyG's bipartite SAGEConv(mean) per relation (`lin_l` with bias, `lin_r` without), summed."""

    def __init__(self, in_dims: Mapping[str, int], out_features: int, relations: Sequence[Relation]) -> None:
        super().__init__()
        self.relations = [tuple(r) for r in relations]
        self.out_features = check_positive_int("out_features", out_features)
        self.lin_l = nn.ModuleDict({relation_key(r): nn.Linear(in_dims[r[0]], out_features) for r in self.relations})
        self.lin_r = nn.ModuleDict({relation_key(r): nn.Linear(in_dims[r[2]], out_features, bias=False)
                                    for r in self.relations})

    def reset_parameters(self) -> None:
        for linear in [*self.lin_l.values(), *self.lin_r.values()]:
            linear.reset_parameters()

    def forward(self, layer: HeteroBlock, h: Mapping[str, Tensor]) -> dict[str, Tensor]:
        out = {name: h[name].new_zeros(count, self.out_features) for name, count in layer.num_dst.items()}
        for relation, mean in relation_means(self.relations, layer, h):
            key = relation_key(relation)
            h_dst = h[relation[2]][: mean.shape[0]]
            out[relation[2]] = out[relation[2]] + self.lin_l[key](mean) + self.lin_r[key](h_dst)
        return out


class RelationGATConv(nn.Module):
    """PyG's bipartite `GATConv(add_self_loops=False)` for one relation: `lin_src`, `lin_dst`, `att_src`, `att_dst`,
    `bias`; the attention vectors folded into the input space so only the sources are projected."""

    def __init__(self, in_src: int, in_dst: int, out_features: int, heads: int, concat: bool,
                 negative_slope: float = 0.2) -> None:
        super().__init__()
        self.out_features, self.heads, self.concat, self.negative_slope = out_features, heads, concat, negative_slope
        self.lin_src = nn.Linear(in_src, heads * out_features, bias=False)
        self.lin_dst = nn.Linear(in_dst, heads * out_features, bias=False)
        self.att_src = nn.Parameter(torch.empty(1, heads, out_features))
        self.att_dst = nn.Parameter(torch.empty(1, heads, out_features))
        self.bias = nn.Parameter(torch.empty(heads * out_features if concat else out_features))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for parameter in (self.lin_src.weight, self.lin_dst.weight, self.att_src, self.att_dst):
            nn.init.xavier_uniform_(parameter)
        nn.init.zeros_(self.bias)

    def folded(self, linear: nn.Linear, attention: Tensor) -> Tensor:
        """`[in, heads]`: the attention vector of every head pulled back through the projection (`a . W h`)."""
        return torch.einsum("hoi,ho->ih", linear.weight.view(self.heads, self.out_features, -1), attention[0])

    def forward(self, block: Block, h_src: Tensor, h_dst: Tensor) -> Tensor:
        width = self.heads * self.out_features if self.concat else self.out_features
        if block.nnz == 0 or block.num_src == 0:
            return self.bias.expand(block.num_dst, width)
        score_src = h_src @ self.folded(self.lin_src, self.att_src)  # == (W h . att_src), no [n, heads, out]
        score_dst = h_dst @ self.folded(self.lin_dst, self.att_dst)
        if gat_layer_order(block, h_src, self.out_features, self.heads, 1.0) == PROJECT_FIRST:
            z = self.lin_src(h_src).view(-1, self.heads, self.out_features)
            out = gat_attention(block, z, score_src, score_dst, self.negative_slope, add_self_loops=False)
        else:  # attend over the inputs shared by the heads, then project each head's destinations only
            attended = gat_attention(block, h_src.unsqueeze(1), score_src, score_dst, self.negative_slope,
                                     add_self_loops=False)
            out = HeadwiseLinear.apply(attended, self.lin_src.weight.view(self.heads, self.out_features, -1))
        return (out.flatten(1) if self.concat else out.mean(1)) + self.bias


class RGATConv(nn.Module):
    """One RGAT layer: a RelationGATConv per relation, summed into each destination type. Never stacked over the
    relations as R-GCN's and HeteroSAGE's means are: each relation's softmax normalises over its own edges, with
    its own projections and attention vectors."""

    def __init__(self, in_dims: Mapping[str, int], out_features: int, relations: Sequence[Relation], heads: int,
                 concat: bool) -> None:
        super().__init__()
        self.relations = [tuple(r) for r in relations]
        self.out_features, self.heads, self.concat = out_features, heads, concat
        self.width = out_features * heads if concat else out_features
        self.convs = nn.ModuleDict({relation_key(r): RelationGATConv(in_dims[r[0]], in_dims[r[2]], out_features,
                                                                     heads, concat) for r in self.relations})

    def reset_parameters(self) -> None:
        for conv in self.convs.values():
            conv.reset_parameters()

    def forward(self, layer: HeteroBlock, h: Mapping[str, Tensor]) -> dict[str, Tensor]:
        out = {name: h[name].new_zeros(count, self.width) for name, count in layer.num_dst.items()}
        for relation in self.relations:
            block = layer.blocks[relation]
            if block.num_dst:
                conv = self.convs[relation_key(relation)]
                out[relation[2]] = out[relation[2]] + conv(block, h[relation[0]], h[relation[2]][: block.num_dst])
        return out


class HeteroModel(nn.Module):
    """A stack of typed layers with ReLU + dropout between them, after `TypedInput`; logits of the target type."""

    reads_neighbours = True
    # A batch may leave parameters without a gradient: a relation none of whose edges was sampled (RGAT's
    # projections, attention), and in the last layer every relation into a type other than the target.
    leaves_parameters_unused = True

    def __init__(self, typed_input: TypedInput, convs: Sequence[nn.Module], target_type: str, dropout: float) -> None:
        super().__init__()
        self.input = typed_input
        self.convs = nn.ModuleList(convs)
        self.target_type = target_type
        self.dropout = check_dropout(dropout)

    @property
    def num_layers(self) -> int:
        return len(self.convs)

    def reset_parameters(self) -> None:
        for conv in self.convs:
            conv.reset_parameters()

    def forward(self, layers: Sequence[HeteroBlock], x: Mapping[str, Tensor]) -> Tensor:
        """Logits `[layers[-1].num_dst[target], num_classes]`."""
        if len(layers) != self.num_layers:
            raise ValueError(f"{type(self).__name__} has num_layers={self.num_layers} but got {len(layers)} layers; "
                             "sample one hop per layer (fanouts with num_layers hops)")
        if not isinstance(x, Mapping):
            raise ValueError("x must be a dict node type -> rows for a heterogeneous model (a typed batch's x)")
        h = self.input(x)
        for i, layer in enumerate(layers):
            missing = [name for name, count in layer.num_src.items() if count and name not in h]
            if missing:
                raise ValueError(f"layer {i} reads node types {missing} that x does not hold")
            h = self.layer(i, layer, h)
        return h[self.target_type]

    def layer(self, i: int, layer: HeteroBlock, h: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """Layer `i` on one typed layer (rows per node type, `self.input`'s for the first), with ReLU + dropout after
        every layer but the last: the per-layer entry point `forward` chains and layer-wise inference calls on
        chunks of destinations."""
        out = self.convs[i](layer, h)
        if i == self.num_layers - 1:
            return out
        return {name: F.dropout(F.relu(value), p=self.dropout, training=self.training) for name, value in out.items()}


HETERO_MODELS = ("rgcn", "rsage", "rgat")


def build_hetero_model(name: str, *, num_nodes: Mapping[str, int], feature_dims: Mapping[str, int],
                       relations: Sequence[Relation], target_type: str, num_classes: int, num_layers: int = 2,
                       hidden: int | None = None, heads: int | None = None, num_bases: int | None = None,
                       embedding_dim: int | None = None, dropout: float = 0.5) -> HeteroModel:
    """Model `name` ("rgcn" | "rsage" | "rgat") for a graph with these types and relations.

    `hidden` defaults to 64; `heads` (RGAT only, default 4); `num_bases` (R-GCN only); `embedding_dim` (width of
    the featureless types' embeddings) defaults to the widest feature width, else `hidden`.
    """
    if name not in HETERO_MODELS:
        raise ValueError(f"model {name!r} is not a heterogeneous model (it ignores node and relation types); use one "
                         f"of {list(HETERO_MODELS)}")
    if heads is not None and name != "rgat":
        raise ValueError(f"heads={heads!r} only applies to name='rgat', not name={name!r}; drop heads")
    if num_bases is not None and name != "rgcn":
        raise ValueError(f"num_bases={num_bases!r} only applies to name='rgcn', not name={name!r}; drop num_bases")
    for label, value in (("num_layers", num_layers), ("num_classes", num_classes)):
        check_positive_int(label, value)
    hidden = check_positive_int("hidden", 64 if hidden is None else hidden)
    heads = check_positive_int("heads", 4 if heads is None else heads)
    if target_type not in num_nodes:
        raise ValueError(f"target_type={target_type!r} is not a node type ({sorted(num_nodes)})")
    embedding_dim = embedding_dim or max(feature_dims.values(), default=hidden)
    typed_input = TypedInput(num_nodes, feature_dims, embedding_dim)
    dims = typed_input.dims
    convs: list[nn.Module] = []
    for i in range(num_layers):
        last = i == num_layers - 1
        out = num_classes if last else hidden
        if name == "rgcn":
            conv: nn.Module = RGCNConv(dims, out, relations, num_bases)
            width = out
        elif name == "rsage":
            conv = HeteroSAGEConv(dims, out, relations)
            width = out
        else:
            conv = RGATConv(dims, out, relations, heads, concat=not last)
            width = conv.width
        convs.append(conv)
        dims = {type_name: width for type_name in dims}
    return HeteroModel(typed_input, convs, target_type, dropout)
