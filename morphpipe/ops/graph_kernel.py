"""The selector for whole-graph layers (AdaptGear): plain CSR or a community decomposition, by timing each once.

On the first call for a full-graph layer shape (graph fingerprint, width, kind, dtype, device),
every candidate (`csr`, and the decompositions into communities of 16, 32 and 64 nodes) runs
once on the call's own input and the fastest is kept for that shape (SENSEi: timing each
candidate once on the first inputs lands within ~2% of a learned cost model). The choice goes
through `morphpipe.ops.choice` as the other op choices do: decision `graph.kernel`, logged
once, counted per call, forceable (`force_choices({"graph.kernel": "community32"})`,
`MORPHPIPE_FORCE_CHOICE=graph.kernel=csr`). A decomposition with no edge inside a community
is no candidate (it only adds work). Tests inject timings with `use_timer`.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import Tensor

from morphpipe.ops import choice
from morphpipe.ops.community import GraphBlock, decomposed_sum
from morphpipe.sampling.minibatch import Block

DECISION = "graph.kernel"
CSR = "csr"
COMMUNITY_SIZES = (16, 32, 64)
REPEATS = 2

# Seconds of one candidate: timer(option, run) where run() computes the candidate's output once.
Timer = Callable[[str, Callable[[], object]], float]


def option_name(size: int) -> str:
    """The `graph.kernel` option of communities of at most `size` nodes."""
    return f"community{size}"


OPTIONS: tuple[str, ...] = (CSR, *(option_name(size) for size in COMMUNITY_SIZES))


def measured_seconds(option: str, run: Callable[[], object]) -> float:
    """Best of `REPEATS` timed runs after one warm-up, without autograd, synchronising CUDA.

    On the CPU it times one intra-op thread, as the cost model's calibration does: on a shared
    machine a multi-threaded op waits whole time slices for a descheduled thread, while one
    thread's timings are stable, and every candidate parallelises over rows alike.
    """
    del option
    cuda = torch.cuda.is_available()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            run()
            best = math.inf
            for _ in range(REPEATS):
                if cuda:
                    torch.cuda.synchronize()
                start = time.perf_counter()
                run()
                if cuda:
                    torch.cuda.synchronize()
                best = min(best, time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)
    return best


_timer: ContextVar[Timer] = ContextVar("morphpipe_graph_kernel_timer", default=measured_seconds)


@contextmanager
def use_timer(timer: Timer) -> Iterator[None]:
    """Times the candidates of every measured choice (this selector's, `relation_stack`'s) with `timer` inside the
    block (tests make the decisions deterministic this way)."""
    token = _timer.set(timer)
    try:
        yield
    finally:
        _timer.reset(token)


def current_timer() -> Timer:
    """The timer measured choices use now: `measured_seconds`, or a test's from `use_timer`."""
    return _timer.get()


def graph_sum(block: GraphBlock, x: Tensor, src_scale: Tensor | None, dst_scale: Tensor | None, self_loop: bool,
              kind: str, csr_sum: Callable[[], Tensor],
              inter_sum: Callable[[Block, Tensor, Tensor | None, Tensor | None], Tensor]) -> Tensor:
    """`dst_scale * (A (src_scale * x) + self loop)` on a whole-graph layer by the kernel the selector keeps.

    `csr_sum()` is the plain kernel's result for this call; `inter_sum(block, x, src_scale,
    dst_scale)` the plain CSR scaled sum the decomposition uses for its inter-community edges.
    `kind` ("sum", "mean", "gcn") determines the scales on a whole graph, so the decomposition
    keeps its scaled dense blocks under it.
    """
    def decomposed(size: int) -> Callable[[], Tensor]:
        return lambda: decomposed_sum(block.decomposition(size), x, src_scale, dst_scale, self_loop, inter_sum,
                                      scale_key=kind)

    candidates: dict[str, Callable[[], Tensor]] = {CSR: csr_sum}
    candidates.update({option_name(size): decomposed(size) for size in COMMUNITY_SIZES})

    def timings() -> dict[str, float]:
        timer = current_timer()
        seconds = {}
        for option, run in candidates.items():
            size = None if option == CSR else int(option.removeprefix("community"))
            if size is not None and block.decomposition(size).intra_edges == 0:
                seconds[option] = math.inf
                continue
            seconds[option] = timer(option, run)
        return seconds

    signature = (kind, block.device.type, str(x.dtype).removeprefix("torch."), block.fingerprint[:16], x.shape[1],
                 src_scale is not None, dst_scale is not None, self_loop)
    chosen = choice.choose(DECISION, signature, timings, OPTIONS, reason="timed")
    return candidates[chosen]()
