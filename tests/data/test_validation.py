"""Every malformed store is refused with GraphValidationError naming the field, the bad value and the fix."""
from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
import torch

from morphpipe.data import GraphStore, GraphValidationError, build_csc
from morphpipe.data import validation


def make_store(**changes) -> GraphStore:
    """A valid 5-node store (path 0->1->2->3->4 plus 4->0), with fields replaced by `changes`."""
    indptr, indices = build_csc([0, 1, 2, 3, 4], [1, 2, 3, 4, 0], 5)
    fields = dict(
        indptr=indptr, indices=indices, features=torch.ones(5, 4),
        labels=torch.tensor([0, 1, 2, 0, -1]),
        train_idx=torch.tensor([0, 1]), val_idx=torch.tensor([2]), test_idx=torch.tensor([3]),
        num_classes=3,
    )
    fields.update(changes)
    return GraphStore(**fields)


def expect_error(store: GraphStore, field: str, *fragments: str) -> GraphValidationError:
    with pytest.raises(GraphValidationError) as caught:
        store.validate()
    error = caught.value
    assert error.field == field, str(error)
    message = str(error)
    assert message.startswith(field) and "fix:" in message
    for fragment in fragments:
        assert fragment in message, message
    return error


def test_valid_store_passes():
    make_store().validate()


def test_error_is_a_value_error_and_pickles():
    error = GraphValidationError("indices", "value 9 is out of range", "remap ids")
    assert isinstance(error, ValueError)
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.field, str(copy)) == ("indices", str(error))


def test_indptr_length_differs_from_recorded_node_count(tmp_path):
    make_store().save(tmp_path)
    meta = json.loads((tmp_path / "meta.json").read_text())
    meta["num_nodes"] = 7
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(GraphValidationError, match="indptr: has length 6, expected num_nodes \\+ 1 = 8"):
        GraphStore.load(tmp_path)


def test_indptr_not_starting_at_zero():
    indptr = torch.tensor([1, 1, 2, 3, 4, 5])
    expect_error(make_store(indptr=indptr), "indptr", "starts at 1")


def test_indptr_decreasing():
    indptr = torch.tensor([0, 2, 1, 3, 4, 5])
    expect_error(make_store(indptr=indptr), "indptr", "decreases at node 1", "2 -> 1")


def test_indptr_last_differs_from_number_of_indices():
    indptr = torch.tensor([0, 1, 2, 3, 4, 4])
    expect_error(make_store(indptr=indptr), "indptr", "ends at 4", "len(indices) = 5")


@pytest.mark.parametrize("bad", [5, -1])
def test_indices_out_of_range(bad):
    indices = torch.tensor([4, 0, 1, bad, 3], dtype=torch.int32)
    expect_error(make_store(indices=indices), "indices", f"value {bad} at position 3", "[0, 5)")


def test_feature_rows_differ_from_node_count():
    expect_error(make_store(features=torch.ones(4, 4)), "features", "4 rows", "num_nodes = 5")


def test_features_must_be_two_dimensional():
    expect_error(make_store(features=torch.ones(5)), "features", "shape (5,)")


@pytest.mark.parametrize("bad", [3, -2])
def test_labels_out_of_range(bad):
    expect_error(make_store(labels=torch.tensor([0, 1, bad, 0, 1])), "labels", f"node 2 has label {bad}", "[0, 3)")


def test_labels_length_differs_from_node_count():
    expect_error(make_store(labels=torch.tensor([0, 1, 2])), "labels", "length 3")


def test_unlabelled_node_allowed_outside_splits_only():
    make_store(labels=torch.tensor([0, 1, 2, 0, -1])).validate()
    expect_error(make_store(labels=torch.tensor([0, 1, 2, -1, 0])), "test_idx", "node 3 has label -1")


@pytest.mark.parametrize("dtype,value", [(torch.float32, float("nan")), (torch.float16, float("inf")),
                                         (torch.bfloat16, float("-inf")), (torch.float16, float("nan"))])
def test_non_finite_features(dtype, value):
    features = torch.ones(5, 4, dtype=dtype)
    features[3, 2] = value
    expect_error(make_store(features=features), "features", "row 3, column 2")


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_non_finite_scan_is_chunked_over_a_memory_mapped_file(tmp_path, monkeypatch, dtype):
    make_store(features=torch.ones(5, 4, dtype=dtype)).save(tmp_path)
    values = np.load(tmp_path / "features.npy")
    values[4, 1] = np.nan
    np.save(tmp_path / "features.npy", values)
    monkeypatch.setattr(validation, "SCAN_CHUNK_BYTES", 8)  # one or two rows per chunk
    with pytest.raises(GraphValidationError, match="features: row 4, column 1 is nan"):
        GraphStore.load(tmp_path, mmap=True)


def test_large_values_are_finite():
    features = torch.full((5, 4), 60000.0, dtype=torch.float16)
    make_store(features=features).validate()
    # bfloat16 keeps float32's exponent range: 1e38 and 2^127 are finite there (float16's would overflow).
    for value in (1e38, 2.0 ** 127, -3e38):
        make_store(features=torch.full((5, 4), value, dtype=torch.bfloat16)).validate()


