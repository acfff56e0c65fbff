"""Fixtures and helpers shared by the command tests: a small graph, a stand-in Profiler, a directory's bytes."""
from __future__ import annotations

from pathlib import Path

import pytest

from morphpipe.data import GeneratorSpec, generate
from morphpipe.profiler.profile import Profile


@pytest.fixture(scope="module")
def graph_dir(tmp_path_factory) -> Path:
    """A small graph to train, bench and tune on, and to be replaced by convert and generate."""
    path = tmp_path_factory.mktemp("small-graph") / "graph"
    generate(GeneratorSpec(kind="community", num_nodes=300, avg_degree=4, feature_dim=8), path, progress=False)
    return path


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file under `directory` (hidden ones included) with its bytes."""
    return {str(path.relative_to(directory)): path.read_bytes() if path.is_file() else b"<dir>"
            for path in sorted(directory.rglob("*"))}


class SyntheticProfiler:
    """Stands in for the Profiler of `tune` and `train --auto` (what is tested is how they write files): a CPU-only
    profile of the small graph's 3 batches per epoch (180 training seeds, batches of 64), recording the precision
    it was asked for as the Profiler does ("auto" settles on float32 here)."""

    def __init__(self, *args, precision: str = "float32", **kwargs) -> None:
        self.precision = "float32" if precision == "auto" else precision

    def run(self) -> Profile:
        return Profile.synthetic(t_cb=0.004, t_m=0.006, num_batches=3, cores=2).replaced(
            workload={"precision": self.precision})
