"""Where a command's graph keeps its feature rows: in RAM (or memory-mapped), or on disk through the feature store
with a host cache of hot rows; chosen by the flags, or by the memory budget and the plan."""
from __future__ import annotations

import argparse

from morphpipe.data.summary import array_tiers, typed_feature_tiers
from morphpipe.numeric import format_bytes
from morphpipe.profiler.disk import cache_budget, default_memory_budget, features_bytes, features_fit, resident_bytes
from morphpipe.scheduler.plan import count_of


def place_features(graph, args: argparse.Namespace) -> None:
    """Puts the features on the disk tier (no cache yet: the plan sizes it) when they do not fit the memory budget
    beside the topology and the flags left the choice open; says so. A typed graph's featured types go on disk
    together, their stores sharing the cache the plan sizes. A --memory-budget below what the topology, labels and
    splits need is refused with that number."""
    needed = resident_bytes(graph)
    if args.memory_budget is not None and args.memory_budget < needed:
        raise ValueError(f"--memory-budget: {format_bytes(args.memory_budget)} is below the {format_bytes(needed)} "
                         f"that {graph.name!r}'s topology, labels and splits need in RAM (the sampler reads them at "
                         f"random); give --memory-budget {-(-needed // 2**20)}M or more")
    if getattr(graph, "feature_store", None) is not None:
        return
    budget = args.memory_budget if args.memory_budget is not None else default_memory_budget()
    if features_fit(graph, budget):
        return
    graph.open_feature_store(0)
    print(f"features ({format_bytes(features_bytes(graph))}) do not fit the memory budget ({format_bytes(budget)}) "
          f"beside the topology, labels and splits ({format_bytes(needed)}): reading them from disk through the "
          f"feature store{' of each featured node type' if getattr(graph, 'is_hetero', False) else ''}, its host "
          f"cache sized by the plan (at most {format_bytes(cache_budget(graph, budget))})")


def planned_cache_bytes(args: argparse.Namespace) -> int | None:
    """The host cache the user fixed (--feature-cache-mb), or None: the planner chooses it."""
    return None if args.feature_cache_mb is None else int(args.feature_cache_mb * 1e6)


def cached_rows(graph, store) -> str:
    """The rows the feature store's cache holds, with what they are ranked by: by node type for a typed graph."""
    if getattr(graph, "is_hetero", False):
        return "hottest rows cached in RAM by type: " + ", ".join(
            f"{name} {part.num_cached:,} rows ({format_bytes(part.cache_bytes)})"
            for name, part in store.stores.items()) + f" (by {graph.cache_ranked_by})"
    return (f"{store.num_cached:,} hottest rows by {graph.cache_ranked_by} ({format_bytes(store.cache_bytes)}) "
            "cached in RAM")


def apply_tiering(graph, plan, args: argparse.Namespace) -> None:
    """Gives the feature store (a typed graph's: its types' stores, sharing the cache) the cache --feature-cache-mb
    fixed, else the one `plan` chose, and the I/O threads the plan chose (plans from before the planner chose them:
    the store keeps its own); says so. The cache's rows are read here, once, in the ranking the graph holds now
    (`rank_cache_by_workload`: the commands load the store without a cache, see `arguments.feature_tier`)."""
    store = getattr(graph, "feature_store", None)
    if store is None:
        return
    fixed, tiering = planned_cache_bytes(args), plan.tiering
    cache_bytes = fixed if fixed is not None else tiering.cache_bytes if tiering is not None else store.cache_bytes
    io_threads = tiering.io_threads if tiering is not None else None
    if store.num_cached != store.rows_cached_by(cache_bytes) or io_threads not in (None, store.io_threads):
        store = graph.open_feature_store(cache_bytes, io_threads)
    if tiering is None:  # a plan made with the features in RAM (or from a profile without the disk)
        how = "as --feature-cache-mb fixed them" if fixed is not None else "the plan sizes no cache"
        print(f"features on disk: {cached_rows(graph, store)}, {how}")
        return
    shared = " shared by the node types" if getattr(graph, "is_hetero", False) else ""
    print(f"features on disk: {cached_rows(graph, store)}, "
          + ("as you fixed" if fixed is not None else f"as planned (predicted hit ratio {tiering.hit_ratio:.1%})")
          + f"; {count_of(store.io_threads, 'I/O thread')}{shared}"
          + (", as planned" if io_threads is not None else ""))


def describe_tiers(graph, plan) -> str:
    """Which tier each array is on under `plan` (features: on disk with the planned cache, when it has one; a typed
    graph's by node type, with the cache the types share)."""
    planned = ""
    if plan.tiering is not None:
        threads = plan.tiering.io_threads
        reads = "" if threads is None else f", read by {count_of(threads, 'I/O thread')}"
        ranked_by = "" if getattr(graph, "is_hetero", False) else f" by {graph.cache_ranked_by}"
        planned = (f"{format_bytes(plan.tiering.cache_bytes)} of hottest rows{ranked_by} cached in RAM (predicted "
                   f"hit ratio {plan.tiering.hit_ratio:.1%}){reads}")
    if getattr(graph, "is_hetero", False):
        tiers = "tiers: features by node type: " + "; ".join(f"{name} {tier}"
                                                            for name, tier in typed_feature_tiers(graph).items())
        store = graph.feature_store
        if store is None or not planned:
            return tiers
        by_type = ", ".join(f"{name} {rows:,} rows" for name, rows in
                            store.cached_by_type(plan.tiering.cache_bytes).items())
        return f"{tiers}; planned: {planned}, the types sharing it by {graph.cache_ranked_by} ({by_type})"
    tiers = array_tiers(graph)
    if planned:
        tiers["features"] = f"disk (feature store), {planned}"
    return "tiers: " + "; ".join(f"{name} {tier}" for name, tier in tiers.items())
