"""Converters from common graph sources to a GraphStore (save it with `store.save(dir)`).

Edge orientation everywhere is source -> destination, and the store keeps in-neighbour lists:
- edge lists: one edge per row (or column of a (2, E) array) as (source, destination);
- scipy.sparse: A[i, j] != 0 is the edge i -> j (rows are sources, so the CSC of A is the store's topology);
- OGB raw files: rows of raw/edge.csv.gz are (source, destination), as in OGB's edge_index;
- PyG: edge_index[0] is the source, edge_index[1] the destination (flow "source_to_target").
What the source lacks comes from the arguments (features, labels, splits), else is generated with
the seed: Gaussian random features, random labels, a random split of the labelled nodes; each such
substitution is announced with a warning and recorded in meta.json (`source.generated`).
"""
from __future__ import annotations

import contextlib
import gzip
import itertools
import os
import shutil
import tempfile
import warnings
import zipfile
import zlib
from dataclasses import asdict, dataclass, field
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse
import torch

from morphpipe.data.csc import CHUNK_EDGES, as_node_ids, build_csc_arrays, edge_key_chunks, release_mapped_pages
from morphpipe.data.dtypes import FEATURE_DTYPES, index_dtype_for
from morphpipe.data.external_csc import KEY_BYTES, SortPlan, build_csc_on_disk, default_memory_budget
from morphpipe.data.ondisk import load_array
from morphpipe.data.splits import SplitFractions, as_split_ids, random_split
from morphpipe.data.store import GraphStore
from morphpipe.data.validation import UNLABELLED, GraphValidationError
from morphpipe.numeric import format_bytes
from morphpipe.outputs import partial_path, remove_stale_partials

SPLIT_NAMES = ("train", "val", "test")
ArrayLike = np.ndarray | torch.Tensor
# {"train", "val" (or "valid"), "test"} -> node ids or boolean masks; an .npz file works too.
Splits = Mapping[str, ArrayLike]


@dataclass
class ConvertOptions:
    """Options shared by every converter."""

    make_undirected: bool = False  # add the reverse of every edge
    drop_self_loops: bool = False
    dedupe: bool = False  # keep one copy of repeated edges
    num_nodes: int | None = None  # default: from the source, else max id + 1
    name: str | None = None  # default: the source's file or directory name
    seed: int = 0  # for whatever has to be generated
    split: SplitFractions = field(default_factory=SplitFractions)  # of a generated split
    feature_dim: int = 64  # of generated random features
    num_classes: int | None = None  # default: max label + 1 (2 for generated labels)
    progress: bool = False  # tqdm bar while building the CSC
    # Bytes the CSC build may use (default: half the available memory); edges beyond it are sorted on disk.
    memory_budget: int | None = None
    scratch_dir: str | os.PathLike | None = None  # where edges sorted on disk go (default: the system's temp dir)

    def __post_init__(self) -> None:
        for name, value, allow_none in (("num_nodes", self.num_nodes, True), ("feature_dim", self.feature_dim, False),
                                        ("num_classes", self.num_classes, True),
                                        ("memory_budget", self.memory_budget, True)):
            if value is None and allow_none:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                option = "--" + name.replace("_", "-")
                raise GraphValidationError(name, f"is {value!r}, expected an integer >= 1",
                                           f"pass a positive {name} ({option}), or leave it out to infer it")


@dataclass
class GraphParts:
    """What a source provides; None marks a part the converter has to take from the arguments or generate."""

    src: np.ndarray
    dst: np.ndarray
    num_nodes: int | None = None
    features: Any = None
    labels: Any = None
    splits: Mapping[str, Any] | None = None


