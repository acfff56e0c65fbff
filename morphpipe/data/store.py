"""The graph store (CSC topology, features, labels, splits), its directory format, and the dataset cache."""
from __future__ import annotations

import fcntl
import os
import shutil
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from morphpipe.data.dtypes import FEATURE_STORAGE, dtype_name, features_from_storage, numpy_view, tensor_to_numpy
from morphpipe.data.edge_split import SPLIT_EDGES_HINT, EdgeSplit
from morphpipe.data.feature_store import DEFAULT_IO_THREADS, FeatureStore
from morphpipe.data.hetero_generator import MagSpec
from morphpipe.data.hetero_store import HeteroGraphStore, is_hetero_dir, read_hetero_meta
from morphpipe.data.ondisk import (ARRAY_FIELDS, EDGE_SPLIT_FILE, MMAP_FIELDS, GraphMeta, array_path,
                                   foreign_entries, is_graph_dir, load_array, read_meta, save_array, write_meta)
from morphpipe.data.presets import PRESETS, Preset
from morphpipe.data.validation import GraphValidationError, validate_graph
from morphpipe.outputs import replacing_directory

DATA_DIR_ENV = "MORPHPIPE_DATA_DIR"
DEFAULT_DATA_ROOT = Path("~/.cache/morphpipe/datasets")
DEFAULT_DATASET = "default"


