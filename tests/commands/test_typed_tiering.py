"""The automatic tiering of a typed graph: features that do not fit --memory-budget go on disk (every featured node
type's), `tune` profiles the disk and plans the cache the types share, `train` opens it and says what each type
caches; a budget below what the topology needs is refused with the number needed."""
from __future__ import annotations

import pytest

from morphpipe.commands.cli import main
from morphpipe.data.hetero_generator import MagSpec
from morphpipe.data.hetero_store import HeteroGraphStore, share_feature_cache
from morphpipe.data.store import GraphStore
from morphpipe.profiler.disk import resident_bytes
from morphpipe.profiler.profile import Profile
from morphpipe.sampling.access_hotness import expected_typed_batch_reads
from morphpipe.scheduler import Plan
from tests.conftest import saved_mag_with_float16_authors

WORKLOAD = ["--model", "rgcn", "--fanouts", "4,3", "--batch-size", "64", "--threads", "1", "--steps", "2"]


@pytest.fixture(scope="module")
def typed_dir(tmp_path_factory):
    spec = MagSpec(num_papers=300, num_authors=200, num_institutions=10, num_fields=20, feature_dim=8)
    return saved_mag_with_float16_authors(tmp_path_factory.mktemp("typed") / "mag", spec, author_width=4, seed=2)


def test_tune_and_train_tier_a_typed_graph_within_the_memory_budget(typed_dir, tmp_path, capsys):
    """The user's path end to end (over 10 s on a loaded machine: the disk profile's timed reads, and a second
    profile when the machine was busy): the one test of placing, profiling, planning and applying a typed tiering."""
    graph = HeteroGraphStore.load(typed_dir)
    budget = resident_bytes(graph) + 2_000  # the features (12 kB) do not fit beside the topology
    plan_path, profile_path = tmp_path / "plan.json", tmp_path / "profile.json"
    assert main(["tune", str(typed_dir), *WORKLOAD, "--warmup", "1", "--memory-budget", str(budget),
                 "-o", str(plan_path), "--profile-output", str(profile_path)]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "do not fit the memory budget" in out and "feature store of each featured node type" in out
    profile, plan = Profile.load(profile_path), Plan.load(plan_path)
    disk = profile.disk
    assert disk is not None, "the typed graph's disk must be profiled"
    assert disk.num_rows == 300 + 200 and disk.row_bytes == -(-(300 * 32 + 200 * 8) // 500)
    assert disk.resident_bytes >= resident_bytes(graph)
    assert disk.cache_budget_bytes <= budget - resident_bytes(graph)
    assert plan.tiering is not None and plan.tiering.cache_bytes <= max(disk.cache_budget_bytes, 0)
    # the cache the types share is split by the workload's expected reads per byte of row
    hotness = expected_typed_batch_reads(graph, graph.train_idx, [4, 3], 64)
    split = share_feature_cache({name: part.float() for name, part in hotness.items()}, {"paper": 32, "author": 8},
                                plan.tiering.cache_bytes)
    assert "tiers: features by node type: paper disk (feature store" in out
    ranked_by = f"expected access per byte (fanouts 4,3, batch 64, {graph.train_idx.numel():,} seeds)"
    shared = (f"the types sharing it by {ranked_by} (paper {split['paper']:,} rows, "
              f"author {split['author']:,} rows)")
    assert shared in out
    assert main(["train", str(typed_dir), *WORKLOAD, "--memory-budget", str(budget), "--plan", str(plan_path),
                 "--epochs", "1", "--no-progress", "--replan", "off"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert (f"features on disk: hottest rows cached in RAM by type: paper {split['paper']:,} rows" in out
            and f"author {split['author']:,} rows" in out and f"(by {ranked_by})" in out
            and "as planned (predicted hit ratio" in out)
    assert "shared by the node types" in out and "test accuracy" in out


@pytest.mark.parametrize("typed", [True, False], ids=["typed", "homogeneous"])
def test_a_memory_budget_below_the_topology_is_refused_with_the_number_needed(typed_dir, graph_dir, typed, capsys):
    directory = typed_dir if typed else graph_dir
    graph = HeteroGraphStore.load(directory) if typed else GraphStore.load(directory)
    needed = resident_bytes(graph)
    assert main(["data", "info", str(directory), "--memory-budget", str(needed - 1)]) == 2
    error = capsys.readouterr().err
    assert f"--memory-budget: {needed - 1} is below" not in error  # said in readable units
    assert "topology, labels and splits need in RAM" in error
    assert f"give --memory-budget {-(-needed // 2**20)}M or more" in error
    assert main(["data", "info", str(directory), "--memory-budget", str(needed)]) == 0
