"""GNN models over mini-batch Blocks (GraphSAGE, GCN, GAT) and an MLP baseline, built on `morphpipe.ops`.

Every model is called as `model(blocks, x)` with `blocks` input layer first and
`x = features[input_nodes]`, and returns logits for the last block's destinations (the seeds).
"""
from morphpipe.nn.base import BlockModel
from morphpipe.nn.factory import MODELS, build_model
from morphpipe.nn.gat import GAT, GATConv
from morphpipe.nn.gcn import GCN, GCNConv
from morphpipe.nn.mlp import MLP
from morphpipe.nn.sage import GraphSAGE, SAGEConv

__all__ = [
    "GAT",
    "GCN",
    "MLP",
    "MODELS",
    "BlockModel",
    "GATConv",
    "GCNConv",
    "GraphSAGE",
    "SAGEConv",
    "build_model",
]