@dataclass(repr=False)
class GraphStore:
    """A graph ready for mini-batch training: CSC in-neighbour lists, node features, labels and splits."""

    indptr: torch.Tensor  # int64 [N+1]; in-neighbours of v are indices[indptr[v]:indptr[v+1]]
    indices: torch.Tensor  # int32 (N < 2**31) or int64 [E]
    features: torch.Tensor  # [N, F] float32 | float16 | bfloat16, possibly memory-mapped
    labels: torch.Tensor  # int64 [N]; -1 = unlabelled (only outside the splits)
    train_idx: torch.Tensor  # int64 node ids
    val_idx: torch.Tensor
    test_idx: torch.Tensor
    num_classes: int
    name: str = "graph"
    source: dict[str, Any] = field(default_factory=dict)  # how the graph was made (meta.json `source`)
    edge_split: EdgeSplit | None = None  # link prediction's positive pairs and fixed negatives, when split
    # Memory-mapped files behind the arrays: path -> (device, inode, size in bytes) when loaded.
    mapped_files: dict[str, tuple[int, int, int]] = field(default_factory=dict, repr=False, compare=False)
    # What the last full validation saw (see `is_validated`); None until a validation passes.
    validated_signature: tuple | None = field(default=None, repr=False, compare=False)
    # Features on disk (load(features_on_disk=True)): the CPU batcher gathers rows through this store (hot rows
    # cached in RAM, the rest read from features.npy); `features` stays the memory map for everything else.
    feature_store: FeatureStore | None = field(default=None, repr=False, compare=False)
    # What the feature cache ranks rows by: (what it is, one value per row); None: in-degree (`cache_hotness`).
    cache_ranking: tuple[str, torch.Tensor] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        """numpy arrays given for any array field become tensors (zero-copy where numpy's dtype allows)."""
        for name in ARRAY_FIELDS:
            value = getattr(self, name)
            if isinstance(value, np.ndarray):
                setattr(self, name, _tensor(np.ascontiguousarray(value), name))

    @property
    def num_nodes(self) -> int:
        return self.indptr.numel() - 1

    @property
    def num_edges(self) -> int:
        return self.indices.numel()

    @property
    def feature_dim(self) -> int:
        return self.features.shape[1]

    @property
    def feature_dtype(self) -> torch.dtype:
        return self.features.dtype

    def open_feature_store(self, cache_bytes: int = 0, io_threads: int | None = None) -> FeatureStore:
        """From now on the batcher reads the features from their file through a FeatureStore caching `cache_bytes`
        of the hottest rows by `cache_hotness` with `io_threads` I/O threads (replacing the store open now, whose I/O
        settings it keeps where not given): how a run moves its features to the disk tier, or gives the cache and
        the I/O threads the sizes its plan chose."""
        path = next((file for file in self.mapped_files if Path(file).stem == "features"), None)
        if path is None:
            raise ValueError(f"features of {self.name!r} are not memory-mapped from a features.npy, so the feature "
                             "store has no file to read; load the graph from its directory (GraphStore.load, "
                             "mmap=True)")
        current = self.feature_store
        self.feature_store = None  # the old store's cache is freed before the new one is read
        self.feature_store = FeatureStore(path, dtype_name(self.feature_dtype), cache_bytes=cache_bytes,
                                          hotness=self.cache_hotness(),
                                          io_threads=(io_threads if io_threads is not None else current.io_threads
                                                      if current is not None else DEFAULT_IO_THREADS),
                                          direct=current.direct if current is not None else None,
                                          reader=current.reader if current is not None else None)
        return self.feature_store

    def in_degrees(self) -> torch.Tensor:
        """int64 [N]: number of in-neighbours of each node."""
        return self.indptr[1:] - self.indptr[:-1]

    def cache_hotness(self) -> torch.Tensor:
        """One value per row: the feature cache holds the rows with the largest (the ranking given to
        `rank_feature_cache`, else in-degree)."""
        return self.cache_ranking[1] if self.cache_ranking is not None else self.in_degrees()

    @property
    def cache_ranked_by(self) -> str:
        """What the feature cache ranks rows by, in words."""
        return self.cache_ranking[0] if self.cache_ranking is not None else "in-degree"

    def rank_feature_cache(self, hotness: torch.Tensor, ranked_by: str) -> None:
        """From now on the feature cache holds the rows with the largest `hotness` (one value per row; `ranked_by`
        says what it is): an open feature store with a cache is re-opened with the same settings so that its rows
        follow the new ranking."""
        if not isinstance(hotness, torch.Tensor) or hotness.shape != (self.num_nodes,) or hotness.is_complex():
            shape = tuple(hotness.shape) if isinstance(hotness, torch.Tensor) else type(hotness).__name__
            raise ValueError(f"hotness: expected one real value per node of {self.name!r}, shape ({self.num_nodes},), "
                             f"got {shape}")
        self.cache_ranking = (ranked_by, hotness)
        store = self.feature_store
        if store is not None and store.cache_bytes:
            self.open_feature_store(store.cache_bytes, store.io_threads)

    def require_edge_split(self, task: str = "link") -> EdgeSplit:
        """The graph's edge split, or a GraphValidationError saying how to make one."""
        if self.edge_split is None:
            raise GraphValidationError("edge split", f"graph {self.name!r} has no edge split (train/val/test positive "
                                       f"pairs and negatives), which the {task} task trains and ranks on",
                                       SPLIT_EDGES_HINT)
        return self.edge_split

    def validate(self) -> None:
        """Checks dtypes, shapes and every value; raises GraphValidationError naming the field and the fix."""
        validate_graph(**self._arrays(), num_classes=self.num_classes)
        if self.edge_split is not None:
            self.edge_split.validate(self.num_nodes)
        self.validated_signature = self._signature()

    def is_validated(self) -> bool:
        """True when every value was checked and no array or num_classes was replaced since (splits excepted:
        batchers check the seeds they are given)."""
        return self.validated_signature is not None and self.validated_signature == self._signature()

    def note_first_use(self) -> None:
        """Warns, once per store, when the store is used without its values having been checked."""
        if self.is_validated() or getattr(self, "_warned_unvalidated", False):
            return
        self._warned_unvalidated = True
        warnings.warn(UnvalidatedGraphWarning(
            f"graph {self.name!r} is used without validation: labels in [0, {self.num_classes}) or -1, finite "
            "features, split ids and the CSC's values were not checked (the native sampler still refuses a "
            "malformed neighbour range or id); call graph.validate() or load with GraphStore.load(path) to check "
            "them"), stacklevel=4)

    def check_files(self) -> None:
        """Refuses to go on when a memory-mapped file shrank since loading: reading a page past its new end
        would kill the process with SIGBUS. Cheap (one stat per file); the batchers call it before every epoch.
        A file truncated while an epoch runs cannot be caught this way."""
        for path, (device, inode, size) in self.mapped_files.items():
            try:
                now = os.stat(path)
            except FileNotFoundError:
                continue  # unlinked or replaced by rename: the mapping keeps the old file alive
            if (now.st_dev, now.st_ino) == (device, inode) and now.st_size < size:
                raise GraphValidationError(
                    Path(path).stem, f"{path} shrank from {size:,} to {now.st_size:,} bytes since graph "
                    f"{self.name!r} was loaded; it is memory-mapped, and reading it now would crash the process",
                    "restore the file (or regenerate the graph) and load it again; replace dataset files by "
                    "writing a new file and renaming it, never by truncating them in place")

    def save(self, path: str | os.PathLike) -> None:
        """Writes the store to directory `path` (meta.json + one .npy per array). Every value is checked first
        (unless a validation of these very arrays passed already). A new directory, or one holding only a graph, is
        built beside and swapped in whole, so a failed or interrupted save leaves the previous graph intact; in a
        directory that holds other files too, each file is replaced atomically and meta.json is written last."""
        if not self.is_validated():
            self.validate()
        directory = Path(path)
        if directory.is_dir() and foreign_entries(directory):
            self._write(directory)  # beside other files: replaced file by file, meta.json last
            return
        with replacing_directory(directory, "path") as staging:
            self._write(staging)

    def _write(self, directory: Path) -> None:
        """Writes every array, then meta.json, into `directory`."""
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "meta.json").unlink(missing_ok=True)
        for name, tensor in self._arrays().items():
            save_array(directory, name, tensor_to_numpy(tensor))
        if self.edge_split is not None:
            self.edge_split.save(directory)
        else:
            (directory / EDGE_SPLIT_FILE).unlink(missing_ok=True)  # a split of an earlier topology is stale
        write_meta(directory, GraphMeta(
            name=self.name,
            num_nodes=self.num_nodes,
            num_edges=self.num_edges,
            feature_dim=self.feature_dim,
            feature_dtype=dtype_name(self.feature_dtype),
            num_classes=int(self.num_classes),
            indices_dtype=dtype_name(self.indices.dtype),
            source=self.source or {"kind": "saved", "note": "built in Python and saved with GraphStore.save"},
        ))

    @classmethod
    def load(cls, path: str | os.PathLike, mmap: bool = True, validate: bool = True, *,
             features_on_disk: bool = False, feature_cache_bytes: int = 0,
             io_threads: int = DEFAULT_IO_THREADS) -> "GraphStore":
        """Reads a graph directory; `mmap` memory-maps indices and features (copy-on-write, the files are never
        modified); `validate` scans every value (dtypes and shapes are always checked).

        `features_on_disk` opens a FeatureStore on features.npy (features are then memory-mapped whatever `mmap`
        says): the CPU batcher reads rows from the file with `io_threads` threads, the hottest rows by in-degree
        cached in `feature_cache_bytes` of RAM (`rank_feature_cache` re-ranks them, e.g. by expected access, once the
        workload is known). `validate` still scans the features once, through the map."""
        meta = read_meta(path)
        arrays = {name: load_array(path, name, mmap=name in MMAP_FIELDS and (mmap or features_on_disk and
                                                                             name == "features"))
                  for name in ARRAY_FIELDS}
        _check_against_meta(arrays, meta, Path(path))
        tensors = {name: _tensor(array, name) for name, array in arrays.items() if name != "features"}
        tensors["features"] = features_from_storage(arrays["features"], meta.feature_dtype)
        store = cls(**tensors, num_classes=meta.num_classes, name=meta.name, source=meta.source,
                    edge_split=EdgeSplit.load(path, meta.num_nodes), mapped_files=_mapped_files(path, arrays))
        validate_graph(**store._arrays(), num_classes=store.num_classes, num_nodes=meta.num_nodes,
                       scan_values=validate, features_freshly_mapped=isinstance(arrays["features"], np.memmap))
        if validate:
            store.validated_signature = store._signature()
        if features_on_disk:
            store.feature_store = FeatureStore(array_path(path, "features"), meta.feature_dtype,
                                               cache_bytes=feature_cache_bytes, hotness=store.in_degrees(),
                                               io_threads=io_threads)
        return store

    def _signature(self) -> tuple:
        """Identity of the arrays a validation covers: their memory, shape and dtype, and num_classes."""
        arrays = (self.indptr, self.indices, self.features, self.labels)
        return (self.num_classes, *((t.data_ptr(), tuple(t.shape), t.dtype) if isinstance(t, torch.Tensor) else id(t)
                                    for t in arrays))

    def _arrays(self) -> dict[str, torch.Tensor]:
        return {name: getattr(self, name) for name in ARRAY_FIELDS}

    def __repr__(self) -> str:
        return (f"GraphStore(name={self.name!r}, num_nodes={self.num_nodes}, num_edges={self.num_edges}, "
                f"features={tuple(self.features.shape)} {dtype_name(self.feature_dtype)}, "
                f"num_classes={self.num_classes}, splits={self.train_idx.numel()}/{self.val_idx.numel()}/"
                f"{self.test_idx.numel()}{'' if self.edge_split is None else f', {self.edge_split!r}'})")


