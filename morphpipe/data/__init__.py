"""Graph data: the CSC graph store, its on-disk format, validation, converters, generators and presets."""
from morphpipe.data.converters import ConvertOptions, from_edge_list, from_ogb, from_pyg, from_scipy
from morphpipe.data.csc import build_csc
from morphpipe.data.generators import GeneratorSpec, generate
from morphpipe.data.presets import PRESETS, Preset, get_preset
from morphpipe.data.splits import SplitFractions, random_split
from morphpipe.data.store import GraphStore, data_root, ensure_preset, load_dataset
from morphpipe.data.summary import GraphSummary, summarize
from morphpipe.data.validation import GraphValidationError

__all__ = [
    "PRESETS",
    "ConvertOptions",
    "GeneratorSpec",
    "GraphStore",
    "GraphSummary",
    "GraphValidationError",
    "Preset",
    "SplitFractions",
    "build_csc",
    "data_root",
    "ensure_preset",
    "from_edge_list",
    "from_ogb",
    "from_pyg",
    "from_scipy",
    "generate",
    "get_preset",
    "load_dataset",
    "random_split",
    "summarize",
]