def test_out_of_range_positions_are_counted_across_scan_chunks(monkeypatch):
    """The scan reads 2 int64 values per chunk; the bad value's position is counted from the array's start."""
    monkeypatch.setattr(validation, "SCAN_CHUNK_BYTES", 16)
    expect_error(make_store(indices=torch.tensor([4, 0, 1, 2, 9])), "indices", "value 9 at position 4")
    expect_error(make_store(labels=torch.tensor([0, 1, 2, 0, 7])), "labels", "node 4 has label 7")
    expect_error(make_store(test_idx=torch.tensor([3, 4, 4, 9])), "test_idx", "node id 9 at position 3")


def test_split_ids_out_of_range():
    expect_error(make_store(val_idx=torch.tensor([7])), "val_idx", "node id 7", "[0, 5)")


def test_split_ids_duplicated():
    expect_error(make_store(train_idx=torch.tensor([0, 1, 0])), "train_idx", "node 0 appears 2 times")


def test_split_ids_shared_between_splits():
    expect_error(make_store(test_idx=torch.tensor([1])), "test_idx", "node 1 is also in train_idx")


def test_empty_train_split():
    expect_error(make_store(train_idx=torch.zeros(0, dtype=torch.int64)), "train_idx", "is empty")


def test_empty_val_and_test_splits_are_allowed():
    empty = torch.zeros(0, dtype=torch.int64)
    make_store(val_idx=empty, test_idx=empty).validate()


@pytest.mark.parametrize("field,value,expected", [
    ("features", torch.ones(5, 4, dtype=torch.float64), "float64"),
    ("features", torch.ones(5, 4, dtype=torch.int32), "int32"),
    ("indices", torch.tensor([4, 0, 1, 2, 3], dtype=torch.int16), "int16"),
    ("indptr", torch.tensor([0, 1, 2, 3, 4, 5], dtype=torch.int32), "int32"),
    ("labels", torch.tensor([0, 1, 2, 0, 1], dtype=torch.int32), "int32"),
    ("train_idx", torch.tensor([0, 1], dtype=torch.int32), "int32"),
])
def test_unsupported_dtypes(field, value, expected):
    expect_error(make_store(**{field: value}), field, f"dtype {expected} is not supported")


def test_non_contiguous_tensor():
    features = torch.ones(4, 5).t()
    expect_error(make_store(features=features), "features", "not contiguous")


def test_num_classes_must_be_positive():
    expect_error(make_store(num_classes=0), "num_classes", "is 0")


def test_stored_dtype_must_match_meta(tmp_path):
    make_store().save(tmp_path)
    np.save(tmp_path / "features.npy", np.ones((5, 4), dtype=np.float16))
    with pytest.raises(GraphValidationError, match="features: .* holds float16, but meta.json says float32"):
        GraphStore.load(tmp_path)


def test_float64_features_file_is_refused(tmp_path):
    make_store().save(tmp_path)
    meta = json.loads((tmp_path / "meta.json").read_text())
    np.save(tmp_path / "features.npy", np.ones((5, 4)))
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(GraphValidationError, match="float64"):
        GraphStore.load(tmp_path)


def test_int32_labels_file_is_refused(tmp_path):
    make_store().save(tmp_path)
    np.save(tmp_path / "labels.npy", np.zeros(5, dtype=np.int32))
    with pytest.raises(GraphValidationError, match="labels: dtype int32 is not supported"):
        GraphStore.load(tmp_path)


def test_edge_count_must_match_meta(tmp_path):
    make_store().save(tmp_path)
    np.save(tmp_path / "indices.npy", np.zeros(4, dtype=np.int32))
    with pytest.raises(GraphValidationError, match="num_edges = 5"):
        GraphStore.load(tmp_path)


def test_pickled_array_file_is_refused(tmp_path):
    make_store().save(tmp_path)
    np.save(tmp_path / "labels.npy", np.array([0, "x"], dtype=object), allow_pickle=True)
    with pytest.raises(GraphValidationError, match="labels: .* not a plain numeric .npy"):
        GraphStore.load(tmp_path)


def test_foreign_byte_order_is_refused(tmp_path):
    make_store().save(tmp_path)
    np.save(tmp_path / "labels.npy", np.array([0, 1, 2, 0, -1], dtype=">i8"))
    with pytest.raises(GraphValidationError, match="non-native byte order"):
        GraphStore.load(tmp_path)


def test_missing_array_file(tmp_path):
    make_store().save(tmp_path)
    (tmp_path / "test_idx.npy").unlink()
    with pytest.raises(GraphValidationError, match="test_idx: file .* is missing"):
        GraphStore.load(tmp_path)


def test_newer_format_version_is_refused(tmp_path):
    make_store().save(tmp_path)
    meta = json.loads((tmp_path / "meta.json").read_text())
    meta["format_version"] = 99
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(GraphValidationError, match="format_version.*99"):
        GraphStore.load(tmp_path)


def test_missing_meta_key(tmp_path):
    make_store().save(tmp_path)
    meta = json.loads((tmp_path / "meta.json").read_text())
    del meta["num_classes"]
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(GraphValidationError, match="meta.json num_classes: is missing"):
        GraphStore.load(tmp_path)
