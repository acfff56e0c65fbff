"""Checkpoints: model, optimizer, epochs done, every RNG state and the history, written atomically.

A run killed at any moment continues from its last completed epoch; a run stopped mid epoch on
request (SIGTERM) continues from the step it stopped after (`partial_epoch`, see
`morphpipe.executor.partial_epoch`; version 3, version 2 files load as epoch-boundary ones). The file is written to a
temporary name in the same directory, flushed to disk and renamed over the previous one, so a
kill leaves either the old checkpoint or the new one, never half of one. A JSON header line
(format, version, size and SHA-256 of the rest) comes first: a damaged file is refused, not
resumed. The RNG states (torch CPU and CUDA, numpy, Python) make the resumed run draw the same dropout masks as an
uninterrupted one; the batchers need no state beyond the epoch number (they replay epoch k).
Files load with `weights_only=True`: plain containers and tensors only. `Checkpointing` is how the
trainers save after each epoch and resume a run; each adds only its history's form and run metadata.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import random
import types
import typing
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from torch import nn

from morphpipe.documents import parse_json
from morphpipe.outputs import check_output_dir, remove_stale_partials, replacing_file

CHECKPOINT_FILE = "checkpoint.pt"
CHECKPOINT_FORMAT = "morphpipe-checkpoint"
CHECKPOINT_VERSION = 3
READABLE_VERSIONS = (2, 3)  # version 2: the same fields, never a partial epoch

Entry = TypeVar("Entry")


@dataclass
class TrainingState:
    """Everything needed to continue a run: `epoch` is the number of completed epochs (the next to run);
    `partial_epoch`, when that epoch was stopped between steps, what of it was applied (EpochProgress.to_dict)."""

    epoch: int
    model: dict[str, Any]
    optimizer: dict[str, Any]
    rng: dict[str, Any]
    history: list[dict[str, Any]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    partial_epoch: dict[str, Any] | None = None


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
    """Writes `state` to `directory/checkpoint.pt` atomically, with a checksum of its contents; returns the path."""
    folder = check_output_dir(directory, "checkpoint_dir")
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / CHECKPOINT_FILE
    document = {"epoch": state.epoch, "model": state.model, "optimizer": state.optimizer, "rng": state.rng,
                "history": state.history, "meta": state.meta, "partial_epoch": state.partial_epoch}
    buffer = io.BytesIO()
    torch.save(document, buffer)
    payload = buffer.getvalue()
    header = {"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION, "payload_bytes": len(payload),
              "sha256": hashlib.sha256(payload).hexdigest()}
    with replacing_file(target, "checkpoint") as temporary:
        with open(temporary, "wb") as handle:
            handle.write(json.dumps(header).encode() + b"\n")
            handle.write(payload)
    return target


def load_checkpoint(directory: str | os.PathLike) -> TrainingState | None:
    """The state saved in `directory`, or None when there is no checkpoint there yet.

    A damaged checkpoint (bad header, wrong size or checksum, missing or mistyped fields) raises
    CheckpointError naming the file and the problem, and is never resumed from.
    """
    path = Path(directory) / CHECKPOINT_FILE
    if not path.exists():
        return None
    if not path.is_file():
        raise CheckpointError(path, "is not a file", "remove it")
    data = path.read_bytes()
    header_line, newline, payload = data.partition(b"\n")
    try:
        header = parse_json(header_line, str(path), "") if newline else None
    except ValueError:
        header = None
    if not isinstance(header, dict) or header.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(path, "is not a morphpipe checkpoint (its header is missing or damaged)")
    if header.get("version") not in READABLE_VERSIONS:
        raise CheckpointError(path, f"has checkpoint version {header.get('version')!r}, this morphpipe reads versions "
                              f"{', '.join(map(str, READABLE_VERSIONS))}")
    if header.get("payload_bytes") != len(payload):
        raise CheckpointError(path, f"holds {len(payload):,} bytes of data, its header says "
                              f"{header.get('payload_bytes')!r} (truncated or appended to)")
    if header.get("sha256") != hashlib.sha256(payload).hexdigest():
        raise CheckpointError(path, "is damaged: its contents do not match the checksum written with it")
    try:
        document = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises many types for unreadable data; all mean the same here
        raise CheckpointError(path, f"could not be read ({type(error).__name__}: {error})") from error
    return TrainingState(**_checked_fields(document, path, header["version"]))


def _checked_fields(document: Any, path: Path, version: int) -> dict[str, Any]:
    """The checkpoint's fields, each checked for its type and range (a partial epoch's in detail where the run's
    batch count is known: `EpochProgress.from_checkpoint`)."""
    if not isinstance(document, dict):
        raise CheckpointError(path, f"holds {type(document).__name__}, expected a dict of fields")
    expected = {"epoch": int, "model": dict, "optimizer": dict, "rng": dict, "history": list, "meta": dict}
    for name, kind in expected.items():
        value = document.get(name)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise CheckpointError(path, f"field {name!r} is {type(value).__name__}, expected {kind.__name__}")
    if document["epoch"] < 0:
        raise CheckpointError(path, f"field 'epoch' is {document['epoch']}, expected the number of completed epochs "
                              "(>= 0)")
    bad_weight = next((key for key, value in document["model"].items() if not isinstance(value, torch.Tensor)), None)
    if bad_weight is not None:
        raise CheckpointError(path, f"model entry {bad_weight!r} is not a tensor")
    if not {"state", "param_groups"} <= set(document["optimizer"]):
        raise CheckpointError(path, "field 'optimizer' lacks 'state' or 'param_groups'")
    problem = _rng_problem(document["rng"])
    if problem is not None:
        raise CheckpointError(path, f"field 'rng' {problem}")
    for index, entry in enumerate(document["history"]):
        if not isinstance(entry, dict) or not all(isinstance(key, str) for key in entry):
            raise CheckpointError(path, f"field 'history[{index}]' is {_show(entry)}, expected a dict of named values")
    partial = document.get("partial_epoch")
    if partial is not None and version < 3:
        raise CheckpointError(path, f"field 'partial_epoch' is in a version {version} checkpoint, which holds none "
                              "(mid-epoch checkpoints are version 3)")
    if partial is not None and not isinstance(partial, dict):
        raise CheckpointError(path, f"field 'partial_epoch' is {type(partial).__name__}, expected a dict or none")
    return {**{name: document[name] for name in expected}, "partial_epoch": partial}


def _rng_problem(rng: dict[str, Any]) -> str | None:
    """What keeps `restore_rng` from putting back these states (the layout `capture_rng` writes), or None."""
    torch_state = rng.get("torch")
    size = torch.get_rng_state().numel()
    if not (isinstance(torch_state, torch.Tensor) and torch_state.dtype == torch.uint8 and torch_state.shape == (size,)):
        return f"'torch' is {_show(torch_state)}, expected a uint8 tensor of {size} bytes (torch.get_rng_state())"
    numpy_state = rng.get("numpy")
    if not (isinstance(numpy_state, list) and len(numpy_state) == 5 and numpy_state[0] == "MT19937"
            and isinstance(numpy_state[1], torch.Tensor) and numpy_state[1].shape == (624,)
            and all(isinstance(v, int) and not isinstance(v, bool) for v in numpy_state[2:4])
            and isinstance(numpy_state[4], float)):
        return f"'numpy' is {_show(numpy_state)}, expected ['MT19937', 624 keys, position, has_gauss, cached]"
    python_state = rng.get("python")
    if not (isinstance(python_state, list) and len(python_state) == 3 and isinstance(python_state[1], list)
            and len(python_state[1]) == 625 and all(isinstance(v, int) for v in python_state[1])):
        return f"'python' is {_show(python_state)}, expected random.getstate() as lists"
    cuda = rng.get("cuda", [])
    if not (isinstance(cuda, list) and all(isinstance(v, torch.Tensor) and v.dtype == torch.uint8 for v in cuda)):
        return f"'cuda' is {_show(cuda)}, expected a list of uint8 tensors (torch.cuda.get_rng_state_all())"
    return None


def _has_type(value: Any, hint: Any) -> bool:
    """Whether `value` (from a checkpoint) fits a dataclass field's type: plain types, `X | None`, list[X], dict[K, V]."""
    origin, arguments = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_has_type(value, option) for option in arguments)
    if origin is list:
        return isinstance(value, list) and all(_has_type(item, arguments[0]) for item in value)
    if origin is dict:
        return isinstance(value, dict) and all(_has_type(k, arguments[0]) and _has_type(v, arguments[1])
                                               for k, v in value.items())
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return hint is Any or isinstance(value, hint)