def from_edge_list(source: str | os.PathLike | ArrayLike, *, features: ArrayLike | None = None,
                   labels: ArrayLike | None = None,
                   splits: Splits | None = None, options: ConvertOptions | None = None) -> GraphStore:
    """A store from an edge list: an array of shape (2, E) or (E, 2), a .npy file, or a csv/txt file.

    Text files hold one edge per line, comma or whitespace separated, with an optional header line;
    lines starting with # are comments; extra columns (e.g. weights) are ignored; .gz files are read too.
    A (2, 2) array is read as (2, E).
    """
    options = options or ConvertOptions()
    with contextlib.ExitStack() as scratch:
        if isinstance(source, (str, os.PathLike)):
            edges = read_edge_file(Path(source), spill=_text_spill(Path(source), options, scratch))
            default_name = Path(source).name.split(".")[0]
        else:
            edges = _edge_array(source.detach().cpu().numpy() if isinstance(source, torch.Tensor) else
                                np.asarray(source), "edges")
            default_name = "edgelist"
        parts = GraphParts(src=edges[0], dst=edges[1])
        return assemble(parts, options, default_name, {"kind": "converted", "converter": "edgelist",
                                                       "input": _describe(source)},
                        features=features, labels=labels, splits=splits)


# Lines of a text edge list parsed at once, and an upper estimate of the parsed int64 bytes per byte of text
# ("1 2\n": 4 bytes of text, 16 parsed; gzip shrinks such text about 4 times).
TEXT_CHUNK_LINES = 1 << 20
TEXT_EXPANSION = 4
GZIP_EXPANSION = 16


def read_edge_file(path: Path, spill: Path | None = None) -> np.ndarray:
    """(2, E) int64 edges from a .npy (memory-mapped), .csv, .txt (or their .gz) file.

    Text is parsed a chunk of lines at a time; with `spill` (a file path) the parsed edges are written there
    and memory-mapped, so memory stays bounded whatever the file's size.
    """
    if not path.is_file():
        raise FileNotFoundError(f"edge list {path} does not exist")
    if path.suffix in (".npy", ".npz") or _starts_with(path, (NPY_MAGIC, ZIP_MAGIC)):
        return _edge_array(load_npy(path, "edges", mmap_mode="r"), str(path))
    fix = "give one 'source destination' (or 'source,destination') pair per line, as text or a complete .gz of it"
    line = 0
    try:
        skip, first = _first_data_line(path)
        delimiter = "," if "," in first else None
        opener = gzip.open if path.suffix == ".gz" else open
        tables, rows = [], 0
        with opener(path, "rt") as handle, (open(spill, "wb") if spill else contextlib.nullcontext()) as out:
            list(itertools.islice(handle, skip))
            line = skip
            while lines := list(itertools.islice(handle, TEXT_CHUNK_LINES)):
                with warnings.catch_warnings():
                    warnings.filterwarnings("ignore", message="loadtxt: input contained no data")
                    table = np.loadtxt(lines, dtype=np.int64, delimiter=delimiter, comments="#", usecols=(0, 1),
                                       ndmin=2)
                line += len(lines)
                rows += table.shape[0]
                if out is None:
                    tables.append(table)
                else:
                    table.tofile(out)
    except (EOFError, gzip.BadGzipFile, zlib.error, UnicodeDecodeError) as error:
        raise GraphValidationError("edges", f"{path} is damaged or not text ({type(error).__name__}: {error})",
                                   fix) from error
    except ValueError as error:
        raise GraphValidationError("edges", f"{path} is not a table of integer node ids (in the "
                                   f"{TEXT_CHUNK_LINES:,} lines after line {line}: {error})", fix) from error
    if spill is not None:
        return np.memmap(spill, dtype=np.int64, mode="r", shape=(rows, 2)).T if rows else np.zeros((2, 0), np.int64)
    return np.ascontiguousarray(np.concatenate(tables).T) if tables else np.zeros((2, 0), dtype=np.int64)


