"""GraphStore: properties, save/load round trips, memory mapping, and the dataset cache."""
from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from morphpipe.data import PRESETS, GraphStore, GraphValidationError, build_csc, load_dataset
from morphpipe.data.ondisk import read_meta
from morphpipe.data.store import DATA_DIR_ENV, data_root


def small_store(feature_dtype=torch.float32, num_nodes=6) -> GraphStore:
    """A 6-node ring plus a chord, with features, labels and splits."""
    src = [0, 1, 2, 3, 4, 5, 0]
    dst = [1, 2, 3, 4, 5, 0, 3]
    indptr, indices = build_csc(src, dst, num_nodes)
    features = torch.arange(num_nodes * 3, dtype=torch.float32).reshape(num_nodes, 3).to(feature_dtype)
    return GraphStore(
        indptr=indptr, indices=indices, features=features,
        labels=torch.tensor([0, 1, 0, 1, -1, 1]),
        train_idx=torch.tensor([0, 1, 2]), val_idx=torch.tensor([3]), test_idx=torch.tensor([5]),
        num_classes=2, name="ring",
    )


def test_properties_describe_the_graph():
    store = small_store()
    assert (store.num_nodes, store.num_edges, store.feature_dim) == (6, 7, 3)
    assert store.feature_dtype == torch.float32
    assert store.indices.dtype == torch.int32 and store.indptr.dtype == torch.int64
    assert store.in_degrees().tolist() == [1, 1, 1, 2, 1, 1]
    assert "num_nodes=6" in repr(store) and "ring" in repr(store)
    store.validate()


def test_in_neighbours_follow_csc_convention():
    store = small_store()
    neighbours = store.indices[store.indptr[3]:store.indptr[4]].tolist()
    assert sorted(neighbours) == [0, 2]  # edges 2->3 and 0->3


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("mmap", [True, False])
def test_save_load_round_trip(tmp_path, dtype, mmap):
    store = small_store(dtype)
    store.save(tmp_path / "g")
    loaded = GraphStore.load(tmp_path / "g", mmap=mmap)
    for name in ("indptr", "indices", "features", "labels", "train_idx", "val_idx", "test_idx"):
        original, copy = getattr(store, name), getattr(loaded, name)
        assert copy.dtype == original.dtype, name
        assert torch.equal(copy, original), name
    assert (loaded.num_classes, loaded.name) == (2, "ring")


def test_meta_json_records_sizes_dtypes_and_origin(tmp_path):
    small_store(torch.bfloat16).save(tmp_path)
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["format"] == "morphpipe-graph" and meta["format_version"] == 1
    assert (meta["num_nodes"], meta["num_edges"], meta["feature_dim"]) == (6, 7, 3)
    assert (meta["feature_dtype"], meta["indices_dtype"], meta["num_classes"]) == ("bfloat16", "int32", 2)
    assert meta["source"]["kind"] == "saved"
    assert np.load(tmp_path / "features.npy").dtype == np.uint16


def mapped_from(tensor: torch.Tensor, path) -> bool:
    """True when the tensor's memory lies in a mapping of file `path` (Linux /proc/self/maps)."""
    address = tensor.data_ptr()
    for line in open("/proc/self/maps"):
        parts = line.split()
        if len(parts) >= 6 and parts[5] == str(path):
            low, high = (int(bound, 16) for bound in parts[0].split("-"))
            if low <= address < high:
                return True
    return False


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc/self/maps")
def test_memory_mapped_features_are_copy_on_write(tmp_path):
    small_store().save(tmp_path)
    loaded = GraphStore.load(tmp_path, mmap=True)
    assert mapped_from(loaded.features, (tmp_path / "features.npy").resolve())
    assert not mapped_from(GraphStore.load(tmp_path, mmap=False).features, (tmp_path / "features.npy").resolve())
    loaded.features[0, 0] = 1234.0
    assert np.load(tmp_path / "features.npy")[0, 0] == 0.0
    assert GraphStore.load(tmp_path).features[0, 0].item() == 0.0


def test_save_over_the_directory_it_was_loaded_from(tmp_path):
    small_store().save(tmp_path)
    loaded = GraphStore.load(tmp_path)
    loaded.name = "renamed"
    loaded.save(tmp_path)
    again = GraphStore.load(tmp_path)
    assert again.name == "renamed"
    assert torch.equal(again.features, small_store().features)


def test_save_refuses_malformed_shapes(tmp_path):
    store = small_store()
    store.labels = store.labels[:3]
    with pytest.raises(GraphValidationError, match="labels"):
        store.save(tmp_path)


def test_load_without_validation_still_checks_shapes(tmp_path):
    small_store().save(tmp_path)
    np.save(tmp_path / "labels.npy", np.array([0, 1], dtype=np.int64))
    with pytest.raises(GraphValidationError, match="labels"):
        GraphStore.load(tmp_path, validate=False)


def test_load_without_validation_skips_value_scans(tmp_path):
    small_store().save(tmp_path)
    labels = np.load(tmp_path / "labels.npy")
    labels[0] = 99
    np.save(tmp_path / "labels.npy", labels)
    assert GraphStore.load(tmp_path, validate=False).labels[0].item() == 99
    with pytest.raises(GraphValidationError, match="labels"):
        GraphStore.load(tmp_path)


def test_store_pickles_for_worker_processes():
    store = small_store()
    copy = pickle.loads(pickle.dumps(store))
    assert torch.equal(copy.indices, store.indices) and copy.num_classes == 2


def test_load_dataset_from_directory(tmp_path):
    small_store().save(tmp_path / "g")
    assert load_dataset(str(tmp_path / "g")).name == "ring"


