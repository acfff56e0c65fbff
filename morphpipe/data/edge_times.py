"""Per-edge timestamps for a time-based edge split, from a file: a .npy of one number per edge of the graph (in the
order of its indices.npy), or an edge list with a time column, matched to the graph's edges by their endpoints.

An edge listed several times takes its earliest time; on an undirected graph a listed edge also times its reverse,
so a list may give each connection once. Listed edges the graph lacks are ignored; a graph edge the list lacks is
an error naming it.
"""
from __future__ import annotations

import gzip
import itertools
import os
import warnings
from pathlib import Path

import numpy as np

from morphpipe.data.converters import _first_data_line, load_npy
from morphpipe.data.edge_split import check_edge_times, edge_keys, is_symmetric, topology_pairs
from morphpipe.data.validation import GraphValidationError

FIX = ("give a .npy of one number per edge (in the order of the graph's indices.npy), or an edge list of "
       "'source destination time' rows (--time-column picks another column)")


def read_timed_edges(path: Path, column: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | np.ndarray:
    """A 1-D .npy's values as they are, else (src, dst, time) of a table's rows (.npy [E, C] or text)."""
    if column < 2:
        raise ValueError(f"--time-column {column}: columns 0 and 1 are the source and destination; the time is "
                         "column 2 or later")
    if path.suffix == ".npy":
        table = load_npy(path, "--by-time")
        if table.ndim == 1:
            return table
        if table.ndim != 2 or table.shape[1] <= column:
            raise GraphValidationError("--by-time", f"{path} holds shape {table.shape}, expected (num_edges,) or a "
                                       f"table with column {column}", FIX)
        return table[:, 0].astype(np.int64), table[:, 1].astype(np.int64), table[:, column]
    skip, _ = _first_data_line(path)
    delimiter = "," if "," in first_row(path, skip) else None
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="loadtxt: input contained no data")
            ends = np.loadtxt(path, dtype=np.int64, comments="#", delimiter=delimiter, skiprows=skip, usecols=(0, 1),
                              ndmin=2)
            times = np.loadtxt(path, dtype=np.float64, comments="#", delimiter=delimiter, skiprows=skip,
                               usecols=(column,), ndmin=1)
    except (ValueError, IndexError) as error:
        raise GraphValidationError("--by-time", f"{path} is not a table of 'source destination ... time' rows with "
                                   f"a number in column {column} ({error})", FIX) from error
    if np.all(np.isfinite(times)) and np.all(times == np.round(times)) and np.all(np.abs(times) < 2 ** 53):
        times = times.astype(np.int64)  # whole numbers (years, epoch seconds) stay integers
    return ends[:, 0], ends[:, 1], times


def first_row(path: Path, skip: int) -> str:
    """The first line after `skip` lines that is neither blank nor a # comment ("" when none)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as handle:
        for line in itertools.islice(handle, skip, None):
            if line.strip() and not line.lstrip().startswith("#"):
                return line
    return ""


def edge_times(source: str | os.PathLike, indptr: np.ndarray, indices: np.ndarray, num_nodes: int, *,
               column: int = 2, undirected: bool | None = None) -> np.ndarray:
    """One timestamp per edge of the CSC (`indptr`, `indices`), in its order, from `source` (module docstring).
    `undirected` None: detected (every edge has its reverse)."""
    path = Path(source)
    if not path.is_file():
        raise FileNotFoundError(f"--by-time: {path} does not exist; {FIX}")
    src, dst = topology_pairs(np.asarray(indptr), np.asarray(indices))
    listed = read_timed_edges(path, column)
    if isinstance(listed, np.ndarray):
        return check_edge_times(listed, src.size)
    listed_src, listed_dst, listed_times = listed
    check_edge_times(listed_times, listed_times.size)
    keys = edge_keys(listed_src, listed_dst, num_nodes)
    if undirected is None:
        undirected = is_symmetric(np.sort(edge_keys(src, dst, num_nodes)), src, dst, num_nodes)
    if undirected:
        keys = np.concatenate([keys, edge_keys(listed_dst, listed_src, num_nodes)])
        listed_times = np.concatenate([listed_times, listed_times])
    by_key = np.lexsort((listed_times, keys))
    keys, listed_times = keys[by_key], listed_times[by_key]
    earliest = np.r_[True, keys[1:] != keys[:-1]] if keys.size else np.zeros(0, dtype=bool)
    keys, listed_times = keys[earliest], listed_times[earliest]
    wanted = edge_keys(src, dst, num_nodes)
    found = np.minimum(np.searchsorted(keys, wanted), max(keys.size - 1, 0))
    missing = np.flatnonzero(keys[found] != wanted) if keys.size else np.arange(wanted.size)
    if missing.size:
        edge = missing[0]
        raise GraphValidationError("--by-time", f"{path} gives no time for edge {src[edge]} -> {dst[edge]} of the "
                                   f"graph ({missing.size:,} edges without one)", FIX)
    return listed_times[found]
