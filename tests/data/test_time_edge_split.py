"""Time-based edge splits (latest edges held out, ties by pair, reverses removed, timestamps checked by name) and
negative pairs shared by a held-out split (drawn, stored and validated with the split)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from morphpipe.commands.cli import main
from morphpipe.data import GraphStore, GraphValidationError
from morphpipe.data.csc import csc_from_sorted_keys
from morphpipe.data.edge_split import EdgeSplit, edge_keys, split_edges
from morphpipe.data.edge_times import edge_times
from morphpipe.data.splits import SplitFractions

# Connections of a 6-node graph with the year each appeared; (3, 4), (4, 5) and (0, 5) tie in 2003.
YEARS = {(0, 1): 2000, (1, 2): 2001, (2, 3): 2002, (3, 4): 2003, (4, 5): 2003, (0, 5): 2003, (0, 2): 2004,
         (1, 3): 2005}
QUARTERS = SplitFractions(0.5, 0.25, 0.25)


def undirected_graph(years: dict[tuple[int, int], int], num_nodes: int = 6):
    """(indptr, indices, per-edge times in CSC order) of the connections both ways, each way with its year."""
    src = np.array([u for u, v in years] + [v for u, v in years])
    dst = np.array([v for u, v in years] + [u for u, v in years])
    keys = edge_keys(src, dst, num_nodes)
    order = np.argsort(keys)
    indptr, indices = csc_from_sorted_keys(keys[order], num_nodes)
    times = np.array([years[(min(a, b), max(a, b))] for a, b in zip(src[order].tolist(), dst[order].tolist())])
    return indptr, indices, times


def edge_set(indptr, indices) -> set[tuple[int, int]]:
    return {(int(indices[e]), v) for v in range(len(indptr) - 1) for e in range(indptr[v], indptr[v + 1])}


def test_latest_edges_are_held_out_with_ties_broken_by_pair():
    indptr, indices, times = undirected_graph(YEARS)
    result = split_edges(indptr, indices, 6, fractions=QUARTERS, negatives=2, timestamps=times)
    split = result.split
    # by time, the 2003 ties by key (destination, source): (3, 4) key 27, (0, 5) key 30, (4, 5) key 34
    assert split.train.T.tolist() == [[0, 1], [1, 2], [2, 3], [3, 4]]
    assert split.val.T.tolist() == [[0, 5], [4, 5]] and split.test.T.tolist() == [[0, 2], [1, 3]]
    assert split.source["kind"] == "time" and split.source["val_from"] == 2003 and split.source["test_from"] == 2004
    held = {(u, v) for part in (split.val, split.test) for u, v in part.T.tolist()}
    assert edge_set(result.indptr, result.indices) == \
        edge_set(indptr, indices) - held - {(v, u) for u, v in held}
    # the seed draws the negatives only: the held-out edges are set by time
    again = split_edges(indptr, indices, 6, fractions=QUARTERS, negatives=2, timestamps=times, seed=5).split
    assert torch.equal(again.val, split.val) and torch.equal(again.test, split.test)


def test_a_connection_takes_its_earliest_time_either_way_round():
    indptr, indices, times = undirected_graph(YEARS)
    late = times.copy()
    src = indices
    dst = np.repeat(np.arange(6), np.diff(indptr))
    late[(src == 1) & (dst == 0)] = 2099  # 1 -> 0 later; 0 -> 1 still 2000: the connection stays the oldest
    split = split_edges(indptr, indices, 6, fractions=QUARTERS, negatives=2, timestamps=late).split
    assert [0, 1] in split.train.T.tolist()


def test_directed_time_split_holds_out_one_direction_only():
    indptr = np.array([0, 1, 3, 4, 6])  # edges 1->0, 0->1, 2->1, 3->2, 0->3, 1->3
    indices = np.array([1, 0, 2, 3, 0, 1])
    times = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    result = split_edges(indptr, indices, 4, fractions=SplitFractions(0.5, 1 / 6, 2 / 6), negatives=1,
                         timestamps=times, undirected=False)
    assert result.split.val.T.tolist() == [[3, 2]] and result.split.test.T.tolist() == [[0, 3], [1, 3]]
    assert edge_set(result.indptr, result.indices) == {(1, 0), (0, 1), (2, 1)}


@pytest.mark.parametrize("times, problem", [
    (np.arange(5), r"shape \(5,\), expected \(16,\)"),
    (np.r_[np.arange(15.0), np.nan], "edge 15 has time nan"),
    (np.array(["2001"] * 16), "not a number type"),
])
def test_bad_timestamps_are_refused_by_name(times, problem):
    indptr, indices, _ = undirected_graph(YEARS)
    with pytest.raises(ValueError, match=f"timestamps: .*{problem}"):
        split_edges(indptr, indices, 6, fractions=QUARTERS, timestamps=times)


def test_times_from_an_edge_list_match_the_graph_edges(tmp_path):
    indptr, indices, times = undirected_graph(YEARS)
    # each connection once, one of them listed twice (the earliest time counts), a header and a comment
    rows = ["src,dst,weight,year", "# collaborations"] + [f"{u},{v},1,{y}" for (u, v), y in YEARS.items()] + \
        ["0,1,3,2010"]
    (tmp_path / "times.csv").write_text("\n".join(rows) + "\n")
    assert np.array_equal(edge_times(tmp_path / "times.csv", indptr, indices, 6, column=3), times)
    np.save(tmp_path / "times.npy", times)
    assert np.array_equal(edge_times(tmp_path / "times.npy", indptr, indices, 6), times)
    (tmp_path / "short.csv").write_text("0,1,2000\n1,2,2001\n")
    with pytest.raises(GraphValidationError, match="gives no time for edge 1 -> 0"):
        # read as directed, the listed 0 -> 1 does not time its reverse, the graph's first edge
        edge_times(tmp_path / "short.csv", indptr, indices, 6, undirected=False)


def test_split_edges_by_time_command(tmp_path, capsys):
    indptr, indices, times = undirected_graph(YEARS)
    graph = GraphStore(indptr=torch.from_numpy(indptr), indices=torch.from_numpy(indices.astype(np.int32)),
                       features=torch.zeros(6, 2), labels=torch.zeros(6, dtype=torch.int64),
                       train_idx=torch.arange(3), val_idx=torch.tensor([3]), test_idx=torch.tensor([4, 5]),
                       num_classes=1, name="years")
    graph.save(tmp_path / "plain")
    np.save(tmp_path / "times.npy", times)
    out = tmp_path / "split"
    assert main(["data", "split-edges", str(tmp_path / "plain"), "--out", str(out), "--by-time",
                 str(tmp_path / "times.npy"), "--fractions", "0.5,0.25,0.25", "--negative-pairs", "4"]) == 0
    assert "by time, val from time 2003, test from time 2004" in capsys.readouterr().out
    split = GraphStore.load(out).edge_split
    assert split.shared_negatives and split.val_negatives.shape == (2, 4)
    assert split.test.T.tolist() == [[0, 2], [1, 3]]
    record = json.loads((out / "edge_split.json").read_text())
    assert record["negatives"] == "shared-pairs" and record["negative_pairs"] == {"val": 4, "test": 4}
    assert main(["data", "info", str(out)]) == 0
    assert "train 4, val 2, test 2 edges; 4 val and 4 test negative pairs shared (undirected, by time)" in \
        capsys.readouterr().out
    np.save(tmp_path / "short.npy", times[:-1])
    assert main(["data", "split-edges", str(tmp_path / "plain"), "--out", str(tmp_path / "s2"), "--by-time",
                 str(tmp_path / "short.npy")]) == 2
    assert "timestamps: shape (15,), expected (16,)" in capsys.readouterr().err
    assert main(["data", "split-edges", str(tmp_path / "plain"), "--out", str(tmp_path / "s3"), "--by-time",
                 str(tmp_path / "missing.npy")]) == 2
    assert "missing.npy does not exist" in capsys.readouterr().err
    assert main(["data", "split-edges", str(tmp_path / "plain"), "--out", str(tmp_path / "s4"),
                 "--time-column", "3"]) == 2
    assert "add --by-time" in capsys.readouterr().err


def test_shared_negative_pairs_are_no_true_edges(tiny):
    split = split_edges(tiny.indptr.numpy(), tiny.indices.numpy(), tiny.num_nodes, negative_pairs=200, seed=4).split
    edges = edge_set(tiny.indptr.numpy(), tiny.indices.numpy())
    for part in ("val", "test"):
        pairs = split.negatives(part)
        assert pairs.shape == (2, 200)
        assert all(u != v and (u, v) not in edges for u, v in pairs.T.tolist())


def test_shared_negatives_are_validated_as_pairs():
    positives = torch.tensor([[0, 1], [1, 2]])
    good = EdgeSplit(positives, positives, positives, torch.tensor([[0, 3], [2, 1]]), torch.tensor([[0], [3]]),
                     False, shared_negatives=True)
    good.validate(4)
    with pytest.raises(GraphValidationError, match=r"val_negatives: has shape \(3, 2\), expected \(2, M\)"):
        EdgeSplit(positives, positives, positives, torch.zeros(3, 2, dtype=torch.int64), torch.tensor([[0], [3]]),
                  False, shared_negatives=True).validate(4)
    with pytest.raises(GraphValidationError, match=r"test_negatives: has shape \(2, 0\)"):
        EdgeSplit(positives, positives, positives, torch.tensor([[0], [3]]), torch.zeros(2, 0, dtype=torch.int64),
                  False, shared_negatives=True).validate(4)


def test_an_unknown_negatives_kind_is_refused_on_load(tmp_path, tiny):
    graph = tiny
    from morphpipe.data.edge_split import with_edge_split

    with_edge_split(graph, negative_pairs=5).save(tmp_path / "g")
    record = json.loads((tmp_path / "g" / "edge_split.json").read_text())
    (tmp_path / "g" / "edge_split.json").write_text(json.dumps({**record, "negatives": "per-batch"}))
    with pytest.raises(GraphValidationError, match="negatives 'per-batch' is not 'per-positive' or 'shared-pairs'"):
        GraphStore.load(tmp_path / "g")