def _check_against_meta(arrays: dict[str, np.ndarray], meta: GraphMeta, path: Path) -> None:
    """The stored arrays have the dtypes and sizes meta.json records."""
    features, indices = arrays["features"], arrays["indices"]
    if meta.feature_dtype not in FEATURE_STORAGE:
        raise GraphValidationError("meta.json feature_dtype", f"{meta.feature_dtype!r} is not supported "
                                   f"(expected {', '.join(FEATURE_STORAGE)})", "re-create the graph with morphpipe")
    expected = FEATURE_STORAGE[meta.feature_dtype]
    if features.dtype != expected:
        raise GraphValidationError("features", f"{path / 'features.npy'} holds {features.dtype}, but meta.json says "
                                   f"{meta.feature_dtype} (stored as {expected})",
                                   "re-save the graph with GraphStore.save")
    if str(indices.dtype) != meta.indices_dtype:
        raise GraphValidationError("indices", f"{path / 'indices.npy'} holds {indices.dtype}, but meta.json says "
                                   f"{meta.indices_dtype}", "re-save the graph with GraphStore.save")
    if indices.ndim != 1 or indices.size != meta.num_edges:
        raise GraphValidationError("indices", f"{path / 'indices.npy'} has shape {indices.shape}, but meta.json "
                                   f"says num_edges = {meta.num_edges}", "re-save the graph with GraphStore.save")
    if features.ndim != 2 or features.shape[1] != meta.feature_dim:
        raise GraphValidationError("features", f"{path / 'features.npy'} has shape {features.shape}, but meta.json "
                                   f"says feature_dim = {meta.feature_dim}", "re-save the graph with GraphStore.save")


