"""`morphpipe data generate | convert | info` through its argparse registration."""
from __future__ import annotations

import argparse
import gzip
import json

import numpy as np
import pytest
import scipy.sparse
import torch

from morphpipe import native
from morphpipe.data import GraphStore
from morphpipe.data.feature_store import DEFAULT_READER
from morphpipe.commands.data import register


def run(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="morphpipe")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(list(argv))
    return args.func(args)


def test_generate_preset_into_directory_then_info(tmp_path, capsys):
    assert run("data", "generate", "tiny", "-o", str(tmp_path / "g"), "--quiet") == 0
    assert "tiny: 3,000 nodes" in capsys.readouterr().out
    assert run("data", "info", str(tmp_path / "g")) == 0
    out = capsys.readouterr().out
    for fragment in ("nodes       3,000", "in-degree", "features    3,000 x 32 float32", "classes     4",
                     "train 1,800, val 600, test 600"):
        assert fragment in out


def test_info_json(tmp_path, capsys):
    run("data", "generate", "tiny", "-o", str(tmp_path), "--quiet")
    capsys.readouterr()
    run("data", "info", str(tmp_path), "--json")
    summary = json.loads(capsys.readouterr().out)
    assert summary["num_nodes"] == 3000 and summary["feature_shape"] == [3000, 32]
    assert summary["in_degree"]["max"] >= summary["in_degree"]["mean"]


