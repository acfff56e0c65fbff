"""morphpipe: hardware-adaptive runtime for mini-batch GNN training on large graphs."""
__version__ = "0.1.0"