def _text_spill(path: Path, options: ConvertOptions, scratch: contextlib.ExitStack) -> Path | None:
    """A scratch file for the parsed edges of a text file that may not fit half the memory budget, else None."""
    if path.suffix in (".npy", ".npz") or not path.is_file():
        return None
    budget = options.memory_budget if options.memory_budget is not None else default_memory_budget()
    if path.stat().st_size * (GZIP_EXPANSION if path.suffix == ".gz" else TEXT_EXPANSION) <= budget // 2:
        return None
    return scratch.enter_context(scratch_directory(options.scratch_dir, "edges")) / "edges.int64"


@contextlib.contextmanager
def scratch_directory(parent: str | os.PathLike | None, purpose: str) -> Iterator[Path]:
    """A hidden directory `.morphpipe-PURPOSE.partial-PID` in `parent` (default: the system's temporary directory),
    removed on exit; one that a killed conversion left is removed by the next (`remove_stale_partials`)."""
    target = Path(parent if parent is not None else tempfile.gettempdir()) / f"morphpipe-{purpose}"
    remove_stale_partials(target)
    directory = partial_path(target)
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir()
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


NPY_MAGIC = b"\x93NUMPY"
ZIP_MAGIC = b"PK\x03\x04"  # how every .npz archive starts


def load_npy(path: str | os.PathLike, field: str, mmap_mode: str | None = None) -> np.ndarray:
    """The one array of a .npy file (pickles refused); an .npz archive, or anything else, given where a .npy array
    belongs is a GraphValidationError naming `field`, the file and which array to extract."""
    path = Path(path)
    if _starts_with(path, (ZIP_MAGIC,)):
        try:
            with np.load(path, allow_pickle=False) as archive:
                names = list(archive.files)
        except (OSError, ValueError, zipfile.BadZipFile):
            names = []
        example = names[0] if names else "NAME"
        raise GraphValidationError(field, f"{path} is an .npz archive (arrays: {', '.join(names) or 'unreadable'}), "
                                   "expected a single .npy array",
                                   f"save the one array as .npy, e.g. np.save('{field.lstrip('-')}.npy', np.load('{path}')"
                                   f"['{example}'])")
    if not _starts_with(path, (NPY_MAGIC,)):
        raise GraphValidationError(field, f"{path} is not a .npy file (no numpy header)",
                                   "save the array with numpy.save")
    try:
        return np.load(path, mmap_mode=mmap_mode, allow_pickle=False)
    except (OSError, ValueError, EOFError) as error:
        raise GraphValidationError(field, f"{path} is a damaged .npy file ({type(error).__name__}: {error})",
                                   "save the array again with numpy.save") from error


def _starts_with(path: Path, prefixes: tuple[bytes, ...]) -> bool:
    with open(path, "rb") as handle:
        head = handle.read(8)
    return head.startswith(prefixes)


