"""Mini-batch types and the batchers that produce them (Route 0: CPU or serial, Route 1: GPU over UVA)."""
from morphpipe.sampling.batcher import Batcher, SeedBatcher
from morphpipe.sampling.cpu_batcher import CpuBatcher, sample_neighbors
from morphpipe.sampling.epochs import batches_per_epoch, epoch_order, epoch_seed
from morphpipe.sampling.gpu_batcher import GpuBatcher
from morphpipe.sampling.gpu_cache import CacheConfig, CachePlan
from morphpipe.sampling.minibatch import Block, MiniBatch
from morphpipe.sampling.serial_batcher import SerialBatcher

__all__ = ["Batcher", "Block", "CacheConfig", "CachePlan", "CpuBatcher", "GpuBatcher", "MiniBatch", "SeedBatcher",
           "SerialBatcher", "batches_per_epoch", "epoch_order", "epoch_seed", "sample_neighbors"]
