"""Mini-batch types and the batchers that produce them (Route 0: CPU or serial, Route 1: GPU over UVA), for node
batches and for link prediction's edge batches."""
from morphpipe.sampling.batcher import Batcher, SeedBatcher
from morphpipe.sampling.cpu_batcher import CpuBatcher, sample_neighbors
from morphpipe.sampling.edge_batcher import (EdgeBatcher, GpuEdgeBatcher, NegativeSampling, SerialEdgeBatcher,
                                             sample_edge_batch)
from morphpipe.sampling.epochs import batches_per_epoch, epoch_order, epoch_seed
from morphpipe.sampling.gpu_batcher import GpuBatcher
from morphpipe.sampling.gpu_cache import CacheConfig, CachePlan
from morphpipe.sampling.minibatch import Block, EdgePairs, MiniBatch
from morphpipe.sampling.serial_batcher import SerialBatcher

__all__ = ["Batcher", "Block", "CacheConfig", "CachePlan", "CpuBatcher", "EdgeBatcher", "EdgePairs", "GpuBatcher",
           "GpuEdgeBatcher", "MiniBatch", "NegativeSampling", "SeedBatcher", "SerialBatcher", "SerialEdgeBatcher",
           "batches_per_epoch", "epoch_order", "epoch_seed", "sample_edge_batch", "sample_neighbors"]
