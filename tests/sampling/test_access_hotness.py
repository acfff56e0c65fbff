"""The expected-access hotness of feature rows against Monte Carlo estimates of the sampler it models, its edge pass
against a plain count, and the feature cache it chooses."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from morphpipe import native
from morphpipe.data.feature_store import hottest_rows
from morphpipe.data.store import load_dataset
from morphpipe.sampling.access_hotness import expected_batch_reads, rank_by_expected_access, read_probability
from tests.conftest import make_graph


def read_frequency(indptr, indices, seeds, batch_size, fanouts, trials) -> torch.Tensor:
    """Monte Carlo: the share of `trials` batches (`batch_size` seeds drawn from `seeds`, sampled by the native
    sampler) whose input nodes hold each node."""
    generator = torch.Generator().manual_seed(7)
    counts = torch.zeros(indptr.numel() - 1, dtype=torch.float64)
    for trial in range(trials):
        batch = seeds[torch.randperm(seeds.numel(), generator=generator)[:batch_size]]
        input_nodes, _, _ = native.ops().sample_neighbors(indptr, indices, batch, fanouts, trial)
        counts[input_nodes] += 1
    return counts / trials


def test_the_model_is_exact_where_no_two_paths_meet():
    # a tree of in-neighbours: 0 <- 1..6, 1 <- 7..10; the seed 0 re-samples at the second hop, as the sampler does
    indptr = torch.tensor([0, 6, 10] + [10] * 9, dtype=torch.int64)
    indices = torch.arange(1, 11, dtype=torch.int64)
    seed = torch.zeros(11, dtype=torch.float64)
    seed[0] = 1.0
    model = read_probability(indptr, indices, seed, [2, 2])
    expected = torch.tensor([1.0] + [1 - (2 / 3) ** 2] * 6 + [1 / 3 * 2 / 4] * 4, dtype=torch.float64)
    torch.testing.assert_close(model, expected)
    # 6,000 batches: the standard error of each frequency is at most 0.0065; 0.03 is more than 4 of them
    measured = read_frequency(indptr, indices, torch.tensor([0]), 1, [2, 2], 6_000)
    assert (measured - model).abs().max() < 0.03


@pytest.mark.parametrize("fanouts", [[4, 3], [3, 3, 2], [5, -1]])
def test_the_model_follows_the_sampler_on_a_random_graph(fanouts):
    """Where paths meet, treating picks as independent over-counts a little (at most 0.15 absolute here, 0.05 on
    average over 3,000 batches of 8 of the 1,000 training nodes); the ranking is what the cache uses, and the rows the
    model puts in the hottest fifth take at least 90% of the reads the truly hottest fifth would."""
    graph = make_graph(2_000)
    batch_size = 8
    seed = torch.zeros(2_000, dtype=torch.float64)
    seed[graph.train_idx] = batch_size / graph.train_idx.numel()
    model = read_probability(graph.indptr, graph.indices, seed, fanouts)
    measured = read_frequency(graph.indptr, graph.indices, graph.train_idx, batch_size, fanouts, 3_000)
    assert (measured - model).abs().max() < 0.15 and (measured - model).abs().mean() < 0.05
    top = 400
    chosen = measured[hottest_rows(model, top)].sum()
    best = measured[hottest_rows(measured, top)].sum()
    assert chosen >= 0.9 * best


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_the_edge_pass_adds_each_destination_value_to_its_in_neighbours(index_dtype):
    graph = make_graph(500, index_dtype=index_dtype)
    values = torch.from_numpy(np.random.default_rng(1).standard_normal(500))
    values[::3] = 0.0  # skipped destinations
    out = torch.full((500,), 2.0, dtype=torch.float64)
    native.ops().add_to_sources(graph.indptr, graph.indices, values, 100, 400, out)
    degrees = (graph.indptr[1:] - graph.indptr[:-1])
    edge_values = torch.repeat_interleave(values, degrees)
    edges = slice(int(graph.indptr[100]), int(graph.indptr[400]))
    expected = 2.0 + torch.bincount(graph.indices[edges].long(), weights=edge_values[edges], minlength=500)
    torch.testing.assert_close(out, expected)


def test_the_edge_pass_refuses_a_node_id_outside_the_graph_and_a_bad_range():
    indptr = torch.tensor([0, 2, 3], dtype=torch.int64)
    values, out = torch.ones(2, dtype=torch.float64), torch.zeros(2, dtype=torch.float64)
    with pytest.raises(RuntimeError, match=r"indices\[1\] holds a node id outside \[0, 2\)"):
        native.ops().add_to_sources(indptr, torch.tensor([0, 5, 1]), values, 0, 2, out)
    with pytest.raises(RuntimeError, match=r"destination range \[1, 3\) must lie inside \[0, 2\]"):
        native.ops().add_to_sources(indptr, torch.tensor([0, 1, 1]), values, 1, 3, out)
    with pytest.raises(RuntimeError, match="values must be float64 with one value per node"):
        native.ops().add_to_sources(indptr, torch.tensor([0, 1, 1]), values.float(), 0, 2, out)


def test_chunked_passes_give_the_same_values_as_one():
    graph = make_graph(800)
    seed = torch.zeros(800, dtype=torch.float64)
    seed[graph.train_idx] = 0.05
    whole = read_probability(graph.indptr, graph.indices, seed, [4, 3, 2])
    assert torch.equal(read_probability(graph.indptr, graph.indices, seed, [4, 3, 2], chunk_edges=500), whole)


def test_every_seed_is_read_at_least_once_an_epoch():
    graph = make_graph(600)
    reads = expected_batch_reads(graph.indptr, graph.indices, graph.train_idx, [3, 2], batch_size=30)
    assert bool((reads[graph.train_idx] >= 1.0 - 1e-9).all())
    assert bool((reads >= 0).all()) and float(reads.max()) <= 10.0  # 300 seeds: 10 batches an epoch


def test_the_feature_cache_holds_the_rows_with_the_most_expected_reads(tmp_path):
    from morphpipe.data import GeneratorSpec, generate

    generate(GeneratorSpec(kind="power-law", num_nodes=2_000, avg_degree=6, feature_dim=8), tmp_path / "graph",
             progress=False)
    graph = load_dataset(tmp_path / "graph", features_on_disk=True, feature_cache_bytes=100 * 8 * 4)
    assert rank_by_expected_access(graph, graph.train_idx, [4, 3], 64)
    assert graph.cache_ranked_by.startswith("expected access (fanouts 4,3, batch 64")
    reads = expected_batch_reads(graph.indptr, graph.indices, graph.train_idx, [4, 3], 64)
    hottest = hottest_rows(reads.float(), 100)
    store = graph.feature_store
    assert store.num_cached == 100
    store.reset_counters()
    assert torch.equal(store.gather(hottest), graph.features[hottest])
    others = torch.tensor(sorted(set(range(2_000)) - set(hottest.tolist()))[:50])
    store.gather(others)
    counted = store.counters()
    assert (counted.hits, counted.misses) == (100, 50)
    ranking = graph.cache_ranking
    assert rank_by_expected_access(graph, graph.train_idx, [4, 3], 64)  # the same workload: not computed again
    assert graph.cache_ranking is ranking and graph.feature_store is store


@pytest.fixture(scope="module")
def link_graph(tmp_path_factory):
    """A directed power-law graph with an edge split: 1,500 nodes, about 6,000 training edges."""
    from morphpipe.data import GeneratorSpec
    from morphpipe.data.link_generator import EdgeSplitSpec, generate_link
    from morphpipe.data.splits import SplitFractions

    spec = GeneratorSpec(kind="power-law", num_nodes=1_500, avg_degree=5, feature_dim=4, undirected=False)
    path = generate_link(spec, EdgeSplitSpec(SplitFractions(0.8, 0.1, 0.1), negatives=2),
                         tmp_path_factory.mktemp("link") / "g", progress=False)
    return load_dataset(path)


def link_read_frequency(graph, fanouts, batch_size, negatives, trials) -> tuple[torch.Tensor, torch.Tensor]:
    """Monte Carlo: the shares of `trials` edge batches (`batch_size` training edges drawn at random, built by the
    native edge batcher with `negatives`, leaving no edge out of the blocks) whose seeds and whose input nodes hold
    each node."""
    generator = torch.Generator().manual_seed(7)
    seeds = torch.zeros(graph.num_nodes, dtype=torch.float64)
    inputs = torch.zeros(graph.num_nodes, dtype=torch.float64)
    src, dst = graph.edge_split.train[0].contiguous(), graph.edge_split.train[1].contiguous()
    cdf = negatives.cdf(graph)
    for trial in range(trials):
        ids = torch.randperm(src.numel(), generator=generator)[:batch_size]
        batch_seeds, _, _, _, input_nodes, _, _ = native.ops().sample_edge_batch(
            graph.indptr, graph.indices, src, dst, ids, fanouts, negatives.k, cdf, False, graph.edge_split.undirected,
            False, trial)
        seeds[batch_seeds] += 1
        inputs[input_nodes] += 1
    return seeds / trials, inputs / trials


@pytest.mark.parametrize("kind", ["uniform", "degree"])
def test_the_link_model_follows_the_edge_batcher(link_graph, kind):
    """An edge batch's seeds (its positives' endpoints and its negatives) follow from the training edges and the
    negatives' distribution: within 0.04 of their frequency over 3,000 batches (a standard error of at most 0.009).
    The hops then over-count where paths meet, as for node batches; the rows the model puts in the hottest fifth
    take at least 90% of the reads the truly hottest fifth would."""
    from morphpipe.sampling.access_hotness import expected_link_batch_reads, link_seed_probability
    from morphpipe.sampling.edge_batcher import NegativeSampling

    graph, fanouts, batch_size = link_graph, [4, 3], 16
    negatives = NegativeSampling(3, kind)
    src, dst = graph.edge_split.train
    seeds, inputs = link_read_frequency(graph, fanouts, batch_size, negatives, 3_000)
    seed_model = link_seed_probability(graph.num_nodes, src, dst, batch_size, negatives.k,
                                       negatives.draw_probability(graph))
    assert (seeds - seed_model).abs().max() < 0.04
    num_batches = -(-src.numel() // batch_size)
    model = expected_link_batch_reads(graph.indptr, graph.indices, src, dst, fanouts, batch_size, negatives.k,
                                      negatives.draw_probability(graph)) / num_batches
    assert (inputs - model).abs().max() < 0.15 and (inputs - model).abs().mean() < 0.05
    top = graph.num_nodes // 5
    assert inputs[hottest_rows(model, top)].sum() >= 0.9 * inputs[hottest_rows(inputs, top)].sum()
    # in-degree, the ranking the cache had before, takes fewer of them
    by_degree = inputs[hottest_rows(graph.in_degrees(), top)].sum()
    assert inputs[hottest_rows(model, top)].sum() > by_degree


def test_link_seeds_are_exact_for_a_node_on_one_edge_and_certain_on_all():
    from morphpipe.sampling.access_hotness import link_seed_probability

    # edges 0->1, 2->3, 2->4, 2->5, 2->2 (a self loop touches 2 once): batches of 2 of the 5 edges, no negatives
    src, dst = torch.tensor([0, 2, 2, 2, 2]), torch.tensor([1, 3, 4, 5, 2])
    probability = link_seed_probability(7, src, dst, 2, 0, torch.full((7,), 1 / 7, dtype=torch.float64))
    assert probability[0] == pytest.approx(2 / 5) and probability[1] == pytest.approx(2 / 5)
    assert probability[2] == 1.0 and probability[6] == 0.0  # on 4 of 5 edges: every batch of 2 takes one
    with_negatives = link_seed_probability(7, src, dst, 2, 3, torch.full((7,), 1 / 7, dtype=torch.float64))
    assert with_negatives[6] == pytest.approx(1 - (6 / 7) ** 6)
    with pytest.raises(ValueError, match=r"training edges name nodes outside \[0, 5\)"):
        link_seed_probability(5, src, dst, 2, 0, torch.full((5,), 0.2, dtype=torch.float64))


def test_the_feature_cache_of_a_link_workload_holds_the_rows_with_the_most_expected_link_reads(tmp_path):
    from morphpipe.data import GeneratorSpec
    from morphpipe.data.link_generator import EdgeSplitSpec, generate_link
    from morphpipe.sampling.access_hotness import expected_link_batch_reads, rank_by_expected_link_access
    from morphpipe.sampling.edge_batcher import NegativeSampling

    spec = GeneratorSpec(kind="power-law", num_nodes=1_000, avg_degree=5, feature_dim=8, undirected=False)
    path = generate_link(spec, EdgeSplitSpec(), tmp_path / "g", progress=False)
    graph = load_dataset(path, features_on_disk=True, feature_cache_bytes=100 * 8 * 4)
    negatives = NegativeSampling(2, "degree")
    edges = torch.arange(graph.edge_split.train.shape[1])
    assert rank_by_expected_link_access(graph, edges, [3, 2], 32, negatives)
    assert graph.cache_ranked_by == (f"expected access of link batches (fanouts 3,2, batch 32, {edges.numel():,} "
                                     "training edges, 2 degree negatives each)")
    src, dst = graph.edge_split.train
    reads = expected_link_batch_reads(graph.indptr, graph.indices, src, dst, [3, 2], 32, 2,
                                      negatives.draw_probability(graph))
    store = graph.feature_store
    assert store.num_cached == 100
    store.reset_counters()
    hottest = hottest_rows(reads.float(), 100)
    assert torch.equal(store.gather(hottest), graph.features[hottest]) and store.counters().misses == 0
    half = edges[1::2]  # an epoch over some of the training edges ranks by those
    assert rank_by_expected_link_access(graph, half, [3, 2], 32, negatives)
    src, dst = graph.edge_split.train[:, half]
    torch.testing.assert_close(graph.cache_ranking[1], expected_link_batch_reads(
        graph.indptr, graph.indices, src, dst, [3, 2], 32, 2, negatives.draw_probability(graph)).float())
    with pytest.raises(ValueError, match="edge_ids"):
        rank_by_expected_link_access(graph, torch.tensor([edges.numel()]), [3, 2], 32, negatives)


@pytest.fixture(scope="module")
def typed_graph_dir(tmp_path_factory):
    """mag-shaped: float32 paper rows of 32 bytes, float16 author rows of 8 bytes, two types without features."""
    from morphpipe.data.hetero_generator import MagSpec
    from tests.conftest import saved_mag_with_float16_authors

    spec = MagSpec(num_papers=600, num_authors=400, num_institutions=10, num_fields=20, feature_dim=8)
    return saved_mag_with_float16_authors(tmp_path_factory.mktemp("typed") / "mag", spec, author_width=4, seed=2)


def test_the_typed_model_follows_the_typed_sampler(typed_graph_dir):
    """Per relation fanouts (one relation left out at the second hop): the expected reads per featured type against
    their frequency over 2,000 typed batches of 16 training papers, within the node model's bounds; the rows the model
    puts in each type's hottest fifth take at least 90% of the reads the truly hottest fifth would."""
    from morphpipe.sampling.access_hotness import expected_typed_batch_reads
    from morphpipe.sampling.hetero_batcher import HeteroCpuBatcher

    graph = load_dataset(typed_graph_dir)
    fanouts = {relation.key: [3, 0 if relation.name == "rev_writes" else 2] for relation in graph.relations}
    batch_size, trials = 16, 2_000
    counts = torch.zeros(graph.num_nodes, dtype=torch.float64)
    generator = torch.Generator().manual_seed(7)
    with HeteroCpuBatcher(graph, fanouts, batch_size, num_threads=1, serial=True) as batcher:
        for trial in range(trials):
            seeds = graph.train_idx[torch.randperm(graph.train_idx.numel(), generator=generator)[:batch_size]]
            counts[batcher._native.build(seeds, 0, trial)[2]] += 1
    num_batches = -(-graph.train_idx.numel() // batch_size)
    model = expected_typed_batch_reads(graph, graph.train_idx, fanouts, batch_size)
    assert set(model) == {"paper", "author"}
    for name, reads in model.items():
        node_type = graph.node_type(name)
        measured = counts[node_type.start:node_type.stop] / trials
        expected = reads / num_batches
        assert (measured - expected).abs().max() < 0.15 and (measured - expected).abs().mean() < 0.05, name
        top = node_type.count // 5
        assert measured[hottest_rows(expected, top)].sum() >= 0.9 * measured[hottest_rows(measured, top)].sum()


def test_a_typed_graphs_shared_cache_ranks_by_expected_access_per_byte(typed_graph_dir):
    from morphpipe.data.hetero_store import share_feature_cache
    from morphpipe.sampling.access_hotness import expected_typed_batch_reads, rank_by_expected_typed_access

    from morphpipe.profiler.disk import resident_bytes

    graph = load_dataset(typed_graph_dir, features_on_disk=True, feature_cache_bytes=4_000)
    assert graph.cache_ranked_by == "source degree per byte"
    unranked = resident_bytes(graph)
    assert rank_by_expected_typed_access(graph, graph.train_idx, [3, 2], 32)
    assert resident_bytes(graph) == unranked + 4 * (600 + 400)  # the ranking is kept in RAM: float32 per row
    assert graph.cache_ranked_by == (f"expected access per byte (fanouts 3,2, batch 32, {graph.train_idx.numel():,} "
                                     "seeds)")
    reads = {name: part.float() for name, part in
             expected_typed_batch_reads(graph, graph.train_idx, [3, 2], 32).items()}
    share = share_feature_cache(reads, {"paper": 32, "author": 8}, 4_000)
    assert {name: store.num_cached for name, store in graph.feature_stores.items()} == share
    assert all(rows > 0 for rows in share.values())  # a real split
    assert share != share_feature_cache({name: graph.source_degrees(name) for name in share},
                                        {"paper": 32, "author": 8}, 4_000)  # and not the one by source degrees
    for name, store in graph.feature_stores.items():
        hottest = hottest_rows(reads[name], store.num_cached)
        store.reset_counters()
        assert torch.equal(store.gather(hottest), graph.features[name][hottest])
        assert store.counters().misses == 0
    stores = graph.feature_stores
    assert rank_by_expected_typed_access(graph, graph.train_idx, [3, 2], 32)  # the same workload: kept as it is
    assert graph.feature_stores is stores
