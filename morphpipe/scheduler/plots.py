"""PNG charts of simulations: a Gantt chart of one epoch and the paper's Figure 9 (epoch vs cores).

matplotlib runs on its Agg backend, so no display is needed.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from morphpipe.outputs import replacing_file  # noqa: E402
from morphpipe.scheduler.plan import Plan  # noqa: E402
from morphpipe.scheduler.result import SimulationResult  # noqa: E402

_COLOURS = {
    ("batch", 0): "tab:blue",
    ("dma", 0): "tab:orange",
    ("uva", 1): "tab:green",
    ("train", 0): "tab:purple",
    ("train", 1): "tab:red",
    ("read", 0): "tab:gray",
    ("read", 1): "tab:olive",
}
_LABELS = {
    ("batch", 0): "CPU batching (Route 0)",
    ("dma", 0): "DMA (Route 0)",
    ("uva", 1): "UVA batching (Route 1)",
    ("train", 0): "training, Route 0 batch",
    ("train", 1): "training, Route 1 batch",
    ("read", 0): "disk: Route 0 misses",
    ("read", 1): "disk: Route 1 misses",
}


def plot_gantt(result: SimulationResult, path: str | Path, *, until: float | None = None,
               title: str | None = None) -> Path:
    """Draws the trace of a simulated epoch (simulate with trace=True) as a Gantt chart PNG.

    One row per CPU batching thread, one for the PCIe link, one for the GPU; `until` limits
    the time axis (a whole epoch of thousands of batches is unreadable).
    """
    if not result.trace:
        raise ValueError("the result has no trace; simulate with trace=True to draw a Gantt chart")
    end = result.epoch_s if until is None else min(until, result.epoch_s)
    rows = sorted({(r.device, r.lane) for r in result.trace}, key=_row_order)
    bars: dict[tuple[tuple[str, int], tuple[str, int]], list[tuple[float, float]]] = defaultdict(list)
    for record in result.trace:
        if record.start < end:
            bars[((record.device, record.lane), (record.phase, record.route))].append(
                (record.start, min(record.end, end) - record.start))
    figure, axes = plt.subplots(figsize=(12, 1.0 + 0.35 * len(rows)))
    shown: set[tuple[str, int]] = set()
    for (row, kind), spans in sorted(bars.items(), key=lambda item: (_row_order(item[0][0]), item[0][1])):
        y = rows.index(row)
        label = _LABELS.get(kind, f"{kind[0]} (Route {kind[1]})") if kind not in shown else None
        shown.add(kind)
        axes.broken_barh(spans, (y - 0.4, 0.8), facecolors=_COLOURS.get(kind, "tab:gray"), label=label)
    axes.set_yticks(range(len(rows)), [_row_name(row) for row in rows])
    axes.invert_yaxis()
    axes.set_xlim(0, end)
    axes.set_xlabel("time (s)")
    axes.set_title(title or f"{result.n_cpu} CPU + {result.n_gpu} GPU batches, cbs={result.cbs} gbs={result.gbs}, "
                   f"epoch {result.epoch_s:.4g} s")
    axes.legend(loc="upper right", fontsize="small", ncol=3)
    figure.tight_layout()
    return _save(figure, path)


def plot_cores_sweep(cores: Sequence[int], plans: Sequence[Plan], path: str | Path, *,
                     title: str | None = None) -> Path:
    """The paper's Figure 9: predicted epoch time of all-CPU, all-GPU and adaptive plans versus cores."""
    if len(cores) != len(plans) or not plans:
        raise ValueError("plot_cores_sweep needs one plan per core count")
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for name in plans[0].baselines_s:
        axes.plot(cores, [plan.baselines_s[name] for plan in plans], marker="o", label=name)
    axes.plot(cores, [plan.predicted_epoch_s for plan in plans], marker="s", linewidth=2.5, label="adaptive (plan)")
    axes.set_xlabel("CPU cores")
    axes.set_ylabel("predicted epoch time (s)")
    axes.set_ylim(bottom=0)
    axes.set_xticks(list(cores))
    axes.grid(alpha=0.3)
    axes.legend()
    axes.set_title(title or "Predicted epoch time versus CPU cores")
    figure.tight_layout()
    return _save(figure, path)


def _save(figure: plt.Figure, path: str | Path) -> Path:
    """Saves the figure as a PNG replacing `path` atomically, then closes it."""
    try:
        with replacing_file(path, "plot") as temporary:
            figure.savefig(temporary, dpi=120, format="png")
    finally:
        plt.close(figure)
    return Path(path)


def _row_order(row: tuple[str, int]) -> tuple[int, int]:
    device, lane = row
    order = {"cpu": 0, "cpu-batching": 0, "pcie": 1, "gpu": 2, "cpu-training": 2}
    return order.get(device, 3), lane


def _row_name(row: tuple[str, int]) -> str:
    device, lane = row
    return {"cpu": f"CPU thread {lane}", "cpu-batching": f"CPU thread {lane}", "pcie": "PCIe",
            "gpu": "GPU", "cpu-training": "CPU training"}.get(device, f"{device} {lane}")