def test_load_dataset_generates_preset_once_into_root(tmp_path):
    store = load_dataset("tiny", root=tmp_path, progress=False)
    assert store.num_nodes == PRESETS["tiny"].spec.num_nodes
    meta_file = tmp_path / "tiny" / "meta.json"
    stamp = meta_file.stat().st_mtime_ns
    again = load_dataset("tiny", root=tmp_path, progress=False)
    assert meta_file.stat().st_mtime_ns == stamp
    assert torch.equal(again.indices, store.indices)
    assert not list(tmp_path.glob(".tiny.partial-*"))


def test_load_dataset_uses_environment_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path))
    assert data_root() == tmp_path
    load_dataset("tiny", progress=False)
    assert (tmp_path / "tiny" / "meta.json").is_file()


def test_default_cache_root(monkeypatch):
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    assert str(data_root()).endswith(".cache/morphpipe/datasets")


def test_load_dataset_regenerates_a_stale_cache(tmp_path):
    load_dataset("tiny", root=tmp_path, progress=False)
    meta_file = tmp_path / "tiny" / "meta.json"
    meta = json.loads(meta_file.read_text())
    meta["source"]["generator_version"] = -1
    meta_file.write_text(json.dumps(meta))
    load_dataset("tiny", root=tmp_path, progress=False)
    assert read_meta(tmp_path / "tiny").source["generator_version"] != -1


def test_load_dataset_unknown_name_lists_presets(tmp_path):
    with pytest.raises(ValueError, match="unknown dataset 'nope'.*tiny.*default.*bench-1m"):
        load_dataset("nope", root=tmp_path)


def test_load_dataset_directory_without_meta(tmp_path):
    with pytest.raises(FileNotFoundError, match="no meta.json"):
        load_dataset(str(tmp_path))


def test_load_dataset_regenerates_a_corrupt_cache(tmp_path):
    load_dataset("tiny", root=tmp_path, progress=False)
    (tmp_path / "tiny" / "meta.json").write_text("{not json")
    assert load_dataset("tiny", root=tmp_path, progress=False).num_nodes == PRESETS["tiny"].spec.num_nodes


def test_arrays_the_kernel_will_not_map_copy_on_write_are_mapped_read_only(tmp_path, monkeypatch) -> None:
    # papers100M's 28 GB of features on a 24 GB machine: a writable private map is refused (ENOMEM) under the
    # default overcommit policy, a read-only one is not. Simulated: every copy-on-write map fails as it would there.
    import errno
    import warnings

    directory = tmp_path / "graph"
    load_dataset("tiny", progress=False).save(directory)
    real_load = np.load
    modes: list[str | None] = []

    def refusing_copy_on_write(path, mmap_mode=None, **options):
        modes.append(mmap_mode)
        if mmap_mode == "c":
            raise OSError(errno.ENOMEM, "Cannot allocate memory")
        return real_load(path, mmap_mode=mmap_mode, **options)

    monkeypatch.setattr(np, "load", refusing_copy_on_write)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "not writable" warning reaches the user
        graph = GraphStore.load(directory, mmap=True)
    monkeypatch.setattr(np, "load", real_load)
    expected = GraphStore.load(directory, mmap=False)
    assert torch.equal(graph.features, expected.features) and torch.equal(graph.indices, expected.indices)
    assert modes.count("c") == modes.count("r") >= 2, modes  # each mapped array: refused, then mapped read-only


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_read_only_feature_maps_load_without_a_warning(tmp_path, dtype) -> None:
    # torch warns once per process about a non-writable array, so only a fresh process shows whether it reaches
    # the user (it did at the end of `data generate papers100m-like`, whose features are mapped read-only).
    import subprocess
    import sys

    storage = np.uint16 if dtype == "bfloat16" else np.float16
    np.save(tmp_path / "features.npy", np.arange(12, dtype=storage).reshape(4, 3))
    code = ("import sys, numpy as np; from morphpipe.data.dtypes import features_from_storage; "
            f"print(features_from_storage(np.load(sys.argv[1], mmap_mode='r'), '{dtype}').shape)")
    done = subprocess.run([sys.executable, "-W", "error", "-c", code, str(tmp_path / "features.npy")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "Warning" not in done.stderr, done.stderr
    assert done.stdout.strip() == "torch.Size([4, 3])"


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs Linux /proc/self/smaps")
def test_validating_mapped_features_leaves_their_pages_out_of_the_resident_set(tmp_path) -> None:
    # A feature file larger than RAM (papers100M's 26.5 GiB on a 23.5 GiB machine) is scanned once at load: the
    # scanned pages must not stay mapped in, or the load alone fills the resident set.
    num_nodes = 32768
    graph = GraphStore(indptr=torch.zeros(num_nodes + 1, dtype=torch.int64), indices=torch.zeros(0, dtype=torch.int32),
                       features=torch.randn(num_nodes, 128), labels=torch.zeros(num_nodes, dtype=torch.int64),
                       train_idx=torch.tensor([0]), val_idx=torch.tensor([1]), test_idx=torch.tensor([2]),
                       num_classes=2)  # 16 MiB of features
    graph.save(tmp_path / "graph")
    loaded = GraphStore.load(tmp_path / "graph", mmap=True)

    def resident_kib(name: str) -> int:
        lines = Path("/proc/self/smaps").read_text().splitlines()
        starts = [i for i, line in enumerate(lines) if line.endswith(name) and "-" in line.split()[0]]
        total = 0
        for start in starts:
            for line in lines[start + 1:]:
                if line.startswith("Rss:"):
                    total += int(line.split()[1])
                    break
        return total

    features_file = str(tmp_path / "graph" / "features.npy")
    assert resident_kib(features_file) <= 64, resident_kib(features_file)
    assert torch.equal(loaded.features, graph.features)  # the rows read back through the map, unchanged
    assert resident_kib(features_file) >= 16 * 1024 - 64

