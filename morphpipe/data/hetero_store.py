"""The heterogeneous graph store: typed nodes as contiguous ranges of one id space, one CSC per relation.

Node type `t` owns the global ids `[start_t, start_t + count_t)`; the ranges tile `[0, num_nodes)`
in the order of `node_types`, so samplers and caches keep one id per node. A relation
`(src_type, name, dst_type)` is a CSC over the destination type's local ids whose `indices` are
the source type's local ids: a relation's neighbour list is one indptr read away, where one CSC with
per-edge relation ids needs two searches per destination and relation (measured 1.28x slower to sample
on the mag preset: BENCHMARKS.md, scripts/bench_hetero_layout.py). Features are per node type,
each with its own width and dtype; a type without features is embedded by the model. Labels
are global (-1 outside the target type) and the splits are global ids of the target type.
Features can stay on disk (`load(features_on_disk=True)`): one FeatureStore per type, all reading through one
pool of I/O threads, the host cache shared between the types by `share_feature_cache`; `feature_store` sees them
as one store (morphpipe.data.typed_feature_store), as the profiler, planner and trainer read a homogeneous graph's.

On disk (a dataset directory): meta.json (format `morphpipe-hetero-graph`) and one .npy per
array, written like the homogeneous format (`morphpipe.data.ondisk`: temporary names, renames,
meta.json last, a whole directory swapped in).
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from morphpipe import __version__
from morphpipe.data.dtypes import FEATURE_DTYPES, FEATURE_STORAGE, dtype_name, features_from_storage, tensor_to_numpy
from morphpipe.data.feature_store import DEFAULT_IO_THREADS, FeatureStore
from morphpipe.data.ondisk import META_FILE, array_path, load_array, save_array
from morphpipe.data.typed_feature_store import TypedFeatureStore, share_feature_cache
from morphpipe.data.validation import (SPLIT_FIELDS, UNLABELLED, GraphValidationError, check_finite_features,
                                       check_labels, check_splits, check_topology_values)
from morphpipe.documents import read_json
from morphpipe.numeric import check_int
from morphpipe.outputs import replacing_directory

HETERO_FORMAT_NAME = "morphpipe-hetero-graph"
HETERO_FORMAT_VERSION = 1


class Relation(NamedTuple):
    """A canonical edge type: edges from nodes of `src` to nodes of `dst`, called `name` (PyG/DGL's triple)."""

    src: str
    name: str
    dst: str

    @property
    def key(self) -> str:
        """The relation's spelling in file names and on the command line: `src__name__dst`."""
        return f"{self.src}__{self.name}__{self.dst}"

    def __str__(self) -> str:
        return f"({self.src}, {self.name}, {self.dst})"


@dataclass(frozen=True)
class NodeType:
    """A node type: its name and its range `[start, start + count)` of global ids."""

    name: str
    start: int
    count: int

    @property
    def stop(self) -> int:
        return self.start + self.count


@dataclass(repr=False)
class HeteroGraphStore:
    """A heterogeneous graph ready for mini-batch training (see the module docstring for the layout)."""

    node_types: tuple[NodeType, ...]
    relations: tuple[Relation, ...]
    indptr: dict[Relation, torch.Tensor]  # int64 [count of dst type + 1]
    indices: dict[Relation, torch.Tensor]  # int32 | int64 [E_r], local ids of the source type
    features: dict[str, torch.Tensor]  # node type -> [count, F_t]; types absent here have no features
    labels: torch.Tensor  # int64 [num_nodes], -1 outside the target type's labelled nodes
    train_idx: torch.Tensor  # int64 global ids of target-type nodes
    val_idx: torch.Tensor
    test_idx: torch.Tensor
    num_classes: int
    target_type: str
    name: str = "graph"
    source: dict[str, Any] = field(default_factory=dict)
    validated: bool = field(default=False, repr=False, compare=False)
    # Features memory-mapped from their files (load with mmap or features_on_disk), for the tier a summary names.
    features_mapped: bool = field(default=False, repr=False, compare=False)
    # Features on disk (load(features_on_disk=True)): type -> the store the typed batcher gathers its rows through
    # (hot rows cached in RAM, the rest read from features.TYPE.npy); `features` stays the memory map.
    feature_stores: dict[str, FeatureStore] = field(default_factory=dict, repr=False, compare=False)
    # The directory the features were loaded from (None: not loaded from one), where open_feature_store finds them.
    directory: Path | None = field(default=None, repr=False, compare=False)
    # Each featured type's row hotness (`cache_hotness`) the open stores' shared cache was split by.
    feature_hotness: dict[str, torch.Tensor] = field(default_factory=dict, repr=False, compare=False)
    # The bytes the open stores' shared cache was given (their rows take up to a row's bytes less).
    feature_cache_bytes: int = field(default=0, repr=False, compare=False)
    # What the shared feature cache ranks rows by: (what it is, each featured type's value per row); None: source
    # degrees (`cache_hotness`).
    cache_ranking: tuple[str, dict[str, torch.Tensor]] | None = field(default=None, repr=False, compare=False)

    is_hetero = True  # what task and command code branch on (a homogeneous GraphStore has no such attribute)

    def __post_init__(self) -> None:
        self.node_types = tuple(self.node_types)
        self.relations = tuple(Relation(*relation) for relation in self.relations)
        self.indptr = {Relation(*key): value for key, value in self.indptr.items()}
        self.indices = {Relation(*key): value for key, value in self.indices.items()}

    # --- sizes and lookups -------------------------------------------------------------------------------------
    @property
    def num_nodes(self) -> int:
        return self.node_types[-1].stop if self.node_types else 0

    @property
    def num_edges(self) -> int:
        return sum(int(self.indices[relation].numel()) for relation in self.relations)

    @property
    def type_names(self) -> tuple[str, ...]:
        return tuple(node_type.name for node_type in self.node_types)

    def node_type(self, name: str) -> NodeType:
        """The node type called `name`, or an error naming the types."""
        for node_type in self.node_types:
            if node_type.name == name:
                return node_type
        raise ValueError(f"node type {name!r} is not in graph {self.name!r}; its types are {list(self.type_names)}")

    def type_offsets(self) -> list[int]:
        """Start of every node type's id range, then num_nodes."""
        return [node_type.start for node_type in self.node_types] + [self.num_nodes]

    @property
    def feature_dims(self) -> dict[str, int]:
        """Feature width of every node type that has features."""
        return {name: int(tensor.shape[1]) for name, tensor in self.features.items()}

    @property
    def feature_dim(self) -> int:
        """The target type's feature width (0 when it has none): what summaries print."""
        return self.feature_dims.get(self.target_type, 0)

    @property
    def feature_dtype(self) -> torch.dtype:
        return self.features[self.target_type].dtype if self.target_type in self.features else torch.float32

    def relation(self, spelling: str | Sequence[str]) -> Relation:
        """The relation spelled as a triple, `src__name__dst`, or its name alone when no other relation shares it."""
        if not isinstance(spelling, str):
            triple = Relation(*spelling)
            if triple in self.relations:
                return triple
            raise ValueError(f"relation {triple} is not in graph {self.name!r}; its relations are "
                             f"{[r.key for r in self.relations]}")
        by_key = {relation.key: relation for relation in self.relations}
        if spelling in by_key:
            return by_key[spelling]
        named = [relation for relation in self.relations if relation.name == spelling]
        if len(named) == 1:
            return named[0]
        if named:
            raise ValueError(f"relation name {spelling!r} is ambiguous in graph {self.name!r} "
                             f"({[r.key for r in named]}); spell it as src__name__dst")
        raise ValueError(f"relation {spelling!r} is not in graph {self.name!r}; its relations are "
                         f"{[r.key for r in self.relations]}")

    def source_degrees(self, type_name: str) -> torch.Tensor:
        """int64 [count of the type]: in how many relations' neighbour lists each node of the type stands (its
        out-degree over the relations it is the source of): how often sampling can draw it, so its row is read."""
        degrees = torch.zeros(self.node_type(type_name).count, dtype=torch.int64)
        for relation in self.relations:
            if relation.src == type_name:
                degrees += torch.bincount(self.indices[relation].long(), minlength=degrees.numel())
        return degrees

    # --- the homogeneous view ----------------------------------------------------------------------------------
    def homogeneous_csc(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The union of every relation as one CSC over global ids (relation types dropped)."""
        offsets = {node_type.name: node_type.start for node_type in self.node_types}
        dst_parts, src_parts = [], []
        for relation in self.relations:
            indptr = self.indptr[relation]
            degrees = indptr[1:] - indptr[:-1]
            dst_parts.append(torch.repeat_interleave(torch.arange(degrees.numel()), degrees) + offsets[relation.dst])
            src_parts.append(self.indices[relation].long() + offsets[relation.src])
        dst = torch.cat(dst_parts) if dst_parts else torch.empty(0, dtype=torch.long)
        src = torch.cat(src_parts) if src_parts else torch.empty(0, dtype=torch.long)
        order = torch.argsort(dst, stable=True)
        counts = torch.bincount(dst, minlength=self.num_nodes)
        indptr = torch.zeros(self.num_nodes + 1, dtype=torch.long)
        torch.cumsum(counts, 0, out=indptr[1:])
        return indptr, src[order]

    # --- validation --------------------------------------------------------------------------------------------
    def validate(self, scan_values: bool = True) -> None:
        """Checks the type ranges, every relation, the features, labels and splits; raises GraphValidationError
        naming the node type or relation and the fix. `scan_values=False` checks only sizes and dtypes."""
        check_node_types(self.node_types)
        names = set(self.type_names)
        seen: set[Relation] = set()
        for relation in self.relations:
            if relation in seen:
                raise GraphValidationError(f"relation {relation}", "is listed twice", "list every relation once")
            seen.add(relation)
            for role, type_name in (("source", relation.src), ("destination", relation.dst)):
                if type_name not in names:
                    raise GraphValidationError(f"relation {relation}", f"its {role} type {type_name!r} is not a node "
                                               f"type (types: {sorted(names)})", "declare the node type or fix the "
                                               "relation's triple")
            if relation not in self.indptr or relation not in self.indices:
                raise GraphValidationError(f"relation {relation}", "has no CSC (indptr and indices)",
                                           "give both arrays for every relation")
            self._check_relation(relation, scan_values)
        extra = (set(self.indptr) | set(self.indices)) - seen
        if extra:
            raise GraphValidationError(f"relation {sorted(extra)[0]}", "has a CSC but is not in `relations`",
                                       "add it to relations or drop its arrays")
        for type_name, features in self.features.items():
            self._check_features(type_name, features, scan_values)
        self._check_labels(scan_values)
        self.validated = scan_values

    def _check_relation(self, relation: Relation, scan_values: bool) -> None:
        label = f"relation {relation}"
        indptr, indices = self.indptr[relation], self.indices[relation]
        num_dst, num_src = self.node_type(relation.dst).count, self.node_type(relation.src).count
        for part, tensor, allowed in (("indptr", indptr, (torch.int64,)), ("indices", indices,
                                                                         (torch.int32, torch.int64))):
            if not isinstance(tensor, torch.Tensor) or tensor.dtype not in allowed or tensor.dim() != 1:
                described = f"{tensor.dtype} {tuple(tensor.shape)}" if isinstance(tensor, torch.Tensor) else \
                    type(tensor).__name__
                raise GraphValidationError(f"{label} {part}", f"is {described}, expected a 1-D "
                                           f"{' or '.join(dtype_name(d) for d in allowed)} tensor",
                                           f"convert it, e.g. torch.as_tensor({part}).to({allowed[-1]})")
            if tensor.device.type != "cpu" or not tensor.is_contiguous():
                raise GraphValidationError(f"{label} {part}", "is not a contiguous CPU tensor",
                                           f"use {part}.cpu().contiguous()")
        if indptr.numel() != num_dst + 1:
            raise GraphValidationError(f"{label} indptr", f"has {indptr.numel()} entries, but destination type "
                                       f"{relation.dst!r} has {num_dst} nodes (needs {num_dst + 1})",
                                       "build the relation's CSC over the destination type's local ids")
        if not scan_values:
            return
        try:
            check_topology_values(indptr, indices, num_src)
        except GraphValidationError as error:
            raise GraphValidationError(f"{label} {error.field}", error.problem.replace(
                f"[0, {num_src})", f"source type {relation.src!r}'s local ids [0, {num_src})"),
                "store source ids as local ids of the source type (global id - type start), and build the CSC "
                "over the destination type's local ids") from None

    def _check_features(self, type_name: str, features: torch.Tensor, scan_values: bool) -> None:
        label = f"features of node type {type_name!r}"
        if type_name not in self.type_names:
            raise GraphValidationError(label, f"{type_name!r} is not a node type (types: {list(self.type_names)})",
                                       "key features by node type name")
        if not isinstance(features, torch.Tensor) or features.dtype not in FEATURE_DTYPES.values():
            raise GraphValidationError(label, f"dtype {getattr(features, 'dtype', type(features).__name__)} is not "
                                       f"supported (expected {', '.join(FEATURE_DTYPES)})", "cast them to float32")
        count = self.node_type(type_name).count
        if features.dim() != 2 or features.shape[0] != count or features.shape[1] < 1:
            raise GraphValidationError(label, f"have shape {tuple(features.shape)}, but the type has {count} nodes",
                                       f"give exactly one row per {type_name!r} node, in local-id order "
                                       f"([{count}, F])")
        if features.device.type != "cpu" or not features.is_contiguous():
            raise GraphValidationError(label, "are not a contiguous CPU tensor", "use features.cpu().contiguous()")
        if scan_values:
            try:
                check_finite_features(features)
            except GraphValidationError as error:
                raise GraphValidationError(label, error.problem, error.fix) from None

    def _check_labels(self, scan_values: bool) -> None:
        if self.target_type not in self.type_names:
            raise GraphValidationError("target_type", f"{self.target_type!r} is not a node type "
                                       f"(types: {list(self.type_names)})", "name the node type whose labels to learn")
        target = self.node_type(self.target_type)
        tensors = {"labels": self.labels, **{name: getattr(self, name) for name in SPLIT_FIELDS}}
        for name, tensor in tensors.items():
            if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.int64 or tensor.dim() != 1:
                raise GraphValidationError(name, "must be a 1-D int64 tensor", f"use torch.as_tensor({name}).long()")
        if self.labels.numel() != self.num_nodes:
            raise GraphValidationError("labels", f"has {self.labels.numel()} entries, expected one per node "
                                       f"({self.num_nodes}, -1 outside the target type)",
                                       "place the target type's labels at its global ids, -1 elsewhere")
        if not scan_values:
            return
        if not isinstance(self.num_classes, int) or self.num_classes < 1:
            raise GraphValidationError("num_classes", f"is {self.num_classes!r}, expected an integer >= 1",
                                       "pass the number of classes")
        check_labels(self.labels, self.num_classes)
        labelled = torch.nonzero(self.labels != UNLABELLED).flatten()
        if labelled.numel() == 0:
            raise GraphValidationError(f"target type {self.target_type!r}", "has no labels (every label is -1)",
                                       "store the target type's labels, or choose a labelled target type")
        outside = labelled[(labelled < target.start) | (labelled >= target.stop)]
        if outside.numel():
            raise GraphValidationError("labels", f"node {int(outside[0])} is labelled but outside target type "
                                       f"{self.target_type!r}'s ids [{target.start}, {target.stop})",
                                       "label only target-type nodes; set the others to -1")
        check_splits({name: getattr(self, name) for name in SPLIT_FIELDS}, self.labels, self.num_nodes)

    # --- the directory format ----------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> None:
        """Writes the graph to directory `path` (checked first), swapped in whole so a failed save changes nothing."""
        if not self.validated:
            self.validate()
        with replacing_directory(Path(path), "path") as staging:
            for relation in self.relations:
                save_array(staging, f"indptr.{relation.key}", tensor_to_numpy(self.indptr[relation]))
                save_array(staging, f"indices.{relation.key}", tensor_to_numpy(self.indices[relation]))
            for type_name, features in self.features.items():
                save_array(staging, f"features.{type_name}", tensor_to_numpy(features))
            for name in ("labels", *SPLIT_FIELDS):
                save_array(staging, name, tensor_to_numpy(getattr(self, name)))
            write_hetero_meta(
                staging, name=self.name, node_types=self.node_types,
                relations={r: (int(self.indices[r].numel()), dtype_name(self.indices[r].dtype))
                           for r in self.relations},
                features={name: (int(f.shape[1]), dtype_name(f.dtype)) for name, f in self.features.items()},
                target_type=self.target_type, num_classes=int(self.num_classes), source=self.source)

    @classmethod
    def load(cls, path: str | os.PathLike, mmap: bool = True, validate: bool = True, *,
             features_on_disk: bool = False, feature_cache_bytes: int = 0,
             io_threads: int = DEFAULT_IO_THREADS) -> "HeteroGraphStore":
        """Reads a heterogeneous graph directory (indices and features memory-mapped when `mmap`) and validates it
        (`validate=False`: sizes and dtypes only).

        `features_on_disk` opens a FeatureStore on every type's features file, as GraphStore.load does on its one
        (features then memory-mapped whatever `mmap` says; each store reads with its own `io_threads` threads):
        the typed batcher reads rows from the files, the `feature_cache_bytes` of RAM shared between the types'
        caches by `share_feature_cache`."""
        directory = Path(path)
        mmap = mmap or features_on_disk
        meta = read_hetero_meta(directory)
        node_types = tuple(NodeType(str(t["name"]), int(t["start"]), int(t["count"])) for t in meta["node_types"])
        relations = tuple(Relation(str(r["src"]), str(r["name"]), str(r["dst"])) for r in meta["relations"])
        indptr = {r: torch.from_numpy(load_array(directory, f"indptr.{r.key}", mmap=False)) for r in relations}
        indices = {r: torch.from_numpy(load_array(directory, f"indices.{r.key}", mmap=mmap)) for r in relations}
        features = {}
        for type_name, spec in meta["features"].items():
            array = load_array(directory, f"features.{type_name}", mmap=mmap)
            if spec.get("dtype") not in FEATURE_STORAGE or array.dtype != FEATURE_STORAGE[spec["dtype"]]:
                raise GraphValidationError(f"features of node type {type_name!r}", f"the file holds {array.dtype}, "
                                           f"meta.json says {spec.get('dtype')!r}", "re-save the graph")
            features[type_name] = features_from_storage(array, spec["dtype"])
        arrays = {name: torch.from_numpy(load_array(directory, name, mmap=False)) for name in ("labels", *SPLIT_FIELDS)}
        store = cls(node_types=node_types, relations=relations, indptr=indptr, indices=indices, features=features,
                    num_classes=int(meta["num_classes"]), target_type=str(meta["target_type"]),
                    name=str(meta.get("name", directory.name)), source=dict(meta.get("source", {})), **arrays)
        store.features_mapped = mmap
        store.directory = directory
        store.validate(scan_values=validate)
        if features_on_disk:
            store.open_feature_stores(directory, feature_cache_bytes, io_threads)
        return store

    def open_feature_stores(self, directory: Path, cache_bytes: int, io_threads: int,
                            direct: bool | None = None, reader: str | None = None) -> None:
        """One FeatureStore per type with features, on features.TYPE.npy in `directory`, all reading through the
        first one's pool of `io_threads` I/O threads (with io_uring: a ring per gather, no pool), their caches
        sharing `cache_bytes` as `share_feature_cache` splits it."""
        cache_bytes = check_int("feature_cache_bytes", cache_bytes, 0)
        hotness = self.cache_hotness()
        row_bytes = {name: int(rows.shape[1]) * rows.element_size() for name, rows in self.features.items()}
        cached = share_feature_cache(hotness, row_bytes, cache_bytes)
        self.feature_stores = {}  # the old stores' caches are freed before the new ones are read
        shared = None
        for name, rows in self.features.items():
            store = FeatureStore(array_path(directory, f"features.{name}"), dtype_name(rows.dtype),
                                 cache_bytes=cached[name] * row_bytes[name], hotness=hotness[name],
                                 io_threads=io_threads, direct=direct, reader=reader, shares_io_with=shared)
            self.feature_stores[name] = store
            if shared is None and store.reader == "pread":
                shared = store
        self.feature_hotness, self.feature_cache_bytes = hotness, cache_bytes

    def cache_hotness(self) -> dict[str, torch.Tensor]:
        """Each featured type's value per row: the shared feature cache holds the rows with the most of it per byte
        (the ranking given to `rank_feature_cache`, else source degrees)."""
        if self.cache_ranking is not None:
            return dict(self.cache_ranking[1])
        return {name: self.source_degrees(name) for name in self.features}

    @property
    def cache_ranked_by(self) -> str:
        """What the shared feature cache ranks rows by (per byte of row), in words."""
        return self.cache_ranking[0] if self.cache_ranking is not None else "source degree per byte"

    def rank_feature_cache(self, hotness: Mapping[str, torch.Tensor], ranked_by: str) -> None:
        """From now on the shared feature cache holds the rows with the most `hotness` per byte (one value per row of
        every featured type; `ranked_by` says what it is): open stores with a cache are re-opened with the same
        settings so that their rows follow the new ranking (GraphStore.rank_feature_cache for a typed graph)."""
        for name, rows in self.features.items():
            values = hotness.get(name)
            if not isinstance(values, torch.Tensor) or values.shape != (rows.shape[0],) or values.is_complex():
                shape = tuple(values.shape) if isinstance(values, torch.Tensor) else type(values).__name__
                raise ValueError(f"hotness[{name!r}]: expected one real value per {name} node of {self.name!r}, shape "
                                 f"({rows.shape[0]},), got {shape}")
        self.cache_ranking = (ranked_by, {name: hotness[name] for name in self.features})
        store = self.feature_store
        if store is not None and store.num_cached:
            self.open_feature_store(self.feature_cache_bytes, store.io_threads)
        elif store is not None:  # nothing cached to re-read: the order a cache would be sized and filled in
            self.feature_hotness = self.cache_hotness()

    @property
    def feature_store(self) -> TypedFeatureStore | None:
        """The types' feature stores as one (None: features in RAM or memory-mapped): what the profiler, the
        planner and the trainer's read counters use, as a homogeneous graph's FeatureStore."""
        if not self.feature_stores:
            return None
        hotness = self.feature_hotness or {name: self.source_degrees(name) for name in self.feature_stores}
        return TypedFeatureStore(self.feature_stores,
                                 {name: self.node_type(name).start for name in self.feature_stores}, hotness)

    @feature_store.setter
    def feature_store(self, store: TypedFeatureStore | None) -> None:
        """Puts the stores of `store` (a TypedFeatureStore of this graph's types, e.g. a twin) in place of theirs."""
        self.feature_stores = {} if store is None else dict(store.stores)

    def open_feature_store(self, cache_bytes: int = 0, io_threads: int | None = None) -> TypedFeatureStore:
        """From now on the typed batcher reads every featured type's rows through the feature stores, their shared
        cache of `cache_bytes` split by `share_feature_cache`, with `io_threads` I/O threads in their one pool
        (replacing the stores open now, whose I/O settings it keeps where not given): GraphStore.open_feature_store
        for a typed graph, how a run moves its features to disk or gives the cache the size its plan chose."""
        if self.directory is None or not self.features_mapped:
            raise ValueError(f"features of {self.name!r} are not memory-mapped from their features.TYPE.npy files, so "
                             "the feature stores have no files to read; load the graph from its directory "
                             "(HeteroGraphStore.load, mmap=True)")
        if not self.features:
            raise ValueError(f"graph {self.name!r} has no node type with features: nothing to read from disk")
        current = next(iter(self.feature_stores.values()), None)
        self.open_feature_stores(self.directory, cache_bytes,
                                 io_threads if io_threads is not None else current.io_threads
                                 if current is not None else DEFAULT_IO_THREADS,
                                 direct=current.direct if current is not None else None,
                                 reader=current.reader if current is not None else None)
        return self.feature_store

    # --- what the batchers expect of a graph store ------------------------------------------------------------
    def note_first_use(self) -> None:
        """Checked on load or by validate(); nothing to say here (the sampler still checks every id it reads)."""

    def check_files(self) -> None:
        """Memory-mapped files are replaced by rename, never truncated, by every morphpipe writer."""

    def __repr__(self) -> str:
        types = ", ".join(f"{t.name}={t.count}" for t in self.node_types)
        return (f"HeteroGraphStore(name={self.name!r}, nodes: {types}; {len(self.relations)} relations, "
                f"{self.num_edges} edges; target {self.target_type!r}, {self.num_classes} classes, "
                f"splits={self.train_idx.numel()}/{self.val_idx.numel()}/{self.test_idx.numel()})")


def write_hetero_meta(directory: Path, *, name: str, node_types: Sequence[NodeType],
                      relations: Mapping[Relation, tuple[int, str]], features: Mapping[str, tuple[int, str]],
                      target_type: str, num_classes: int, source: dict[str, Any] | None) -> None:
    """Writes meta.json of a heterogeneous graph directory atomically, after every array is in place; `relations`
    maps each relation (in order) to (number of edges, indices dtype name), `features` each type to (width, dtype)."""
    meta = {
        "format": HETERO_FORMAT_NAME, "format_version": HETERO_FORMAT_VERSION, "name": name,
        "node_types": [{"name": t.name, "start": t.start, "count": t.count} for t in node_types],
        "relations": [{"src": r.src, "name": r.name, "dst": r.dst, "num_edges": edges, "indices_dtype": dtype}
                      for r, (edges, dtype) in relations.items()],
        "features": {type_name: {"dim": dim, "dtype": dtype} for type_name, (dim, dtype) in features.items()},
        "target_type": target_type, "num_classes": num_classes,
        "source": source or {"kind": "saved"}, "morphpipe_version": __version__,
    }
    temporary = directory / f".{META_FILE}.tmp"
    temporary.write_text(json.dumps(meta, indent=2) + "\n")
    os.replace(temporary, directory / META_FILE)


def check_node_types(node_types: Sequence[NodeType]) -> None:
    """The type ranges tile [0, num_nodes) in order: no overlap, no gap, distinct names, none empty of name."""
    if not node_types:
        raise GraphValidationError("node_types", "is empty", "declare at least one node type")
    expected_start = 0
    names: set[str] = set()
    for node_type in node_types:
        if not node_type.name or node_type.name in names or "__" in node_type.name or "/" in node_type.name:
            raise GraphValidationError(f"node type {node_type.name!r}", "is empty, repeated, or holds '__' or '/'",
                                       "give every node type a distinct plain name")
        names.add(node_type.name)
        if node_type.count < 0:
            raise GraphValidationError(f"node type {node_type.name!r}", f"has count {node_type.count}",
                                       "give a node count >= 0")
        if node_type.start != expected_start:
            kind = "overlaps the previous type's range" if node_type.start < expected_start else \
                "leaves a gap after the previous type's range"
            raise GraphValidationError(
                f"node type {node_type.name!r}", f"starts at {node_type.start}, which {kind} (expected "
                f"{expected_start})", "number node types as consecutive ranges of one id space: each type starts "
                "where the previous one ends, the first at 0")
        expected_start = node_type.stop


def read_hetero_meta(directory: Path) -> dict[str, Any]:
    """meta.json of a heterogeneous graph directory, with its keys checked."""
    path = directory / META_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{directory} is not a morphpipe graph directory (no {META_FILE})")
    try:
        meta = read_json(path, "")
    except ValueError as error:
        raise GraphValidationError("meta.json", str(error), "re-create the graph with morphpipe") from None
    if not isinstance(meta, dict) or meta.get("format") != HETERO_FORMAT_NAME:
        raise GraphValidationError("meta.json format", f"{path} is not a heterogeneous morphpipe graph",
                                   "point at a directory written by HeteroGraphStore.save")
    if meta.get("format_version") != HETERO_FORMAT_VERSION:
        raise GraphValidationError("meta.json format_version", f"{path} has version {meta.get('format_version')!r}, "
                                   f"this morphpipe reads {HETERO_FORMAT_VERSION}", "re-create the graph")
    for key, kind in (("node_types", list), ("relations", list), ("features", dict), ("target_type", str),
                      ("num_classes", int)):
        if not isinstance(meta.get(key), kind):
            raise GraphValidationError(f"meta.json {key}", f"is missing or not a {kind.__name__} in {path}",
                                       "re-create the graph with morphpipe")
    return meta


def is_hetero_dir(path: str | os.PathLike) -> bool:
    """True for a directory holding a finished heterogeneous graph."""
    meta = Path(path) / META_FILE
    if not meta.is_file():
        return False
    try:
        data = read_json(meta, "")
    except (ValueError, OSError):
        return False  # not readable as ours: the homogeneous loader names what is wrong with it
    return isinstance(data, dict) and data.get("format") == HETERO_FORMAT_NAME


def type_ranges(counts: Mapping[str, int]) -> tuple[NodeType, ...]:
    """Node types numbered consecutively in the order of `counts` (name -> node count)."""
    types, start = [], 0
    for name, count in counts.items():
        types.append(NodeType(name, start, int(count)))
        start += int(count)
    return tuple(types)


def csc_of(src: np.ndarray, dst: np.ndarray, num_dst: int, num_src: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A relation's CSC from local (source, destination) id pairs: indptr int64, indices int32/int64, edges of each
    destination in source-id order."""
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    order = np.lexsort((src, dst))
    counts = np.bincount(dst, minlength=num_dst)
    indptr = np.zeros(num_dst + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    dtype = np.int32 if num_src < 2**31 else np.int64
    return torch.from_numpy(indptr), torch.from_numpy(src[order].astype(dtype))
