"""Typed graphs with features on disk: one FeatureStore per type with features, the host cache shared between
the types by hotness per byte of row (`share_feature_cache`), and each type's tier said by the summaries."""
from __future__ import annotations

import pytest
import torch

from morphpipe.commands.cli import main
from morphpipe.data.feature_store import hottest_rows
from morphpipe.data.hetero_generator import MagSpec
from morphpipe.data.hetero_store import HeteroGraphStore, share_feature_cache
from morphpipe.data.store import load_dataset
from morphpipe.data.summary import typed_feature_tiers
from tests.conftest import saved_mag_with_float16_authors


@pytest.fixture(scope="module")
def graph_dir(tmp_path_factory):
    """mag-shaped: float32 paper rows of 32 bytes, float16 author rows of 8 bytes, two types without features."""
    spec = MagSpec(num_papers=300, num_authors=200, num_institutions=10, num_fields=20, feature_dim=8)
    return saved_mag_with_float16_authors(tmp_path_factory.mktemp("typed") / "mag", spec, author_width=4, seed=2)


def test_the_cache_goes_to_the_rows_with_most_hotness_per_byte():
    hotness = {"wide": torch.tensor([8, 1, 6, 0]), "narrow": torch.tensor([3, 5, 3])}
    row_bytes = {"wide": 4, "narrow": 2}  # per byte: wide 2, .25, 1.5, 0; narrow 1.5, 2.5, 1.5
    # narrow 1 (2.5), wide 0 (2), wide 2 (1.5; ties to the type listed first), narrow 0 and 2 (1.5), then wide 1
    assert share_feature_cache(hotness, row_bytes, 2 + 4) == {"wide": 1, "narrow": 1}
    assert share_feature_cache(hotness, row_bytes, 2 + 4 + 4) == {"wide": 2, "narrow": 1}
    assert share_feature_cache(hotness, row_bytes, 2 + 4 + 4 + 2 + 2) == {"wide": 2, "narrow": 3}
    assert share_feature_cache(hotness, row_bytes, 13) == {"wide": 2, "narrow": 2}  # the next row does not fit
    assert share_feature_cache(hotness, row_bytes, 10**9) == {"wide": 4, "narrow": 3}
    assert share_feature_cache(hotness, row_bytes, 0) == {"wide": 0, "narrow": 0}
    assert share_feature_cache({}, {}, 100) == {}


def test_source_degrees_count_the_neighbour_lists_a_node_stands_in(graph_dir):
    graph = HeteroGraphStore.load(graph_dir)
    for name in graph.type_names:
        expected = torch.zeros(graph.node_type(name).count, dtype=torch.int64)
        for relation in graph.relations:
            if relation.src == name:
                for source in graph.indices[relation].tolist():
                    expected[source] += 1
        assert torch.equal(graph.source_degrees(name), expected), name


@pytest.mark.parametrize("cache_bytes", [0, 1000, 10**9], ids=["none", "shared", "everything"])
def test_each_type_caches_its_share_of_the_budget_its_hottest_rows(graph_dir, cache_bytes):
    graph = HeteroGraphStore.load(graph_dir, features_on_disk=True, feature_cache_bytes=cache_bytes, io_threads=1)
    hotness = {name: graph.source_degrees(name) for name in ("paper", "author")}
    share = share_feature_cache(hotness, {"paper": 32, "author": 8}, cache_bytes)
    assert {name: store.num_cached for name, store in graph.feature_stores.items()} == share
    assert sum(store.cache_bytes for store in graph.feature_stores.values()) <= cache_bytes
    if cache_bytes == 1000:
        assert all(0 < rows < graph.node_type(name).count for name, rows in share.items())  # a real split
        assert 1000 - 32 < sum(store.cache_bytes for store in graph.feature_stores.values())
    for name, store in graph.feature_stores.items():
        assert store.dtype == graph.features[name].dtype and store.shape == tuple(graph.features[name].shape)
        hottest = hottest_rows(hotness[name], store.num_cached)
        store.reset_counters()
        assert torch.equal(store.gather(hottest), graph.features[name][hottest])
        assert store.counters().misses == 0  # exactly the hottest rows are the cached ones


def test_load_dataset_puts_a_typed_graphs_features_on_disk_and_the_summaries_say_so(graph_dir, capsys):
    graph = load_dataset(graph_dir, features_on_disk=True, feature_cache_bytes=1000)
    assert graph.is_hetero and set(graph.feature_stores) == {"paper", "author"}
    tiers = typed_feature_tiers(graph)
    assert tiers["institution"] == tiers["field_of_study"] == "none (embedded by the model)"
    assert tiers["paper"].startswith("disk (feature store, ") and "cached in RAM" in tiers["paper"]
    assert typed_feature_tiers(load_dataset(graph_dir))["paper"] == "memory-mapped (page cache)"
    assert main(["data", "info", str(graph_dir), "--features-on-disk", "--feature-cache-mb", "0.001"]) == 0
    out = capsys.readouterr().out
    assert "features by node type:" in out and "  institution: none (embedded by the model)" in out
    assert f"  paper: {tiers['paper']}" in out


@pytest.mark.parametrize("options, message", [
    ({"feature_cache_bytes": -1}, "feature_cache_bytes"),
    ({"feature_cache_bytes": 1.5}, "feature_cache_bytes"),
    ({"io_threads": -2}, "io_threads"),
])
def test_bad_disk_settings_are_refused_naming_the_field(graph_dir, options, message):
    with pytest.raises(ValueError, match=message):
        HeteroGraphStore.load(graph_dir, features_on_disk=True, **options)
