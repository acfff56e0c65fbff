"""Mini-batch types and the batchers that produce them (Route 0: CPU)."""
from morphpipe.sampling.cpu_batcher import CpuBatcher, sample_neighbors, usable_cores
from morphpipe.sampling.minibatch import Block, MiniBatch

__all__ = ["Block", "CpuBatcher", "MiniBatch", "sample_neighbors", "usable_cores"]
