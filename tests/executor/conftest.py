"""Fixtures shared by the executor tests."""
from __future__ import annotations

import pytest
import torch

from morphpipe.ops import force_choices


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
