"""`morphpipe data generate | convert | split-edges | info`: make, import and inspect graph datasets."""
from __future__ import annotations

import argparse
import importlib.util
import json
import pickle
import sys
import time
import warnings
import zipfile
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse
import torch

from morphpipe.commands import arguments, tiering
from morphpipe.data.converters import ConvertOptions, from_edge_list, from_ogb, from_pyg, from_scipy, load_npy
from morphpipe.data.dtypes import FEATURE_DTYPES, dtype_name
from morphpipe.data.edge_split import DEFAULT_EDGE_FRACTIONS, DEFAULT_EVAL_NEGATIVES, with_edge_split
from morphpipe.data.edge_times import edge_times
from morphpipe.data.generators import KINDS, GeneratorSpec, generate
from morphpipe.data.hetero_convert import from_igbh, from_ogb_mag
from morphpipe.data.hetero_generator import MagSpec, generate_hetero
from morphpipe.data.link_converters import from_edge_split_list, from_ogb_link, from_pyg_link
from morphpipe.data.link_generator import generate_link
from morphpipe.data.ondisk import check_graph_output, nearest_existing_dir
from morphpipe.data.presets import PRESETS, get_preset
from morphpipe.data.store import GraphStore, ensure_preset, load_dataset, load_graph_dir
from morphpipe.data.summary import summarize, typed_feature_tiers
from morphpipe.data.validation import GraphValidationError

