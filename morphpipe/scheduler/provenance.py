"""What a plan was made for (dataset, workload, machine), and the differences that make it wrong for a run.

A plan's numbers hold only for the dataset, model, fanouts and batch size that were profiled,
on the machine that was profiled: `morphpipe train --plan` must refuse a plan made for something
else instead of running a wrong split (or 1000 training threads on 2 cores) silently.
"""
from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import torch

from morphpipe.cores import usable_cores

SAMPLED_ENTRIES = 4096


def dataset_fingerprint(graph) -> str:
    """A short hash of a dataset's sizes and of evenly spaced entries of its topology, labels and splits (O(1) reads)."""
    digest = hashlib.sha256()
    sizes = (graph.num_nodes, graph.num_edges, graph.feature_dim, str(graph.features.dtype), graph.num_classes)
    digest.update(repr(sizes).encode())
    for tensor in (graph.indptr, graph.indices, graph.labels, graph.train_idx, graph.val_idx, graph.test_idx):
        digest.update(repr(tuple(tensor.shape)).encode())
        if tensor.numel():
            positions = torch.linspace(0, tensor.numel() - 1, min(SAMPLED_ENTRIES, tensor.numel())).long()
            digest.update(tensor.reshape(-1)[positions].to(torch.int64).numpy().tobytes())
    return digest.hexdigest()[:16]


def plan_mismatches(made_for: Mapping[str, Any], graph, settings: Mapping[str, Any]) -> list[str]:
    """How the run (`graph`, workload `settings`: model, fanouts, batch_size, hidden) differs from a plan's workload.

    Fields the plan does not record (plans from older versions, synthetic profiles) are not compared.
    """
    now: dict[str, Any] = {
        "dataset": getattr(graph, "name", None),
        "num_nodes": int(graph.num_nodes),
        "num_edges": int(graph.num_edges),
        "dataset_fingerprint": dataset_fingerprint(graph),
        "model": settings.get("model"),
        "fanouts": ",".join(str(f) for f in settings.get("fanouts", ())),
        "batch_size": settings.get("batch_size"),
        "hidden": settings.get("hidden"),
    }
    differences = []
    for key, value in now.items():
        if key in made_for and made_for[key] != value:
            differences.append(f"{key}: plan {made_for[key]!r}, now {value!r}")
    return differences


def hardware_problems(plan) -> list[str]:
    """What in `plan` this machine cannot run: more threads than its usable cores, a GPU it lacks."""
    cores = usable_cores()
    problems = []
    for name in ("cpu_threads", "train_threads"):
        threads = getattr(plan, name)
        if threads is not None and threads > cores:
            problems.append(f"{name} {threads} > {cores} usable cores here")
    if plan.kind != "cpu-only" and not torch.cuda.is_available():
        problems.append(f"schedule {plan.kind!r} trains on a GPU and torch sees none here")
    return problems