def _first_data_line(path: Path) -> tuple[int, str]:
    """(lines to skip, first edge line): a first line that is not two integers is a header."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as handle:
        for number, line in enumerate(handle):
            text = line.strip()
            if not text or text.startswith("#"):
                continue
            fields = text.replace(",", " ").split()
            header = len(fields) < 2 or not all(part.lstrip("-").isdigit() for part in fields[:2])
            return (number + 1, next(handle, "")) if header else (0, text)
    return 0, ""


def _edge_array(array: np.ndarray, origin: str) -> np.ndarray:
    """(2, E) view of an edge array given as (2, E) or (E, 2)."""
    if array.ndim == 2 and array.shape[0] == 2:
        return array
    if array.ndim == 2 and array.shape[1] == 2:
        return array.T
    raise GraphValidationError("edges", f"{origin} has shape {array.shape}, expected (2, E) or (E, 2)",
                               "store sources and destinations as two rows or two columns")


def from_scipy(matrix: scipy.sparse.sparray | scipy.sparse.spmatrix, *, features: ArrayLike | None = None,
               labels: ArrayLike | None = None, splits: Splits | None = None,
               options: ConvertOptions | None = None) -> GraphStore:
    """A store from a square scipy.sparse matrix or array of any format: A[i, j] != 0 is the edge i -> j."""
    if not scipy.sparse.issparse(matrix):
        raise GraphValidationError("matrix", f"is {type(matrix).__name__}, expected a scipy.sparse matrix",
                                   "pass scipy.sparse.coo_matrix(dense) or load it with scipy.sparse.load_npz")
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
        raise GraphValidationError("matrix", f"has shape {matrix.shape}, an adjacency matrix is square",
                                   "pass the N x N adjacency matrix")
    coo = scipy.sparse.coo_matrix(matrix)
    nonzero = coo.data != 0
    options = options or ConvertOptions()
    parts = GraphParts(src=coo.row[nonzero], dst=coo.col[nonzero], num_nodes=matrix.shape[0])
    return assemble(parts, options, "scipy", {"kind": "converted", "converter": "scipy", "format": matrix.format},
                    features=features, labels=labels, splits=splits)


def from_ogb(directory: str | os.PathLike, *, split_scheme: str | None = None,
             features: ArrayLike | None = None, labels: ArrayLike | None = None, splits: Splits | None = None,
             options: ConvertOptions | None = None) -> GraphStore:
    """A store from an OGB node-property-prediction directory (raw csv.gz files, as downloaded by ogb).

    Reads raw/edge.csv.gz, raw/num-node-list.csv.gz, raw/node-feat.csv.gz, raw/node-label.csv.gz
    (NaN labels become -1) and split/<scheme>/{train,valid,test}.csv.gz; the scheme is found
    automatically when split/ has one. OGB lists each edge of ogbn-products and ogbn-proteins once
    (its loader adds the reverse edges): pass make_undirected=True for those.
    """
    root = Path(directory)
    raw = root / "raw"
    if not (raw / "edge.csv.gz").is_file():
        raise FileNotFoundError(f"{raw / 'edge.csv.gz'} not found: {root} is not an OGB node-property-prediction "
                                "directory (expected raw/ and split/ inside)")
    options = options or ConvertOptions()
    with contextlib.ExitStack() as scratch:
        edges = read_edge_file(raw / "edge.csv.gz", spill=_text_spill(raw / "edge.csv.gz", options, scratch))
        return _from_ogb_parts(root, edges, split_scheme, options, features, labels, splits)


def _from_ogb_parts(root: Path, edges: np.ndarray, split_scheme: str | None, options: ConvertOptions,
                    features: ArrayLike | None, labels: ArrayLike | None, splits: Splits | None) -> GraphStore:
    """The rest of `from_ogb` once the edges are read: node count, features, labels, splits."""
    raw = root / "raw"
    num_nodes = int(np.loadtxt(raw / "num-node-list.csv.gz", dtype=np.int64, delimiter=",", ndmin=1)[0]) \
        if (raw / "num-node-list.csv.gz").is_file() else None
    parts = GraphParts(src=edges[0], dst=edges[1], num_nodes=num_nodes)
    if (raw / "node-feat.csv.gz").is_file():
        parts.features = np.loadtxt(raw / "node-feat.csv.gz", dtype=np.float32, delimiter=",", ndmin=2)
    if (raw / "node-label.csv.gz").is_file():
        parts.labels = _ogb_labels(raw / "node-label.csv.gz")
    scheme_dir = _ogb_split_dir(root, split_scheme)
    if scheme_dir is not None:
        parts.splits = {name: _read_ids(scheme_dir / f"{file}.csv.gz")
                        for name, file in zip(SPLIT_NAMES, ("train", "valid", "test"))}
    return assemble(parts, options, root.name, {"kind": "converted", "converter": "ogb", "input": str(root),
                                                "split_scheme": scheme_dir.name if scheme_dir else None},
                    features=features, labels=labels, splits=splits)


def _read_ids(path: Path) -> np.ndarray:
    """One int64 node id per line; an empty file is an empty split."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="loadtxt: input contained no data")
        return np.loadtxt(path, dtype=np.int64, delimiter=",", ndmin=1)


