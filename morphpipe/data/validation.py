"""Checks that a graph store is well formed, so the C++ sampler can trust every id it reads.

Label convention: labels lie in [0, num_classes); -1 marks an unlabelled node, which is allowed
only for nodes that are in no split (e.g. the unlabelled majority of ogbn-papers100M).
Value scans run in chunks, so a memory-mapped multi-GB feature file is never loaded whole.
"""
from __future__ import annotations

import ctypes
import functools
import mmap
import sys

import numpy as np
import torch

from morphpipe.data.dtypes import FEATURE_DTYPES, INDEX_DTYPES, INT32_LIMIT, dtype_name, tensor_to_numpy

UNLABELLED = -1
SPLIT_FIELDS = ("train_idx", "val_idx", "test_idx")
SCAN_CHUNK_BYTES = 64 << 20
PAGE_BYTES = mmap.PAGESIZE
MADV_DONTNEED = 4  # <sys/mman.h> on Linux
# Exponent bits of the 16-bit float formats: all ones means Inf or NaN.
NONFINITE_EXPONENT = {torch.float16: 0x7C00, torch.bfloat16: 0x7F80}


class GraphValidationError(ValueError):
    """A malformed graph store; the message names the field, the bad value and the fix."""

    def __init__(self, field: str, problem: str, fix: str):
        super().__init__(f"{field}: {problem}; fix: {fix}")
        self.field = field
        self.problem = problem
        self.fix = fix

    def __reduce__(self):
        return type(self), (self.field, self.problem, self.fix)


def validate_graph(
    *,
    indptr: torch.Tensor,
    indices: torch.Tensor,
    features: torch.Tensor,
    labels: torch.Tensor,
    train_idx: torch.Tensor,
    val_idx: torch.Tensor,
    test_idx: torch.Tensor,
    num_classes: int,
    num_nodes: int | None = None,
    scan_values: bool = True,
    features_freshly_mapped: bool = False,
) -> None:
    """Checks dtypes and shapes (cheap), then every value (one pass over each array) when `scan_values`.

    `num_nodes` defaults to `len(indptr) - 1`; pass the recorded count to check the topology against it.
    `features_freshly_mapped`: the features are a file mapping nothing has written to yet (GraphStore.load), whose
    scanned pages may be unmapped again (see `check_finite_features`).
    """
    tensors = {"indptr": indptr, "indices": indices, "features": features, "labels": labels,
               "train_idx": train_idx, "val_idx": val_idx, "test_idx": test_idx}
    check_dtypes(tensors)
    check_layout(tensors)
    if num_nodes is None:
        num_nodes = indptr.numel() - 1
    check_shapes(tensors, num_nodes, num_classes)
    if scan_values:
        check_topology_values(indptr, indices, num_nodes)
        check_finite_features(features, drop_scanned_pages=features_freshly_mapped)
        check_labels(labels, num_classes)
        check_splits({name: tensors[name] for name in SPLIT_FIELDS}, labels, num_nodes)


def check_dtypes(tensors: dict[str, torch.Tensor]) -> None:
    """Each field has a dtype the C++ kernels are compiled for."""
    allowed = {
        "indptr": {"int64": torch.int64},
        "indices": INDEX_DTYPES,
        "features": FEATURE_DTYPES,
        "labels": {"int64": torch.int64},
        **{name: {"int64": torch.int64} for name in SPLIT_FIELDS},
    }
    for field, tensor in tensors.items():
        if not isinstance(tensor, torch.Tensor):
            raise GraphValidationError(field, f"expected a torch.Tensor, got {type(tensor).__name__}",
                                       "wrap it with torch.as_tensor(...)")
        if tensor.dtype not in allowed[field].values():
            names = " or ".join(allowed[field])
            raise GraphValidationError(field, f"dtype {dtype_name(tensor.dtype)} is not supported (expected {names})",
                                       f"cast it, e.g. {field}.to(torch.{next(iter(allowed[field]))})")


def check_layout(tensors: dict[str, torch.Tensor]) -> None:
    """Every tensor is a contiguous CPU tensor, the memory layout the C++ side indexes directly."""
    for field, tensor in tensors.items():
        if tensor.device.type != "cpu":
            raise GraphValidationError(field, f"is on {tensor.device}, the graph store lives in host memory",
                                       f"move it with {field}.cpu()")
        if not tensor.is_contiguous():
            raise GraphValidationError(field, f"is not contiguous (strides {tuple(tensor.stride())})",
                                       f"use {field}.contiguous()")


