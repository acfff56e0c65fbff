"""The batchers' buffer pool holds flat memory however batch sizes vary (issue 25: resident memory flat over epochs).

A pool that lets a small tensor take a large idle buffer makes the next large tensor allocate another one, so
every buffer in circulation drifts towards the largest size ever asked for: batching alone on the default preset
grew by some 150 MiB an epoch. An idle buffer must serve only requests of at least half its size.
"""
from __future__ import annotations

from morphpipe import native

MIB = 1 << 20


def test_a_small_request_does_not_take_a_large_idle_buffer() -> None:
    pool = native.load().BufferPool(8)
    large = pool.empty(MIB)
    held = pool.held_bytes
    assert held >= MIB
    del large  # back to the pool, idle
    small = pool.empty(100_000)  # above the small-request floor, a tenth of the idle buffer
    assert pool.held_bytes > held, "the small request got a buffer of its own"
    before = pool.held_bytes
    again = pool.empty(MIB)
    assert pool.held_bytes == before, "the large request reused the idle large buffer"
    assert again.numel() == MIB and small.numel() == 100_000


def test_a_request_near_an_idle_buffers_size_reuses_it() -> None:
    pool = native.load().BufferPool(4)
    first = pool.empty(MIB)
    held = pool.held_bytes
    del first
    assert held >= MIB  # the pool adds headroom: the idle buffer may be larger than the first request
    near = held // 2 + 1  # just over half the idle buffer: still served by it
    reused = pool.empty(near)
    assert pool.held_bytes == held and reused.numel() == near