def _ogb_labels(path: Path) -> np.ndarray:
    """int64 labels from node-label.csv.gz, NaN (unlabelled) as -1; multi-label files are refused."""
    values = np.loadtxt(path, dtype=np.float64, delimiter=",", ndmin=2)
    if values.shape[1] != 1:
        raise GraphValidationError("labels", f"{path} has {values.shape[1]} label columns (multi-label task)",
                                   "morphpipe trains single-label node classification; pass labels= explicitly")
    values = values[:, 0]
    return np.where(np.isnan(values), UNLABELLED, values).astype(np.int64)


def _ogb_split_dir(root: Path, scheme: str | None) -> Path | None:
    """split/<scheme>, the only scheme when none is named, None without a split/ directory."""
    split_root = root / "split"
    if scheme is not None:
        if not (split_root / scheme).is_dir():
            raise FileNotFoundError(f"split scheme directory {split_root / scheme} not found")
        return split_root / scheme
    if not split_root.is_dir():
        return None
    schemes = sorted(entry for entry in split_root.iterdir() if entry.is_dir())
    if len(schemes) != 1:
        raise ValueError(f"{split_root} has split schemes {[entry.name for entry in schemes]}; choose one with "
                         "split_scheme (--split-scheme)")
    return schemes[0]


def from_pyg(data: Any, *, features: ArrayLike | None = None, labels: ArrayLike | None = None,
             splits: Splits | None = None, options: ConvertOptions | None = None) -> GraphStore:
    """A store from a torch_geometric `Data` object: edge_index, x, y, and train/val/test masks or index arrays."""
    if not hasattr(data, "edge_index") or data.edge_index is None:
        raise GraphValidationError("data", f"{type(data).__name__} has no edge_index",
                                   "pass a torch_geometric.data.Data with edge_index")
    edge_index = _edge_array(data.edge_index.detach().cpu().numpy(), "data.edge_index")
    parts = GraphParts(src=edge_index[0], dst=edge_index[1], num_nodes=int(data.num_nodes))
    parts.features = getattr(data, "x", None)
    target = getattr(data, "y", None)
    if target is not None:
        target = target.detach().cpu()
        if target.dim() == 2 and target.shape[1] == 1:
            target = target.reshape(-1)
        if target.dim() != 1 or target.is_floating_point():
            raise GraphValidationError("data.y", f"has shape {tuple(target.shape)} and dtype {target.dtype}, "
                                       "expected one integer class per node", "pass labels= explicitly")
        parts.labels = target
    parts.splits = _pyg_splits(data)
    options = options or ConvertOptions()
    return assemble(parts, options, "pyg", {"kind": "converted", "converter": "pyg"},
                    features=features, labels=labels, splits=splits)


def _pyg_splits(data: Any) -> dict[str, torch.Tensor] | None:
    """Splits from <split>_mask or <split>_idx attributes; 2-D masks (several splits) use column 0, with a warning."""
    found = {}
    for name, aliases in zip(SPLIT_NAMES, (("train",), ("val", "valid"), ("test",))):
        for alias in aliases:
            for attribute in (f"{alias}_mask", f"{alias}_idx"):
                value = getattr(data, attribute, None)
                if value is None:
                    continue
                if value.dim() == 2:
                    warnings.warn(f"data.{attribute} holds {value.shape[1]} splits; using the first (column 0)",
                                  stacklevel=3)
                    value = value[:, 0]
                found[name] = value
    return found or None