def _show(value: Any) -> str:
    text = f"tensor of shape {tuple(value.shape)} and dtype {value.dtype}" if isinstance(value, torch.Tensor) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from; the message names the file, the problem and the fix."""

    def __init__(self, path: Path, problem: str, fix: str = "delete it to start over, or resume from a backup"):
        super().__init__(f"checkpoint {path}: {problem}; fix: {fix}")
        self.path = path


def check_same_run(state: TrainingState, expected: dict[str, Any], directory: str | os.PathLike) -> None:
    """Refuses to continue from a checkpoint whose run metadata (dataset, model, settings) differs from `expected`."""
    different = {key: (state.meta.get(key), value) for key, value in expected.items() if state.meta.get(key) != value}
    if different:
        details = ", ".join(f"{key}: checkpoint {saved!r} vs now {now!r}" for key, (saved, now) in different.items())
        raise ValueError(f"{directory}: the checkpoint is for another run ({details}); use another "
                         "checkpoint directory or the same settings")


def run_meta(graph: Any, model: nn.Module) -> dict[str, Any]:
    """The dataset and model a run trains, with which every trainer's checkpoint metadata starts."""
    return {"dataset": getattr(graph, "name", "graph"), "num_nodes": int(graph.num_nodes),
            "model": type(model).__name__}


