"""A user's path with features larger than the memory budget: `train --auto` puts them on disk, the planner sizes
their host cache, and training runs through the feature store; `data info` says which tier each array is on."""
from __future__ import annotations

from morphpipe.commands.cli import main
from morphpipe.data import GeneratorSpec, generate, load_dataset
from morphpipe.profiler.disk import resident_bytes
from morphpipe.scheduler import Plan
from morphpipe.scheduler.plan import count_of


def test_train_auto_puts_features_that_do_not_fit_on_disk_and_sizes_their_cache(tmp_path, capsys):
    graph_dir = tmp_path / "graph"
    generate(GeneratorSpec(kind="community", num_nodes=4000, avg_degree=4, feature_dim=64), graph_dir,
             progress=False)  # float32 rows of 256 B: 1 MB of features
    graph = load_dataset(graph_dir)
    budget = resident_bytes(graph) + 300_000  # room for under a third of the features
    plan_path = tmp_path / "plan.json"
    assert main(["train", str(graph_dir), "--auto", "--memory-budget", str(budget), "--epochs", "1", "--threads",
                 "1,2", "--steps", "3", "--fanouts", "4,3", "--batch-size", "256", "--no-progress",
                 "--save-plan", str(plan_path)]) == 0
    out = capsys.readouterr().out
    assert "do not fit the memory budget" in out and "reading them from disk through the feature store" in out
    assert "random 4096 B reads/s at queue depth 48" in out and "hit ratio " in out and "reads per miss " in out
    assert "bytes per read " in out  # each cache size's misses' mean read, the size their I/O curve prices them at
    plan = Plan.load(plan_path)
    assert plan.tiering is not None and 0 <= plan.tiering.cache_bytes <= 300_000
    # The budget holds the batches in flight and a step beside the cache: here (batches of 1 MB, features of 1 MB)
    # they take the 300 kB the topology left, and more.
    assert "profiling: training holds " in out and "a feature cache may take 0.0 MiB of the memory budget" in out
    assert "so the run will hold more than it (raise --memory-budget, or lower --gbs or --batch-size)" in out
    assert plan.tiering.cache_budget_bytes == 0 and plan.tiering.candidates_s
    assert f"features on disk: {plan.tiering.cache_bytes // 256:,} hottest rows" in out and "as planned" in out
    assert "hottest rows by expected access (fanouts 4,3, batch 256, " in out  # the ranking the profile measured
    assert "features on disk behind a host cache" in out
    if plan.tiering.io_threads is not None:  # timed at several I/O thread counts (O_DIRECT reads): the plan's applied
        assert f"{count_of(plan.tiering.io_threads, 'I/O thread')}, as planned" in out
        assert f"read by {count_of(plan.tiering.io_threads, 'I/O thread')}" in out
        assert "by I/O threads   1: " in out and " kB; the rates above at 48)" in out
    assert "test accuracy" in out


def test_data_info_says_the_features_go_on_disk_under_a_small_budget(tmp_path, capsys):
    graph_dir = tmp_path / "graph"
    generate(GeneratorSpec(kind="community", num_nodes=2000, avg_degree=4, feature_dim=64), graph_dir,
             progress=False)
    budget = resident_bytes(load_dataset(graph_dir)) + 100_000
    assert main(["data", "info", str(graph_dir), "--memory-budget", str(budget)]) == 0
    out = capsys.readouterr().out
    assert "do not fit the memory budget" in out
    assert "features disk (feature store, " in out and "0 hottest rows (0.0%, 0.0 MB) cached" in out
    assert main(["data", "info", str(graph_dir)]) == 0
    assert "features memory-mapped (page cache)" in capsys.readouterr().out


def test_morphpipe_info_says_which_reader_the_feature_store_uses(monkeypatch):
    from morphpipe.commands.info import native_status

    monkeypatch.delenv("MORPHPIPE_FEATURE_READER", raising=False)
    from morphpipe.data.feature_store import reader_line

    assert ("feature store reader", reader_line()) in native_status()  # the line itself: tests/data
    monkeypatch.setenv("MORPHPIPE_FEATURE_READER", "pread")
    assert ("feature store reader", "pread pool (forced by MORPHPIPE_FEATURE_READER)") in native_status()


