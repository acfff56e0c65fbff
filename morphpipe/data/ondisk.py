"""The on-disk graph format: a directory holding meta.json and one .npy file per array.

Files are written under a temporary name and renamed into place, and meta.json is written last,
so a directory without meta.json is an unfinished write and a file that another process has
memory-mapped is replaced, never overwritten in place.
"""
from __future__ import annotations

import errno
import json
import os
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from morphpipe import __version__
from morphpipe.data.validation import GraphValidationError
from morphpipe.documents import read_json
from morphpipe.outputs import check_output_dir

META_FILE = "meta.json"
FORMAT_NAME = "morphpipe-graph"
FORMAT_VERSION = 1
ARRAY_FIELDS = ("indptr", "indices", "features", "labels", "train_idx", "val_idx", "test_idx")
# A link-prediction edge split (morphpipe.data.edge_split): these arrays, then its record file, written last.
EDGE_ARRAYS = ("train_edges", "val_edges", "test_edges", "val_negatives", "test_negatives")
EDGE_SPLIT_FILE = "edge_split.json"
# Arrays memory-mapped on load (copy-on-write): the two that grow with the graph.
MMAP_FIELDS = ("indices", "features")
# A heterogeneous graph's per-relation and per-type arrays (morphpipe.data.hetero_store):
# indptr.<src>__<name>__<dst>.npy, features.<type>.npy, and their temporary names.
TYPED_ARRAY_FILE = re.compile(r"\.?(indptr|indices|features)\.[^/.]+\.npy(\.tmp)?")


@dataclass
class GraphMeta:
    """Contents of meta.json: sizes and dtypes of the arrays, and how the graph was made."""

    name: str
    num_nodes: int
    num_edges: int
    feature_dim: int
    feature_dtype: str
    num_classes: int
    indices_dtype: str
    source: dict[str, Any] = field(default_factory=dict)
    format: str = FORMAT_NAME
    format_version: int = FORMAT_VERSION
    morphpipe_version: str = __version__

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], origin: str) -> "GraphMeta":
        """Parses meta.json contents, naming the missing or mistyped key and the file it came from."""
        if data.get("format") != FORMAT_NAME:
            raise GraphValidationError("meta.json format", f"{origin} has format {data.get('format')!r}, expected "
                                       f"{FORMAT_NAME!r}", "point at a directory written by morphpipe")
        version = data.get("format_version")
        if type(version) is not int or version != FORMAT_VERSION:
            newer = type(version) is int and version > FORMAT_VERSION
            raise GraphValidationError("meta.json format_version", f"{origin} has version {version!r}, this morphpipe "
                                       f"reads version {FORMAT_VERSION} exactly",
                                       "upgrade morphpipe" if newer else "re-create the graph with morphpipe")
        types = {"name": str, "num_nodes": int, "num_edges": int, "feature_dim": int, "feature_dtype": str,
                 "num_classes": int, "indices_dtype": str, "source": dict, "morphpipe_version": str}
        values = {}
        for item in fields(cls):
            if item.name not in data:
                if item.name in ("source", "morphpipe_version"):
                    continue
                raise GraphValidationError(f"meta.json {item.name}", f"is missing from {origin}",
                                           "re-create the graph with morphpipe (save, convert or generate)")
            value = data[item.name]
            expected = types.get(item.name)
            if expected is not None and (not isinstance(value, expected) or isinstance(value, bool)):
                raise GraphValidationError(f"meta.json {item.name}", f"is {value!r} in {origin}, expected "
                                           f"{expected.__name__}", "re-create the graph with morphpipe")
            values[item.name] = value
        return cls(**values)


def is_graph_dir(path: str | os.PathLike) -> bool:
    """True for a directory holding a finished graph (its meta.json exists)."""
    return (Path(path) / META_FILE).is_file()


def read_meta(directory: str | os.PathLike) -> GraphMeta:
    """Reads and checks meta.json of a graph directory."""
    path = Path(directory) / META_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{directory} is not a morphpipe graph directory (no {META_FILE}); create one with "
                                "`morphpipe data convert` or `morphpipe data generate`")
    try:
        data = read_json(path, "")
    except ValueError as error:
        raise GraphValidationError("meta.json", str(error), "re-create the graph with morphpipe (save, convert or "
                                   "generate)") from None
    if not isinstance(data, dict):
        raise GraphValidationError("meta.json", f"{path} holds {type(data).__name__}, expected an object",
                                   "re-create the graph with morphpipe")
    return GraphMeta.from_dict(data, str(path))


def write_meta(directory: str | os.PathLike, meta: GraphMeta) -> None:
    """Writes meta.json atomically; call it after every array is in place."""
    path = Path(directory) / META_FILE
    temporary = path.with_name(f".{META_FILE}.tmp")
    temporary.write_text(json.dumps(meta.to_dict(), indent=2) + "\n")
    os.replace(temporary, path)


def check_graph_output(out_dir: str | os.PathLike, overwrite: bool) -> Path:
    """`out_dir` as a graph directory a new graph may replace, checked before any work and changing nothing.

    A missing or empty directory is fine; a non-empty one needs `overwrite` and may hold only graph
    files (so replacing it never removes anything else). Write the new graph with
    `morphpipe.outputs.replacing_directory`, which keeps the old one until the new one is complete.
    """
    out = check_output_dir(out_dir, "output")
    if not out.is_dir():
        return out
    entries = list(out.iterdir())
    if not entries:
        return out
    if not overwrite:
        kind = "a graph" if is_graph_dir(out) else "files"
        raise FileExistsError(f"output directory {out} already holds {kind}; overwrite it (--force) or choose "
                              "another path")
    foreign = foreign_entries(out)
    if foreign:
        raise FileExistsError(f"output directory {out} holds files that are not part of a graph "
                              f"({', '.join(foreign[:5])}); refusing to overwrite it, choose another path")
    return out