def assemble(parts: GraphParts, options: ConvertOptions, default_name: str, source: dict[str, Any], *,
             features: ArrayLike | None = None, labels: ArrayLike | None = None,
             splits: Splits | None = None) -> GraphStore:
    """Builds the CSC and fills in features, labels and splits: arguments first, then the source, then generated."""
    src, dst = as_node_ids(parts.src, "src"), as_node_ids(parts.dst, "dst")
    num_nodes = options.num_nodes if options.num_nodes is not None else \
        parts.num_nodes or _infer_num_nodes(src, dst, features, labels, parts)
    indptr, indices = _build_csc(src, dst, num_nodes, options)
    generated = []
    rng = np.random.default_rng(np.random.SeedSequence([options.seed, 0xC0DE]))
    features = features if features is not None else parts.features
    if features is None:
        generated.append("features")
        features = rng.standard_normal((num_nodes, options.feature_dim), dtype=np.float32)
    label_values = labels if labels is not None else parts.labels
    num_classes = options.num_classes
    if label_values is None:
        generated.append("labels")
        num_classes = num_classes or 2
        label_values = rng.integers(0, num_classes, num_nodes)
    label_values = _label_array(label_values)
    if num_classes is None:
        num_classes = int(label_values.max()) + 1 if label_values.size and label_values.max() >= 0 else 1
    split_values = splits if splits is not None else parts.splits
    if split_values is None:
        generated.append("splits")
        split_values = dict(zip(SPLIT_NAMES, random_split(np.flatnonzero(label_values >= 0), options.split,
                                                          options.seed)))
    if generated:
        warnings.warn(f"{default_name}: no {', '.join(generated)} in the source or the arguments; generated random "
                      f"{', '.join(generated)} (seed {options.seed})", stacklevel=3)
    split_ids = _split_arrays(split_values, num_nodes)
    store = GraphStore(
        indptr=torch.from_numpy(indptr),
        indices=torch.from_numpy(indices),
        features=_feature_tensor(features),
        labels=torch.from_numpy(label_values),
        train_idx=torch.from_numpy(split_ids["train"]),
        val_idx=torch.from_numpy(split_ids["val"]),
        test_idx=torch.from_numpy(split_ids["test"]),
        num_classes=num_classes,
        name=options.name or default_name,
        source={**source, "options": _options_record(options), "generated": generated},
    )
    store.validate()
    return store


def _build_csc(src: np.ndarray, dst: np.ndarray, num_nodes: int, options: ConvertOptions) -> tuple[np.ndarray, ...]:
    """(indptr, indices): sorted in memory when the edge keys and indices fit the memory budget, else by the external
    sort into a scratch directory, whose indices file stays memory-mapped (copy-on-write) after it is unlinked."""
    num_keys = src.size * (2 if options.make_undirected else 1)
    budget = options.memory_budget if options.memory_budget is not None else default_memory_budget()
    in_memory = num_keys * (KEY_BYTES + index_dtype_for(num_nodes).itemsize) + (num_nodes + 1) * 8
    if in_memory <= budget:
        return build_csc_arrays(src, dst, num_nodes, make_undirected=options.make_undirected,
                                drop_self_loops=options.drop_self_loops, dedupe=options.dedupe,
                                progress=options.progress)
    needed = (num_nodes + 1) * 8 + SortPlan.minimum_bytes(num_keys)
    if budget < needed:
        raise GraphValidationError("memory_budget", f"is {format_bytes(budget)}, below the {format_bytes(needed)} "
                                   f"the topology of {num_nodes:,} nodes needs (indptr, {num_nodes + 1:,} int64 "
                                   "values, stays in memory; the edge sort needs at least "
                                   f"{format_bytes(SortPlan.minimum_bytes(num_keys))})",
                                   f"give --memory-budget {-(-needed // 2**20)}M or more")
    with scratch_directory(options.scratch_dir, "csc") as scratch:
        indptr, _ = build_csc_on_disk(edge_key_chunks(src, dst, num_nodes, make_undirected=options.make_undirected),
                                      num_keys, num_nodes, scratch, memory_budget=budget - (num_nodes + 1) * 8,
                                      drop_self_loops=options.drop_self_loops, dedupe=options.dedupe,
                                      progress=options.progress)
        indices = load_array(scratch, "indices", mmap=True)
    return indptr, indices


