"""What `morphpipe train` reports after training, the same in one process and on rank 0 of a distributed run:
the measured against the predicted epoch, and the stats JSON (--stats-json)."""
from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from morphpipe.outputs import write_text_atomic


def print_epoch_summary(history: Sequence[Any], predicted_epoch_s: float, say: Callable[[str], None] = print) -> None:
    """The mean measured epoch against the predicted one (nothing when no epoch ran)."""
    if history:
        measured = sum(stats.epoch_s for stats in history) / len(history)
        say(f"mean epoch {measured:.2f} s measured vs {predicted_epoch_s:.2f} s predicted "
            f"({measured / predicted_epoch_s - 1:+.0%})")


def run_settings(settings: dict[str, object], args: argparse.Namespace, dataset: str) -> dict[str, object]:
    """The run's settings as the stats JSON records them: the workload's, then epochs, learning rate, seed, dataset."""
    return {**settings, "epochs": args.epochs, "lr": args.lr, "seed": args.seed, "dataset": dataset}


def write_stats(path: Path, head: dict[str, object], settings: dict[str, object], epochs: list[dict[str, Any]],
                test_acc: float | None) -> None:
    """Writes the stats JSON: `head` (what the run planned), its settings, every epoch's stats, the test accuracy."""
    document = {**head, "settings": settings, "epochs": epochs, "test_acc": test_acc}
    write_text_atomic(path, json.dumps(document, indent=2) + "\n", "--stats-json")
    print(f"wrote {path}")
