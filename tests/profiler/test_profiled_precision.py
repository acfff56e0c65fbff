"""The profile times the training step in the precision training will run; "auto" picks the faster where the
hardware has bfloat16 arithmetic, and the profile records the precision it settled on."""
from __future__ import annotations

import pytest

from morphpipe.profiler import Profile
from morphpipe.profiler.operators import ProfilingSession
from morphpipe.profiler.profiler import Profiler

SETTINGS = {"model": "sage", "fanouts": [4, 3], "batch_size": 64, "hidden": 16, "device": "cpu",
            "thread_counts": [1], "warmup": 0, "steps": 3, "progress": False, "attempts": 1}


@pytest.fixture
def steps_made(monkeypatch):
    """The precision of every training step the profiler builds, in order."""
    made: list[str] = []
    build = ProfilingSession.new_train_step

    def recording(session, device, precision=None):
        step = build(session, device, precision)
        made.append(step.precision)
        return step

    monkeypatch.setattr(ProfilingSession, "new_train_step", recording)
    return made


@pytest.mark.parametrize("precision", ["float32", "bf16"])
def test_the_training_phase_is_timed_in_the_precision_asked_and_recorded(tiny, steps_made, tmp_path, precision):
    profile = Profiler(tiny, precision=precision, log=lambda _: None, **SETTINGS).run()
    assert steps_made == [precision], "one timed model, in the precision asked"
    assert profile.workload["precision"] == precision
    profile.save(tmp_path / "profile.json")
    assert Profile.load(tmp_path / "profile.json").workload["precision"] == precision


def test_auto_without_bf16_instructions_profiles_float32_and_says_why(tiny, steps_made, monkeypatch):
    monkeypatch.setattr("morphpipe.profiler.profiler.isa_flags", lambda: ["avx2", "avx512f"])
    said: list[str] = []
    profile = Profiler(tiny, precision="auto", log=said.append, **SETTINGS).run()
    assert steps_made == ["float32"] and profile.workload["precision"] == "float32"
    assert "precision float32 (auto: this CPU reports no AVX512-BF16 or AMX)" in said


@pytest.mark.parametrize("faster", ["float32", "bf16"])
def test_auto_with_bf16_instructions_profiles_the_faster_step(tiny, steps_made, monkeypatch, faster):
    """The timed comparison decides (its timer stands in, so the verdict does not hang on this machine's load)."""
    monkeypatch.setattr("morphpipe.profiler.profiler.isa_flags", lambda: ["avx512_bf16"])
    seconds = {faster: 0.010, ({"float32", "bf16"} - {faster}).pop(): 0.020}

    def timer(run, repeats):
        run()  # a real step of the model being compared
        return seconds[steps_made[-1]]

    monkeypatch.setattr("morphpipe.profiler.profiler.best_seconds", timer)
    said: list[str] = []
    profile = Profiler(tiny, precision="auto", log=said.append, **SETTINGS).run()
    assert steps_made == ["float32", "bf16", faster], "both compared, then the faster one profiled"
    assert profile.workload["precision"] == faster
    assert f"precision {faster} (auto: avx512_bf16; a training step takes " in said[0]


def test_an_unknown_precision_is_named(tiny):
    with pytest.raises(ValueError, match="precision='fp8'"):
        Profiler(tiny, precision="fp8", **SETTINGS)


def test_a_profile_naming_an_unknown_precision_is_refused(tiny, tmp_path):
    path = tmp_path / "profile.json"
    Profile.synthetic(t_cb=0.004, t_m=0.006, num_batches=3, cores=2).replaced(workload={"precision": "fp8"}).save(path)
    with pytest.raises(ValueError, match="precision"):
        Profile.load(path)