class UnvalidatedGraphWarning(UserWarning):
    """A graph store is used before its values were checked."""


def _mapped_files(path: str | os.PathLike, arrays: dict[str, np.ndarray]) -> dict[str, tuple[int, int, int]]:
    """(device, inode, size) of the file behind every memory-mapped array."""
    files = {}
    for name, array in arrays.items():
        if isinstance(array, np.memmap):
            file = array_path(path, name)
            info = os.stat(file)
            files[str(file)] = (info.st_dev, info.st_ino, info.st_size)
    return files


def _tensor(array: np.ndarray, name: str) -> torch.Tensor:
    """Zero-copy tensor over a loaded array; dtypes torch cannot hold are a validation error."""
    if array.dtype.kind not in "biuf":
        raise GraphValidationError(name, f"has numpy dtype {array.dtype}, expected a numeric array",
                                   "re-save the array with a supported integer dtype")
    try:
        return numpy_view(array)
    except TypeError as error:
        raise GraphValidationError(name, f"has numpy dtype {array.dtype}, which torch cannot hold ({error})",
                                   "re-save the array as int64") from error


def data_root(root: str | os.PathLike | None = None) -> Path:
    """The dataset cache: `root`, else $MORPHPIPE_DATA_DIR, else ~/.cache/morphpipe/datasets."""
    chosen = root if root is not None else os.environ.get(DATA_DIR_ENV) or DEFAULT_DATA_ROOT
    return Path(chosen).expanduser()


