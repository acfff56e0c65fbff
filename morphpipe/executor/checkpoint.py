"""Checkpoints: model, optimizer, epochs done, every RNG state and the history, written atomically.

A run killed at any moment continues from its last completed epoch: the file is written to a
temporary name in the same directory, flushed to disk and renamed over the previous one, so a
kill leaves either the old checkpoint or the new one, never half of one. The RNG states
(torch CPU and CUDA, numpy, Python) make the resumed run draw the same dropout masks as an
uninterrupted one; the batchers need no state beyond the epoch number (they replay epoch k).
Files load with `weights_only=True`: plain containers and tensors only.
"""
from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

CHECKPOINT_FILE = "checkpoint.pt"
CHECKPOINT_VERSION = 1


@dataclass
class TrainingState:
    """Everything needed to continue a run: `epoch` is the number of completed epochs (the next to run)."""

    epoch: int
    model: dict[str, Any]
    optimizer: dict[str, Any]
    rng: dict[str, Any]
    history: list[dict[str, Any]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)


def capture_rng() -> dict[str, Any]:
    """The torch (CPU and CUDA), numpy and Python RNG states, as plain containers and tensors."""
    name, keys, position, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": [name, torch.from_numpy(keys.astype(np.int64)), int(position), int(has_gauss), float(cached)],
        "python": _to_lists(random.getstate()),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Puts back the RNG states `capture_rng` took."""
    torch.set_rng_state(state["torch"])
    name, keys, position, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), position, has_gauss, cached))
    random.setstate(_to_tuples(state["python"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _to_lists(value: Any) -> Any:
    return [_to_lists(item) for item in value] if isinstance(value, tuple) else value


def _to_tuples(value: Any) -> Any:
    return tuple(_to_tuples(item) for item in value) if isinstance(value, list) else value


def save_checkpoint(directory: str | os.PathLike, state: TrainingState) -> Path:
    """Writes `state` to `directory/checkpoint.pt` atomically; returns the path."""
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / CHECKPOINT_FILE
    temporary = folder / f".{CHECKPOINT_FILE}.{os.getpid()}.tmp"
    document = {"version": CHECKPOINT_VERSION, "epoch": state.epoch, "model": state.model,
                "optimizer": state.optimizer, "rng": state.rng, "history": state.history, "meta": state.meta}
    with open(temporary, "wb") as handle:
        torch.save(document, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, target)
    return target


def load_checkpoint(directory: str | os.PathLike) -> TrainingState | None:
    """The state saved in `directory`, or None when there is no checkpoint there yet."""
    path = Path(directory) / CHECKPOINT_FILE
    if not path.exists():
        return None
    try:
        document = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise ValueError(f"{path}: not a readable morphpipe checkpoint ({error}); delete it to start over") from error
    if not isinstance(document, dict) or document.get("version") != CHECKPOINT_VERSION:
        raise ValueError(f"{path}: checkpoint version {document.get('version') if isinstance(document, dict) else '?'}"
                         f", this morphpipe reads version {CHECKPOINT_VERSION}; delete it to start over")
    return TrainingState(epoch=document["epoch"], model=document["model"], optimizer=document["optimizer"],
                         rng=document["rng"], history=document["history"], meta=document["meta"])
