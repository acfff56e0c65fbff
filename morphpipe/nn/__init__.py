"""GNN models over mini-batch Blocks (GraphSAGE, GCN, GAT), an MLP baseline, the tasks they are trained for, the
training step, and their evaluation (sampled, or exact by layer-wise inference).

Every model is called as `model(blocks, x)` with `blocks` input layer first and
`x = features[input_nodes]`, and returns logits for the last block's destinations (the seeds).
"""
from morphpipe.nn.base import BlockModel
from morphpipe.nn.factory import MODELS, build_model
from morphpipe.nn.gat import GAT, GATConv
from morphpipe.nn.gcn import GCN, GCNConv
from morphpipe.nn.mlp import MLP
from morphpipe.nn.sage import GraphSAGE, SAGEConv
from morphpipe.nn.task import TASKS, NodeClassification, Task, make_task
from morphpipe.nn.train_step import TrainStep, make_optimizer

__all__ = [
    "GAT",
    "GCN",
    "MLP",
    "MODELS",
    "TASKS",
    "BlockModel",
    "GATConv",
    "GCNConv",
    "GraphSAGE",
    "NodeClassification",
    "SAGEConv",
    "Task",
    "TrainStep",
    "build_model",
    "make_optimizer",
    "make_task",
]
