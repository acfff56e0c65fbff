"""Generators and presets: determinism, degree skew, homophily, and a graph where neighbours beat own features."""
from __future__ import annotations

import errno
import os
import shutil
import subprocess

import numpy as np
import pytest
import scipy.sparse
import torch

from morphpipe.data import PRESETS, GeneratorSpec, GraphStore, SplitFractions, generate, get_preset
from morphpipe.data import external_csc, generators
from morphpipe.data.ondisk import read_meta


def spec(**changes) -> GeneratorSpec:
    values = dict(kind="power-law", num_nodes=2_000, avg_degree=10, feature_dim=8, num_classes=3)
    values.update(changes)
    return GeneratorSpec(**values)


def build(tmp_path, generator_spec: GeneratorSpec, name: str = "g") -> GraphStore:
    return GraphStore.load(generate(generator_spec, tmp_path / name, progress=False))


def file_bytes(directory) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir())}


@pytest.mark.parametrize("kind", ["power-law", "community"])
def test_same_seed_same_files(tmp_path, kind):
    generate(spec(kind=kind), tmp_path / "a", progress=False)
    generate(spec(kind=kind), tmp_path / "b", progress=False)
    generate(spec(kind=kind, seed=1), tmp_path / "c", progress=False)
    assert file_bytes(tmp_path / "a") == file_bytes(tmp_path / "b")
    assert file_bytes(tmp_path / "a")["indices.npy"] != file_bytes(tmp_path / "c")["indices.npy"]


@pytest.mark.parametrize("kind", ["power-law", "community"])
def test_generated_graph_is_simple_valid_and_near_target_degree(tmp_path, kind):
    store = build(tmp_path, spec(kind=kind))
    store.validate()
    assert store.indices.dtype == torch.int32
    dst = np.repeat(np.arange(store.num_nodes), store.in_degrees().numpy())
    src = store.indices.numpy()
    assert not np.any(src == dst), "self loops"
    keys = dst.astype(np.int64) * store.num_nodes + src
    assert np.unique(keys).size == keys.size, "duplicate edges"
    assert 9.0 <= store.num_edges / store.num_nodes <= 10.0
    reverse = set(zip(dst.tolist(), src.tolist()))
    assert all((s, d) in reverse for s, d in zip(src[:200].tolist(), dst[:200].tolist())), "undirected"


def test_power_law_degrees_are_skewed(tmp_path):
    degrees = build(tmp_path, spec(num_nodes=20_000)).in_degrees().numpy()
    assert degrees.max() > 20 * degrees.mean()
    assert np.median(degrees) < degrees.mean()


def test_power_law_sampler_follows_weights():
    sampler = generators.PowerLawSampler(1000, exponent=2.5)
    rng = np.random.default_rng(0)
    ranks = sampler.sample(rng, np.empty(200_000), np.empty(200_000, dtype=np.int32))
    counts = np.bincount(ranks, minlength=1000)
    assert ranks.min() >= 0 and ranks.max() < 1000
    power = 1 - 1 / 1.5  # P(i) is proportional to (i + 2)^power - (i + 1)^power
    weights = np.arange(2, 1002) ** power - np.arange(1, 1001) ** power
    expected = weights / weights.sum() * ranks.size
    assert np.allclose(counts[:10], expected[:10], rtol=0.05)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_feature_dtypes(tmp_path, dtype):
    store = build(tmp_path, spec(feature_dtype=dtype))
    assert store.features.dtype == getattr(torch, dtype)
    assert torch.isfinite(store.features.float()).all()


def test_splits_follow_fractions(tmp_path):
    store = build(tmp_path, spec(split=SplitFractions(0.5, 0.1, 0.2)))
    assert (store.train_idx.numel(), store.val_idx.numel(), store.test_idx.numel()) == (1000, 200, 400)


def test_many_chunks_give_a_valid_graph(tmp_path, monkeypatch):
    monkeypatch.setattr(generators, "CHUNK_EDGES", 999)
    monkeypatch.setattr(generators, "CHUNK_FEATURE_VALUES", 77)
    for kind in ("power-law", "community"):
        store = build(tmp_path, spec(kind=kind), name=kind)
        store.validate()
        assert store.num_edges > 0


def test_meta_records_the_spec(tmp_path):
    generate(spec(), tmp_path / "g", progress=False, name="mine")
    meta = read_meta(tmp_path / "g")
    assert meta.name == "mine"
    assert GeneratorSpec.from_dict(meta.source["spec"]) == spec()
    assert meta.source["generator_version"] == generators.GENERATOR_VERSION


def test_timings_are_reported(tmp_path):
    timings: dict[str, float] = {}
    generate(spec(), tmp_path / "g", progress=False, timings=timings)
    assert set(timings) == {"edges", "csc", "save", "features"}


