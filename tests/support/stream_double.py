"""A recording double of the CUDA stream/event API, and the checker of stream discipline that runs on it.

`RecordingStreams` implements `morphpipe.sampling.streams.StreamApi` on the CPU: streams and
events carry vector clocks (a stream's clock counts the ops it ran and what it waited on), and,
inside `tracking()`, a TorchDispatchMode tags every tensor a stream's op makes with that stream
and its clock. Ops outside any stream context are host work (synchronous). Every later op is
checked:

- a tensor used on another stream than the one that made it must be covered by that stream's
  clock (it waited on an event recorded after the tensor was made), and `record_stream`-ed there;
- the host reading a tensor a stream made must have synchronised on an event that covers it;
- a host batch read by a copy (`copy_to`) must not be released (`watch_host`) before the host
  knows that copy completed.

Violations are collected in `violations`, never raised mid-run, so a test sees all of them.
"""
from __future__ import annotations

import contextlib
import itertools
import weakref
from collections.abc import Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from morphpipe.sampling.minibatch import Block, MiniBatch

Clock = dict[str, int]


def _merge(into: Clock, other: Clock) -> None:
    for name, count in other.items():
        into[name] = max(into.get(name, 0), count)


def _key(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


class FakeStream:
    """A stream: a name and a vector clock."""

    def __init__(self, api: RecordingStreams, name: str) -> None:
        self.api = api
        self.name = name
        self.clock: Clock = {name: 0}

    def tick(self) -> int:
        self.clock[self.name] += 1
        return self.clock[self.name]

    def wait_event(self, event: FakeEvent) -> None:
        self.api.log.append(("wait_event", self.name, event.stream_name))
        if event.clock is not None:
            _merge(self.clock, event.clock)

    def wait_stream(self, other: FakeStream) -> None:
        self.api.log.append(("wait_stream", self.name, other.name))
        _merge(self.clock, other.clock)

    def synchronize(self) -> None:
        _merge(self.api.host, self.clock)

    def __repr__(self) -> str:
        return f"FakeStream({self.name})"


class FakeEvent:
    """An event: the clock of the stream it was recorded on, at that moment."""

    def __init__(self, api: RecordingStreams) -> None:
        self.api = api
        self.clock: Clock | None = None
        self.stream_name: str | None = None
        self.tick: int | None = None

    def record(self, stream: FakeStream | None = None) -> None:
        stream = stream or self.api.current
        self.clock, self.stream_name = dict(stream.clock), stream.name
        self.tick = next(self.api.ticks)
        self.api.log.append(("record", stream.name))

    def wait(self, stream: FakeStream | None = None) -> None:
        (stream or self.api.current).wait_event(self)

    def synchronize(self) -> None:
        if self.clock is not None:
            _merge(self.api.host, self.clock)

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: FakeEvent) -> float:
        """Milliseconds between two records: one microsecond per API call in between (deterministic)."""
        return (end.tick - self.tick) * 1e-3


