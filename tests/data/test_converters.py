"""Converters: edge lists, scipy.sparse, OGB raw directories and PyG Data into a valid GraphStore."""
from __future__ import annotations

import gzip
import os
import subprocess

import numpy as np
import pytest
import scipy.sparse
import torch

from morphpipe.data import (ConvertOptions, GraphStore, GraphValidationError, SplitFractions, from_edge_list,
                            from_ogb, from_pyg, from_scipy)
from morphpipe.data import converters
from morphpipe.data.external_csc import SortPlan

# A 4-node graph: 0->1, 1->2, 2->0, 2->3, 3->3 (self loop), 0->1 (repeated).
SRC = [0, 1, 2, 2, 3, 0]
DST = [1, 2, 0, 3, 3, 1]
FEATURES = np.arange(8, dtype=np.float32).reshape(4, 2)
LABELS = np.array([0, 1, 1, 0])
SPLITS = {"train": np.array([0, 1]), "val": np.array([2]), "test": np.array([3])}


def neighbours(store: GraphStore) -> list[list[int]]:
    return [sorted(store.indices[store.indptr[v]:store.indptr[v + 1]].tolist()) for v in range(store.num_nodes)]


def given_parts(**options) -> dict:
    return dict(features=FEATURES, labels=LABELS, splits=SPLITS, options=ConvertOptions(**options))


@pytest.mark.parametrize("layout", ["rows", "columns", "tensor"])
def test_edge_array_orientation(layout):
    edges = np.array([SRC, DST])
    source = {"rows": edges, "columns": edges.T, "tensor": torch.from_numpy(edges)}[layout]
    store = from_edge_list(source, **given_parts())
    assert neighbours(store) == [[2], [0, 0], [1], [2, 3]]
    assert torch.equal(store.features, torch.from_numpy(FEATURES))
    assert store.labels.tolist() == LABELS.tolist() and store.num_classes == 2


def test_options_undirected_self_loops_dedupe():
    store = from_edge_list(np.array([SRC, DST]), **given_parts(make_undirected=True, drop_self_loops=True,
                                                                  dedupe=True))
    assert neighbours(store) == [[1, 2], [0, 2], [0, 1, 3], [2]]
    assert store.source["options"]["make_undirected"] is True


def test_npy_file(tmp_path):
    np.save(tmp_path / "edges.npy", np.array([SRC, DST]).T)
    store = from_edge_list(tmp_path / "edges.npy", **given_parts())
    assert neighbours(store) == [[2], [0, 0], [1], [2, 3]]
    assert store.name == "edges"


@pytest.mark.parametrize("text", [
    "src,dst\n" + "".join(f"{s},{d}\n" for s, d in zip(SRC, DST)),
    "# comment\n" + "".join(f"{s} {d}\n" for s, d in zip(SRC, DST)),
    "source\ttarget\tweight\n" + "".join(f"{s}\t{d}\t0.5\n" for s, d in zip(SRC, DST)),
])
def test_text_files(tmp_path, text):
    path = tmp_path / "edges.txt"
    path.write_text(text)
    assert neighbours(from_edge_list(path, **given_parts())) == [[2], [0, 0], [1], [2, 3]]


def test_gzipped_csv(tmp_path):
    path = tmp_path / "edges.csv.gz"
    with gzip.open(path, "wt") as handle:
        handle.write("".join(f"{s},{d}\n" for s, d in zip(SRC, DST)))
    assert neighbours(from_edge_list(path, **given_parts())) == [[2], [0, 0], [1], [2, 3]]


def test_bad_edge_shape():
    with pytest.raises(GraphValidationError, match="edges: .*shape \\(3, 3\\)"):
        from_edge_list(np.zeros((3, 3), dtype=np.int64))


def test_non_integer_text(tmp_path):
    path = tmp_path / "edges.csv"
    path.write_text("0,1\n1,x\n")
    with pytest.raises(GraphValidationError, match="edges"):
        from_edge_list(path)


def test_missing_parts_are_generated_with_a_warning():
    with pytest.warns(UserWarning, match="generated random features, labels, splits"):
        store = from_edge_list(np.array([SRC, DST]), options=ConvertOptions(feature_dim=5, num_classes=3, seed=4))
    assert store.features.shape == (4, 5) and store.num_classes == 3
    assert store.source["generated"] == ["features", "labels", "splits"]
    with pytest.warns(UserWarning):
        again = from_edge_list(np.array([SRC, DST]), options=ConvertOptions(feature_dim=5, num_classes=3, seed=4))
    assert torch.equal(store.features, again.features) and torch.equal(store.train_idx, again.train_idx)


