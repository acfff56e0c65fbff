"""Which rows a run's feature cache holds: those its workload is expected to read most (node classification's
seed batches, on a typed graph per byte of row, or link prediction's edge batches with their negatives), ranked
before the profiler measures the cache's hit curve and before the cache is filled."""
from __future__ import annotations

from collections.abc import Sequence

from morphpipe.nn.link_task import LinkPrediction
from morphpipe.nn.task import NodeClassification, Task
from morphpipe.sampling.access_hotness import (rank_by_expected_access, rank_by_expected_link_access,
                                               rank_by_expected_typed_access)


def rank_cache_by_workload(graph, task: Task, fanouts: Sequence[int], batch_size: int, *,
                           progress: bool = False) -> bool:
    """Ranks the feature cache of `graph` (features on disk) by the expected reads of an epoch of `task` over its
    training seeds or edges, in batches of `batch_size` sampled with `fanouts` (a typed graph: the task's fanouts per
    relation); returns whether it is ranked so. A graph without a feature store, or another task, keeps its ranking
    (in-degree; a typed graph's: source degree per byte)."""
    if getattr(graph, "feature_store", None) is None:
        return False
    if isinstance(task, NodeClassification) and getattr(graph, "is_hetero", False):
        return rank_by_expected_typed_access(graph, task.seeds(graph), task.typed_fanouts(fanouts), batch_size,
                                             progress=progress)
    if isinstance(task, NodeClassification):
        return rank_by_expected_access(graph, task.seeds(graph), fanouts, batch_size, progress=progress)
    if isinstance(task, LinkPrediction):
        return rank_by_expected_link_access(graph, task.seeds(graph), fanouts, batch_size, task.sampling,
                                            progress=progress)
    return False
