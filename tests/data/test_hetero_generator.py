"""The out-of-core build of the mag-shaped graph: the same graph as the in-memory build whatever the budget, in
bounded memory, refusing a budget below its minimum with the number, and leaving the previous dataset on failure."""
from __future__ import annotations

import errno
import tracemalloc
from pathlib import Path

import pytest

from morphpipe.commands.cli import main
from morphpipe.data import external_csc, hetero_generator
from morphpipe.data.hetero_generator import MAG_RELATIONS, MagSpec, generate_hetero, mag_generation_needs, mag_shaped
from morphpipe.data.hetero_store import HeteroGraphStore
from morphpipe.data.presets import PRESETS
from tests.data.conftest import assert_same_graph

# Twenty citations per paper: the cites relation is large enough for its sort to spill many runs at the minimum budget.
SPEC = MagSpec(num_papers=20_000, num_authors=15_000, num_institutions=40, num_fields=300, feature_dim=16,
               citations=20)


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    """Chunks of 2,048 papers: many chunks per relation, and chunk buffers small enough for small budgets."""
    monkeypatch.setattr(hetero_generator, "CHUNK_PAPERS", 2048)
    monkeypatch.setattr(hetero_generator, "FEATURE_CHUNK_VALUES", 1 << 14)


def file_bytes(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir())}


def budget_for_runs(spec: MagSpec, runs: str) -> int:
    """A budget under which the largest relation's sort takes one run, exactly two, or many (the minimum budget)."""
    minimum = mag_generation_needs(spec, 1).minimum
    if runs == "one":
        return minimum * 8
    if runs == "many":
        return minimum
    low, high = minimum, minimum * 8  # the fewest runs grow as the budget shrinks: find the budget giving two
    while high - low > 1024:
        middle = (low + high) // 2
        low, high = (middle, high) if mag_generation_needs(spec, middle).sort.num_runs > 2 else (low, middle)
    return high


@pytest.mark.parametrize("runs", ["one", "two", "many"])
def test_the_out_of_core_build_equals_the_in_memory_build(tmp_path, runs):
    budget = budget_for_runs(SPEC, runs)
    needs = mag_generation_needs(SPEC, budget)
    assert needs.sort.num_runs == {"one": 1, "two": 2}.get(runs, needs.sort.num_runs) and \
        (runs != "many" or needs.sort.num_runs > 4), needs.sort
    generate_hetero(SPEC, tmp_path / "g", progress=False, memory_budget=budget)
    built = HeteroGraphStore.load(tmp_path / "g")
    expected = mag_shaped(SPEC)
    assert_same_graph(built, expected)
    for relation in MAG_RELATIONS:
        assert built.indices[relation].dtype == expected.indices[relation].dtype
    assert built.source == expected.source and not list(tmp_path.glob("g/.*")), "no spill file is left behind"


def test_peak_memory_stays_within_the_budget_as_the_graph_grows(tmp_path):
    """At 1x and 4x the papers under one budget, the build's peak (tracemalloc: numpy's buffers included) stays within
    the budget, although the larger graph is several times the budget on disk."""
    small = SPEC.with_overrides(citations=6)
    large = small.scaled_to(4 * small.num_papers)
    budget = mag_generation_needs(large, 1).minimum
    peaks = {}
    for name, spec in (("small", small), ("large", large)):
        tracemalloc.start()
        generate_hetero(spec, tmp_path / name, progress=False, memory_budget=budget)
        peaks[name] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    graph_bytes = sum(path.stat().st_size for path in (tmp_path / "large").iterdir())
    assert graph_bytes > 3 * budget
    assert max(peaks.values()) <= budget, (peaks, budget)
    assert mag_generation_needs(large, budget).sort.num_runs > 1, "the large graph's edges are sorted out of core"


def test_a_budget_below_the_minimum_is_refused_with_the_number(tmp_path, capsys):
    minimum = mag_generation_needs(SPEC, 1).minimum
    with pytest.raises(ValueError, match=rf"20,000 papers need about .* chunk buffers .*--memory-budget is 1\.0 MiB; "
                                         rf"fix: --memory-budget {-(-minimum // 2**20)}M or more"):
        generate_hetero(SPEC, tmp_path / "g", progress=False, memory_budget=1 << 20)
    assert not (tmp_path / "g").exists()
    assert main(["data", "generate", "mag-tiny", "-o", str(tmp_path / "t"), "--memory-budget", "1M", "--quiet"]) == 2
    assert "fix: --memory-budget" in capsys.readouterr().err and not (tmp_path / "t").exists()


@pytest.mark.parametrize("where", ["sort runs", "features"])
def test_an_interrupted_build_leaves_the_previous_dataset_intact(tmp_path, monkeypatch, where):
    small = SPEC.with_overrides(num_papers=3000, num_authors=2000)
    generate_hetero(small, tmp_path / "g", progress=False)
    before = file_bytes(tmp_path / "g")

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(*((external_csc, "_spill", disk_full) if where == "sort runs" else
                          (hetero_generator.ClassFeatures, "write", disk_full)))
    with pytest.raises(OSError, match=r"No space left on device.*whatever was at .* is unchanged"):
        generate_hetero(SPEC, tmp_path / "g", progress=False, overwrite=True,
                        memory_budget=mag_generation_needs(SPEC, 1).minimum)
    assert [path.name for path in tmp_path.iterdir()] == ["g"]
    assert file_bytes(tmp_path / "g") == before


def test_the_command_line_states_the_needs_and_sizes_by_papers(tmp_path, capsys):
    out = tmp_path / "mag"
    assert main(["data", "generate", "mag-tiny", "-o", str(out), "--papers", "6000", "--memory-budget", "64M"]) == 0
    captured = capsys.readouterr()
    assert "memory budget 64.0 MiB" in captured.err and "at peak" in captured.err and "free on" in captured.err
    graph = HeteroGraphStore.load(out)
    tiny = PRESETS["mag-tiny"].spec
    assert graph.node_type("paper").count == 6000 and graph.node_type("author").count == 2 * tiny.num_authors
    assert graph.source["preset"] is None and graph.source["spec"]["num_papers"] == 6000
    assert main(["data", "generate", "tiny", "-o", str(tmp_path / "x"), "--papers", "10"]) == 2
    assert "--papers 10 sizes a heterogeneous preset" in capsys.readouterr().err


def test_a_disk_too_small_is_refused_before_any_work(tmp_path, monkeypatch):
    real_usage = hetero_generator.shutil.disk_usage
    monkeypatch.setattr(hetero_generator.shutil, "disk_usage", lambda path: real_usage(path)._replace(free=1 << 20))
    with pytest.raises(ValueError, match=r"the graph takes about .* on disk at peak .* has 1\.0 MiB free; fix: fewer "
                                         r"papers \(--papers\)"):
        generate_hetero(SPEC, tmp_path / "g", progress=False, memory_budget=mag_generation_needs(SPEC, 1).minimum)
    assert not (tmp_path / "g").exists()
