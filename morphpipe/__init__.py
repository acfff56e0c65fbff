"""morphpipe: hardware-adaptive runtime for mini-batch GNN training on large graphs."""
from morphpipe.huge_pages import apply_huge_pages
from morphpipe.openmp_env import apply_wait_policy

# Before anything imports torch: libgomp reads OMP_WAIT_POLICY once, when torch loads it, and torch's
# allocator reads THP_MEM_ALLOC_ENABLE once, at its first allocation of 2 MiB or more.
apply_wait_policy()
apply_huge_pages()

__version__ = "0.1.0"