def nearest_existing_dir(path: str | os.PathLike) -> Path:
    """`path` or its nearest existing ancestor directory (absolute): where a new output's file system is."""
    existing = Path(path).expanduser().absolute()
    while not existing.is_dir():
        existing = existing.parent
    return existing


def foreign_entries(directory: Path) -> list[str]:
    """Names of the entries of an existing directory that are not files of a graph (sorted)."""
    names = ARRAY_FIELDS + EDGE_ARRAYS
    ours = {META_FILE, f".{META_FILE}.tmp", EDGE_SPLIT_FILE, f".{EDGE_SPLIT_FILE}.tmp"} | \
        {f"{name}.npy" for name in names} | {f".{name}.npy.tmp" for name in names}
    return sorted(entry.name for entry in directory.iterdir()
                  if not entry.is_file() or (entry.name not in ours and not TYPED_ARRAY_FILE.fullmatch(entry.name)))


def array_path(directory: str | os.PathLike, name: str) -> Path:
    """Path of the .npy file holding array `name`."""
    return Path(directory) / f"{name}.npy"


def save_array(directory: str | os.PathLike, name: str, array: np.ndarray) -> None:
    """Writes one array to `<name>.npy` via a temporary file and a rename."""
    path = array_path(directory, name)
    temporary = path.with_name(f".{path.name}.tmp")
    with open(temporary, "wb") as handle:
        np.save(handle, np.ascontiguousarray(array), allow_pickle=False)
    os.replace(temporary, path)


def load_array(directory: str | os.PathLike, name: str, mmap: bool) -> np.ndarray:
    """Reads `<name>.npy`, refusing pickles and foreign byte order. With `mmap` it is a copy-on-write memory map, or
    a read-only one when the kernel refuses to commit that much writable memory (an array larger than RAM + swap
    under the default overcommit policy, e.g. papers100M's 28 GB of features on a 24 GB machine)."""
    path = array_path(directory, name)
    if not path.is_file():
        raise GraphValidationError(name, f"file {path} is missing", "re-save or re-convert the graph")
    try:
        try:
            array = np.load(path, mmap_mode="c" if mmap else None, allow_pickle=False)
        except OSError as error:
            if not (mmap and error.errno == errno.ENOMEM):
                raise
            array = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, EOFError, OSError) as error:
        raise GraphValidationError(name, f"{path} is not a plain numeric .npy file, or is cut short ({error})",
                                   "re-save the array with numpy.save, or re-create the graph") from error
    if not array.dtype.isnative:
        raise GraphValidationError(name, f"{path} has non-native byte order ({array.dtype.str})",
                                   "re-save it with array.astype(array.dtype.newbyteorder('='))")
    return array


class NpyChunkWriter:
    """Writes a .npy file row-chunk by row-chunk, so the whole array never sits in memory.

    Plain sequential writes (rather than a writable memory map) keep the written pages out of the
    process's resident memory.
    """

    def __init__(self, directory: str | os.PathLike, name: str, shape: tuple[int, ...], dtype: np.dtype, *,
                 rows_at_most: bool = False):
        """`rows_at_most`: shape[0] is an upper bound, and the header is rewritten with the rows written at close
        (numpy leaves room in the header for the first dimension to change in place)."""
        self.path = array_path(directory, name)
        self.temporary = self.path.with_name(f".{self.path.name}.tmp")
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.rows_at_most = rows_at_most
        self.rows_written = 0
        self.handle = open(self.temporary, "wb")
        self.header_bytes = self._write_header(self.shape)

    def write(self, rows: np.ndarray) -> None:
        """Appends the next rows, in order."""
        if rows.dtype != self.dtype or rows.shape[1:] != self.shape[1:]:
            raise ValueError(f"{self.path.name}: chunk {rows.dtype}{rows.shape} does not match "
                             f"{self.dtype}{self.shape}")
        if self.rows_written + rows.shape[0] > self.shape[0]:
            raise ValueError(f"{self.path.name}: more than {self.shape[0]} rows written")
        np.ascontiguousarray(rows).tofile(self.handle)
        self.rows_written += rows.shape[0]

    def close(self) -> None:
        """Finishes the file and renames it into place; it must hold every row."""
        if self.rows_at_most and self.rows_written != self.shape[0]:
            self.handle.seek(0)
            if self._write_header((self.rows_written, *self.shape[1:])) != self.header_bytes:
                raise AssertionError(f"{self.path.name}: the .npy header changed length when its shape was rewritten")
        self.handle.close()
        if self.rows_written != self.shape[0] and not self.rows_at_most:
            self.temporary.unlink(missing_ok=True)
            raise ValueError(f"{self.path.name}: {self.rows_written} of {self.shape[0]} rows written")
        os.replace(self.temporary, self.path)

    def _write_header(self, shape: tuple[int, ...]) -> int:
        """Writes the .npy header at the current position; returns its length in bytes."""
        start = self.handle.tell()
        header = {"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False, "shape": shape}
        np.lib.format.write_array_header_1_0(self.handle, header)
        return self.handle.tell() - start

    def __enter__(self) -> "NpyChunkWriter":
        return self

    def __exit__(self, kind, value, traceback) -> None:
        if kind is None:
            self.close()
        else:
            self.handle.close()
            self.temporary.unlink(missing_ok=True)
