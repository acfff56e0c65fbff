"""External-memory CSC build: equal to the in-memory build whatever the number of sorted runs, and its plan."""
from __future__ import annotations

import numpy as np
import pytest

from morphpipe.data.csc import build_csc_arrays, pack_edge_keys
from morphpipe.data.external_csc import KEY_BYTES, SPILL_FILE, SortPlan, build_csc_on_disk
from morphpipe.data.ondisk import load_array


def random_edges(seed: int, num_nodes: int, num_edges: int) -> tuple[np.ndarray, np.ndarray]:
    """int64 endpoints with duplicates, self loops and (num_nodes well above the ids drawn) isolated nodes."""
    rng = np.random.default_rng(seed)
    used = max(2, num_nodes // 2)
    src = rng.integers(0, used, num_edges, dtype=np.int64)
    dst = rng.integers(0, used, num_edges, dtype=np.int64)
    src[: num_edges // 10] = dst[: num_edges // 10]  # self loops
    src[-50:], dst[-50:] = src[:50], dst[:50]  # exact duplicates
    src[0], dst[0] = num_nodes - 1, num_nodes - 1  # the largest id, as a self loop
    return src, dst


def chunks_of(keys: np.ndarray, size: int):
    """The keys in chunks through one reused buffer, as the generators hand them out."""
    buffer = np.empty(size, dtype=np.int64)
    for start in range(0, keys.size, size):
        part = keys[start:start + size]
        buffer[:part.size] = part
        yield buffer[:part.size]
        buffer[:] = -1  # the builder must have copied the chunk already


def budget_for_runs(num_keys: int, runs: int) -> int:
    """The smallest budget whose sort plan has at most `runs` runs (the count falls as the budget grows)."""
    low, high = 1, 64 * num_keys * KEY_BYTES
    while low < high:
        middle = (low + high) // 2
        low, high = (low, middle) if SortPlan.for_budget(num_keys, middle).num_runs <= runs else (middle + 1, high)
    return low


@pytest.mark.parametrize("runs", [1, 2, 7, 60])
@pytest.mark.parametrize("dedupe,drop_self_loops", [(True, True), (False, False), (True, False)])
def test_equals_in_memory_build(tmp_path, runs, dedupe, drop_self_loops):
    num_nodes = 3_000_000  # keys dst * N + src well beyond 2**32
    src, dst = random_edges(runs, num_nodes, 20_000)
    keys = pack_edge_keys(src, dst, num_nodes, make_undirected=True)
    budget = budget_for_runs(keys.size, runs)
    plan = SortPlan.for_budget(keys.size, budget)
    assert plan.num_runs == runs
    indptr, num_edges = build_csc_on_disk(chunks_of(keys, 1_234), keys.size, num_nodes, tmp_path,
                                          memory_budget=budget, dedupe=dedupe, drop_self_loops=drop_self_loops)
    expected_indptr, expected_indices = build_csc_arrays(src, dst, num_nodes, make_undirected=True, dedupe=dedupe,
                                                         drop_self_loops=drop_self_loops)
    indices = load_array(tmp_path, "indices", mmap=False)
    assert np.array_equal(indptr, expected_indptr)
    assert indices.dtype == expected_indices.dtype and np.array_equal(indices, expected_indices)
    assert num_edges == expected_indices.size
    assert not (tmp_path / SPILL_FILE).exists()


def test_many_runs_with_tiny_blocks_and_sorted_input(tmp_path):
    """Already sorted and reverse sorted input (runs that do not overlap at all) through one-key merge blocks."""
    num_nodes = 500
    src, dst = random_edges(3, num_nodes, 600)
    keys = np.sort(pack_edge_keys(src, dst, num_nodes))[::-1].copy()
    plan = SortPlan.for_budget(keys.size, 64)
    assert plan.num_runs == 200 and plan.block_keys == 1
    indptr, _ = build_csc_on_disk(chunks_of(keys, 999), keys.size, num_nodes, tmp_path, memory_budget=64)
    expected_indptr, expected_indices = build_csc_arrays(src, dst, num_nodes)
    assert np.array_equal(indptr, expected_indptr)
    assert np.array_equal(load_array(tmp_path, "indices", mmap=False), expected_indices)


def test_no_edges(tmp_path):
    indptr, num_edges = build_csc_on_disk(iter(()), 0, 4, tmp_path, memory_budget=1 << 20)
    assert indptr.tolist() == [0, 0, 0, 0, 0] and num_edges == 0
    assert load_array(tmp_path, "indices", mmap=False).shape == (0,)


@pytest.mark.parametrize("given", [9, 11])
def test_key_count_must_match_the_announced_count(tmp_path, given):
    keys = np.arange(given, dtype=np.int64)
    with pytest.raises(ValueError, match="10 announced"):
        build_csc_on_disk(chunks_of(keys, 4), 10, 100, tmp_path, memory_budget=100)
    assert sorted(path.name for path in tmp_path.iterdir()) == []


def test_plan_spills_only_beyond_the_budget():
    assert SortPlan.for_budget(1_000, 1 << 30).num_runs == 1
    assert SortPlan.for_budget(1_000, 1 << 30).spill_bytes == 0
    plan = SortPlan.for_budget(10**9, 2 << 30)
    assert plan.num_runs == 5 and plan.spill_bytes == 8 * 10**9
    assert plan.run_keys * KEY_BYTES + plan.decode_keys * 34 <= 2 << 30
    assert plan.num_runs * plan.block_keys * 16 <= 2 << 30
    with pytest.raises(ValueError, match="budget"):
        SortPlan.for_budget(10, 0)


def test_minimum_budget_keeps_the_runs_few():
    assert SortPlan.minimum_bytes(1_000) == 1_000 * 42  # small inputs: one run in memory
    assert SortPlan.minimum_bytes(10**6) == 1 << 20
    for num_keys in (10**8, 16 * 10**8):
        assert SortPlan.for_budget(num_keys, SortPlan.minimum_bytes(num_keys)).num_runs <= 256
