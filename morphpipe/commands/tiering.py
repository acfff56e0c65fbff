"""Where a command's graph keeps its feature rows: in RAM (or memory-mapped), or on disk through the feature store
with a host cache of hot rows; chosen by the flags, or by the memory budget and the plan."""
from __future__ import annotations

import argparse

from morphpipe.data.summary import array_tiers, typed_feature_tiers
from morphpipe.nn.task import NodeClassification
from morphpipe.numeric import format_bytes
from morphpipe.profiler.disk import cache_budget, default_memory_budget, features_fit, resident_bytes
from morphpipe.sampling.access_hotness import rank_by_expected_access
from morphpipe.scheduler.plan import count_of


def place_features(graph, args: argparse.Namespace, hold_in_ram: bool = True) -> None:
    """Puts the features on the disk tier (no cache yet: the plan sizes it) when they do not fit the memory budget
    beside the topology and the flags left the choice open; says so. Features that fit are copied out of their
    memory map into RAM on huge pages when `hold_in_ram` (commands that batch: a batch's row gathers run faster
    there). A typed graph's features go on disk only when asked (--features-on-disk), their cache as
    --feature-cache-mb fixes it: a memory budget for it is refused."""
    if getattr(graph, "is_hetero", False):
        if args.memory_budget is not None:
            raise ValueError(f"--memory-budget: the planner places features on disk and sizes their cache for "
                             f"homogeneous graphs only, and {graph.name!r} is a typed graph; pass --features-on-disk "
                             "--feature-cache-mb MB instead (or drop --memory-budget)")
        return
    if getattr(graph, "feature_store", None) is not None:
        return
    budget = args.memory_budget if args.memory_budget is not None else default_memory_budget()
    if features_fit(graph, budget):
        if hold_in_ram:
            graph.hold_features_in_ram(progress=not getattr(args, "no_progress", False))
        return
    features = graph.features.shape[0] * graph.features.shape[1] * graph.features.element_size()
    graph.open_feature_store(0)
    print(f"features ({format_bytes(features)}) do not fit the memory budget ({format_bytes(budget)}) beside the "
          f"topology, labels and splits ({format_bytes(resident_bytes(graph))}): reading them from disk through the "
          f"feature store, its host cache sized by the plan (at most {format_bytes(cache_budget(graph, budget))})")


def planned_cache_bytes(args: argparse.Namespace) -> int | None:
    """The host cache the user fixed (--feature-cache-mb), or None: the planner chooses it."""
    return None if args.feature_cache_mb is None else int(args.feature_cache_mb * 1e6)


def rank_hot_rows(graph, task, settings: dict[str, object], progress: bool = True) -> None:
    """Ranks the feature cache by the rows' expected reads under the run's workload (node classification's seeds,
    fanouts and batch size), as the profiler does when it plans; other tasks keep the in-degree ranking."""
    if isinstance(task, NodeClassification):
        rank_by_expected_access(graph, task.seeds(graph), settings["fanouts"], int(settings["batch_size"]),
                                progress=progress)


def apply_tiering(graph, plan, args: argparse.Namespace) -> None:
    """Gives the feature store the cache `plan` chose (unless --feature-cache-mb fixed it) and the I/O threads it
    chose (plans from before the planner chose them: the store keeps its own); says so."""
    if getattr(graph, "is_hetero", False) and graph.feature_stores:
        cached = ", ".join(f"{name} {store.num_cached:,} rows ({format_bytes(store.cache_bytes)})"
                           for name, store in graph.feature_stores.items())
        print(f"features on disk: hottest rows cached in RAM by type: {cached}, as --feature-cache-mb fixed them "
              "(the planner does not size typed graphs' caches)")
        return
    store = getattr(graph, "feature_store", None)
    if store is None or plan.tiering is None:
        return
    cache_bytes = store.cache_bytes if args.feature_cache_mb is not None else plan.tiering.cache_bytes
    io_threads = plan.tiering.io_threads
    if store.cache_bytes != cache_bytes or io_threads not in (None, store.io_threads):
        store = graph.open_feature_store(cache_bytes, io_threads)
    print(f"features on disk: {store.num_cached:,} hottest rows by {graph.cache_ranked_by} "
          f"({format_bytes(store.cache_bytes)}) cached in RAM, "
          + ("as you fixed" if args.feature_cache_mb is not None else
             f"as planned (predicted hit ratio {plan.tiering.hit_ratio:.1%})")
          + f"; {count_of(store.io_threads, 'I/O thread')}" + (", as planned" if io_threads is not None else ""))


def describe_tiers(graph, plan) -> str:
    """Which tier each array is on under `plan` (features: on disk with the planned cache, when it has one)."""
    if getattr(graph, "is_hetero", False):
        return "tiers: features by node type: " + "; ".join(f"{name} {tier}"
                                                           for name, tier in typed_feature_tiers(graph).items())
    tiers = array_tiers(graph)
    if plan.tiering is not None:
        threads = plan.tiering.io_threads
        reads = "" if threads is None else f", read by {count_of(threads, 'I/O thread')}"
        ranked_by = getattr(graph, "cache_ranked_by", "in-degree")
        tiers["features"] = (f"disk (feature store), {format_bytes(plan.tiering.cache_bytes)} of hottest rows by "
                             f"{ranked_by} cached in RAM (predicted hit ratio {plan.tiering.hit_ratio:.1%}){reads}")
    return "tiers: " + "; ".join(f"{name} {tier}" for name, tier in tiers.items())
