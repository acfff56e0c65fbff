"""Bad input through the Python API: a specific exception naming the argument, never a silent acceptance.

Nothing here reaches native code with unchecked values (the native refusals run in child processes in
test_bad_input_native.py), so the cases run in-process.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from morphpipe.data import GeneratorSpec, GraphStore, GraphValidationError, build_csc
from morphpipe.data.generators import check_fits_in_memory
from morphpipe.data.store import UnvalidatedGraphWarning
from morphpipe.executor.checkpoint import (CHECKPOINT_FILE, CheckpointError, TrainingState, capture_rng,
                                           load_checkpoint, save_checkpoint)
from morphpipe.outputs import OutputPathError, check_output_dir, check_output_file
from morphpipe.sampling.cpu_batcher import CpuBatcher, sample_neighbors
from tests.conftest import checkpoint_bytes


def store(**changes) -> GraphStore:
    indptr, indices = build_csc([1, 2, 3, 0], [0, 1, 2, 3], 4)
    fields = dict(indptr=indptr, indices=indices, features=torch.ones(4, 3), labels=torch.tensor([0, 1, 0, 1]),
                  train_idx=torch.tensor([0, 1]), val_idx=torch.tensor([2]), test_idx=torch.tensor([3]),
                  num_classes=2)
    fields.update(changes)
    return GraphStore(**fields)


@pytest.mark.parametrize("seeds, fragment", [
    (["a", "b"], "str"),
    ([0, None], "NoneType"),
    ([object(), 1], "object"),
    (None, "NoneType"),
    ("0,1", "str"),
    ([[0, 1], [2]], "flat list"),
    ([0.5, 1.0], "float"),
])
def test_seeds_that_are_not_integer_ids_are_refused(seeds, fragment):
    graph = store()
    graph.validate()
    with pytest.raises(ValueError, match="seeds") as caught:
        sample_neighbors(graph, seeds, [2])
    assert fragment in str(caught.value)
    if seeds is not None:  # CpuBatcher(seeds=None) means the train split
        with pytest.raises(ValueError, match="seeds"):
            CpuBatcher(graph, [2], 2, seeds=seeds, num_threads=1)


@pytest.mark.parametrize("fanout", [2**63, 2**70, 2**31])
def test_fanouts_beyond_what_a_batch_can_hold_are_refused(fanout):
    graph = store()
    graph.validate()
    with pytest.raises(ValueError, match=r"fanouts\[1\].*use -1"):
        sample_neighbors(graph, [0], [2, fanout])
    with pytest.raises(ValueError, match=r"fanouts\[0\]"):
        CpuBatcher(graph, [fanout], 2, num_threads=1)


def test_numpy_arrays_are_accepted_as_tensors():
    indptr, indices = build_csc([1, 2, 3, 0], [0, 1, 2, 3], 4)
    graph = GraphStore(indptr=indptr.numpy(), indices=indices.numpy(), features=np.ones((4, 3), dtype=np.float32),
                       labels=np.array([0, 1, 0, 1]), train_idx=np.array([0, 1]), val_idx=np.array([2]),
                       test_idx=np.array([3]), num_classes=2)
    assert isinstance(graph.features, torch.Tensor) and graph.features.dtype == torch.float32
    graph.validate()
    batch = sample_neighbors(graph, np.array([0, 1], dtype=np.uint32), [2])
    assert batch.seeds.tolist() == [0, 1] and batch.x.shape[1] == 3
    wrong = store(features=np.ones((4, 3)))  # float64: converted, then refused with the cast to make
    with pytest.raises(GraphValidationError, match="features: dtype float64 is not supported"):
        wrong.validate()
    with pytest.raises(GraphValidationError, match="labels"):
        store(labels=np.array(["a", "b", "c", "d"]))


@pytest.mark.parametrize("changes, field", [
    ({"labels": torch.tensor([0, 1, 5, 1])}, "labels"),
    ({"labels": torch.tensor([0, -3, 0, 1])}, "labels"),
    ({"features": torch.tensor([[1.0, float("nan"), 0.0]] * 4)}, "features"),
    ({"features": torch.full((4, 3), float("inf"), dtype=torch.float16)}, "features"),
])
def test_save_validates_what_it_writes(changes, field, tmp_path):
    with pytest.raises(GraphValidationError) as caught:
        store(**changes).save(tmp_path / "graph")
    assert caught.value.field == field
    assert not (tmp_path / "graph").exists()


def test_first_use_of_an_unvalidated_store_says_what_was_not_checked():
    graph = store(labels=torch.tensor([0, 1, 7, 1]))
    with pytest.warns(UnvalidatedGraphWarning, match="labels in \\[0, 2\\).*finite features"):
        sample_neighbors(graph, [0], [2])
    checked = store()
    checked.validate()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        CpuBatcher(checked, [2], 2, num_threads=1).close()
    checked.labels = torch.tensor([1, 1, 1, 1])  # replaced after validation: unvalidated again
    assert not checked.is_validated()


def test_loaded_store_is_validated_unless_asked_not_to(tmp_path):
    store().save(tmp_path)
    assert GraphStore.load(tmp_path).is_validated()
    assert not GraphStore.load(tmp_path, validate=False).is_validated()


def good_document(**changes) -> dict:
    document = {"epoch": 1, "model": {"w": torch.ones(2)}, "optimizer": {"state": {}, "param_groups": []},
                "rng": capture_rng(), "history": [], "meta": {}}
    document.update(changes)
    return document


@pytest.mark.parametrize("damage, fragment", [
    (lambda data: data[:-10], "truncated"),
    (lambda data: data[:-200] + bytes([data[-200] ^ 0x01]) + data[-199:], "checksum"),
    (lambda data: b"garbage" + data, "header"),
    (lambda data: data.replace(b'"version": 3', b'"version": 9'), "version 9"),
    (lambda data: checkpoint_bytes(good_document(epoch=-1)), "'epoch' is -1"),
    (lambda data: checkpoint_bytes(good_document(epoch=True)), "'epoch' is bool"),
    (lambda data: checkpoint_bytes(good_document(model={"w": "not a tensor"})), "model entry 'w'"),
    (lambda data: checkpoint_bytes(good_document(optimizer={})), "optimizer"),
    (lambda data: checkpoint_bytes([1, 2]), "holds list"),
])
def test_damaged_checkpoint_is_refused(damage, fragment, tmp_path):
    state = TrainingState(epoch=1, model={"w": torch.ones(2)}, optimizer={"state": {}, "param_groups": []},
                          rng=capture_rng())
    path = save_checkpoint(tmp_path, state)
    assert load_checkpoint(tmp_path).epoch == 1
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(CheckpointError, match="delete it to start over") as caught:
        load_checkpoint(tmp_path)
    assert fragment in str(caught.value) and str(tmp_path / CHECKPOINT_FILE) in str(caught.value)


def test_generation_that_cannot_fit_is_refused_with_the_size_it_needs(tmp_path):
    with pytest.raises(ValueError, match="GiB of memory"):
        check_fits_in_memory(GeneratorSpec(kind="power-law", num_nodes=2_000_000_000, avg_degree=64, feature_dim=8))
    with pytest.raises(ValueError, match="GiB on disk"):
        check_fits_in_memory(GeneratorSpec(kind="power-law", num_nodes=1_000_000, avg_degree=1,
                                           feature_dim=10_000_000), tmp_path)


def test_output_path_errors_name_the_option(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputPathError, match="--stats-json .*is a directory"):
        check_output_file(tmp_path, "--stats-json")
    with pytest.raises(OutputPathError, match="output .*is a file"):
        check_output_file(tmp_path / "file" / "a" / "b.json")
    with pytest.raises(OutputPathError, match="checkpoint_dir .*not a directory"):
        check_output_dir(tmp_path / "file", "checkpoint_dir")
