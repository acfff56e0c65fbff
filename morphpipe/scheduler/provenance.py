"""What a plan was made for (dataset, workload, machine), and the differences that make it wrong for a run.

A plan's numbers hold only for the dataset, model, fanouts and batch size that were profiled,
on the machine that was profiled: `morphpipe train --plan` must refuse a plan made for something
else instead of running a wrong split (or 1000 training threads on 2 cores) silently.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from morphpipe.cores import usable_cores
from morphpipe.data.fingerprint import dataset_fingerprint


def plan_mismatches(made_for: Mapping[str, Any], graph, settings: Mapping[str, Any]) -> list[str]:
    """How the run (`graph`, workload `settings`: model, fanouts, batch_size, hidden, precision) differs from a plan's workload.

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
        "task": settings.get("task"),
        "negatives": settings.get("negatives"),  # link prediction: negatives per edge set the batching cost
        "precision": settings.get("precision"),  # the training step was timed in it
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