def test_random_split_uses_labelled_nodes_only():
    labels = np.array([0, -1, 1, 1] * 25)
    edges = np.array([np.arange(100), (np.arange(100) + 1) % 100])
    with pytest.warns(UserWarning, match="splits"):
        store = from_edge_list(edges, features=np.ones((100, 2)), labels=labels,
                               options=ConvertOptions(split=SplitFractions(0.5, 0.2, 0.3)))
    ids = torch.cat([store.train_idx, store.val_idx, store.test_idx])
    assert ids.numel() == 75 and ids.unique().numel() == 75
    assert (store.labels[ids] >= 0).all()
    assert store.features.dtype == torch.float32  # float64 input is cast


def test_boolean_mask_splits():
    masks = {"train": np.array([True, True, False, False]), "valid": np.array([False, False, True, False]),
             "test": np.array([False, False, False, True])}
    store = from_edge_list(np.array([SRC, DST]), features=FEATURES, labels=LABELS, splits=masks)
    assert (store.train_idx.tolist(), store.val_idx.tolist(), store.test_idx.tolist()) == ([0, 1], [2], [3])


def test_num_nodes_option_adds_isolated_nodes():
    store = from_edge_list(np.array([SRC, DST]), features=np.ones((6, 1)), labels=np.zeros(6, dtype=np.int64),
                           splits={"train": [0], "val": [], "test": []}, options=ConvertOptions(num_nodes=6))
    assert store.num_nodes == 6 and neighbours(store)[5] == []


@pytest.mark.parametrize("fmt", ["coo", "csr", "csc", "lil", "dok", "bsr", "dia", "csr_array"])
def test_scipy_formats_and_orientation(fmt):
    dense = np.zeros((4, 4))
    for s, d in zip(SRC, DST):
        dense[s, d] = 1.0  # A[i, j] != 0 is the edge i -> j
    matrix = scipy.sparse.csr_array(dense) if fmt == "csr_array" else scipy.sparse.coo_matrix(dense).asformat(fmt)
    store = from_scipy(matrix, **given_parts())
    assert neighbours(store) == [[2], [0], [1], [2, 3]]


def test_scipy_explicit_zeros_are_not_edges():
    matrix = scipy.sparse.coo_matrix((np.array([1.0, 0.0]), (np.array([0, 1]), np.array([1, 2]))), shape=(4, 4))
    assert neighbours(from_scipy(matrix, **given_parts())) == [[], [0], [], []]


def test_scipy_non_square():
    with pytest.raises(GraphValidationError, match="square"):
        from_scipy(scipy.sparse.coo_matrix(np.ones((2, 3))), **given_parts())


def write_csv_gz(path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as handle:
        handle.write("".join(",".join(str(value) for value in np.atleast_1d(row)) + "\n" for row in rows))


def make_ogb_dir(root, schemes=("time",)) -> None:
    """A 5-node OGB-style directory; node 4 is unlabelled (NaN) and in no split."""
    write_csv_gz(root / "raw" / "edge.csv.gz", [(0, 1), (1, 2), (2, 3), (3, 0)])
    write_csv_gz(root / "raw" / "num-node-list.csv.gz", [5])
    write_csv_gz(root / "raw" / "node-feat.csv.gz", [(v, v + 0.5, -v) for v in range(5)])
    write_csv_gz(root / "raw" / "node-label.csv.gz", ["1", "0", "2", "1", "nan"])
    for scheme in schemes:
        write_csv_gz(root / "split" / scheme / "train.csv.gz", [0, 1])
        write_csv_gz(root / "split" / scheme / "valid.csv.gz", [2])
        write_csv_gz(root / "split" / scheme / "test.csv.gz", [3])


def test_ogb_directory(tmp_path):
    root = tmp_path / "ogbn_toy"
    make_ogb_dir(root)
    store = from_ogb(root)
    assert store.num_nodes == 5 and store.name == "ogbn_toy"
    assert neighbours(store) == [[3], [0], [1], [2], []]
    assert store.features.shape == (5, 3) and store.features[2].tolist() == [2.0, 2.5, -2.0]
    assert store.labels.tolist() == [1, 0, 2, 1, -1] and store.num_classes == 3
    assert (store.train_idx.tolist(), store.val_idx.tolist(), store.test_idx.tolist()) == ([0, 1], [2], [3])
    assert store.source["split_scheme"] == "time"
    store.save(tmp_path / "out")
    assert GraphStore.load(tmp_path / "out").labels.tolist() == [1, 0, 2, 1, -1]


def test_ogb_undirected(tmp_path):
    make_ogb_dir(tmp_path)
    store = from_ogb(tmp_path, options=ConvertOptions(make_undirected=True))
    assert neighbours(store)[0] == [1, 3]


def test_ogb_several_split_schemes(tmp_path):
    make_ogb_dir(tmp_path, schemes=("a", "b"))
    with pytest.raises(ValueError, match="choose one"):
        from_ogb(tmp_path)
    assert from_ogb(tmp_path, split_scheme="b").source["split_scheme"] == "b"


def test_ogb_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="edge.csv.gz"):
        from_ogb(tmp_path)