def _infer_num_nodes(src: np.ndarray, dst: np.ndarray, features: ArrayLike | None, labels: ArrayLike | None,
                     parts: GraphParts) -> int:
    """max id + 1 over the edges, at least the number of feature rows or labels given."""
    counts = [_max_id(ids) + 1 for ids in (src, dst) if ids.size]
    for rows in (features, labels, parts.features, parts.labels):
        if rows is not None:
            counts.append(len(rows))
    if not counts:
        raise GraphValidationError("num_nodes", "cannot be inferred from an empty edge list",
                                   "pass num_nodes in the options (--num-nodes)")
    return max(counts)


def _max_id(ids: np.ndarray) -> int:
    """ids.max(), a chunk at a time, so the pages of a memory-mapped edge list leave the resident set once read."""
    largest = int(ids[0])
    for start in range(0, ids.size, CHUNK_EDGES):
        largest = max(largest, int(ids[start:start + CHUNK_EDGES].max()))
        release_mapped_pages(ids[start:start + CHUNK_EDGES])
    return largest


def _feature_tensor(features: ArrayLike) -> torch.Tensor:
    """Features as a contiguous tensor: supported dtypes are kept, other floats become float32."""
    array = features if isinstance(features, torch.Tensor) else np.asarray(features)
    if isinstance(array, np.ndarray) and array.dtype.kind not in "biuf":
        raise GraphValidationError("features", f"hold {array.dtype} values of type {type(features).__name__}, expected "
                                   "numbers", "pass a numeric array [N, F] (one array of an .npz archive, not the "
                                   "archive)")
    tensor = array if isinstance(array, torch.Tensor) else torch.from_numpy(array)
    if tensor.dtype not in FEATURE_DTYPES.values() and tensor.is_floating_point():
        tensor = tensor.to(torch.float32)
    if tensor.dim() == 1:
        tensor = tensor.reshape(-1, 1)
    return tensor.contiguous()


def _label_array(labels: ArrayLike) -> np.ndarray:
    """Labels as int64 numpy; float labels must be whole numbers (NaN = unlabelled)."""
    array = labels.detach().cpu().numpy() if isinstance(labels, torch.Tensor) else np.asarray(labels)
    array = array.reshape(-1) if array.ndim == 2 and array.shape[1] == 1 else array
    if np.issubdtype(array.dtype, np.floating):
        whole = np.where(np.isnan(array), UNLABELLED, array)
        if not np.array_equal(whole, np.round(whole)):
            raise GraphValidationError("labels", "holds fractional values, expected class ids",
                                       "pass integer class ids (regression targets are not supported)")
        array = whole
    return np.ascontiguousarray(array.astype(np.int64))


def _split_arrays(splits: Splits, num_nodes: int) -> dict[str, np.ndarray]:
    """{'train', 'val', 'test'} -> int64 ids, from a dict (or npz) of id arrays or boolean masks."""
    keys = {name: name for name in splits}
    if "valid" in keys and "val" not in keys:
        keys["val"] = "valid"
    missing = [name for name in SPLIT_NAMES if name not in keys]
    if "train" in missing:
        raise GraphValidationError("splits", f"has keys {sorted(splits)}, expected train, val and test",
                                   "pass a mapping with 'train', 'val' (or 'valid') and 'test' entries")
    empty = np.zeros(0, dtype=np.int64)
    return {name: as_split_ids(splits[keys[name]], num_nodes, f"{name}_idx") if name in keys else empty
            for name in SPLIT_NAMES}


def _options_record(options: ConvertOptions) -> dict[str, Any]:
    record = asdict(options)
    for how in ("progress", "memory_budget", "scratch_dir"):  # how the graph was built, not what it holds
        del record[how]
    record["split"] = list(options.split.as_tuple())
    return record


def _describe(source: str | os.PathLike | ArrayLike) -> str:
    return str(source) if isinstance(source, (str, os.PathLike)) else f"array {getattr(source, 'shape', '')}"
