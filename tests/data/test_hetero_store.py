"""The heterogeneous store: its directory format round-trips, and load-time validation names the type or relation."""
from __future__ import annotations

import dataclasses
import gzip
import json

import numpy as np
import pytest
import torch

from morphpipe.commands.cli import main
from morphpipe.data.hetero_convert import from_igbh, from_ogb_mag, from_pyg_hetero, homogeneous_view, to_pyg_hetero
from morphpipe.data.hetero_generator import MAG_RELATIONS, MagSpec, mag_shaped
from morphpipe.data.hetero_store import HeteroGraphStore, NodeType, Relation
from morphpipe.data.store import load_dataset
from morphpipe.data.validation import GraphValidationError
from tests.data.conftest import assert_same_graph

SPEC = MagSpec(num_papers=300, num_authors=200, num_institutions=10, num_fields=20, feature_dim=8)


@pytest.fixture(scope="module")
def graph() -> HeteroGraphStore:
    store = mag_shaped(SPEC)
    store.validate()
    return store


def test_the_directory_format_round_trips(graph, tmp_path) -> None:
    graph.save(tmp_path / "g")
    loaded = HeteroGraphStore.load(tmp_path / "g")
    assert_same_graph(graph, loaded)
    assert loaded.validated and load_dataset(tmp_path / "g").relations == graph.relations