def test_info_says_which_tier_each_array_is_on(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MORPHPIPE_FEATURE_READER", "pread")
    run("data", "generate", "tiny", "-o", str(tmp_path), "--quiet")
    capsys.readouterr()
    run("data", "info", str(tmp_path))
    out = capsys.readouterr().out
    assert "tiers       indptr RAM; indices memory-mapped (page cache); features memory-mapped (page cache);" in out
    run("data", "info", str(tmp_path), "--features-on-disk", "--feature-cache-mb", "0.0384")  # 300 rows of 128 B
    out = capsys.readouterr().out
    assert ("features disk (feature store, pread pool of 48 I/O threads (forced by MORPHPIPE_FEATURE_READER), "
            "O_DIRECT), 300 hottest rows (10.0%, 0.0 MB) cached in RAM") in out
    monkeypatch.delenv("MORPHPIPE_FEATURE_READER")
    run("data", "info", str(tmp_path), "--features-on-disk")
    out = capsys.readouterr().out
    unavailable = native.load().io_uring_unavailable_reason()
    reader = {"pread": "pread pool of 48 I/O threads",
              "io_uring": (f"pread pool of 48 I/O threads (io_uring unavailable: {unavailable})" if unavailable
                           else "io_uring, 49 reads in flight per gather")}[DEFAULT_READER]
    assert f"features disk (feature store, {reader}, O_DIRECT)" in out


def test_generate_preset_into_cache_and_info_by_name(tmp_path, capsys):
    assert run("data", "generate", "tiny", "--root", str(tmp_path), "--quiet") == 0
    assert (tmp_path / "tiny" / "meta.json").is_file()
    assert run("data", "info", "tiny", "--root", str(tmp_path)) == 0
    assert "tiny (generated tiny)" in capsys.readouterr().out
    stamp = (tmp_path / "tiny" / "meta.json").stat().st_mtime_ns
    run("data", "generate", "tiny", "--root", str(tmp_path), "--quiet")
    assert (tmp_path / "tiny" / "meta.json").stat().st_mtime_ns == stamp
    run("data", "generate", "tiny", "--root", str(tmp_path), "--quiet", "--force")
    assert (tmp_path / "tiny" / "meta.json").stat().st_mtime_ns != stamp


def test_generate_kind_with_options(tmp_path):
    out = tmp_path / "pl"
    assert run("data", "generate", "--kind", "power-law", "--nodes", "500", "--avg-degree", "6", "--feature-dim",
               "4", "--feature-dtype", "bfloat16", "--classes", "3", "--seed", "2", "--split", "0.5,0.25,0.25",
               "-o", str(out), "--quiet") == 0
    store = GraphStore.load(out)
    assert (store.num_nodes, store.feature_dim, store.feature_dtype, store.num_classes) == (500, 4, torch.bfloat16, 3)
    assert store.train_idx.numel() == 250
    assert store.source["spec"]["seed"] == 2


def test_generate_preset_with_override_and_force(tmp_path):
    out = str(tmp_path / "g")
    run("data", "generate", "tiny", "--nodes", "400", "-o", out, "--quiet")
    assert GraphStore.load(out).num_nodes == 400
    with pytest.raises(FileExistsError):
        run("data", "generate", "tiny", "-o", out, "--quiet")
    run("data", "generate", "tiny", "-o", out, "--quiet", "--force")
    assert GraphStore.load(out).num_nodes == 3000


@pytest.mark.parametrize("argv,message", [
    (("tiny", "--kind", "community", "-o", "x"), "not both"),
    (("--kind", "community", "-o", "x"), "--nodes"),
    (("tiny", "--seed", "3"), "change the preset"),
    ((), "give a PRESET"),
])
def test_generate_argument_errors(tmp_path, argv, message):
    with pytest.raises(ValueError, match=message):
        run("data", "generate", *argv)


def test_convert_edgelist_with_parts(tmp_path, capsys):
    (tmp_path / "edges.csv").write_text("src,dst\n0,1\n1,2\n2,0\n2,2\n")
    np.save(tmp_path / "x.npy", np.ones((3, 2), dtype=np.float16))
    np.save(tmp_path / "y.npy", np.array([0, 1, 0]))
    np.savez(tmp_path / "splits.npz", train=np.array([0]), valid=np.array([1]), test=np.array([2]))
    out = tmp_path / "out"
    assert run("data", "convert", "edgelist", str(tmp_path / "edges.csv"), "-o", str(out), "--undirected",
               "--drop-self-loops", "--features", str(tmp_path / "x.npy"), "--labels", str(tmp_path / "y.npy"),
               "--splits", str(tmp_path / "splits.npz")) == 0
    assert "3 nodes, 6 edges" in capsys.readouterr().out
    store = GraphStore.load(out)
    assert store.feature_dtype == torch.float16 and store.val_idx.tolist() == [1]
    assert store.source["converter"] == "edgelist"


def test_convert_scipy_npz(tmp_path, capsys):
    scipy.sparse.save_npz(tmp_path / "a.npz", scipy.sparse.csr_matrix(np.array([[0, 1], [0, 0]])))
    run("data", "convert", "scipy", str(tmp_path / "a.npz"), "-o", str(tmp_path / "out"), "--feature-dim", "3")
    assert "note: scipy: no features, labels, splits" in capsys.readouterr().err
    store = GraphStore.load(tmp_path / "out")
    assert store.indptr.tolist() == [0, 0, 1] and store.indices.tolist() == [0] and store.feature_dim == 3


def test_convert_ogb(tmp_path):
    root = tmp_path / "ogbn_toy"
    files = {"raw/edge.csv.gz": "0,1\n1,2\n", "raw/num-node-list.csv.gz": "3\n",
             "raw/node-feat.csv.gz": "0.5,1\n1,2\n2,3\n", "raw/node-label.csv.gz": "1\nnan\n0\n",
             "split/sales/train.csv.gz": "0\n", "split/sales/valid.csv.gz": "2\n", "split/sales/test.csv.gz": ""}
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(root / name, "wt") as handle:
            handle.write(text)
    run("data", "convert", "ogb", str(root), "-o", str(tmp_path / "out"), "--undirected")
    store = GraphStore.load(tmp_path / "out")
    assert store.labels.tolist() == [1, -1, 0] and store.num_edges == 4 and store.test_idx.numel() == 0


def test_convert_pyg_file(tmp_path):
    torch_geometric = pytest.importorskip("torch_geometric")
    data = torch_geometric.data.Data(x=torch.ones(3, 2), y=torch.tensor([0, 1, 1]),
                                     edge_index=torch.tensor([[0, 1], [1, 2]]),
                                     train_mask=torch.tensor([True, False, False]),
                                     val_mask=torch.tensor([False, True, False]),
                                     test_mask=torch.tensor([False, False, True]))
    torch.save(data, tmp_path / "data.pt")
    run("data", "convert", "pyg", str(tmp_path / "data.pt"), "-o", str(tmp_path / "out"))
    store = GraphStore.load(tmp_path / "out")
    assert store.indices.tolist() == [0, 1] and store.num_classes == 2


def test_convert_missing_source(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        run("data", "convert", "edgelist", str(tmp_path / "nope.csv"), "-o", str(tmp_path / "out"))


def test_generate_memory_budget(tmp_path, capsys):
    out = tmp_path / "g"
    with pytest.raises(ValueError, match=r"--memory-budget is 1\.0 MiB; fix: --memory-budget \d+M or more"):
        run("data", "generate", "--kind", "power-law", "--nodes", "50000", "-o", str(out), "--memory-budget", "1M")
    assert run("data", "generate", "--kind", "power-law", "--nodes", "50000", "--avg-degree", "40", "-o", str(out),
               "--memory-budget", "64MiB") == 0
    assert "sorted on disk in" in capsys.readouterr().err
    assert GraphStore.load(out).num_nodes == 50_000


def test_convert_memory_budget(tmp_path):
    rng = np.random.default_rng(0)
    np.save(tmp_path / "edges.npy", rng.integers(0, 20_000, (2, 200_000)))
    common = ("data", "convert", "edgelist", str(tmp_path / "edges.npy"), "--num-nodes", "20000", "--undirected")
    with pytest.raises(ValueError, match=r"memory_budget: is 1\.0 MiB, below .* give --memory-budget 2M or more"):
        run(*common, "-o", str(tmp_path / "small"), "--memory-budget", "1M")
    assert not (tmp_path / "small").exists()
    assert run(*common, "-o", str(tmp_path / "on-disk"), "--memory-budget", "2M") == 0
    assert run(*common, "-o", str(tmp_path / "in-memory")) == 0
    assert sorted(path.name for path in tmp_path.iterdir()) == ["edges.npy", "in-memory", "on-disk"]
    for name in ("indptr.npy", "indices.npy"):
        assert (tmp_path / "on-disk" / name).read_bytes() == (tmp_path / "in-memory" / name).read_bytes()