def cache_fills(monkeypatch) -> list:
    """Every FeatureStore opened from now on that reads rows into its cache (the profiler's twins, which cache the
    batches it times, are not opened this way)."""
    from morphpipe.data.feature_store import FeatureStore

    fills, opened = [], FeatureStore.__init__

    def counted(self, *args, **kwargs) -> None:
        opened(self, *args, **kwargs)
        if self.num_cached:
            fills.append(self)

    monkeypatch.setattr(FeatureStore, "__init__", counted)
    return fills


def test_a_fixed_cache_is_read_once_ranked_by_the_workload(graph_dir, tmp_path, monkeypatch, capsys):
    """--feature-cache-mb with a plan: the store opens without a cache and reads its rows once, by expected access
    (not by in-degree at load, then again)."""
    from morphpipe.data.feature_store import hottest_rows
    from morphpipe.profiler.profile import Profile
    from morphpipe.sampling.access_hotness import expected_batch_reads

    profile = tmp_path / "profile.json"
    Profile.synthetic(t_cb=0.004, t_m=0.006, num_batches=3, cores=2).save(profile)
    fills = cache_fills(monkeypatch)
    assert main(["train", str(graph_dir), "--profile", str(profile), "--fanouts", "4,3", "--batch-size", "64",
                 "--epochs", "1", "--no-progress", "--replan", "off", "--features-on-disk",
                 "--feature-cache-mb", "0.0032"]) == 0  # 100 rows of 32 bytes
    out = capsys.readouterr().out
    assert [store.num_cached for store in fills] == [100]
    assert "features on disk: 100 hottest rows by expected access (fanouts 4,3, batch 64, " in out
    graph = load_dataset(graph_dir)
    hottest = hottest_rows(expected_batch_reads(graph.indptr, graph.indices, graph.train_idx, [4, 3], 64).float(), 100)
    store = fills[0]
    store.reset_counters()
    store.gather(hottest)
    assert store.counters().misses == 0


def test_tune_with_a_fixed_cache_reads_no_cache(graph_dir, tmp_path, monkeypatch, capsys):
    """tune plans at the fixed size and trains nothing: the profile's hit curve comes from the ranking and the
    sampled batches, so no cache is read (it was read twice: by in-degree at load, and again by expected access)."""
    fills = cache_fills(monkeypatch)
    assert main(["tune", str(graph_dir), "--fanouts", "4,3", "--batch-size", "64", "--threads", "1", "--steps",
                 "2", "--warmup", "1", "--features-on-disk", "--feature-cache-mb", "0.0032", "-o",
                 str(tmp_path / "plan.json"), "--profile-output", str(tmp_path / "profile.json")]) == 0
    out = capsys.readouterr().out
    assert fills == []
    assert "hottest rows by expected access (fanouts 4,3, batch 64, 180 seeds)" in out
    assert Plan.load(tmp_path / "plan.json").tiering.cache_bytes == 3200


def test_train_ranks_a_link_workloads_cache_by_its_edge_batches(tmp_path, monkeypatch, capsys):
    from morphpipe.profiler.profile import Profile
    from morphpipe.data.link_generator import EdgeSplitSpec, generate_link
    from morphpipe.scheduler import plan_from_profile

    spec = GeneratorSpec(kind="power-law", num_nodes=500, avg_degree=5, feature_dim=8, undirected=False)
    path = generate_link(spec, EdgeSplitSpec(), tmp_path / "g", progress=False)
    edges = load_dataset(path).edge_split.train.shape[1]
    plan_from_profile(Profile.synthetic(t_cb=0.004, t_m=0.006, num_batches=-(-edges // 256), cores=2)).save(
        tmp_path / "p.json")
    fills = cache_fills(monkeypatch)
    assert main(["train", str(path), "--task", "link", "--plan", str(tmp_path / "p.json"), "--epochs", "1",
                 "--fanouts", "4,3", "--batch-size", "256", "--hidden", "8", "--negatives", "2", "--no-progress",
                 "--features-on-disk", "--feature-cache-mb", "0.0032"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert [store.num_cached for store in fills] == [100]
    assert (f"100 hottest rows by expected access of link batches (fanouts 4,3, batch 256, {edges:,} training "
            "edges, 2 uniform negatives each)") in out
    assert "test mrr" in out

