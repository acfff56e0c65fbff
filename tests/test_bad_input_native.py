"""Malformed CSCs and shrinking memory-mapped files never crash the process or corrupt its memory.

Each scenario runs in a child process (a bug here is a signal, which would take pytest down): the child
tries every malformed input through one entry point and prints one JSON line per case; the parent asserts
that the child exited normally and that every case raised an error naming the problem.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

CHILD_SETUP = textwrap.dedent("""
    import json, sys, warnings
    import numpy as np
    import torch
    from morphpipe.data import GraphStore, build_csc
    from morphpipe.sampling.cpu_batcher import CpuBatcher, sample_neighbors

    warnings.simplefilter("ignore")
    tmp = sys.argv[1]
    # 6 nodes, 9 edges; every node has in-neighbours, so every range is read.
    src = [1, 2, 3, 4, 5, 0, 2, 3, 4]
    dst = [0, 1, 2, 3, 4, 5, 0, 1, 2]
    INDPTR, INDICES = build_csc(src, dst, 6)

    def malformed(kind):
        indptr = INDPTR.clone()
        if kind == "dips":          # node 2's range runs backwards
            indptr[3] = indptr[2] - 2
        elif kind == "below-zero":  # the first range starts before the indices buffer
            indptr[0] = -1000
        elif kind == "past-nnz":    # a range ends far past the last edge
            indptr[3] = 10**9
        return indptr

    def store_from_tensors(indptr):
        return GraphStore(indptr=indptr, indices=INDICES.clone(), features=torch.ones(6, 4),
                          labels=torch.zeros(6, dtype=torch.long), train_idx=torch.arange(6),
                          val_idx=torch.zeros(0, dtype=torch.long), test_idx=torch.zeros(0, dtype=torch.long),
                          num_classes=2)

    def store_from_disk(indptr, kind):
        good = store_from_tensors(INDPTR.clone())
        good.save(f"{tmp}/{kind}")
        np.save(f"{tmp}/{kind}/indptr.npy", indptr.numpy())
        return GraphStore.load(f"{tmp}/{kind}", validate=False)

    def report(case, action):
        try:
            action()
        except Exception as error:
            print(json.dumps({"case": case, "type": type(error).__name__, "message": str(error)}), flush=True)
        else:
            print(json.dumps({"case": case, "type": None, "message": ""}), flush=True)

    def cpu_batcher_epoch(store):
        with CpuBatcher(store, [-1, -1], 2, num_threads=2, seed=0) as batcher:
            for _ in batcher:
                pass
""")

SAMPLE = CHILD_SETUP + textwrap.dedent("""
    for kind in ("dips", "below-zero", "past-nnz"):
        report(f"tensors/{kind}",
               lambda: sample_neighbors(store_from_tensors(malformed(kind)), list(range(6)), [-1, -1]))
        report(f"disk/{kind}", lambda: sample_neighbors(store_from_disk(malformed(kind), kind), list(range(6)), [3, 3]))
""")

BATCHER = CHILD_SETUP + textwrap.dedent("""
    for kind in ("dips", "below-zero", "past-nnz"):
        report(f"tensors/{kind}", lambda: cpu_batcher_epoch(store_from_tensors(malformed(kind))))
        report(f"disk/{kind}", lambda: cpu_batcher_epoch(store_from_disk(malformed(kind), kind)))
""")

TRUNCATED = CHILD_SETUP + textwrap.dedent("""
    good = store_from_tensors(INDPTR.clone())
    good.features = torch.ones(6, 4096)  # 96 KiB of features: several pages to lose
    good.save(f"{tmp}/graph")
    store = GraphStore.load(f"{tmp}/graph")
    batcher = CpuBatcher(store, [2, 2], 2, num_threads=1, seed=0)
    list(batcher)  # one good epoch
    with open(f"{tmp}/graph/features.npy", "r+b") as handle:
        handle.truncate(4096)
    report("cpu-batcher-next-epoch", lambda: list(batcher))
    report("sample-neighbors", lambda: sample_neighbors(store, [0, 1], [2, 2]))
    batcher.close()
    report("reload", lambda: GraphStore.load(f"{tmp}/graph"))
""")


def run_child(script: str, tmp_path: Path) -> list[dict]:
    """Runs `script` in a fresh interpreter; returns its JSON lines after checking that no signal killed it."""
    completed = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True,
                               timeout=300, env={**os.environ, "PYTHONFAULTHANDLER": "1"})
    assert completed.returncode >= 0, (
        f"killed by signal {signal.Signals(-completed.returncode).name}:\n{completed.stdout}\n{completed.stderr}")
    assert completed.returncode == 0, completed.stderr
    return [json.loads(line) for line in completed.stdout.splitlines() if line.startswith("{")]


@pytest.mark.parametrize("script", [SAMPLE, BATCHER], ids=["sample_neighbors", "CpuBatcher"])
def test_malformed_indptr_is_refused_naming_the_node(script: str, tmp_path: Path) -> None:
    results = run_child(script, tmp_path)
    assert [result["case"] for result in results] == [f"{origin}/{kind}" for kind in ("dips", "below-zero", "past-nnz")
                                                      for origin in ("tensors", "disk")]
    for result in results:
        assert result["type"] == "RuntimeError", result
        assert result["message"].startswith("indptr: node "), result
        assert "neighbour range" in result["message"] and "fix:" in result["message"], result


def test_truncated_memory_mapped_file_is_refused_before_it_is_read(tmp_path: Path) -> None:
    results = {result["case"]: result for result in run_child(TRUNCATED, tmp_path)}
    for case in ("cpu-batcher-next-epoch", "sample-neighbors"):
        assert results[case]["type"] == "GraphValidationError", results[case]
        assert "features.npy shrank from" in results[case]["message"], results[case]
    assert results["reload"]["type"] == "GraphValidationError"
    assert "features" in results["reload"]["message"] and "cut short" in results["reload"]["message"]