class Checkpointing:
    """A run's checkpoints in `directory`: `save` writes one after an epoch, `resume` continues from the one there.

    It saves and restores what every trainer keeps the same way: the model's and the optimizer's
    state, the RNG states, and `model_spec` (build_model's arguments, for `morphpipe evaluate`);
    the trainer gives its history as dicts and the run metadata a resumed run must agree with.
    """

    def __init__(self, directory: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer, *,
                 log: Callable[[str], None], model_spec: dict[str, Any] | None = None) -> None:
        self.directory = Path(directory)
        self.model = model
        self.optimizer = optimizer
        self.log = log
        self.model_spec = model_spec

    @property
    def path(self) -> Path:
        """The checkpoint file."""
        return self.directory / CHECKPOINT_FILE

    def save(self, epochs_done: int, history: list[dict[str, Any]], meta: dict[str, Any],
             partial_epoch: dict[str, Any] | None = None) -> Path:
        """Writes a checkpoint after `epochs_done` completed epochs and, mid epoch, the `partial_epoch` applied of
        the next (atomically); returns its path."""
        if self.model_spec is not None:
            meta = {**meta, "model_spec": self.model_spec}
        state = TrainingState(epoch=epochs_done, model=self.model.state_dict(), optimizer=self.optimizer.state_dict(),
                              rng=capture_rng(), history=history, meta=meta, partial_epoch=partial_epoch)
        return save_checkpoint(self.directory, state)

    def history(self, state: TrainingState, entry: type[Entry]) -> list[Entry]:
        """The checkpoint's history as `entry` dataclasses (unknown keys, e.g. derived rates, are dropped); an entry
        lacking a field or holding a value of another type than the field's is a CheckpointError naming it."""
        path = self.path
        hints = typing.get_type_hints(entry)
        required = {f.name for f in fields(entry) if f.default is MISSING and f.default_factory is MISSING}
        entries = []
        for index, item in enumerate(state.history):
            missing = sorted(required - set(item))
            if missing:
                raise CheckpointError(path, f"field 'history[{index}]' lacks {', '.join(missing)}")
            for name in set(item) & set(hints):
                if not _has_type(item[name], hints[name]):
                    raise CheckpointError(path, f"field 'history[{index}].{name}' is {_show(item[name])}, "
                                          f"expected {hints[name]}")
            entries.append(entry(**{name: item[name] for name in item if name in hints}))
        return entries

    def load(self) -> TrainingState | None:
        """The checkpoint in the directory, or None when there is none yet; first removes the partial
        checkpoint files that killed writers left there (`remove_stale_partials`)."""
        for stale in remove_stale_partials(self.path):
            self.log(f"removed {stale}, a partial checkpoint left by a process that was killed while writing it")
        return load_checkpoint(self.directory)

    def resume(self, meta: dict[str, Any]) -> TrainingState | None:
        """Continues from the checkpoint in the directory, if any (see `restore`); None: start afresh."""
        return self.restore(self.load(), meta)

    def restore(self, state: TrainingState | None, meta: dict[str, Any], *, rng: bool = True,
                announce: bool = True, mid_epoch: bool = False) -> TrainingState | None:
        """Checks `state` is of this run (`meta`), loads its model and optimizer state and, with `rng`, its RNG
        states; with `announce`, logs where it resumed. Returns `state`, whose history the trainer takes back.
        A checkpoint of an epoch stopped mid way is refused unless the trainer continues one (`mid_epoch`)."""
        if state is None:
            return None
        if state.partial_epoch is not None and not mid_epoch:
            raise CheckpointError(self.path, f"holds epoch {state.epoch + 1} stopped mid epoch, which only "
                                  "`morphpipe train` (mini-batch, one process) continues",
                                  "resume it with the command that wrote it, or use another checkpoint directory")
        check_same_run(state, meta, self.directory)
        self.model.load_state_dict(state.model)
        self.optimizer.load_state_dict(state.optimizer)
        if rng:
            restore_rng(state.rng)
        if announce:
            self.log(f"resumed from {self.directory} after epoch {state.epoch}")
        return state
