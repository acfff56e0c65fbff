"""Edge splits: held-out edges (and reverses) leave the topology, negatives are no true edges, storage round-trips,
bad splits are refused by name, `data split-edges` writes a graph with its split, the link preset has one."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from morphpipe.commands.cli import main
from morphpipe.data import GraphStore, GraphValidationError
from morphpipe.data.edge_split import EdgeSplit, contains, split_edges, with_edge_split
from morphpipe.data.generators import COMMUNITY, GeneratorSpec
from morphpipe.data.link_generator import EdgeSplitSpec, generate_link
from morphpipe.data.splits import SplitFractions


def edge_set(indptr, indices) -> set[tuple[int, int]]:
    indptr, indices = np.asarray(indptr), np.asarray(indices)
    return {(int(indices[e]), v) for v in range(indptr.size - 1) for e in range(indptr[v], indptr[v + 1])}


@pytest.fixture(scope="module")
def link_graph(tmp_path_factory):
    spec = GeneratorSpec(COMMUNITY, num_nodes=600, avg_degree=8, feature_dim=8, num_classes=6, homophily=0.9)
    path = generate_link(spec, EdgeSplitSpec(SplitFractions(0.8, 0.1, 0.1), negatives=20, seed=3),
                         tmp_path_factory.mktemp("link") / "g", progress=False)
    return GraphStore.load(path)


def test_held_out_edges_and_reverses_leave_the_topology(tiny):
    before = edge_set(tiny.indptr, tiny.indices)
    result = split_edges(tiny.indptr.numpy(), tiny.indices.numpy(), tiny.num_nodes,
                         fractions=SplitFractions(0.8, 0.1, 0.1), negatives=5, seed=1)
    after = edge_set(result.indptr, result.indices)
    split = result.split
    assert split.undirected
    held = {(int(u), int(v)) for part in (split.val, split.test) for u, v in part.T}
    assert held and not held & after and not {(v, u) for u, v in held} & after
    train = {(int(u), int(v)) for u, v in split.train.T}
    assert train <= after and {(v, u) for u, v in train} <= after
    # every connection is in exactly one split, and only held-out edges left
    assert after == before - held - {(v, u) for u, v in held}
    assert len(train) + len(held) == sum(1 for u, v in before if u < v)
    assert not train & held


def test_negatives_are_not_true_edges_nor_the_source(tiny):
    split = split_edges(tiny.indptr.numpy(), tiny.indices.numpy(), tiny.num_nodes, negatives=30, seed=2).split
    edges = edge_set(tiny.indptr, tiny.indices)
    for part in ("val", "test"):
        src = split.pairs(part)[0]
        negatives = split.negatives(part)
        assert negatives.shape == (src.numel(), 30)
        for u, row in zip(src.tolist(), negatives.tolist()):
            assert u not in row and not any((u, w) in edges for w in row)


def test_directed_split_holds_out_one_direction_only():
    indptr = np.array([0, 1, 3, 4, 6])  # edges 1->0, 0->1, 2->1, 3->2, 0->3, 1->3
    indices = np.array([1, 0, 2, 3, 0, 1])
    result = split_edges(indptr, indices, 4, fractions=SplitFractions(0.5, 0.25, 0.25), negatives=1, seed=0)
    split = result.split
    assert not split.undirected
    held = {(int(u), int(v)) for part in (split.val, split.test) for u, v in part.T}
    after = edge_set(result.indptr, result.indices)
    assert after == edge_set(indptr, indices) - held
    with pytest.raises(ValueError, match="no reverse"):
        split_edges(indptr, indices, 4, undirected=True)


def test_split_is_deterministic_per_seed(tiny):
    first, again, other = (split_edges(tiny.indptr.numpy(), tiny.indices.numpy(), tiny.num_nodes, negatives=3,
                                       seed=seed).split for seed in (4, 4, 5))
    assert torch.equal(first.val, again.val) and torch.equal(first.test_negatives, again.test_negatives)
    assert not torch.equal(first.val, other.val)


def test_link_graph_round_trips_and_is_validated(link_graph, tmp_path):
    split = link_graph.edge_split
    assert split is not None and split.val_negatives.shape == (split.val.shape[1], 20)
    link_graph.save(tmp_path / "copy")
    again = GraphStore.load(tmp_path / "copy")
    for name, tensor in split.arrays().items():
        assert torch.equal(tensor, again.edge_split.arrays()[name]), name
    bad = EdgeSplit(split.train, split.val, split.test, split.val_negatives[:-1], split.test_negatives, True)
    with pytest.raises(GraphValidationError, match="val_negatives"):
        bad.validate(link_graph.num_nodes)
    outside = split.train.clone()
    outside[1, 0] = link_graph.num_nodes
    with pytest.raises(GraphValidationError, match=f"train_edges.*outside \\[0, {link_graph.num_nodes}\\)"):
        EdgeSplit(outside, split.val, split.test, split.val_negatives, split.test_negatives, True).validate(
            link_graph.num_nodes)


def test_graph_without_split_names_split_edges(tiny):
    with pytest.raises(GraphValidationError, match="data split-edges"):
        tiny.require_edge_split()


def test_saving_without_a_split_drops_a_stale_one(link_graph, tmp_path):
    link_graph.save(tmp_path / "g")
    plain = GraphStore.load(tmp_path / "g")
    plain.edge_split = None
    plain.save(tmp_path / "g")
    assert GraphStore.load(tmp_path / "g").edge_split is None


def test_split_edges_command(tmp_path, tiny, capsys):
    tiny.save(tmp_path / "plain")
    out = tmp_path / "split"
    assert main(["data", "split-edges", str(tmp_path / "plain"), "--out", str(out), "--negatives", "7",
                 "--fractions", "0.8,0.1,0.1", "--seed", "3"]) == 0
    graph = GraphStore.load(out)
    expected = with_edge_split(tiny, fractions=SplitFractions(0.8, 0.1, 0.1), negatives=7, seed=3)
    assert torch.equal(graph.edge_split.val, expected.edge_split.val)
    assert torch.equal(graph.indices.long(), expected.indices.long())
    assert "validation" in capsys.readouterr().out
    # refuses to overwrite without --force, and names the option
    assert main(["data", "split-edges", str(tmp_path / "plain"), "--out", str(out)]) == 2
    assert "--force" in capsys.readouterr().err


def test_an_edge_list_with_a_split_column_converts_to_a_link_dataset(tmp_path, capsys):
    rows = ["src,dst,split", "0,1,train", "1,2,train", "2,3,train", "3,4,train", "4,5,train", "5,0,train",
            "0,2,val", "1,3,valid", "2,4,test", "# a comment", "3,5,2"]
    (tmp_path / "edges.csv").write_text("\n".join(rows) + "\n")
    assert main(["data", "convert", "edgelist", str(tmp_path / "edges.csv"), "-o", str(tmp_path / "g"), "--undirected",
                 "--edge-split-column", "--negatives", "2"]) == 0
    graph = GraphStore.load(tmp_path / "g")
    split = graph.edge_split
    assert split.undirected and split.train.shape[1] == 6
    assert split.val.tolist() == [[0, 1], [2, 3]] and split.test.tolist() == [[2, 3], [4, 5]]
    topology = edge_set(graph.indptr, graph.indices)
    assert topology == {(u, v) for u, v in split.train.T.tolist()} | {(v, u) for u, v in split.train.T.tolist()}
    listed = {(u, v) for u, v in [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 0), (0, 2), (1, 3), (2, 4), (3, 5)]}
    listed |= {(v, u) for u, v in listed}
    for part in ("val", "test"):
        for u, row in zip(split.pairs(part)[0].tolist(), split.negatives(part).tolist()):
            assert u not in row and not any((u, w) in listed for w in row)
    # a held-out edge that is also a training edge would leak into message passing: refused by name
    (tmp_path / "leak.csv").write_text("0,1,train\n1,2,train\n1,0,test\n")
    assert main(["data", "convert", "edgelist", str(tmp_path / "leak.csv"), "-o", str(tmp_path / "l"), "--undirected",
                 "--edge-split-column"]) == 2
    assert "test edge 1 -> 0 is also a training edge" in capsys.readouterr().err
    (tmp_path / "bad.csv").write_text("0,1,train\n1,2,holdout\n")
    assert main(["data", "convert", "edgelist", str(tmp_path / "bad.csv"), "-o", str(tmp_path / "b"),
                 "--edge-split-column"]) == 2
    assert "split 'holdout' is not train" in capsys.readouterr().err


def write_ogb_link(root, *, citation_style: bool) -> None:
    """A miniature ogbl-* download: raw/edge.csv.gz (the training graph, each edge once; collab style with its
    edge_year and edge_weight files) and split/time/*.pt (collab: edge, year, weight, and shared edge_neg pairs)."""
    import gzip

    (root / "raw").mkdir(parents=True)
    (root / "split" / "time").mkdir(parents=True)
    train = [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 0)]
    with gzip.open(root / "raw" / "edge.csv.gz", "wt") as handle:
        handle.write("".join(f"{u},{v}\n" for u, v in train))
    with gzip.open(root / "raw" / "num-node-list.csv.gz", "wt") as handle:
        handle.write("8\n")
    if not citation_style:
        with gzip.open(root / "raw" / "edge_year.csv.gz", "wt") as handle:
            handle.write("".join(f"{2010 + i}\n" for i in range(len(train))))
        with gzip.open(root / "raw" / "edge_weight.csv.gz", "wt") as handle:
            handle.write("1\n" * len(train))
    held = {"train": train, "valid": [(0, 2), (1, 3)], "test": [(2, 4), (6, 7)]}
    for number, (file, pairs) in enumerate(held.items()):
        pairs = torch.tensor(pairs)
        if citation_style:
            record = {"source_node": pairs[:, 0], "target_node": pairs[:, 1]}
            if file != "train":
                record["target_node_neg"] = torch.tensor([[5, 6, 7]] * len(pairs))
        else:
            record = {"edge": pairs, "year": torch.full((len(pairs),), 2016 + number), "weight": torch.ones(len(pairs))}
            if file != "train":
                record["edge_neg"] = torch.tensor([[0, 7], [3, 7], [1, 6]])
        torch.save(record, root / "split" / "time" / f"{file}.pt")


def test_ogb_link_directories_convert_with_their_split(tmp_path, capsys):
    write_ogb_link(tmp_path / "ogbl-citation", citation_style=True)
    assert main(["data", "convert", "ogbl", str(tmp_path / "ogbl-citation"), "-o", str(tmp_path / "c")]) == 0
    graph = GraphStore.load(tmp_path / "c")
    split = graph.edge_split
    assert not split.undirected and graph.num_nodes == 8 and graph.num_edges == 6 and not split.shared_negatives
    assert split.val.tolist() == [[0, 1], [2, 3]] and split.test_negatives.tolist() == [[5, 6, 7]] * 2
    write_ogb_link(tmp_path / "ogbl-collab", citation_style=False)
    assert main(["data", "convert", "ogbl", str(tmp_path / "ogbl-collab"), "-o", str(tmp_path / "u"),
                 "--undirected"]) == 0
    graph = GraphStore.load(tmp_path / "u")
    split = graph.edge_split
    # collab's edge_neg pairs are kept as they are, shared by every positive of the split (ranked by Hits@K)
    assert split.undirected and graph.num_edges == 12 and split.shared_negatives
    assert split.val_negatives.tolist() == [[0, 3, 1], [7, 7, 6]] and torch.equal(split.test_negatives,
                                                                                  split.val_negatives)
    assert split.source["edge_year"] == {"raw": [2010, 2015], "train": [2016, 2016], "val": [2017, 2017],
                                         "test": [2018, 2018]}
    assert split.source["edge_weight"] == {"raw": [1.0, 1.0], "stored": False}
    # its own negatives make --negatives meaningless: refused by name
    assert main(["data", "convert", "ogbl", str(tmp_path / "ogbl-collab"), "-o", str(tmp_path / "n"),
                 "--negatives", "4"]) == 2
    assert "gives its own fixed negatives (edge_neg pairs); drop --negatives" in capsys.readouterr().err
    import gzip

    with gzip.open(tmp_path / "ogbl-collab" / "raw" / "edge_year.csv.gz", "wt") as handle:
        handle.write("2010\n2011\n")
    assert main(["data", "convert", "ogbl", str(tmp_path / "ogbl-collab"), "-o", str(tmp_path / "y")]) == 2
    assert "edge year: " in capsys.readouterr().err


def test_data_info_describes_the_edge_split(link_graph, tmp_path, capsys):
    link_graph.save(tmp_path / "g")
    assert main(["data", "info", str(tmp_path / "g")]) == 0
    split = link_graph.edge_split
    assert (f"edge split  train {split.train.shape[1]:,}, val {split.val.shape[1]:,}, test {split.test.shape[1]:,} "
            "edges; 20 negatives each (undirected)") in capsys.readouterr().out


def test_randomlinksplit_output_converts_with_its_split(tmp_path, capsys):
    pyg = pytest.importorskip("torch_geometric")
    from torch_geometric.transforms import RandomLinkSplit
    from torch_geometric.utils import to_undirected

    generator = torch.Generator().manual_seed(0)
    edge_index = to_undirected(torch.randint(0, 60, (2, 300), generator=generator))
    data = pyg.data.Data(x=torch.randn(60, 4, generator=generator), edge_index=edge_index, num_nodes=60)
    train, val, test = RandomLinkSplit(num_val=0.1, num_test=0.1, is_undirected=True)(data)
    torch.save((train, val, test), tmp_path / "split.pt")
    assert main(["data", "convert", "pyg-link", str(tmp_path / "split.pt"), "-o", str(tmp_path / "g"),
                 "--negatives", "5"]) == 0
    assert "drew 5 negative destinations" in capsys.readouterr().err
    graph = GraphStore.load(tmp_path / "g")
    split = graph.edge_split
    assert split.undirected and torch.equal(graph.features, train.x)
    assert edge_set(graph.indptr, graph.indices) == {tuple(e) for e in train.edge_index.T.tolist()}
    for part, data in (("val", val), ("test", test)):
        positives = data.edge_label_index[:, data.edge_label == 1]
        assert torch.equal(split.pairs(part), positives) and split.negatives(part).shape == (positives.shape[1], 5)


def test_contains_looks_keys_up_as_isin_does() -> None:
    """The sorted-order lookup behind negative drawing and the symmetry check: repeated keys, keys below and above
    the table, any shape, and an empty table or query."""
    rng = np.random.default_rng(0)
    table = np.unique(rng.integers(0, 1000, 300))
    keys = np.concatenate([rng.integers(-5, 1005, 2000), table[:7], table[:7]]).reshape(-1, 2)
    assert np.array_equal(contains(table, keys), np.isin(keys, table))
    assert contains(np.empty(0, dtype=np.int64), keys).shape == keys.shape
    assert not contains(np.empty(0, dtype=np.int64), keys).any()
    assert contains(table, np.empty((0, 3), dtype=np.int64)).shape == (0, 3)
