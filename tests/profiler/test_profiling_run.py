"""The Profiler measures real phases on this machine and produces a valid, reloadable Profile."""
from __future__ import annotations

import pytest

from morphpipe.data import load_dataset
from morphpipe.profiler import Profile
from morphpipe.profiler.operators import OPERATORS
from morphpipe.profiler.profiler import Profiler, default_thread_counts


@pytest.fixture(scope="module")
def default_graph():
    return load_dataset("default", progress=False)


def test_profile_of_the_default_dataset_is_valid_and_round_trips(default_graph, tmp_path):
    profiler = Profiler(default_graph, model="sage", fanouts=[5, 5], batch_size=256, hidden=32, device="cpu",
                        thread_counts=[1, 2], warmup=1, steps=3, progress=False)
    profile = profiler.run()
    assert profile.device == "cpu"
    assert profile.num_batches == -(-len(default_graph.train_idx) // 256)
    assert profile.batch_bytes > 0
    assert set(profile.cpu_batching.points) == {1, 2}
    assert set(profile.cpu_training.points) == {1, 2}
    assert all(timing.samples == 3 for timing in profile.cpu_batching.points.values())
    assert profile.cpu_batch_time(1) > 0
    assert profile.workload["dataset"] == "default" and profile.workload["fanouts"] == "5,5"
    profile.save(tmp_path / "profile.json")
    assert Profile.load(tmp_path / "profile.json").to_dict() == profile.to_dict()


def test_cpu_profiles_need_only_cpu_operators():
    assert ("cpu_batching", "cpu") in OPERATORS and ("training", "cpu") in OPERATORS


def test_default_thread_counts_cover_powers_of_two_and_the_core_count():
    assert default_thread_counts(1) == [1]
    assert default_thread_counts(2) == [1, 2]
    assert default_thread_counts(6) == [1, 2, 4, 6]
    assert default_thread_counts(16) == [1, 2, 4, 8, 16]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"device": "tpu"}, "device"),
        ({"fanouts": [0]}, "fanouts"),
        ({"batch_size": 0}, "batch_size"),
        ({"thread_counts": [0]}, "thread_counts"),
        ({"budget_s": 0}, "budget_s"),
    ],
)
def test_bad_settings_are_named(default_graph, kwargs, match):
    with pytest.raises(ValueError, match=match):
        Profiler(default_graph, progress=False, **kwargs)