def test_the_mag_shaped_graph_has_the_ogbn_mag_schema_and_is_deterministic(graph) -> None:
    assert graph.type_names == ("paper", "author", "institution", "field_of_study")
    assert set(graph.relations) == set(MAG_RELATIONS) and len(MAG_RELATIONS) == 8
    assert set(graph.features) == {"paper"}
    assert_same_graph(graph, mag_shaped(SPEC))
    cites = Relation("paper", "cites", "paper")
    indptr, citing = graph.indptr[cites], graph.indices[cites].long()
    cited = torch.repeat_interleave(torch.arange(indptr.numel() - 1), indptr[1:] - indptr[:-1])
    labels = graph.labels
    assert torch.equal((labels[citing] + SPEC.num_classes // 4) % SPEC.num_classes, labels[cited]), \
        "a paper of class c cites papers of class c + C/4"


def test_every_reverse_relation_holds_the_same_edges_reversed(graph) -> None:
    for relation in MAG_RELATIONS[:4]:
        backwards = Relation(relation.dst, f"rev_{relation.name}", relation.src)
        forward = to_pairs(graph, relation)
        assert forward == {(dst, src) for src, dst in to_pairs(graph, backwards)}


def to_pairs(graph, relation) -> set[tuple[int, int]]:
    indptr = graph.indptr[relation]
    dst = torch.repeat_interleave(torch.arange(indptr.numel() - 1), indptr[1:] - indptr[:-1])
    return set(zip(graph.indices[relation].tolist(), dst.tolist()))


def broken(graph: HeteroGraphStore, **changes) -> HeteroGraphStore:
    return dataclasses.replace(graph, validated=False, **changes)


@pytest.mark.parametrize("start, words", [(250, "overlaps"), (320, "leaves a gap")])
def test_overlapping_or_gapped_type_ranges_are_refused_naming_the_type(graph, start, words) -> None:
    types = list(graph.node_types)
    types[1] = NodeType("author", start, types[1].count)
    with pytest.raises(GraphValidationError, match=f"node type 'author'.*{words}.*consecutive ranges"):
        broken(graph, node_types=tuple(types)).validate()


def test_source_ids_outside_the_source_type_are_refused_naming_the_relation(graph) -> None:
    writes = Relation("author", "writes", "paper")
    indices = dict(graph.indices)
    bad = indices[writes].clone()
    bad[3] = 200  # authors are 0..199 in their type
    indices[writes] = bad
    with pytest.raises(GraphValidationError, match=r"relation \(author, writes, paper\) indices.*200.*source type "
                                                   r"'author'.*local ids"):
        broken(graph, indices=indices).validate()


def test_a_csc_not_over_the_destination_type_is_refused_naming_the_relation(graph) -> None:
    topic = Relation("paper", "has_topic", "field_of_study")
    indptr = dict(graph.indptr)
    indptr[topic] = torch.cat([indptr[topic], indptr[topic][-1:]])
    with pytest.raises(GraphValidationError, match=r"\(paper, has_topic, field_of_study\) indptr.*'field_of_study' "
                                                   r"has 20 nodes"):
        broken(graph, indptr=indptr).validate()


def test_a_relation_naming_an_unknown_type_is_refused(graph) -> None:
    relation = Relation("venue", "hosts", "paper")
    with pytest.raises(GraphValidationError, match="source type 'venue' is not a node type"):
        broken(graph, relations=(*graph.relations, relation)).validate()


def test_a_target_type_without_labels_is_refused(graph) -> None:
    with pytest.raises(GraphValidationError, match="target type 'paper': has no labels"):
        broken(graph, labels=torch.full_like(graph.labels, -1), train_idx=torch.zeros(0, dtype=torch.long),
               val_idx=torch.zeros(0, dtype=torch.long), test_idx=torch.zeros(0, dtype=torch.long)).validate()
    with pytest.raises(GraphValidationError, match="target_type: 'venue' is not a node type"):
        broken(graph, target_type="venue").validate()


def test_feature_rows_not_matching_the_type_are_refused_naming_the_type(graph) -> None:
    with pytest.raises(GraphValidationError, match=r"features of node type 'paper'.*\(299, 8\).*300 nodes"):
        broken(graph, features={"paper": graph.features["paper"][:299].contiguous()}).validate()
    with pytest.raises(GraphValidationError, match="features of node type 'venue'"):
        broken(graph, features={**graph.features, "venue": torch.zeros(2, 2)}).validate()


def test_a_bad_file_is_refused_at_load(graph, tmp_path) -> None:
    graph.save(tmp_path / "g")
    cites = Relation("paper", "cites", "paper")
    np.save(tmp_path / "g" / f"indices.{cites.key}.npy", np.full(graph.indices[cites].numel(), 10**6, np.int32))
    with pytest.raises(GraphValidationError, match=r"relation \(paper, cites, paper\) indices"):
        HeteroGraphStore.load(tmp_path / "g")
    meta = json.loads((tmp_path / "g" / "meta.json").read_text())
    meta["node_types"][2]["start"] += 1
    (tmp_path / "g" / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(GraphValidationError, match="node type 'institution'.*gap"):
        HeteroGraphStore.load(tmp_path / "g", validate=False)


def test_pyg_heterodata_round_trips(graph) -> None:
    pytest.importorskip("torch_geometric")
    back = from_pyg_hetero(to_pyg_hetero(graph), "paper", num_classes=graph.num_classes, name=graph.name)
    assert_same_graph(graph, back)


def test_pyg_heterodata_without_target_labels_is_refused(graph) -> None:
    pytest.importorskip("torch_geometric")
    data = to_pyg_hetero(graph)
    del data["paper"].y
    with pytest.raises(GraphValidationError, match="target type 'paper': has no labels"):
        from_pyg_hetero(data, "paper")


def test_the_homogeneous_view_merges_every_relation(graph) -> None:
    view = homogeneous_view(graph)
    view.validate()
    assert view.num_nodes == graph.num_nodes and view.num_edges == graph.num_edges
    assert torch.equal(view.features[:300], graph.features["paper"]) and not view.features[300:].any()


def test_data_generate_makes_the_mag_preset(tmp_path, capsys) -> None:
    out = tmp_path / "mag"
    assert main(["data", "generate", "mag-tiny", "-o", str(out), "--classes", "4", "--seed", "3"]) == 0
    loaded = HeteroGraphStore.load(out)
    assert loaded.num_classes == 4 and loaded.source["spec"]["seed"] == 3
    assert main(["data", "generate", "mag-tiny", "-o", str(tmp_path / "x"), "--nodes", "5"]) == 2
    assert "do not apply to a mag-shaped graph" in capsys.readouterr().err


def test_pyg_heterodata_with_ids_outside_a_type_is_refused(graph) -> None:
    pytest.importorskip("torch_geometric")
    data = to_pyg_hetero(graph)
    data["author", "writes", "paper"].edge_index[0, 5] = 200
    with pytest.raises(GraphValidationError, match=r"\(author, writes, paper\) edge_index: holds source id 200 "
                                                   r"outside 'author'"):
        from_pyg_hetero(data, "paper")


def write_ogb_mag(graph: HeteroGraphStore, root) -> None:
    """`graph`'s four base relations in OGB's heterogeneous raw layout, node types in OGB's (alphabetical) order."""
    raw = root / "raw"
    types = sorted(graph.type_names)

    def write(path, lines) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(path, "wt") as handle:
            handle.write("".join(f"{line}\n" for line in lines))

    write(raw / "num-node-dict.csv.gz", [",".join(types), ",".join(str(graph.node_type(t).count) for t in types)])
    base = MAG_RELATIONS[:4]
    write(raw / "triplet-type-list.csv.gz", [f"{r.src},{r.name},{r.dst}" for r in base])
    for relation in base:
        write(raw / "relations" / f"{relation.src}___{relation.name}___{relation.dst}" / "edge.csv.gz",
              [f"{s},{d}" for s, d in sorted(to_pairs(graph, relation))])
    write(raw / "node-feat" / "paper" / "node-feat.csv.gz",
          [",".join(f"{v:.9g}" for v in row) for row in graph.features["paper"].tolist()])
    write(raw / "node-label" / "paper" / "node-label.csv.gz", [str(v) for v in graph.labels[:300].tolist()])
    for field, file in (("train_idx", "train"), ("val_idx", "valid"), ("test_idx", "test")):
        write(root / "split" / "time" / "paper" / f"{file}.csv.gz", [str(v) for v in getattr(graph, field).tolist()])


def test_an_ogb_mag_directory_converts_with_its_reverse_relations(graph, tmp_path, capsys) -> None:
    write_ogb_mag(graph, tmp_path / "ogbn_mag")
    converted = from_ogb_mag(tmp_path / "ogbn_mag")
    assert converted.type_names == ("author", "field_of_study", "institution", "paper")
    assert set(converted.relations) == set(graph.relations) and converted.target_type == "paper"
    for relation in graph.relations:
        assert to_pairs(converted, relation) == to_pairs(graph, relation), relation
    paper = converted.node_type("paper")
    torch.testing.assert_close(converted.features["paper"], graph.features["paper"])
    assert torch.equal(converted.labels[paper.start:paper.stop], graph.labels[:300])
    assert torch.equal(converted.train_idx - paper.start, graph.train_idx)
    assert main(["data", "convert", "ogb-hetero", str(tmp_path / "ogbn_mag"), "-o", str(tmp_path / "out")]) == 0
    assert HeteroGraphStore.load(tmp_path / "out").relations == converted.relations


def test_an_igbh_style_directory_converts(graph, tmp_path) -> None:
    root = tmp_path / "igbh"
    for node_type in graph.node_types:
        (root / node_type.name).mkdir(parents=True)
        rows = graph.features.get(node_type.name, torch.ones(node_type.count, 2))
        np.save(root / node_type.name / "node_feat.npy", rows.numpy())
    np.save(root / "paper" / "node_label_19.npy", graph.labels[:300].numpy())
    for relation in MAG_RELATIONS[:4]:
        (root / relation.key).mkdir()
        np.save(root / relation.key / "edge_index.npy", np.array(sorted(to_pairs(graph, relation)), dtype=np.int64))
    converted = from_igbh(root, seed=5)
    assert set(converted.relations) == set(graph.relations)
    for relation in graph.relations:
        assert to_pairs(converted, relation) == to_pairs(graph, relation), relation
    paper = converted.node_type("paper")
    assert torch.equal(converted.features["paper"], graph.features["paper"])
    assert torch.equal(converted.labels[paper.start:paper.stop], graph.labels[:300])
    assert converted.train_idx.numel() == 180 and converted.source["converter"] == "igbh"
    np.save(root / "author__writes__paper" / "edge_index.npy", np.array([[0, 300]]))
    with pytest.raises(GraphValidationError, match=r"\(author, writes, paper\) edge_index: holds destination ids "
                                                   r"outside 'paper'"):
        from_igbh(root)
