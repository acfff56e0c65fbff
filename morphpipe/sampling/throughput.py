"""Measured throughput of a batcher: what the benchmark, `morphpipe bench` and the profiler report."""
from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

import torch

from morphpipe.sampling.cpu_batcher import CpuBatcher
from morphpipe.sampling.minibatch import MiniBatch, tensors_of


@dataclass
class BatcherThroughput:
    """Batches, sampled edges and gathered feature bytes per second over one measured run, and the CPU time the
    process spent per batch (all threads: on a loaded machine less inflated than the wall time)."""

    batches: int
    seconds: float
    batches_per_s: float
    edges_per_s: float
    feature_bytes_per_s: float
    edges_per_batch: float
    input_nodes_per_batch: float
    bytes_per_batch: float
    cpu_seconds_per_batch: float

    def to_dict(self) -> dict:
        return asdict(self)


def measurement_seeds(train_idx: torch.Tensor, batches: int, batch_size: int, seed: int = 0) -> torch.Tensor:
    """`batches * batch_size` training seeds drawn by a seeded shuffle, so every measurement of a run sees the same ones."""
    needed = batches * batch_size
    if train_idx.numel() < needed:
        raise ValueError(f"batches={batches} of {batch_size} need {needed:,} seeds, but the train split has only "
                         f"{train_idx.numel():,}; ask for fewer batches")
    generator = torch.Generator().manual_seed(seed)
    return train_idx[torch.randperm(train_idx.numel(), generator=generator)[:needed]]


def measure_throughput(batches: Iterable[MiniBatch], max_batches: int | None = None) -> BatcherThroughput:
    """Consumes up to `max_batches` batches and times them from the first request to the last."""
    start, cpu_start = time.perf_counter(), time.process_time()
    count = edges = input_nodes = feature_bytes = total_bytes = 0
    for batch in batches:
        count += 1
        edges += batch.num_sampled_edges()
        input_nodes += batch.input_nodes.numel()
        feature_bytes += sum(t.numel() * t.element_size() for t in tensors_of(batch.x) if t.is_floating_point())
        total_bytes += batch.nbytes
        if max_batches is not None and count >= max_batches:
            break
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    if count == 0:
        raise ValueError("measure_throughput: the batcher produced no batch; check the seeds and batch_size")
    return BatcherThroughput(
        batches=count,
        seconds=seconds,
        batches_per_s=count / seconds,
        edges_per_s=edges / seconds,
        feature_bytes_per_s=feature_bytes / seconds,
        edges_per_batch=edges / count,
        input_nodes_per_batch=input_nodes / count,
        bytes_per_batch=total_bytes / count,
        cpu_seconds_per_batch=cpu_seconds / count,
    )


def cpu_batcher_by_threads(graph, fanouts: Sequence[int], batch_size: int, seeds: torch.Tensor, max_threads: int, *,
                           pin_memory: bool) -> list[dict]:
    """CpuBatcher throughput over `seeds` at 1..`max_threads` threads, each timed on the epoch after a warm-up one."""
    rows = []
    for threads in range(1, max_threads + 1):
        with CpuBatcher(graph, fanouts, batch_size, num_threads=threads, seeds=seeds, seed=0,
                        pin_memory=pin_memory) as batcher:
            list(batcher)
            row = measure_throughput(batcher).to_dict()
        rows.append({**row, "threads": threads})
    return rows
