"""morphpipe: hardware-adaptive runtime for mini-batch GNN training on large graphs."""
from morphpipe.openmp_env import apply_wait_policy

# Before anything imports torch: libgomp reads OMP_WAIT_POLICY once, when torch loads it.
apply_wait_policy()

__version__ = "0.1.0"
