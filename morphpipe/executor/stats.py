"""Per-epoch statistics of a training run: what was measured, beside what the planner predicted."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from morphpipe.nn.finite_guard import skipped_text


@dataclass
class EpochStats:
    """One trained epoch: time, throughput, loss, validation accuracy, busy fractions, buffers, prediction.

    `busy` holds the measured busy fraction of each traced device (training device, PCIe link,
    virtual CPU threads), `predicted_busy` the simulator's for the plan. `cpu_utilisation` is
    the process's CPU time over the epoch as a share of the usable cores: the C++ batching
    threads are not traced per batch, so this is how busy the CPU was overall. `op_choices`
    counts, per input-sensitive op decision (morphpipe.ops.choice), the calls that ran each option
    during the epoch's training steps. `plan_change` says why the next epoch runs another plan.
    """

    epoch: int
    epoch_s: float
    batches: int
    seeds: int
    loss: float
    val_acc: float | None
    n_cpu: int
    n_gpu: int
    cbs: int
    gbs: int
    max_cpu_buffer: int
    max_gpu_buffer: int
    cpu_idle_s: float
    gpu_idle_s: float
    cpu_utilisation: float | None
    predicted_epoch_s: float | None = None
    busy: dict[str, float] = field(default_factory=dict)
    predicted_busy: dict[str, float] = field(default_factory=dict)
    op_choices: dict[str, dict[str, int]] = field(default_factory=dict)
    plan_change: str | None = None  # set when the re-planner switched plans after this epoch, and why
    skipped_batches: dict[str, int] = field(default_factory=dict)  # steps left out for non-finite values, by reason
    metric: str = "acc"  # what val_acc measures: the task's metric ("acc", or "mrr" for link prediction)

    @property
    def batches_per_s(self) -> float:
        return self.batches / self.epoch_s if self.epoch_s > 0 else 0.0

    @property
    def seeds_per_s(self) -> float:
        return self.seeds / self.epoch_s if self.epoch_s > 0 else 0.0

    @property
    def prediction_error(self) -> float | None:
        """Measured over predicted epoch time, minus one (None without a prediction)."""
        if not self.predicted_epoch_s:
            return None
        return self.epoch_s / self.predicted_epoch_s - 1.0

    def line(self, epochs: int | None = None) -> str:
        """The per-epoch line the CLI prints."""
        of = f"/{epochs}" if epochs else ""
        parts = [f"epoch {self.epoch + 1}{of}: {self.epoch_s:.2f} s"]
        if self.predicted_epoch_s:
            parts[0] += f" (predicted {self.predicted_epoch_s:.2f} s, {self.prediction_error:+.0%})"
        parts.append(f"{self.batches_per_s:.2f} batches/s ({self.seeds_per_s:,.0f} seeds/s)")
        parts.append(f"loss {self.loss:.4f}")
        if self.val_acc is not None:
            parts.append(f"val {self.metric} {self.val_acc:.4f}")
        busy = ", ".join(f"{device} {share:.0%}" + (f" (pred {self.predicted_busy[device]:.0%})"
                                                    if device in self.predicted_busy else "")
                         for device, share in self.busy.items())
        if busy:
            parts.append(f"busy {busy}")
        if self.cpu_utilisation is not None:
            parts.append(f"CPU {self.cpu_utilisation:.0%}")
        if self.skipped_batches:
            parts.append(skipped_text(self.skipped_batches))
        if self.plan_change:
            parts.append(self.plan_change)
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, with the derived rates."""
        return {**asdict(self), "batches_per_s": self.batches_per_s, "seeds_per_s": self.seeds_per_s}