def test_refuses_to_overwrite_without_permission(tmp_path):
    generate(spec(), tmp_path / "g", progress=False)
    with pytest.raises(FileExistsError, match="already holds a graph"):
        generate(spec(), tmp_path / "g", progress=False)
    generate(spec(seed=3), tmp_path / "g", progress=False, overwrite=True)
    assert read_meta(tmp_path / "g").source["spec"]["seed"] == 3


def test_overwrite_never_deletes_foreign_files(tmp_path):
    (tmp_path / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="notes.txt"):
        generate(spec(), tmp_path, progress=False, overwrite=True)
    assert (tmp_path / "notes.txt").read_text() == "keep me"


@pytest.mark.parametrize("field,value", [
    ("kind", "random"), ("num_nodes", 0), ("exponent", 2.0), ("feature_dtype", "float64"), ("homophily", 0.1),
    ("feature_dim", 0), ("num_classes", 0),
])
def test_spec_checks(field, value):
    with pytest.raises(ValueError, match=rf"generator spec: {field}\b"):
        spec(**{field: value})


def neighbourhood_estimates(store: GraphStore) -> tuple[float, float, float]:
    """(edge homophily, accuracy of nearest class mean on own features, same on the mean over self + neighbours).

    The class means come from the train split, accuracy is measured on the test split: a stand-in
    for an MLP versus one mean-aggregation layer of GraphSAGE.
    """
    labels = store.labels.numpy()
    features = store.features.float().numpy()
    degrees = store.in_degrees().numpy()
    dst = np.repeat(np.arange(store.num_nodes), degrees)
    homophily = float(np.mean(labels[store.indices.numpy()] == labels[dst]))
    adjacency = scipy.sparse.csr_matrix(
        (np.ones(store.num_edges, dtype=np.float32), store.indices.numpy(), store.indptr.numpy()),
        shape=(store.num_nodes, store.num_nodes))
    averaged = (adjacency @ features + features) / (degrees[:, None] + 1)
    train, test = store.train_idx.numpy(), store.test_idx.numpy()

    def accuracy(values: np.ndarray) -> float:
        means = np.stack([values[train][labels[train] == c].mean(0) for c in range(store.num_classes)])
        distances = ((values[test][:, None, :] - means[None]) ** 2).sum(-1)
        return float(np.mean(distances.argmin(1) == labels[test]))

    return homophily, accuracy(features), accuracy(averaged)


@pytest.mark.parametrize("name", ["tiny", "default"])
def test_community_presets_reward_neighbourhood_aggregation(tmp_path, name):
    preset = get_preset(name)
    store = GraphStore.load(generate(preset.spec, tmp_path / name, preset=name, progress=False))
    homophily, own, neighbourhood = neighbourhood_estimates(store)
    assert 0.8 <= homophily <= 0.9
    assert 0.35 <= own <= 0.65
    assert neighbourhood >= 0.9


def test_presets_match_their_descriptions():
    assert {"tiny", "default", "bench-1m", "bench-10m"} <= set(PRESETS)
    default = PRESETS["default"].spec
    assert default.kind == "community" and 100_000 <= default.num_nodes <= 200_000
    assert 15 <= default.avg_degree <= 20 and 64 <= default.feature_dim <= 128 and 10 <= default.num_classes <= 16
    assert default.feature_dtype == "float32"
    assert PRESETS["tiny"].spec.num_nodes < 10_000
    one, ten = PRESETS["bench-1m"].spec, PRESETS["bench-10m"].spec
    assert (one.kind, one.num_nodes, one.avg_degree, one.feature_dim, one.feature_dtype) == \
        ("power-law", 1_000_000, 20, 128, "float16")
    assert (ten.kind, ten.num_nodes, ten.num_nodes * ten.avg_degree, ten.feature_dim, ten.feature_dtype) == \
        ("power-law", 10_000_000, 200_000_000, 128, "float16")


def test_unknown_preset_lists_the_presets():
    with pytest.raises(ValueError, match="tiny, default, bench-1m, bench-10m, papers100m-like"):
        get_preset("huge")


def test_a_budget_that_spills_sorted_runs_gives_the_same_files(tmp_path):
    """The external sort (edges in several runs on disk) writes byte-identical graphs to the in-memory sort."""
    big = spec(num_nodes=20_000, avg_degree=20)
    generate(big, tmp_path / "memory", progress=False)
    held = generators.generation_needs(big).held_bytes
    needs = generators.check_fits_in_memory(big, tmp_path, memory_budget=held + (1 << 20))
    assert needs.sort.num_runs > 2 and generators.generation_needs(big, held + (64 << 20)).sort.num_runs == 1
    generate(big, tmp_path / "runs", progress=False, memory_budget=needs.budget)
    assert file_bytes(tmp_path / "memory") == file_bytes(tmp_path / "runs")