def check_shapes(tensors: dict[str, torch.Tensor], num_nodes: int, num_classes: int) -> None:
    """Ranks and lengths agree with `num_nodes`; no value is read."""
    indptr, indices, features, labels = (tensors[name] for name in ("indptr", "indices", "features", "labels"))
    if num_nodes < 1:
        raise GraphValidationError("num_nodes", f"is {num_nodes}, a graph needs at least one node",
                                   "build the store from a non-empty graph")
    if not isinstance(num_classes, (int, np.integer)) or isinstance(num_classes, bool) or num_classes < 1:
        raise GraphValidationError("num_classes", f"is {num_classes!r}, expected an integer >= 1",
                                   "pass the number of distinct labels")
    for field in ("indptr", "indices", "labels", *SPLIT_FIELDS):
        if tensors[field].dim() != 1:
            raise GraphValidationError(field, f"has shape {tuple(tensors[field].shape)}, expected one dimension",
                                       f"flatten it with {field}.reshape(-1)")
    if indptr.numel() != num_nodes + 1:
        raise GraphValidationError("indptr", f"has length {indptr.numel()}, expected num_nodes + 1 = {num_nodes + 1}",
                                   "rebuild the CSC with build_csc(src, dst, num_nodes)")
    if indices.dtype == torch.int32 and num_nodes >= INT32_LIMIT:
        raise GraphValidationError("indices", f"is int32 but num_nodes = {num_nodes} needs int64 ids",
                                   "cast with indices.to(torch.int64)")
    if features.dim() != 2 or features.shape[1] < 1:
        raise GraphValidationError("features", f"has shape {tuple(features.shape)}, expected [num_nodes, F], F >= 1",
                                   "give every node a feature row, e.g. features.reshape(num_nodes, -1)")
    if features.shape[0] != num_nodes:
        raise GraphValidationError("features", f"has {features.shape[0]} rows, expected num_nodes = {num_nodes}",
                                   "provide exactly one feature row per node, in node-id order")
    if labels.numel() != num_nodes:
        raise GraphValidationError("labels", f"has length {labels.numel()}, expected num_nodes = {num_nodes}",
                                   f"provide one label per node ({UNLABELLED} for unlabelled nodes)")


def check_topology_values(indptr: torch.Tensor, indices: torch.Tensor, num_nodes: int) -> None:
    """indptr starts at 0, never decreases and ends at len(indices); every index is a node id."""
    offsets = tensor_to_numpy(indptr)
    num_edges = indices.numel()
    fix_csc = "rebuild the CSC with build_csc(src, dst, num_nodes)"
    if offsets[0] != 0:
        raise GraphValidationError("indptr", f"starts at {int(offsets[0])}, expected 0", fix_csc)
    steps = np.diff(offsets)
    if steps.size and steps.min() < 0:
        node = int(np.argmax(steps < 0))
        raise GraphValidationError(
            "indptr", f"decreases at node {node} ({int(offsets[node])} -> {int(offsets[node + 1])}); it must be "
            "non-decreasing", fix_csc)
    if offsets[-1] != num_edges:
        raise GraphValidationError("indptr", f"ends at {int(offsets[-1])}, expected len(indices) = {num_edges}",
                                   fix_csc)
    ids = tensor_to_numpy(indices)
    if num_edges and (ids.min() < 0 or ids.max() >= num_nodes):
        position = _first_index_outside(ids, 0, num_nodes)
        raise GraphValidationError(
            "indices", f"value {int(ids[position])} at position {position} is outside [0, {num_nodes})",
            "remap node ids to 0..num_nodes-1 (or raise num_nodes) before building the CSC")