def load_dataset(name_or_path: str | os.PathLike | None = None, root: str | os.PathLike | None = None,
                 progress: bool = True, *, features_on_disk: bool = False,
                 feature_cache_bytes: int = 0) -> GraphStore | HeteroGraphStore:
    """A graph directory (with meta.json), or a preset from the cache (generated there first if missing);
    None means the "default" preset. A heterogeneous graph comes back as a HeteroGraphStore. `features_on_disk`
    and `feature_cache_bytes`: see GraphStore.load and HeteroGraphStore.load."""
    target = DEFAULT_DATASET if name_or_path is None else str(name_or_path)
    disk = {"features_on_disk": features_on_disk, "feature_cache_bytes": feature_cache_bytes}
    if is_graph_dir(Path(target).expanduser()):
        return load_graph_dir(Path(target).expanduser(), **disk)
    if target in PRESETS:
        return load_graph_dir(ensure_preset(PRESETS[target], root=root, progress=progress), **disk)
    if Path(target).expanduser().exists():
        raise FileNotFoundError(f"{target} is not a morphpipe graph directory (no meta.json); create one with "
                                "`morphpipe data convert` or `morphpipe data generate`")
    raise ValueError(f"unknown dataset {target!r}: not a graph directory and not a preset; "
                     f"presets: {', '.join(PRESETS)}")


def load_graph_dir(path: Path, validate: bool = True, *, features_on_disk: bool = False,
                   feature_cache_bytes: int = 0) -> GraphStore | HeteroGraphStore:
    """The graph in directory `path`, homogeneous or heterogeneous as its meta.json says, its features on disk
    when asked (see GraphStore.load and HeteroGraphStore.load)."""
    loader = HeteroGraphStore.load if is_hetero_dir(path) else GraphStore.load
    return loader(path, validate=validate, features_on_disk=features_on_disk, feature_cache_bytes=feature_cache_bytes)


def ensure_preset(preset: Preset, root: str | os.PathLike | None = None, progress: bool = True,
                  regenerate: bool = False, memory_budget: int | None = None) -> Path:
    """Path of the preset in the cache, generated first when missing, made by another generator version or spec,
    or when `regenerate` (within `memory_budget` bytes, see `generate`).

    A lock file serialises concurrent callers; generation goes to a temporary directory swapped into place
    (one left by a crashed generation is removed under the lock).
    """
    cache = data_root(root)
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / preset.name
    with open(cache / f".{preset.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not regenerate and _is_current(target, preset):
            return target
        stale = is_graph_dir(target) and not regenerate
        if progress or stale:
            reason = "the cached copy comes from another generator version or spec" if stale else \
                "regenerating as asked" if regenerate else "first use"
            print(f"morphpipe: generating dataset {preset.name} into {target} ({reason})", file=sys.stderr)
        for leftover in cache.glob(f".{preset.name}.partial-*"):
            shutil.rmtree(leftover)
        preset.generate(target, progress=progress, overwrite=True, memory_budget=memory_budget)
    return target


def _is_current(directory: Path, preset: Preset) -> bool:
    """True when `directory` holds the preset made by this generator version from the same spec."""
    if not is_graph_dir(directory):
        return False
    try:
        if isinstance(preset.spec, MagSpec):
            return read_hetero_meta(directory).get("source") == preset.record()
        return read_meta(directory).source == preset.record()
    except (GraphValidationError, OSError):
        return False
