"""Typed layer-wise inference equals the model applied to the whole graph at once (every relation's whole CSC as one
typed layer), at several chunk sizes, for R-GCN, HeteroSAGE and RGAT, with a relation without edges and node types
without features (the mag-shaped graph has features on papers only)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from morphpipe.data.feature_store import FeatureStore
from morphpipe.data.hetero_generator import MagSpec, mag_shaped
from morphpipe.data.hetero_store import HeteroGraphStore
from morphpipe.nn.hetero import build_hetero_model
from morphpipe.nn.hetero_layerwise import TypedChunkBuilder, types_per_layer, typed_layerwise_inference
from morphpipe.sampling.hetero_block import HeteroBlock
from morphpipe.sampling.minibatch import Block
from tests.conftest import saved_mag_with_float16_authors

EMPTIED = ("field_of_study", "rev_has_topic", "paper")  # a relation into the target type left without edges


@pytest.fixture(scope="module")
def graph():
    store = mag_shaped(MagSpec(num_papers=90, num_authors=60, num_institutions=5, num_fields=12, feature_dim=6))
    relation = store.relation(EMPTIED)
    store = dataclasses.replace(store, indptr={**store.indptr, relation: torch.zeros(91, dtype=torch.int64)},
                                indices={**store.indices, relation: store.indices[relation][:0]})
    store.validate()
    return store


def model_for(graph, name, num_layers=2, **options):
    torch.manual_seed(1)
    model = build_hetero_model(name, num_nodes={t.name: t.count for t in graph.node_types},
                               feature_dims=graph.feature_dims, relations=graph.relations,
                               target_type=graph.target_type, num_classes=graph.num_classes, num_layers=num_layers,
                               hidden=5, dropout=0.3, **options)
    with torch.no_grad():  # non-zero biases, so a missed self term or a wrongly zeroed type shows
        for name_, parameter in model.named_parameters():
            if "bias" in name_:
                parameter.uniform_(-0.5, 0.5)
    return model


def whole_graph_logits(model, graph) -> torch.Tensor:
    """Reference: every layer applied once to the whole graph (every node of a type a source and a destination)."""
    counts = {t.name: t.count for t in graph.node_types}
    blocks = {relation: Block(graph.indptr[relation], graph.indices[relation].long(), counts[relation.src],
                              counts[relation.dst]) for relation in graph.relations}
    layer = HeteroBlock(blocks, counts, dict(counts))
    x = {t.name: graph.features[t.name] if t.name in graph.features else torch.arange(t.count)
         for t in graph.node_types}
    model.eval()
    with torch.no_grad():
        return model([layer] * model.num_layers, x)


MODELS = [("rgcn", {}), ("rgcn", {"num_bases": 2}), ("rsage", {}), ("rgat", {"heads": 2})]


@pytest.mark.parametrize("chunk_size", [4, 33, None])
@pytest.mark.parametrize("name, options", MODELS)
def test_layerwise_equals_whole_graph(graph, name, options, chunk_size) -> None:
    model = model_for(graph, name, **options).train()
    expected = whole_graph_logits(model, graph)
    model.train()
    got = typed_layerwise_inference(model, graph, chunk_size=chunk_size, progress=False)
    assert model.training, "the model's mode is restored"
    assert got.shape == (graph.node_type("paper").count, graph.num_classes)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_three_layers_reach_every_type_and_nodes_pick_rows(graph) -> None:
    """A third layer reads institutions (through authors); `nodes` are global ids, in any order, repeats allowed."""
    assert types_per_layer(3, graph.relations, "paper", graph.type_names)[0] == list(graph.type_names)
    assert "institution" not in types_per_layer(2, graph.relations, "paper", graph.type_names)[0]
    model = model_for(graph, "rgat", num_layers=3, heads=2)
    expected = whole_graph_logits(model, graph)
    start = graph.node_type("paper").start
    nodes = torch.tensor([start + 7, start + 2, start + 80, start + 2])
    got = typed_layerwise_inference(model, graph, nodes, chunk_size=3, progress=False)
    torch.testing.assert_close(got, expected[nodes - start], rtol=1e-5, atol=1e-5)


def test_tables_over_the_budget_are_memory_mapped_with_the_same_result(graph, tmp_path) -> None:
    model = model_for(graph, "rsage")
    messages: list[str] = []
    got = typed_layerwise_inference(model, graph, chunk_size=16, memory_budget=1, tmp_dir=tmp_path,
                                    progress=False, log=messages.append)
    torch.testing.assert_close(got, whole_graph_logits(model, graph), rtol=1e-5, atol=1e-5)
    on_disk = [m for m in messages if "on disk" in m]
    assert len(on_disk) == 3 and all("layer 1 table of" in m for m in on_disk), messages  # paper, author, field_of_study
    assert len([m for m in messages if "read back through a feature store" in m]) == 3, messages
    assert not list(tmp_path.iterdir()), "the tables on disk are removed"


def test_the_budget_counts_the_tables_already_made(graph) -> None:
    """Layer 1's tables (paper, author, field_of_study: 5 wide, float32) beside the paper features: a budget that
    holds the features, the paper and the author tables leaves the third table on disk."""
    features = graph.features["paper"].numel() * graph.features["paper"].element_size()
    budget = features + 5 * 4 * (graph.node_type("paper").count + graph.node_type("author").count)
    messages: list[str] = []
    model = model_for(graph, "rsage")
    got = typed_layerwise_inference(model, graph, chunk_size=16, memory_budget=budget, progress=False,
                                    log=messages.append)
    torch.testing.assert_close(got, whole_graph_logits(model, graph), rtol=1e-5, atol=1e-5)
    assert [m.split(" table of ")[1].split()[0] for m in messages if "on disk" in m] == ["'field_of_study'"]


def test_chunk_builder_relabels_each_source_type_destinations_first(graph) -> None:
    builder = TypedChunkBuilder(graph)
    dst = torch.tensor([9, 3, 40])
    layer, src_ids = builder.layer("paper", dst)
    assert layer.num_dst == {"paper": 3} and src_ids["paper"][:3].tolist() == [9, 3, 40]
    assert set(src_ids) == {"paper", "author", "field_of_study"}
    for relation in graph.relations:
        block = layer.blocks[relation]
        if relation.dst != "paper":
            assert block.num_dst == block.nnz == 0
            continue
        assert block.num_src == src_ids[relation.src].numel()
        for k, node in enumerate(dst.tolist()):
            stored = graph.indices[relation][graph.indptr[relation][node]:graph.indptr[relation][node + 1]].long()
            local = block.indices[block.indptr[k]:block.indptr[k + 1]]
            assert src_ids[relation.src][local].tolist() == stored.tolist(), relation
    assert layer.blocks[graph.relation(EMPTIED)].nnz == 0 and src_ids["field_of_study"].numel() == 0


def test_nodes_outside_the_target_type_are_refused(graph) -> None:
    author = graph.node_type("author")
    with pytest.raises(ValueError, match=r"nodes must be ids of target type 'paper', in \[0, 90\)"):
        typed_layerwise_inference(model_for(graph, "rgcn"), graph, torch.tensor([author.start]), progress=False)


def test_features_and_tables_on_disk_are_read_through_the_types_stores(tmp_path) -> None:
    """Each featured type's rows (float32 papers, float16 authors) come from its feature store, the tables over the
    budget from theirs; the logits equal, bit for bit, those of the same graph held in RAM."""
    spec = MagSpec(num_papers=80, num_authors=50, num_institutions=5, num_fields=9, feature_dim=6)
    directory = saved_mag_with_float16_authors(tmp_path / "mag", spec, author_width=3, seed=4)
    in_ram = HeteroGraphStore.load(directory)
    on_disk = HeteroGraphStore.load(directory, features_on_disk=True, io_threads=2)
    model = model_for(in_ram, "rsage")
    expected = typed_layerwise_inference(model, in_ram, chunk_size=16, progress=False)
    messages: list[str] = []
    read: set[tuple[str, bool]] = set()
    original = FeatureStore.gather

    def recording(store, ids):
        read.add((store.path.name, store.direct))
        return original(store, ids)

    FeatureStore.gather = recording
    try:
        got = typed_layerwise_inference(model, on_disk, chunk_size=16, memory_budget=1, progress=False,
                                        log=messages.append)
    finally:
        FeatureStore.gather = original
    assert torch.equal(got.view(torch.int32), expected.view(torch.int32))
    features = {(Path(store.path).name, False) for store in on_disk.feature_stores.values()}
    assert len(features) == 2 and features <= read, \
        "each featured type's rows come through a store on its file (without a cache: through the page cache)"
    assert len([m for m in messages if "read back through a feature store" in m]) == 3, messages