class RecordingStreams:
    """The StreamApi on the CPU, recording and checking every cross-stream use (see the module docstring)."""

    def __init__(self) -> None:
        self.default = FakeStream(self, "default")
        self.current = self.default
        self.explicit = 0  # depth of stream contexts: 0 means host work
        self.streams: list[FakeStream] = [self.default]
        self.host: Clock = {}
        self.ticks = itertools.count()
        self.producers: dict[int, tuple[str, int]] = {}
        self.copies: dict[int, tuple[str, int]] = {}  # id of a host batch -> (copy stream, its clock after the copy)
        self.recorded: set[tuple[int, str]] = set()
        self.cross_uses: dict[tuple[int, str], str] = {}
        self.violations: list[str] = []
        self.log: list[tuple] = []
        self.released_hosts = 0
        self._alive: list[torch.Tensor] = []  # keeps tracked storages from being reused for the whole run

    # --- StreamApi -----------------------------------------------------------------------------------------
    def Stream(self, device: torch.device) -> FakeStream:  # noqa: N802
        stream = FakeStream(self, f"s{len(self.streams)}")
        self.streams.append(stream)
        return stream

    def Event(self, enable_timing: bool = False) -> FakeEvent:  # noqa: N802
        return FakeEvent(self)

    def current_stream(self, device: torch.device) -> FakeStream:
        return self.current

    @contextlib.contextmanager
    def stream(self, stream: FakeStream) -> Iterator[None]:
        saved = self.current
        self.current, self.explicit = stream, self.explicit + 1
        try:
            yield
        finally:
            self.current, self.explicit = saved, self.explicit - 1

    def device(self, device: torch.device) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def record_stream(self, tensor: torch.Tensor, stream: FakeStream) -> None:
        if tensor.numel():
            self.recorded.add((_key(tensor), stream.name))

    def copy_to(self, batch: MiniBatch, device: torch.device) -> MiniBatch:
        """A copy engine: fresh tensors made by ops on the current stream (the copy stream)."""
        blocks = [Block(b.indptr.clone(), b.indices.clone(), b.num_src, b.num_dst) for b in batch.blocks]
        copy = MiniBatch(batch.seeds.clone(), batch.input_nodes.clone(), blocks, batch.x.clone(), batch.y.clone(),
                         batch.batch_index, batch.route)
        self.copies[id(batch)] = (self.current.name, self.current.clock[self.current.name])
        return copy

    def synchronize(self, device: torch.device) -> None:
        for stream in self.streams:
            _merge(self.host, stream.clock)

    # --- checking ------------------------------------------------------------------------------------------
    def on_op(self, func, inputs: list[torch.Tensor]) -> tuple[str | None, int]:
        """Checks an op's reads; returns (stream name or None for host work, its clock count)."""
        if self.explicit == 0:
            where, clock, count = None, self.host, 0
        else:
            where, clock = self.current.name, self.current.clock
            count = self.current.tick()
        for tensor in inputs:
            if tensor.numel() == 0:
                continue
            key = _key(tensor)
            producer = self.producers.get(key)
            if producer is not None and producer[0] != where:
                made_on, made_at = producer
                reader = where or "host"
                if clock.get(made_on, 0) < made_at:
                    self.violations.append(f"{func} on {reader} reads a tensor made on {made_on} (op {made_at}) "
                                           "without waiting on an event recorded after it")
                if where is not None:
                    self.cross_uses[(key, where)] = str(func)
        return where, count

    def on_outputs(self, func, inputs: list[torch.Tensor], outputs: list[torch.Tensor], where: str | None,
                   count: int) -> None:
        if where is None:
            return
        read = {_key(t) for t in inputs if t.numel()}
        for tensor in outputs:
            if tensor.numel() == 0:
                continue
            key = _key(tensor)
            if key in read and not func._schema.is_mutable:
                continue
            self.producers[key] = (where, count)
            self._alive.append(tensor)

    def watch_host(self, batch: MiniBatch) -> None:
        """Checks, when `batch` (a host batch) is released, that every copy reading it had completed."""
        weakref.finalize(batch, self._host_released, id(batch))

    def _host_released(self, ident: int) -> None:
        self.released_hosts += 1
        copied = self.copies.pop(ident, None)
        if copied is not None and self.host.get(copied[0], 0) < copied[1]:
            self.violations.append(f"a host buffer was released while the copy on {copied[0]} reading it "
                                   f"(op {copied[1]}) was not known to have completed")

    def missing_record_streams(self) -> list[str]:
        """Cross-stream uses of tensors never `record_stream`-ed on the stream that used them."""
        return [f"{op} used a tensor on {stream} that was not record_stream-ed there"
                for (key, stream), op in self.cross_uses.items() if (key, stream) not in self.recorded]

    @contextlib.contextmanager
    def tracking(self) -> Iterator[RecordingStreams]:
        """Runs the block with every aten op on this thread checked and tagged."""
        with _Tracker(self):
            yield self


class _Tracker(TorchDispatchMode):
    def __init__(self, api: RecordingStreams) -> None:
        super().__init__()
        self.api = api

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "is_view", False):
            return func(*args, **kwargs)
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        where, count = self.api.on_op(func, inputs)
        out = func(*args, **kwargs)
        outputs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        self.api.on_outputs(func, inputs, outputs, where, count)
        return out