def check_finite_features(features: torch.Tensor, drop_scanned_pages: bool = False) -> None:
    """No NaN or Inf anywhere in the features, scanned chunk by chunk.

    `drop_scanned_pages` (only for a file mapping without private writes): each scanned chunk's pages are unmapped
    from this process again (they stay in the page cache), so that scanning a feature file larger than RAM does not
    leave it all in the resident set: the batcher reads only the rows it needs later."""
    values = tensor_to_numpy(features)
    rows_per_chunk = max(1, SCAN_CHUNK_BYTES // max(1, values.shape[1] * values.itemsize))
    mask = NONFINITE_EXPONENT.get(features.dtype)
    for start in range(0, values.shape[0], rows_per_chunk):
        chunk = values[start:start + rows_per_chunk]
        if mask is None:
            bad = ~np.isfinite(chunk)
        else:
            bad = (chunk.view(np.uint16) & mask) == mask
        if drop_scanned_pages:
            _unmap_pages(chunk)
        if bad.any():
            row, column = np.argwhere(bad)[0]
            value = features[start + row, column].item()
            raise GraphValidationError(
                "features", f"row {start + row}, column {column} is {value} (NaN/Inf are not allowed)",
                "clean the features first, e.g. torch.nan_to_num(features) or impute missing values")


def check_labels(labels: torch.Tensor, num_classes: int) -> None:
    """Every label is a class in [0, num_classes) or -1 (unlabelled)."""
    values = tensor_to_numpy(labels)
    if values.size and (values.min() < UNLABELLED or values.max() >= num_classes):
        node = _first_index_outside(values, UNLABELLED, num_classes)
        raise GraphValidationError(
            "labels", f"node {node} has label {int(values[node])}, outside [0, {num_classes}) "
            f"({UNLABELLED} = unlabelled)", "raise num_classes to the number of classes, or remap the labels")


def check_splits(splits: dict[str, torch.Tensor], labels: torch.Tensor, num_nodes: int) -> None:
    """Split ids are in range, appear once across all splits, are labelled; train is not empty."""
    label_values = tensor_to_numpy(labels)
    names = list(splits)
    owner = np.zeros(num_nodes, dtype=np.uint8)
    for number, (field, split) in enumerate(splits.items(), start=1):
        ids = tensor_to_numpy(split)
        if ids.size == 0:
            if field == "train_idx":
                raise GraphValidationError(field, "is empty, training needs at least one node",
                                           "assign some labelled nodes to the train split")
            continue
        if ids.min() < 0 or ids.max() >= num_nodes:
            position = _first_index_outside(ids, 0, num_nodes)
            raise GraphValidationError(field, f"node id {int(ids[position])} at position {position} is outside "
                                       f"[0, {num_nodes})", "keep only ids of existing nodes")
        counts = np.bincount(ids, minlength=num_nodes)
        repeated = np.flatnonzero(counts > 1)
        if repeated.size:
            raise GraphValidationError(field, f"node {int(repeated[0])} appears {int(counts[repeated[0]])} times "
                                       f"({repeated.size} duplicated ids)", f"deduplicate, e.g. {field}.unique()")
        shared = np.flatnonzero((counts > 0) & (owner > 0))
        if shared.size:
            other = names[owner[shared[0]] - 1]
            raise GraphValidationError(field, f"node {int(shared[0])} is also in {other} ({shared.size} shared ids)",
                                       "make the splits disjoint")
        owner[counts > 0] = number
        unlabelled = ids[label_values[ids] < 0]
        if unlabelled.size:
            raise GraphValidationError(field, f"node {int(unlabelled[0])} has label {UNLABELLED} (unlabelled) "
                                       f"({unlabelled.size} such nodes)",
                                       "remove unlabelled nodes from the splits or give them a label")


def _unmap_pages(chunk: np.ndarray) -> None:
    """madvise(MADV_DONTNEED) over the whole pages inside a contiguous chunk of a clean file mapping: the next read
    faults them in again from the page cache (or the file). Linux only; elsewhere the pages stay."""
    libc = _libc()
    if libc is None or not chunk.flags.c_contiguous or chunk.nbytes == 0:
        return
    begin = -(-chunk.ctypes.data // PAGE_BYTES) * PAGE_BYTES
    end = (chunk.ctypes.data + chunk.nbytes) // PAGE_BYTES * PAGE_BYTES
    if end > begin:
        libc.madvise(ctypes.c_void_p(begin), ctypes.c_size_t(end - begin), MADV_DONTNEED)


@functools.cache
def _libc() -> ctypes.CDLL | None:
    return ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def _first_index_outside(values: np.ndarray, low: int, high: int) -> int:
    """Position of the first value outside [low, high), found chunk by chunk."""
    step = SCAN_CHUNK_BYTES // max(1, values.itemsize)
    for start in range(0, values.size, step):
        chunk = values[start:start + step]
        bad = np.flatnonzero((chunk < low) | (chunk >= high))
        if bad.size:
            return start + int(bad[0])
    raise AssertionError("called without an out-of-range value")
