"""The reusing CPU allocator (`morphpipe.ops.cpu_memory`): freed large blocks are lent again, what it holds stays
within the most ever lent at once, small tensors pass through, and training computes the same with it as without."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from morphpipe.nn import build_model
from morphpipe.nn.train_step import TrainStep, make_optimizer
from morphpipe.ops.cpu_memory import (REUSE_ENV, REUSE_MAX_WASTE, REUSE_MIN_BYTES, WASTE_ENV, cpu_memory_reuse,
                                      release_idle_cpu_memory, reuse_cpu_memory, reuse_line, reuse_max_waste,
                                      reuse_wanted)
from morphpipe.sampling import CpuBatcher

MIB = 2**20

# In a fresh process (nothing lent before, so the peak starts at 0): the rules, step by step, as JSON.
RULES_SCRIPT = """
import json, torch
from morphpipe.ops.cpu_memory import cpu_memory_reuse, reuse_cpu_memory
MIB = 2**20
def state(**extra):
    s = cpu_memory_reuse()
    return {"hits": s.hits, "misses": s.misses, "oversized": s.oversized, "released": s.released, "waste": s.max_waste,
            "lent": s.lent_bytes // MIB, "idle": s.idle_bytes // MIB, "peak": s.peak_bytes // MIB, **extra}
reuse_cpu_memory()
seen = []
a = torch.empty(8 * MIB, dtype=torch.uint8)
del a
seen.append(state())                       # 8 MiB idle, peak 8
b = torch.empty(12 * MIB, dtype=torch.uint8)
seen.append(state())                       # no idle block holds 12 MiB: the 8 MiB one goes first, peak 12
del b
c = torch.empty(3 * MIB, dtype=torch.uint8)
seen.append(state())                       # the 12 MiB block is over twice the 4 MiB request: released, fresh 4 MiB
d = torch.empty(5 * MIB, dtype=torch.uint8)
seen.append(state())                       # fresh 6 MiB (2 MiB steps), nothing idle
del c, d
e = torch.empty(2 * MIB, dtype=torch.uint8)
seen.append(state())                       # the 4 MiB block is exactly twice the request: lent
f = torch.empty(5 * MIB, dtype=torch.uint8)
seen.append(state())                       # the 6 MiB block: lent
print(json.dumps(seen))
"""

# Three SAGE steps on the tiny preset's first batches, wide enough that activations pass 2 MiB: the losses.
STEPS_SCRIPT = """
import json, torch
from morphpipe.data import load_dataset
from morphpipe.nn import build_model
from morphpipe.nn.train_step import TrainStep, make_optimizer
from morphpipe.ops.cpu_memory import cpu_memory_reuse
from morphpipe.sampling import CpuBatcher
torch.set_num_threads(1)
graph = load_dataset("tiny", progress=False)
with CpuBatcher(graph, [5, 5, 5], 256, num_threads=1, seed=0) as batcher:
    batches = [batch for _, batch in zip(range(3), batcher)]
torch.manual_seed(0)
model = build_model("sage", graph.feature_dim, graph.num_classes, hidden=2048)
step = TrainStep(model, make_optimizer(model.parameters(), 3e-3, "cpu"))
losses = [float(step(batch)) for batch in batches]
print(json.dumps({"losses": losses, "hits": cpu_memory_reuse().hits}))
"""


def run(script: str, **environment: str) -> object:
    """`script`'s JSON output, run in a fresh Python with `environment` added."""
    result = subprocess.run([sys.executable, "-c", script], env={**os.environ, **environment}, capture_output=True,
                            text=True, check=True, timeout=300)
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_freed_blocks_are_lent_again_within_the_peak_and_never_to_a_request_under_half_their_size() -> None:
    seen = run(RULES_SCRIPT)
    keys = ("hits", "misses", "oversized", "released", "lent", "idle", "peak")
    expected = [(0, 1, 0, 0, 0, 8, 8), (0, 2, 0, 1, 12, 0, 12), (0, 3, 1, 2, 4, 0, 12), (0, 4, 1, 2, 10, 0, 12),
                (1, 4, 1, 2, 4, 6, 12), (2, 4, 1, 2, 10, 0, 12)]
    assert [tuple(state[key] for key in keys) for state in seen] == expected
    for state in seen:
        assert state["lent"] + state["idle"] <= state["peak"]
        assert state["waste"] == REUSE_MAX_WASTE == 2


def test_without_the_waste_limit_any_idle_block_that_holds_the_request_is_lent() -> None:
    seen = run(RULES_SCRIPT, **{WASTE_ENV: "0"})
    assert seen[2]["hits"] == 1 and seen[2]["oversized"] == 0 and seen[2]["lent"] == 12  # the rule before the limit
    for state in seen:
        assert state["lent"] + state["idle"] <= state["peak"] and state["waste"] == 0


def test_the_waste_limit_is_read_from_the_environment_and_bad_values_are_refused() -> None:
    assert reuse_max_waste({}) == REUSE_MAX_WASTE
    assert reuse_max_waste({WASTE_ENV: "0"}) == 0
    assert reuse_max_waste({WASTE_ENV: " 4 "}) == 4
    for value in ("-1", "half", "1.5", ""):
        with pytest.raises(ValueError, match=f"{WASTE_ENV}='{value}': set it to an integer of at least 1"):
            reuse_max_waste({WASTE_ENV: value})
        assert reuse_line({WASTE_ENV: value}).startswith("not chosen: ")
    assert "lent to requests of at least 1/2 of a block" in reuse_line({})
    assert "lent to any request" in reuse_line({WASTE_ENV: "0"})


def test_a_freed_block_comes_back_to_the_next_request_it_holds_and_small_ones_pass_through() -> None:
    reuse_cpu_memory()
    release_idle_cpu_memory()  # blocks of earlier tests could serve the request first
    before = cpu_memory_reuse()
    tensor = torch.empty(8 * MIB, dtype=torch.uint8)
    pointer = tensor.data_ptr()
    del tensor
    again = torch.empty(7 * MIB, dtype=torch.uint8)
    assert again.data_ptr() == pointer
    assert torch.equal(torch._lazy_clone(again), again)  # a "simple" data pointer, as copy-on-write clones need
    small = torch.ones(REUSE_MIN_BYTES // 4 - 1, dtype=torch.float32)  # just under the threshold
    after = cpu_memory_reuse()
    assert (after.hits - before.hits, after.misses - before.misses) == (1, 1)
    assert after.lent_bytes - before.lent_bytes == 8 * MIB  # the block's whole capacity; `small` is not counted
    assert float(small.sum()) == small.numel()
    assert release_idle_cpu_memory() == 0  # `again` holds the only block this test made
    del again
    assert cpu_memory_reuse().idle_bytes >= 8 * MIB


def test_training_steps_compute_the_same_with_reuse_as_without(tiny) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with CpuBatcher(tiny, [5, 5, 5], 256, num_threads=1, seed=0) as batcher:
            batches = [batch for _, batch in zip(range(3), batcher)]
        torch.manual_seed(0)
        model = build_model("sage", tiny.feature_dim, tiny.num_classes, hidden=2048)
        step = TrainStep(model, make_optimizer(model.parameters(), 3e-3, "cpu"))  # installs the reuse
        hits = cpu_memory_reuse().hits
        losses = [float(step(batch)) for batch in batches]
        assert cpu_memory_reuse().hits > hits  # the steps' activations did reuse freed blocks
    finally:
        torch.set_num_threads(threads)
    without = run(STEPS_SCRIPT, **{REUSE_ENV: "0"})
    assert without["hits"] == 0  # the opt-out kept torch's own allocator
    assert losses == without["losses"]


def test_the_user_can_opt_out() -> None:
    assert reuse_wanted({})
    assert reuse_wanted({REUSE_ENV: "1"})
    assert not reuse_wanted({REUSE_ENV: "0"})
    assert not reuse_wanted({REUSE_ENV: ""})
    assert reuse_line({REUSE_ENV: "0"}).startswith("off")
    for value in ("false", "off", "2"):
        with pytest.raises(ValueError, match=f"{REUSE_ENV}='{value}': set it to 0 .* or 1"):
            reuse_wanted({REUSE_ENV: value})
        assert reuse_line({REUSE_ENV: value}).startswith("not chosen: ")
    assert reuse_line({}).startswith("on (blocks of 2 MiB or more")


def test_the_profiler_sees_reused_blocks_come_and_go():
    """torch.profiler's memory view counts a lent block as allocated and an idle one as freed, the first lending
    or a later one alike (a test measuring allocations with it must see a reused block)."""
    reuse_cpu_memory()
    torch.empty(8 * MIB, dtype=torch.uint8)  # freed at once: an idle block that holds the next request
    hits = cpu_memory_reuse().hits
    with torch.profiler.profile(profile_memory=True) as profile:
        block = torch.empty(8 * MIB, dtype=torch.uint8)
        del block
    sizes = [event.cpu_memory_usage for event in profile.events()]
    assert max(sizes) >= 8 * MIB and min(sizes) <= -8 * MIB
    assert cpu_memory_reuse().hits > hits or not reuse_wanted()