def test_pyg_data():
    torch_geometric = pytest.importorskip("torch_geometric")
    data = torch_geometric.data.Data(
        x=torch.from_numpy(FEATURES), y=torch.from_numpy(LABELS).reshape(-1, 1),
        edge_index=torch.tensor([SRC, DST]),
        train_mask=torch.tensor([True, True, False, False]), val_mask=torch.tensor([False, False, True, False]),
        test_mask=torch.tensor([False, False, False, True]),
    )
    store = from_pyg(data, options=ConvertOptions(dedupe=True))
    assert neighbours(store) == [[2], [0], [1], [2, 3]]
    assert store.labels.tolist() == LABELS.tolist()
    assert (store.train_idx.tolist(), store.val_idx.tolist(), store.test_idx.tolist()) == ([0, 1], [2], [3])


def test_pyg_float_targets_are_refused():
    torch_geometric = pytest.importorskip("torch_geometric")
    data = torch_geometric.data.Data(x=torch.ones(4, 2), y=torch.rand(4), edge_index=torch.tensor([SRC, DST]))
    with pytest.raises(GraphValidationError, match="data.y"):
        from_pyg(data)


def test_float_labels_with_nan_are_unlabelled_nodes():
    labels = np.array([0.0, np.nan, 1.0, 1.0])
    store = from_edge_list(np.array([SRC, DST]), features=FEATURES, labels=labels,
                           splits={"train": [0, 2], "val": [3], "test": []})
    assert store.labels.tolist() == [0, -1, 1, 1] and store.num_classes == 2


def test_pyg_masks_of_several_splits_use_the_first():
    torch_geometric = pytest.importorskip("torch_geometric")
    def columns(first, second):
        return torch.tensor([first, second], dtype=torch.bool).T

    data = torch_geometric.data.Data(  # column 0: train 0, 1, val 2, test 3; column 1: train 2, 3, val 0, test 1
        x=torch.from_numpy(FEATURES), y=torch.from_numpy(LABELS), edge_index=torch.tensor([SRC, DST]),
        train_mask=columns([1, 1, 0, 0], [0, 0, 1, 1]), val_mask=columns([0, 0, 1, 0], [1, 0, 0, 0]),
        test_mask=columns([0, 0, 0, 1], [0, 1, 0, 0]))
    with pytest.warns(UserWarning, match="holds 2 splits; using the first"):
        store = from_pyg(data)
    assert (store.train_idx.tolist(), store.val_idx.tolist(), store.test_idx.tolist()) == ([0, 1], [2], [3])


def test_node_count_covers_feature_rows_beyond_the_last_edge():
    """Nodes 4 and 5 have features and labels but no edges: they are nodes all the same."""
    store = from_edge_list(np.array([SRC, DST]), features=np.ones((6, 2), dtype=np.float32),
                           labels=np.array([0, 1, 1, 0, 1, 0]), splits={"train": [0, 5], "val": [4], "test": []})
    assert store.num_nodes == 6 and neighbours(store)[4:] == [[], []]
    store = from_edge_list(np.array([SRC, DST]), features=np.ones((6, 2), dtype=np.float32),
                           splits={"train": [0, 5], "val": [4], "test": []},
                           options=ConvertOptions(num_classes=2))
    assert store.num_nodes == 6


def random_edge_table(num_nodes: int = 20_000, num_edges: int = 200_000) -> np.ndarray:
    """(E, 2) int64 edges with self loops, repeated edges and isolated nodes (ids drawn from 90% of the nodes)."""
    rng = np.random.default_rng(7)
    table = rng.integers(0, int(num_nodes * 0.9), (num_edges, 2), dtype=np.int64)
    table[:1000, 1] = table[:1000, 0]
    table[-1000:] = table[1000:2000]
    table[0] = num_nodes - 1
    return table


SMALL_BUDGET = 20_001 * 8 + (1 << 20)  # indptr of 20,000 nodes and the least sort memory: several sorted runs