def test_a_budget_below_what_the_topology_needs_is_refused_with_the_number(tmp_path):
    big = spec(num_nodes=200_000, avg_degree=4)
    with pytest.raises(ValueError, match=r"indptr 1\.5 MiB, labels 1\.5 MiB.*--memory-budget is 1\.0 MiB; "
                                         r"fix: --memory-budget \d+M or more"):
        generate(big, tmp_path / "g", progress=False, memory_budget=1 << 20)
    assert not (tmp_path / "g").exists()


def test_papers100m_like_preset_is_shaped_like_papers100m(tmp_path):
    papers = PRESETS["papers100m-like"].spec
    assert (papers.num_nodes, papers.feature_dim, papers.feature_dtype, papers.num_classes, papers.undirected) == \
        (111_059_956, 128, "float16", 172, False)
    assert 1.55e9 <= papers.num_nodes * papers.avg_degree <= 1.65e9
    needs = generators.generation_needs(papers, memory_budget=6 << 30, directory=tmp_path)
    assert needs.sort.num_runs > 1 and needs.budget - needs.held_bytes >= 2 << 30
    assert 36e9 <= needs.peak_disk_bytes <= 40e9  # 28.4 GB features, 6.5 GB int32 indices, 2.7 GB per-node arrays
    # The same shape at 1/5000 of the nodes: directed, skewed in-degree, 1.1% of the nodes in the train split.
    store = build(tmp_path, papers.with_overrides(num_nodes=22_212))
    degrees = store.in_degrees().numpy()
    assert 14 <= store.num_edges / store.num_nodes <= 14.55
    assert degrees.max() > 20 * degrees.mean()
    assert store.train_idx.numel() == round(0.011 * 22_212) and store.num_classes == 172
    dst = np.repeat(np.arange(store.num_nodes), degrees)
    forward = set(zip(store.indices.numpy()[:2000].tolist(), dst[:2000].tolist()))
    assert sum((d, s) in forward for s, d in forward) < 0.1 * len(forward), "directed: few reverse edges"


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 4 MiB tmpfs: a file system that really fills up (needs root and mount; skipped elsewhere)."""
    mount_point = tmp_path / "tmpfs"
    mount_point.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount_point)],
                                           capture_output=True).returncode != 0:
        pytest.skip("mounting a tmpfs needs root")
    yield mount_point
    subprocess.run(["umount", str(mount_point)], check=True)


def test_a_full_disk_during_generation_leaves_the_previous_graph_intact(small_tmpfs, monkeypatch):
    generate(spec(), small_tmpfs / "g", progress=False)
    before = file_bytes(small_tmpfs / "g")
    bigger = spec(num_nodes=20_000, avg_degree=20, feature_dim=64)  # ~1.6 MB of sort runs, 5 MB of features
    with pytest.raises(ValueError, match="GiB on disk at peak|MiB"):
        generate(bigger, small_tmpfs / "g", progress=False, overwrite=True)
    real_usage = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda path: real_usage(path)._replace(free=1 << 40))  # the check passes
    with pytest.raises(OSError, match=r"failed while writing \(\d+ requested and \d+ written\); .* is free "
                                      r"now on .*whatever was at .* is unchanged"):
        generate(bigger, small_tmpfs / "g", progress=False, overwrite=True, memory_budget=64 << 20)
    assert [path.name for path in small_tmpfs.iterdir()] == ["g"]
    assert file_bytes(small_tmpfs / "g") == before


@pytest.mark.parametrize("where", ["sort runs", "features"])
def test_a_write_error_during_generation_leaves_the_previous_graph_intact(tmp_path, monkeypatch, where):
    """The same with the error injected (runs everywhere): while spilling sorted runs, or writing features."""
    generate(spec(), tmp_path / "g", progress=False)
    before = file_bytes(tmp_path / "g")

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    if where == "sort runs":
        monkeypatch.setattr(external_csc, "_spill", disk_full)
    else:
        monkeypatch.setattr(generators.NpyChunkWriter, "write", disk_full)
    big = spec(num_nodes=20_000, avg_degree=20)
    held = generators.generation_needs(big).held_bytes
    with pytest.raises(OSError, match="No space left on device"):
        generate(big, tmp_path / "g", progress=False, overwrite=True, memory_budget=held + (1 << 20))
    assert [path.name for path in tmp_path.iterdir()] == ["g"]
    assert file_bytes(tmp_path / "g") == before
