"""morphpipe.executor: the dual-buffer training runtime that executes a Plan (MorphGL Algorithms 1-4).

`Executor` runs epochs of the schedule on `Devices` (CUDA streams and events, the CPU, or
virtual devices for tests); `Trainer` builds it from a graph, a model and a plan, and adds
evaluation, progress bars and checkpoints.
"""
from morphpipe.executor.checkpoint import TrainingState, load_checkpoint, save_checkpoint
from morphpipe.executor.devices import CpuDevices, CudaDevices, Devices, InFlight, Launched
from morphpipe.executor.executor import EpochResult, Executor
from morphpipe.executor.routes import RouteSeeds, route_seeds
from morphpipe.executor.stats import EpochStats
from morphpipe.executor.trainer import Trainer, training_device
from morphpipe.executor.full_graph import FullGraphTrainer

__all__ = [
    "CpuDevices", "CudaDevices", "Devices", "EpochResult", "EpochStats", "Executor", "InFlight",
    "Launched", "RouteSeeds", "Trainer", "TrainingState", "load_checkpoint",
    "route_seeds", "save_checkpoint", "training_device",
    "FullGraphTrainer",
]