@pytest.fixture
def external_runs(monkeypatch) -> list[int]:
    """The number of sorted runs of every external CSC build the converters start."""
    runs: list[int] = []
    build = converters.build_csc_on_disk

    def spy(chunks, num_keys, num_nodes, directory, *, memory_budget, **options):
        runs.append(SortPlan.for_budget(num_keys, memory_budget).num_runs)
        return build(chunks, num_keys, num_nodes, directory, memory_budget=memory_budget, **options)

    monkeypatch.setattr(converters, "build_csc_on_disk", spy)
    return runs


@pytest.mark.parametrize("options", [dict(), dict(make_undirected=True, drop_self_loops=True, dedupe=True)])
@pytest.mark.parametrize("converter", ["npy", "text", "ogb", "pyg"])
def test_external_sort_gives_the_in_memory_csc(tmp_path, converter, options, external_runs):
    table = random_edge_table()
    if converter == "npy":
        np.save(tmp_path / "edges.npy", table)
        convert = lambda opts: from_edge_list(tmp_path / "edges.npy", options=opts)  # noqa: E731
    elif converter == "text":
        np.savetxt(tmp_path / "edges.csv", table, fmt="%d", delimiter=",", header="src,dst", comments="")
        convert = lambda opts: from_edge_list(tmp_path / "edges.csv", options=opts)  # noqa: E731
    elif converter == "ogb":
        write_csv_gz(tmp_path / "raw" / "edge.csv.gz", table)
        write_csv_gz(tmp_path / "raw" / "num-node-list.csv.gz", [20_000])
        convert = lambda opts: from_ogb(tmp_path, options=opts)  # noqa: E731
    else:
        torch_geometric = pytest.importorskip("torch_geometric")
        data = torch_geometric.data.Data(edge_index=torch.from_numpy(table.T.copy()), num_nodes=20_000)
        convert = lambda opts: from_pyg(data, options=opts)  # noqa: E731
    with pytest.warns(UserWarning, match="generated random"):
        on_disk = convert(ConvertOptions(memory_budget=SMALL_BUDGET, num_nodes=20_000, **options))
        assert len(external_runs) == 1 and external_runs[0] >= 2
        in_memory = convert(ConvertOptions(num_nodes=20_000, **options))
        assert len(external_runs) == 1
    assert torch.equal(on_disk.indptr, in_memory.indptr) and torch.equal(on_disk.indices, in_memory.indices)
    assert on_disk.indices.dtype == torch.int32
    on_disk.save(tmp_path / "saved")
    assert torch.equal(GraphStore.load(tmp_path / "saved").indices, in_memory.indices)


@pytest.mark.parametrize("source", ["array", "text"])
def test_external_sort_leaves_no_scratch_files(tmp_path, external_runs, source):
    edges = random_edge_table()
    if source == "text":
        np.savetxt(tmp_path / "edges.txt", edges, fmt="%d")
        edges = tmp_path / "edges.txt"
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    with pytest.warns(UserWarning):
        store = from_edge_list(edges, options=ConvertOptions(memory_budget=SMALL_BUDGET, scratch_dir=scratch,
                                                             num_nodes=20_000))
    assert external_runs and list(scratch.iterdir()) == [] and store.num_edges == 200_000


def test_scratch_left_by_a_killed_conversion_is_removed(tmp_path):
    dead = _dead_pid()
    left = tmp_path / f".morphpipe-csc.partial-{dead}"
    left.mkdir()
    (left / ".sorted-runs.tmp").write_bytes(b"x" * 100)
    with converters.scratch_directory(tmp_path, "csc") as scratch:
        assert scratch.name == f".morphpipe-csc.partial-{os.getpid()}" and not left.exists()
    assert list(tmp_path.iterdir()) == []


def _dead_pid() -> int:
    """The id of a process that has exited."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_budget_below_the_topology_is_refused_with_the_number_needed():
    with pytest.raises(GraphValidationError, match=r"memory_budget: is 1\.0 MiB, below the 1\.8 MiB the topology of "
                                                   r"100,000 nodes needs .* give --memory-budget 2M or more"):
        from_edge_list(random_edge_table(100_000), options=ConvertOptions(memory_budget=1 << 20,
                                                                          num_nodes=100_000))


def test_bad_id_in_a_later_chunk_is_named_by_its_edge(tmp_path, monkeypatch):
    monkeypatch.setattr("morphpipe.data.csc.CHUNK_EDGES", 1000)
    table = random_edge_table()
    table[150_001, 1] = 20_000
    with pytest.raises(GraphValidationError, match="dst: node id 20000 at edge 150001 is outside"):
        from_edge_list(table, options=ConvertOptions(memory_budget=SMALL_BUDGET, num_nodes=20_000))
