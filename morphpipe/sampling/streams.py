"""The stream/event API the GPU batcher and `CudaDevices` use, as one injectable object.

Everything that orders work between CUDA streams goes through a `StreamApi`: making streams and
events, entering a stream, marking a tensor as used on a stream (`record_stream`), copying a
batch to the device. `CudaStreams` is torch.cuda; tests inject a recording double that runs the
same product code on CPU tensors and checks every cross-stream use against the events waited on
(tests/support/stream_double.py). The rule the product code follows:

- a tensor is used on another stream than the one that made it only after that stream waited on
  an event recorded after the tensor was made, and it is `record_stream`-ed there, so the
  caching allocator does not hand its memory out again while that stream may still read it;
- a pinned host buffer is kept alive until an event after the copy reading it has completed.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from morphpipe.sampling.minibatch import MiniBatch


class StreamApi(Protocol):
    """What the GPU-side code needs of streams and events (torch.cuda's, or a test double's)."""

    def Stream(self, device: torch.device) -> Any: ...  # noqa: N802 - mirrors torch.cuda.Stream

    def Event(self, enable_timing: bool = False) -> Any: ...  # noqa: N802 - mirrors torch.cuda.Event

    def current_stream(self, device: torch.device) -> Any: ...

    def stream(self, stream: Any) -> contextlib.AbstractContextManager: ...

    def device(self, device: torch.device) -> contextlib.AbstractContextManager: ...

    def record_stream(self, tensor: torch.Tensor, stream: Any) -> None: ...

    def copy_to(self, batch: MiniBatch, device: torch.device) -> MiniBatch: ...

    def synchronize(self, device: torch.device) -> None: ...


class CudaStreams:
    """torch.cuda's streams and events."""

    def Stream(self, device: torch.device) -> torch.cuda.Stream:  # noqa: N802
        return torch.cuda.Stream(device)

    def Event(self, enable_timing: bool = False) -> torch.cuda.Event:  # noqa: N802
        return torch.cuda.Event(enable_timing=enable_timing)

    def current_stream(self, device: torch.device) -> torch.cuda.Stream:
        return torch.cuda.current_stream(device)

    def stream(self, stream: torch.cuda.Stream) -> contextlib.AbstractContextManager:
        return torch.cuda.stream(stream)

    def device(self, device: torch.device) -> contextlib.AbstractContextManager:
        return torch.cuda.device(device)

    def record_stream(self, tensor: torch.Tensor, stream: torch.cuda.Stream) -> None:
        tensor.record_stream(stream)

    def copy_to(self, batch: MiniBatch, device: torch.device) -> MiniBatch:
        return batch.to(device, non_blocking=True)

    def synchronize(self, device: torch.device) -> None:
        torch.cuda.synchronize(device)


CUDA_STREAMS = CudaStreams()


def batch_tensors(batch: MiniBatch) -> Iterator[torch.Tensor]:
    """Every tensor a batch holds (ids, features, targets, block structure)."""
    yield from batch.tensors()
    for block in batch.blocks:
        yield from block.tensors()


def record_batch(api: StreamApi, batch: MiniBatch, stream: Any) -> None:
    """Marks every tensor of `batch` as used on `stream` (after `stream` waited on the batch's ready event)."""
    for tensor in batch_tensors(batch):
        api.record_stream(tensor, stream)


@dataclass
class Handoff:
    """How a batch made on its own stream is handed over: that stream, and events recorded before and after it."""

    stream: Any
    start: Any
    ready: Any