CONVERTERS = ("edgelist", "scipy", "ogb", "ogbl", "ogb-hetero", "igbh", "pyg", "pyg-link")
MEMORY_BUDGET_HELP = ("memory the build may use, e.g. 6G (default: half the available memory); edges beyond it are "
                      "sorted on disk in runs, and a budget below what the per-node arrays need is refused")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds `data` and its sub-commands to the top-level parser."""
    parser = subparsers.add_parser("data", help="generate, convert and inspect graph datasets",
                                   description="Generate, convert and inspect graph datasets.")
    commands = parser.add_subparsers(dest="data_command", metavar="SUBCOMMAND")
    commands.required = True
    add_generate(commands)
    add_convert(commands)
    add_split_edges(commands)
    add_info(commands)


def add_generate(commands: argparse._SubParsersAction) -> None:
    """`data generate [PRESET] [--kind ...] [-o DIR]`."""
    parser = commands.add_parser(
        "generate", help="generate a preset or a synthetic graph",
        description=f"Generate a preset ({', '.join(PRESETS)}) into the dataset cache or -o DIR, or a graph "
                    "of a given --kind into -o DIR. Options after a preset override its spec (needs -o).")
    parser.add_argument("preset", nargs="?", choices=list(PRESETS), metavar="PRESET",
                        help=f"one of {', '.join(PRESETS)}")
    parser.add_argument("--kind", choices=KINDS, help="generator, instead of a preset")
    parser.add_argument("--nodes", type=arguments.positive_int, help="number of nodes (required with --kind)")
    parser.add_argument("--papers", type=arguments.positive_int,
                        help="mag presets: number of papers, the other node types scaled in proportion")
    parser.add_argument("--avg-degree", type=arguments.non_negative_float, help="average in-degree (default with --kind: 16)")
    parser.add_argument("--feature-dim", type=arguments.positive_int, help="feature width (default with --kind: 64)")
    parser.add_argument("--feature-dtype", choices=list(FEATURE_DTYPES), help="default: float32")
    parser.add_argument("--classes", type=arguments.positive_int, help="number of classes (default: 10)")
    parser.add_argument("--seed", type=arguments.seed, help="random seed (default: 0)")
    parser.add_argument("--exponent", type=arguments.number(2, above=True), help="degree power-law exponent, > 2 (default: 2.5)")
    parser.add_argument("--homophily", type=arguments.fraction, help="community: share of same-class edges (default: 0.85)")
    parser.add_argument("--feature-noise", type=arguments.non_negative_float, help="noise std per feature dimension (default: 1.0)")
    parser.add_argument("--split", type=arguments.split_fractions, help="train,val,test fractions, e.g. 0.6,0.2,0.2")
    parser.add_argument("-o", "--output", help="output directory (default for a preset: the dataset cache)")
    parser.add_argument("--name", help="dataset name recorded in meta.json")
    parser.add_argument("--root", help="dataset cache directory (default: $MORPHPIPE_DATA_DIR or "
                                       "~/.cache/morphpipe/datasets)")
    parser.add_argument("--memory-budget", type=arguments.byte_size, help=MEMORY_BUDGET_HELP)
    parser.add_argument("--force", action="store_true", help="overwrite an existing graph")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.set_defaults(func=run_generate)


def run_generate(args: argparse.Namespace) -> int:
    """Generates a preset or a spec built from the options, then prints a summary."""
    overrides = {
        "num_nodes": args.nodes, "avg_degree": args.avg_degree, "feature_dim": args.feature_dim,
        "feature_dtype": args.feature_dtype, "num_classes": args.classes, "seed": args.seed,
        "exponent": args.exponent, "homophily": args.homophily, "feature_noise": args.feature_noise,
        "split": args.split,
    }
    changed = {key: value for key, value in overrides.items() if value is not None}
    progress = not args.quiet
    started = time.perf_counter()
    if args.preset and args.kind:
        raise ValueError("give a PRESET or --kind, not both")
    if args.papers is not None and (args.preset is None or not isinstance(get_preset(args.preset).spec, MagSpec)):
        raise ValueError(f"--papers {args.papers} sizes a heterogeneous preset (mag, mag-tiny); other graphs take "
                         "--nodes")
    if args.papers is not None:
        changed["num_papers"] = args.papers
    if args.preset:
        preset = get_preset(args.preset)
        if args.output is None:
            if changed or args.name:
                named = sorted(changed) + (["name"] if args.name else [])
                raise ValueError(f"options {', '.join(named)} change the preset; the cache only holds presets as "
                                 "defined, so give -o DIR")
            path = ensure_preset(preset, root=args.root, progress=progress, regenerate=args.force,
                                 memory_budget=args.memory_budget)
        elif isinstance(preset.spec, MagSpec):
            papers = changed.pop("num_papers", None)
            spec = preset.spec.with_overrides(**changed)
            spec = spec if papers is None else spec.scaled_to(papers)
            path = generate_hetero(spec, args.output, name=args.name or preset.name,
                                   preset=None if changed or papers else preset.name, overwrite=args.force,
                                   progress=progress, memory_budget=args.memory_budget)
        else:
            spec = preset.spec.with_overrides(**changed)
            options = {"name": args.name or preset.name, "preset": None if changed else preset.name,
                       "progress": progress, "overwrite": args.force}
            if preset.edge_split is None:
                path = generate(spec, args.output, memory_budget=args.memory_budget, **options)
            else:
                path = generate_link(spec, preset.edge_split, args.output, **options)
    else:
        if args.kind is None:
            raise ValueError(f"give a PRESET ({', '.join(PRESETS)}) or --kind {'|'.join(KINDS)}")
        if args.output is None or args.nodes is None:
            raise ValueError("--kind needs -o DIR and --nodes N")
        changed.setdefault("avg_degree", 16.0)
        changed.setdefault("feature_dim", 64)
        spec = GeneratorSpec(kind=args.kind, **changed)
        path = generate(spec, args.output, name=args.name, progress=progress, overwrite=args.force,
                        memory_budget=args.memory_budget)
    store = load_graph_dir(Path(path), validate=False)
    if getattr(store, "is_hetero", False):
        print(f"{store!r} -> {path} ({time.perf_counter() - started:.1f} s)")
        return 0
    print(f"{store.name}: {store.num_nodes:,} nodes, {store.num_edges:,} edges, features {store.num_nodes:,} x "
          f"{store.feature_dim} {dtype_name(store.feature_dtype)} -> {path} "
          f"({time.perf_counter() - started:.1f} s)")
    return 0


def add_convert(commands: argparse._SubParsersAction) -> None:
    """`data convert {edgelist,scipy,ogb,pyg} SRC -o DIR [options]`."""
    parser = commands.add_parser(
        "convert", help="convert an edge list, scipy matrix, OGB directory or PyG Data to a graph directory",
        description="Convert a graph to morphpipe's format. Edges go source -> destination: edge-list rows, "
                    "A[i, j] != 0 of a scipy matrix, OGB raw/edge.csv.gz rows, PyG edge_index columns. What the "
                    "source lacks comes from --features/--labels/--splits or is generated with --seed.")
    parser.add_argument("format", choices=CONVERTERS, help="edgelist: .npy (2,E)/(E,2) or csv/txt; scipy: .npz "
                        "from scipy.sparse.save_npz; ogb: dataset directory with raw/ and split/; ogbl: an OGB "
                        "link-prediction directory (ogbl-*: its edge split too; --undirected for collab, ddi, ppa); "
                        "ogb-hetero: a heterogeneous OGB directory such as ogbn-mag (reverse relations added); igbh: "
                        "a folder per node type (node_feat.npy, paper/node_label_19.npy) and per relation "
                        "src__name__dst (edge_index.npy [E, 2]); pyg: torch.save'd Data; pyg-link: torch.save'd "
                        "(train, val, test) Data of RandomLinkSplit, with its edge split (both unpickled: only convert "
                        "files you trust)")
    parser.add_argument("source", help="input file or directory")
    parser.add_argument("-o", "--output", required=True, help="output graph directory")
    parser.add_argument("--undirected", action="store_true", help="add the reverse of every edge")
    parser.add_argument("--drop-self-loops", action="store_true")
    parser.add_argument("--dedupe", action="store_true", help="keep one copy of repeated edges")
    parser.add_argument("--num-nodes", type=arguments.positive_int, help="default: from the source, else max id + 1")
    parser.add_argument("--features", help=".npy [N, F] features (float32/float16 kept, other floats -> float32)")
    parser.add_argument("--labels", help=".npy [N] integer labels (-1 = unlabelled)")
    parser.add_argument("--splits", help=".npz with train, val (or valid) and test id arrays or boolean masks")
    parser.add_argument("--num-classes", type=arguments.positive_int, help="default: max label + 1")
    parser.add_argument("--feature-dim", type=arguments.positive_int, default=64, help="width of generated random features (64)")
    parser.add_argument("--split", type=arguments.split_fractions, default="0.6,0.2,0.2", help="fractions of a generated split (0.6,0.2,0.2)")
    parser.add_argument("--seed", type=arguments.seed, default=0, help="seed for whatever is generated (0)")
    parser.add_argument("--split-scheme", help="ogb: the split/<scheme> directory, when there are several")
    parser.add_argument("--edge-split-column", action="store_true",
                        help="edgelist: a third column names each edge's split (train, val/valid, test or 0, 1, 2): "
                             "the topology holds the training edges, the others become a link-prediction edge split")
    parser.add_argument("--negatives", type=arguments.positive_int, default=None,
                        help=f"with --edge-split-column, or ogbl without its own negatives (citation2's per edge, "
                             f"collab's shared pairs are kept): fixed negatives per validation and test edge "
                             f"(default {DEFAULT_EVAL_NEGATIVES})")
    parser.add_argument("--name", help="dataset name (default: from the source)")
    parser.add_argument("--memory-budget", type=arguments.byte_size, help=MEMORY_BUDGET_HELP + " (beside the output)")
    parser.add_argument("--force", action="store_true", help="overwrite an existing graph")
    parser.set_defaults(func=run_convert)


def run_convert(args: argparse.Namespace) -> int:
    """Checks the output, reads the source, converts, validates and saves it; an existing graph at the output is
    replaced only once the new one is complete."""
    out = check_graph_output(args.output, overwrite=args.force)
    options = ConvertOptions(
        make_undirected=args.undirected, drop_self_loops=args.drop_self_loops, dedupe=args.dedupe,
        num_nodes=args.num_nodes, name=args.name, seed=args.seed, split=args.split,
        feature_dim=args.feature_dim, num_classes=args.num_classes, progress=True,
        memory_budget=args.memory_budget, scratch_dir=nearest_existing_dir(out.absolute().parent),
    )
    source = Path(args.source)
    if not source.exists():
        raise FileNotFoundError(f"{args.format} source {source} does not exist")
    extra = {
        "features": read_input(args.features, "--features", "a .npy array [N, F]",
                               lambda path: load_npy(path, "--features", mmap_mode="c")),
        "labels": read_input(args.labels, "--labels", "a .npy array [N]",
                             lambda path: load_npy(path, "--labels")),
        "splits": read_input(args.splits, "--splits", "an .npz archive of id arrays",
                             lambda path: dict(np.load(path, allow_pickle=False))),
    }
    if args.edge_split_column and args.format != "edgelist":
        raise ValueError(f"--edge-split-column reads a third column of an edge list; format {args.format} has none "
                         "(convert it, then `morphpipe data split-edges`)")
    if args.negatives is not None and not (args.edge_split_column or args.format in ("ogbl", "pyg-link")):
        raise ValueError("--negatives applies with --edge-split-column or formats ogbl and pyg-link; for a random "
                         "edge split use `morphpipe data split-edges --negatives K`")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        if args.edge_split_column:
            store = from_edge_split_list(source, options=options, negatives=args.negatives or DEFAULT_EVAL_NEGATIVES,
                                         **extra)
        elif args.format == "ogbl":
            store = read_input(source, "source", "an OGB link-property-prediction directory",
                               lambda path: from_ogb_link(path, split_scheme=args.split_scheme, options=options,
                                                          negatives=args.negatives, **extra))
        elif args.format == "pyg-link":
            store = from_pyg_link(read_input(source, "source", "a torch.save'd (train, val, test) tuple of PyG Data",
                                             load_pyg_data),
                                  options=options, negatives=args.negatives or DEFAULT_EVAL_NEGATIVES, **extra)
        elif args.format == "edgelist":
            store = read_input(source, "source", "an edge list (.npy, csv or txt)",
                               lambda path: from_edge_list(path, options=options, **extra))
        elif args.format == "scipy":
            matrix = read_input(source, "source", "a scipy.sparse .npz file", scipy.sparse.load_npz)
            store = from_scipy(matrix, options=options, **extra)
        elif args.format == "ogb-hetero":
            store = read_input(source, "source", "an OGB heterogeneous dataset directory",
                               lambda path: from_ogb_mag(path, split_scheme=args.split_scheme, name=args.name))
        elif args.format == "igbh":
            store = read_input(source, "source", "an IGBH-style directory of per-type .npy files",
                               lambda path: from_igbh(path, split=args.split, seed=args.seed, name=args.name))
        elif args.format == "ogb":
            store = read_input(source, "source", "an OGB node-property-prediction directory",
                               lambda path: from_ogb(path, split_scheme=args.split_scheme, options=options, **extra))
        else:
            store = from_pyg(read_input(source, "source", "a torch.save'd PyG Data object", load_pyg_data),
                             options=options, **extra)
    for warning in caught:
        print(f"morphpipe data convert: note: {warning.message}", file=sys.stderr)
    store.save(out)  # `out` holds no other files (checked above): the new graph is swapped in whole
    print(f"{store.name}: {store.num_nodes:,} nodes, {store.num_edges:,} edges -> {out}")
    return 0


def read_input(path: str | Path | None, field: str, expected: str, reader: Callable[[Path], Any]) -> Any:
    """reader(path), or None without a path; a file that cannot be parsed (corrupt, binary, empty, pickled, wrong
    compression or encoding) is a GraphValidationError naming `field` and the file, never a raw traceback."""
    if path is None:
        return None
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{field} {path} does not exist")
    try:
        return reader(path)
    except GraphValidationError:
        raise
    except (OSError, EOFError, ValueError, zipfile.BadZipFile, pickle.UnpicklingError, KeyError,
            IndexError) as error:  # what numpy, gzip, zipfile and pickle raise on a file they cannot parse
        raise GraphValidationError(field, f"{path} could not be read as {expected} ({type(error).__name__}: "
                                   f"{error})", f"give {expected}") from error


def load_pyg_data(path: Path):
    """A torch.save'd torch_geometric Data object (unpickling needs torch_geometric and runs the file's code)."""
    if importlib.util.find_spec("torch_geometric") is None:
        raise RuntimeError("converting a PyG file needs torch_geometric: pip install torch_geometric")
    try:
        return torch.load(path, weights_only=False)
    except RuntimeError as error:  # torch.load's way of saying the file is not one torch.save wrote
        raise ValueError(f"not a file written by torch.save ({error})") from error


def add_split_edges(commands: argparse._SubParsersAction) -> None:
    """`data split-edges DATASET --out DIR [--fractions ...] [--by-time TIMES] [--negatives K | --negative-pairs M]`."""
    parser = commands.add_parser(
        "split-edges", help="split a graph's edges into train/val/test pairs for link prediction",
        description="Hold out a random share of a graph's edges (or with --by-time its latest edges) as validation "
                    "and test positives (removed from the topology, with their reverses when the graph is "
                    "undirected), draw K fixed negatives per held-out positive (or M negative pairs shared by each "
                    "held-out split), and write the graph with its edge split to --out (train with --task link).")
    parser.add_argument("dataset", help="preset name or dataset directory")
    parser.add_argument("--out", required=True, help="output directory of the split graph")
    parser.add_argument("--fractions", type=arguments.split_fractions, default=DEFAULT_EDGE_FRACTIONS,
                        help="train,val,test shares of the edges (default 0.9,0.05,0.05; train takes the rest)")
    negatives = parser.add_mutually_exclusive_group()
    negatives.add_argument("--negatives", type=arguments.positive_int, default=DEFAULT_EVAL_NEGATIVES,
                           help=f"fixed negatives per validation and test edge (default {DEFAULT_EVAL_NEGATIVES}; "
                                "ranked by MRR)")
    negatives.add_argument("--negative-pairs", type=arguments.positive_int, metavar="M",
                           help="instead: M negative pairs per held-out split, shared by all its positives "
                                "(ogbl-collab style; ranked by Hits@K)")
    parser.add_argument("--by-time", metavar="TIMES",
                        help="split by time: a .npy of one number per edge (in the order of the dataset's "
                             "indices.npy), or an edge list of 'source destination time' rows; the latest edges are "
                             "held out (test latest), ties broken by (destination, source)")
    parser.add_argument("--time-column", type=arguments.integer(2),
                        help="with --by-time and an edge list: the column holding the time (default 2)")
    parser.add_argument("--seed", type=arguments.seed, default=0, help="random seed (default 0)")
    direction = parser.add_mutually_exclusive_group()
    direction.add_argument("--undirected", dest="undirected", action="store_true", default=None,
                           help="treat edges as connections both ways (default: detected)")
    direction.add_argument("--directed", dest="undirected", action="store_false", help="treat edges as directed")
    parser.add_argument("--force", action="store_true", help="overwrite an existing graph at --out")
    parser.set_defaults(func=run_split_edges)


def run_split_edges(args: argparse.Namespace) -> int:
    """Checks the output, splits the dataset's edges and writes the split graph there atomically."""
    if args.time_column is not None and args.by_time is None:
        raise ValueError("--time-column names the time column of --by-time's edge list: add --by-time FILE")
    out = check_graph_output(args.out, overwrite=args.force)
    graph = load_dataset(args.dataset)
    times = None if args.by_time is None else \
        edge_times(args.by_time, graph.indptr.numpy(), graph.indices.numpy(), graph.num_nodes,
                   column=args.time_column or 2, undirected=args.undirected)
    split = with_edge_split(graph, fractions=args.fractions, negatives=args.negatives, seed=args.seed,
                            undirected=args.undirected, timestamps=times, negative_pairs=args.negative_pairs)
    split.save(out)
    edges = split.edge_split
    negatives = f"{args.negative_pairs} negative pairs per held-out split" if edges.shared_negatives else \
        f"{args.negatives} negatives per held-out edge"
    cuts = "".join(f", {name} from time {edges.source[f'{name}_from']}" for name in ("val", "test")
                   if f"{name}_from" in edges.source)
    print(f"{graph.name}: {edges.train.shape[1]:,} training, {edges.val.shape[1]:,} validation and "
          f"{edges.test.shape[1]:,} test edges ({'by time' if times is not None else 'random'}{cuts}; "
          f"{'undirected' if edges.undirected else 'directed'}; {negatives}); topology {graph.num_edges:,} -> "
          f"{split.num_edges:,} edges -> {out}")
    return 0


def add_info(commands: argparse._SubParsersAction) -> None:
    """`data info DIR|PRESET [--json]`."""
    parser = commands.add_parser("info", help="print sizes, degree statistics, features, classes and splits",
                                 description="Summarise a graph directory or a preset (generated first if missing).")
    parser.add_argument("target", metavar="DIR|PRESET", help=f"graph directory or preset ({', '.join(PRESETS)})")
    parser.add_argument("--root", help="dataset cache directory for presets")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    arguments.add_feature_tier_arguments(parser)
    parser.set_defaults(func=run_info)


def run_info(args: argparse.Namespace) -> int:
    """Loads (and validates) the graph and prints its summary."""
    graph = load_dataset(args.target, root=args.root, **arguments.feature_tier(args))
    tiering.place_features(graph, args)
    if getattr(graph, "is_hetero", False):
        tiers = typed_feature_tiers(graph)
        lines = [repr(graph), "features by node type:", *(f"  {name}: {tier}" for name, tier in tiers.items())]
        print(json.dumps({"summary": repr(graph), "feature_tiers": tiers}) if args.json else "\n".join(lines))
        return 0
    summary = summarize(graph)
    print(json.dumps(asdict(summary), indent=2) if args.json else summary)
    return 0
