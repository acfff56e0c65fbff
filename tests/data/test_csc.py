"""build_csc: in-neighbour lists grouped by destination, with the undirected / self-loop / dedupe options."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from morphpipe.data import GraphValidationError, build_csc
from morphpipe.data import csc
from morphpipe.data.dtypes import index_dtype_for


def reference(src, dst, num_nodes, make_undirected=False, drop_self_loops=False, dedupe=False):
    """Sorted in-neighbour list of every node, computed the obvious way."""
    edges = list(zip(src, dst))
    if make_undirected:
        edges += [(d, s) for s, d in edges]
    if drop_self_loops:
        edges = [(s, d) for s, d in edges if s != d]
    if dedupe:
        edges = sorted(set(edges))
    lists = [[] for _ in range(num_nodes)]
    for s, d in edges:
        lists[d].append(s)
    return [sorted(neighbours) for neighbours in lists]


def as_lists(indptr, indices):
    return [indices[indptr[v]:indptr[v + 1]].tolist() for v in range(indptr.numel() - 1)]


def test_groups_sources_by_destination():
    indptr, indices = build_csc([0, 2, 1, 2], [1, 1, 0, 0], 3)
    assert indptr.tolist() == [0, 2, 4, 4]
    assert as_lists(indptr, indices) == [[1, 2], [0, 2], []]
    assert indptr.dtype == torch.int64 and indices.dtype == torch.int32


def test_options():
    src, dst = [0, 0, 1, 2, 2], [1, 1, 1, 2, 0]
    indptr, indices = build_csc(src, dst, 3, make_undirected=True, drop_self_loops=True, dedupe=True)
    assert as_lists(indptr, indices) == [[1, 2], [0], [0]]
    indptr, indices = build_csc(src, dst, 3)
    assert as_lists(indptr, indices) == [[2], [0, 0, 1], [2]]


def test_matches_scipy_on_a_random_graph():
    rng = np.random.default_rng(0)
    src, dst = rng.integers(0, 500, 5000), rng.integers(0, 500, 5000)
    indptr, indices = build_csc(torch.from_numpy(src), torch.from_numpy(dst), 500, dedupe=True)
    expected = scipy.sparse.coo_matrix((np.ones(src.size), (src, dst)), shape=(500, 500)).tocsc()
    expected.sum_duplicates()
    expected.sort_indices()
    assert np.array_equal(indptr.numpy(), expected.indptr)
    assert np.array_equal(indices.numpy(), expected.indices)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 12).flatmap(lambda n: st.tuples(
        st.just(n),
        st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=40),
        st.booleans(), st.booleans(), st.booleans(), st.integers(1, 5),
    ))
)
def test_property_matches_reference(case):
    num_nodes, edges, undirected, no_loops, dedupe, chunk = case
    src = [s for s, _ in edges]
    dst = [d for _, d in edges]
    original = csc.CHUNK_EDGES
    csc.CHUNK_EDGES = chunk  # exercise the chunk boundaries (dedupe across chunks)
    try:
        indptr, indices = build_csc(np.array(src, dtype=np.int64), np.array(dst, dtype=np.int64), num_nodes,
                                    make_undirected=undirected, drop_self_loops=no_loops, dedupe=dedupe)
    finally:
        csc.CHUNK_EDGES = original
    assert as_lists(indptr, indices) == reference(src, dst, num_nodes, undirected, no_loops, dedupe)


def test_empty_edge_list():
    indptr, indices = build_csc([], [], 4)
    assert indptr.tolist() == [0, 0, 0, 0, 0] and indices.numel() == 0


def test_node_ids_are_int32_below_two_to_the_31():
    assert index_dtype_for(2**31 - 1) == np.int32
    assert index_dtype_for(2**31) == np.int64


@pytest.mark.parametrize("src,dst,field", [([0, 3], [1, 1], "src"), ([0, 1], [1, -1], "dst")])
def test_ids_out_of_range(src, dst, field):
    with pytest.raises(GraphValidationError, match=f"{field}: node id .* outside \\[0, 3\\)"):
        build_csc(src, dst, 3)


def test_mismatched_lengths():
    with pytest.raises(GraphValidationError, match="dst: has 1 entries but src has 2"):
        build_csc([0, 1], [1], 3)


def test_float_ids_are_refused():
    with pytest.raises(GraphValidationError, match="src: .*float64"):
        build_csc(np.array([0.0, 1.0]), [1, 2], 3)


@pytest.mark.parametrize("layout", ["rows", "columns"])
def test_edge_chunks_of_a_mapped_file_do_not_pile_up_in_rss(tmp_path, layout, monkeypatch):
    """Keys of a memory-mapped edge file equal pack_edge_keys', and its pages leave the resident set once read."""
    psutil = pytest.importorskip("psutil")
    monkeypatch.setattr(csc, "CHUNK_EDGES", 1 << 20)
    rng = np.random.default_rng(0)
    edges = rng.integers(0, 1000, (2, 12 << 20))
    np.save(tmp_path / "edges.npy", edges if layout == "rows" else np.ascontiguousarray(edges.T))
    mapped = np.load(tmp_path / "edges.npy", mmap_mode="r")
    src, dst = (mapped[0], mapped[1]) if layout == "rows" else (mapped[:, 0], mapped[:, 1])
    process = psutil.Process()
    before = process.memory_info().rss
    keys = np.concatenate([chunk.copy() for chunk in csc.edge_key_chunks(src, dst, 1000)])
    grown = process.memory_info().rss - before - keys.nbytes
    assert np.array_equal(keys, csc.pack_edge_keys(edges[0], edges[1], 1000))
    assert grown < 48 << 20, f"{grown >> 20} MiB of the 192 MiB file stayed resident"


def test_pages_of_a_copy_on_write_map_are_kept(tmp_path):
    """Dropping the pages of a "c" map would discard the caller's in-memory changes: they are left alone."""
    np.save(tmp_path / "edges.npy", np.zeros((2, 1 << 16), dtype=np.int64))
    edges = np.load(tmp_path / "edges.npy", mmap_mode="c")
    edges[0] = 1
    keys = np.concatenate([chunk.copy() for chunk in csc.edge_key_chunks(edges[0], edges[1], 2)])
    assert np.all(keys == 1) and np.all(edges[0] == 1)
