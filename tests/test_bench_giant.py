"""scripts/bench_giant.py's physical bound: the room a limit leaves a cache, the least disk time a batch's misses
take, and the batches/s no reader of the disk can pass, checked on cases worked by hand."""
from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


@pytest.fixture(scope="module")
def bench_giant():
    spec = importlib.util.spec_from_file_location("bench_giant", SCRIPTS / "bench_giant.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_least_read_seconds_by_hand(bench_giant):
    # A disk of 1,000 random reads/s (1 ms a read) and 4,096,000 bytes/s: a read may span 4,096 bytes for one
    # slot, and costs its bytes beyond that.
    least = bench_giant.least_read_seconds
    # Rows 0-1 and 100 of 256 bytes: two reads (bytes 0-512 and 25600-25856), 2 ms; one read over all 25,856
    # bytes would take 6.3 ms.
    assert least([0, 256, 25600], [256, 512, 25856], 1000, 4_096_000) == (pytest.approx(0.002), 2)
    # Rows 0 and 20: one read over 5,376 bytes (1.3125 ms) beats two reads (2 ms).
    assert least([0, 5120], [256, 5376], 1000, 4_096_000) == (pytest.approx(5376 / 4_096_000), 1)
    # 64 rows back to back (16 KiB): the bytes bound it, 4 ms however they are split.
    seconds, _ = least([256 * k for k in range(64)], [256 * (k + 1) for k in range(64)], 1000, 4_096_000)
    assert seconds == pytest.approx(0.004)
    # Rows 0, 20 and 40: 0-20 in one read (1.3125 ms) and 40 alone (1 ms) cost 2.3125 ms, like 0 alone and 20-40
    # in one; all three in one read (10,496 bytes) 2.5625 ms, three reads 3 ms.
    assert least([0, 5120, 10240], [256, 5376, 10496], 1000, 4_096_000) == (pytest.approx(0.0023125), 2)
    # Rows bigger than the window cost their bytes each.
    assert least([0, 100_000], [10_000, 110_000], 1000, 4_096_000) == (pytest.approx(20_000 / 4_096_000), 2)
    assert least([], [], 1000, 4_096_000) == (0.0, 0)


def test_cache_room_is_the_share_less_the_topology(bench_giant, tmp_path):
    sizes = {}
    for name, shape in {"indptr": (11,), "indices": (40,), "features": (10, 16), "labels": (10,),
                        "train_idx": (5,), "val_idx": (2,), "test_idx": (3,)}.items():
        np.save(tmp_path / f"{name}.npy", np.zeros(shape, dtype=np.int64 if name != "indices" else np.int32))
        sizes[name] = (tmp_path / f"{name}.npy").stat().st_size
    total = sum(sizes.values())
    topology = sum(sizes[name] for name in ("indptr", "labels", "train_idx", "val_idx", "test_idx", "indices"))
    num_nodes = sizes["indptr"] // 8  # as the script counts them: the file's bytes over 8
    args = SimpleNamespace(limit_gib=None, working_gib=1.0)
    assert bench_giant.cache_room(tmp_path, 0.8, args) == pytest.approx(0.8 * total - topology - 4 * num_nodes)
    fixed = SimpleNamespace(limit_gib=2.0, working_gib=0.5)  # a fixed limit keeps the working room asked for
    assert bench_giant.cache_room(tmp_path, 0.8, fixed) == pytest.approx(
        0.8 * total - topology - 4 * num_nodes - 0.5 * 2**30)


def test_physical_bounds_on_a_saved_graph(bench_giant, tiny, tmp_path):
    directory = tmp_path / "tiny"
    tiny.save(directory)
    args = SimpleNamespace(limit_gib=None, working_gib=1.0, fanouts="3,2", batch_size=16, bound_batches=3)
    total = bench_giant.array_bytes(directory, bench_giant.ARRAYS)
    room_for_none = bench_giant.array_bytes(directory, bench_giant.IN_RAM + ("indices",)) / total
    room_for_all = 2 * total  # the share of the arrays whose room holds every row
    bounds = bench_giant.physical_bounds(directory, args, [room_for_none / 2, room_for_all / total], 100_000, 1e9)
    none, every = bounds.values()
    # No room: nothing cached, every row a batch reads is missed.
    assert none["cache_rows"] == 0 and none["hit_ratio_sampled"] == {"in-degree": 0.0, "expected-access": 0.0}
    assert none["missed_rows_per_batch"] == none["rows_per_batch"] > 0
    assert none["least_reads_per_batch"] <= none["missed_rows_per_batch"]
    assert none["store_reads_per_batch"] <= none["missed_rows_per_batch"]
    assert none["batches_per_s"] == pytest.approx(1 / none["least_disk_seconds_per_batch"])
    # Every read costs at least one slot of the random rate: no more than 100,000 reads/s over the least reads.
    assert none["batches_per_s"] <= 100_000 / none["least_reads_per_batch"] + 1e-9
    # Room for every row: no misses, no bound from the disk.
    assert every["cache_rows"] == tiny.num_nodes and every["missed_rows_per_batch"] == 0
    assert every["batches_per_s"] == math.inf
    assert "no bound from the disk" in bench_giant.bound_line(every)
    line = bench_giant.bound_line(none, mmap_rate=none["batches_per_s"] / 9.5)
    assert f"at most {none['batches_per_s']:.2f} batches/s" in line and "9.5x the memory map's" in line
    assert line.endswith("the goal of 10x is out of reach on this disk")
    assert bench_giant.bound_line(none, mmap_rate=none["batches_per_s"] / 10.5).endswith("within reach on this disk")
