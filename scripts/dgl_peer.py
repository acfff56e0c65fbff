"""The DGL 2.1 peer of the benchmarks: its interpreter, the graph directory it reads, and one run of a script in it.

DGL is never imported here: a benchmark passes its DGL side as script text, run by DGL's own interpreter
(`--dgl-python`) on a dataset directory's .npy arrays (`morphpipe/data/ondisk.py`) with OMP and torch threads set;
the script takes its settings as JSON in argv[1] and prints its result as its last line, one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
from pathlib import Path

from morphpipe.data import data_root
from morphpipe.data.presets import PRESETS

DGL_PYTHON = "/work/dglvenv/bin/python"

# The start of a DGL-side script: settings, threads, and the graph (CSC, as stored) with its features and labels.
DGL_PRELUDE = r'''
import json, sys, time
import numpy as np, torch, dgl

args = json.loads(sys.argv[1])
torch.set_num_threads(args["threads"])
root = args["dataset"]
indptr = torch.from_numpy(np.load(f"{root}/indptr.npy")).long()
indices = torch.from_numpy(np.load(f"{root}/indices.npy")).long()
graph = dgl.graph(("csc", (indptr, indices, torch.tensor([], dtype=torch.long))), num_nodes=indptr.numel() - 1)
features = torch.from_numpy(np.load(f"{root}/features.npy"))
labels = torch.from_numpy(np.load(f"{root}/labels.npy")).long()
'''

# DGL-side helpers (after numpy and torch are imported): our GraphSAGE layers' initial weights, saved as an .npz of
# their state dict, copied into dgl.nn.SAGEConv layers (fc_neigh = lin_neigh, fc_self = lin_self with lin_neigh's
# bias), so both sides start from the same point and differ by training alone; and DGL's trained layers saved back
# under our names, so one evaluator can score both sides' models.
DGL_OUR_SAGE_WEIGHTS = r'''
def copy_our_sage_weights(convs, path, prefix=""):
    weights = np.load(path)
    with torch.no_grad():
        for i, conv in enumerate(convs):
            conv.fc_neigh.weight.copy_(torch.from_numpy(weights[f"{prefix}convs.{i}.lin_neigh.weight"]))
            conv.fc_self.weight.copy_(torch.from_numpy(weights[f"{prefix}convs.{i}.lin_self.weight"]))
            conv.fc_self.bias.copy_(torch.from_numpy(weights[f"{prefix}convs.{i}.lin_neigh.bias"]))

def save_as_our_sage_weights(convs, path):
    weights = {}
    for i, conv in enumerate(convs):
        weights[f"convs.{i}.lin_neigh.weight"] = conv.fc_neigh.weight.detach().numpy()
        weights[f"convs.{i}.lin_self.weight"] = conv.fc_self.weight.detach().numpy()
        weights[f"convs.{i}.lin_neigh.bias"] = conv.fc_self.bias.detach().numpy()
    np.savez(path, **weights)
'''


def int_list(text: str) -> list[int]:
    """argparse type of the benchmarks' list options: comma-separated integers ("15,10,5")."""
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers (e.g. 0,1)") from None


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1 (and below 2**63, as `morphpipe train` takes it)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1 and < 2**63, got {text!r}") from None
    if not 1 <= value < 2**63:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1 and < 2**63, got {value}")
    return value


def writable_file(text: str) -> Path:
    """argparse type of a benchmark's --out: a file whose folder exists and can be written, checked before the
    minutes of measuring rather than after them."""
    path = Path(text)
    folder = path.parent
    if not folder.is_dir() or not os.access(folder, os.W_OK) or path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} cannot be written (its folder must exist and be writable)")
    return path


def dataset_directory(dataset: str) -> Path:
    """The directory holding `dataset`'s arrays: a preset's cache directory, else `dataset` as a path."""
    return data_root() / dataset if dataset in PRESETS else Path(dataset)


def run_dgl_script(script: str, settings: dict, threads: int, dgl_python: str = DGL_PYTHON) -> dict:
    """Runs `script` in DGL's interpreter with `settings` (JSON in argv[1]) and `threads` OMP threads; returns the
    JSON object it printed last. A failed run stops the benchmark with the end of DGL's stderr. DGL inherits this
    process's environment, the OpenMP wait policy and huge pages `import morphpipe` set included: both sides run
    under the same settings."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "DGLBACKEND": "pytorch"}
    done = subprocess.run([dgl_python, "-c", script, json.dumps(settings)], capture_output=True, text=True, env=env,
                          check=False)
    if done.returncode != 0:
        raise SystemExit(f"DGL's run failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
