"""Fixtures and helpers shared by tests in more than one folder.

Each conftest.py holds what the tests under its folder share: pytest finds its fixtures, and its
plain helpers and constants (needed at import or parametrize time) import as `from tests.conftest
import ...`; `tests` is a package, so no test module imports another one.
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from morphpipe.data import load_dataset
from morphpipe.data.hetero_generator import MagSpec, mag_shaped
from morphpipe.ops import force_choices


def make_graph(num_nodes: int, index_dtype=torch.int32, seed: int = 0, num_classes: int = 5):
    """A graph with zero-degree nodes, low-degree nodes, hubs, and no duplicate edges."""
    rng = np.random.default_rng(seed)
    degrees = rng.integers(0, 12, num_nodes)
    degrees[::17] = 0
    degrees[5] = min(300, num_nodes - 1)
    neighbour_lists = [np.sort(rng.choice(num_nodes, size=d, replace=False)) for d in degrees]
    indptr = torch.zeros(num_nodes + 1, dtype=torch.int64)
    indptr[1:] = torch.from_numpy(np.cumsum(degrees))
    indices = torch.from_numpy(np.concatenate(neighbour_lists)).to(index_dtype)
    features = torch.from_numpy(rng.standard_normal((num_nodes, 7)).astype(np.float32))
    labels = torch.from_numpy(rng.integers(0, num_classes, num_nodes))
    return SimpleNamespace(
        indptr=indptr, indices=indices, features=features, labels=labels,
        train_idx=torch.arange(0, num_nodes, 2), num_nodes=num_nodes,
    )


@pytest.fixture(scope="module")
def tiny():
    """The `tiny` preset dataset, loaded once per test module."""
    return load_dataset("tiny", progress=False)


@pytest.fixture
def community_cache(tmp_path, monkeypatch):
    """Partitions go to a per-test directory; the whole-graph path runs plain CSR unless a test forces otherwise
    (the selector is tested in tests/ops/test_community.py), still counted; one intra-op thread (tiny ops on a
    loaded 2-core machine otherwise wait for the second thread every call)."""
    monkeypatch.setenv("MORPHPIPE_COMMUNITY_CACHE", str(tmp_path / "communities"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with force_choices({"graph.kernel": "csr"}):
        yield
    torch.set_num_threads(threads)


def checkpoint_bytes(document, version: int = 2) -> bytes:
    """A well-formed checkpoint file around `document` (correct header and checksum) of format `version`: 2 is what
    morphpipe wrote before mid-epoch checkpoints, and still reads."""
    buffer = io.BytesIO()
    torch.save(document, buffer)
    payload = buffer.getvalue()
    header = {"format": "morphpipe-checkpoint", "version": version, "payload_bytes": len(payload),
              "sha256": hashlib.sha256(payload).hexdigest()}
    return json.dumps(header).encode() + b"\n" + payload


def saved_mag_with_float16_authors(directory, spec: MagSpec, author_width: int, seed: int):
    """A mag-shaped graph saved in `directory`: the generator's float32 paper features, float16 author features of
    `author_width`, institutions and fields without features (typed feature stores' mixed dtypes and tiers)."""
    graph = mag_shaped(spec)
    authors = torch.randn(spec.num_authors, author_width, generator=torch.Generator().manual_seed(seed))
    graph = dataclasses.replace(graph, features={**graph.features, "author": authors.to(torch.float16)},
                                validated=False)
    graph.save(directory)
    return directory
