"""Profile, PhaseTiming, ThreadScaling and HardwareFacts: values, extrapolation, JSON round trip, errors."""
from __future__ import annotations

import json
import math
import sys
import types

import pytest

from morphpipe.profiler import SCHEMA_VERSION, GpuFacts, HardwareFacts, PhaseTiming, Profile, ThreadScaling
from morphpipe.profiler.hardware import pcie_bandwidth_gbps


def gpu_profile(**overrides: object) -> Profile:
    numbers = dict(t_cb=0.08, t_gb=0.01, t_dma=0.004, t_m=0.006, cores=8, cpu_efficiency=0.75,
                   num_batches=500, cv=0.2, batch_bytes=40_000_000)
    numbers.update(overrides)
    return Profile.synthetic(**numbers)


def test_phase_timing_from_samples_matches_statistics() -> None:
    timing = PhaseTiming.from_samples([1.0, 2.0, 3.0])
    assert timing.mean_s == pytest.approx(2.0)
    assert timing.std_s == pytest.approx(1.0)
    assert timing.cv == pytest.approx(0.5)
    assert timing.samples == 3


@pytest.mark.parametrize("kwargs, field", [
    (dict(mean_s=0.0), "mean_s"),
    (dict(mean_s=-1.0), "mean_s"),
    (dict(mean_s=1.0, std_s=-0.1, cv=0.0), "std_s"),
    (dict(mean_s=1.0, std_s=0.5, cv=0.1), "cv"),
    (dict(mean_s=1.0, samples=-1), "samples"),
])
def test_phase_timing_rejects_bad_values_naming_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        PhaseTiming(**kwargs)


def test_thread_scaling_interpolates_and_extrapolates_in_throughput() -> None:
    scaling = ThreadScaling({1: PhaseTiming.from_mean(1.0), 4: PhaseTiming.from_mean(0.5)})
    assert scaling.per_batch_time(1) == pytest.approx(1.0)
    assert scaling.per_batch_time(4) == pytest.approx(0.5)
    # between 1 (1 batch/s) and 4 threads (2 batches/s): linear in throughput
    assert scaling.throughput(2) == pytest.approx(1.0 + 1.0 / 3.0)
    # beyond 4: marginal gain of the last step (1/3 batch/s per thread), below the mean per thread (0.5)
    assert scaling.marginal_rate() == pytest.approx(1.0 / 3.0)
    assert scaling.throughput(10) == pytest.approx(2.0 + 6.0 / 3.0)
    # never better than the core count allows
    assert scaling.per_batch_time(32, cores=4) == pytest.approx(0.5)


def test_thread_scaling_with_one_point_assumes_linear_speedup() -> None:
    scaling = ThreadScaling({2: PhaseTiming.from_mean(0.5)})
    assert scaling.per_batch_time(1) == pytest.approx(1.0)
    assert scaling.per_batch_time(8) == pytest.approx(0.125)
    assert scaling.efficiency(8) == pytest.approx(1.0)


def test_thread_scaling_linear_helper_matches_its_efficiency() -> None:
    scaling = ThreadScaling.linear(1.0, 8, efficiency=0.5)
    assert scaling.throughput(8) == pytest.approx(1.0 + 7 * 0.5)
    assert scaling.throughput(16) == pytest.approx(1.0 + 15 * 0.5)
    assert all(scaling.throughput(p + 1) >= scaling.throughput(p) for p in range(1, 40))
    one_core = ThreadScaling.linear(1.0, 1, efficiency=0.5)
    assert one_core.per_batch_time(1) == pytest.approx(1.0)
    assert one_core.throughput(9) == pytest.approx(1.0 + 8 * 0.5), "the efficiency survives a 1-core profile"


def test_cpu_batching_spread_comes_from_the_fewest_threads() -> None:
    scaling = ThreadScaling({4: PhaseTiming.from_mean(0.3, 0.9), 1: PhaseTiming.from_mean(1.0, 0.2)})
    assert scaling.fewest_threads_cv() == pytest.approx(0.2)
    assert scaling.timing(4).cv == pytest.approx(0.9)


def test_profile_cpu_batch_time_uses_all_usable_cores_by_default() -> None:
    profile = gpu_profile()
    assert profile.cores == 8
    assert profile.cpu_batch_time() == pytest.approx(0.08 / (1 + 7 * 0.75))


def test_gpu_phases_are_absent_on_a_cpu_profile() -> None:
    profile = Profile.synthetic(t_cb=0.1, t_m=0.05, cores=4)
    assert profile.device == "cpu"
    assert profile.gpu_batching is None and profile.dma is None and profile.training is None
    assert profile.cpu_training is not None
    with pytest.raises(ValueError, match="dma"):
        Profile.synthetic(t_cb=0.1, t_m=0.05, t_gb=0.01, t_dma=None, device="cuda")


def test_profile_json_round_trip(tmp_path) -> None:
    profile = gpu_profile(workload={"dataset": "ogbn-products", "fanouts": "15,10,5"})
    path = tmp_path / "profile.json"
    profile.save(path)
    loaded = Profile.load(path)
    assert loaded == profile
    document = json.loads(path.read_text())
    assert document["schema_version"] == SCHEMA_VERSION
    assert document["kind"] == "morphpipe.profile"
    cpu = Profile.synthetic(t_cb=0.1, t_m=0.05, cores=4, cv=0.1)
    cpu.save(path)
    assert Profile.load(path) == cpu


def write(path, document) -> None:
    path.write_text(json.dumps(document))


def test_load_rejects_newer_and_older_schema_versions(tmp_path) -> None:
    document = gpu_profile().to_dict()
    path = tmp_path / "profile.json"
    write(path, {**document, "schema_version": SCHEMA_VERSION + 1})
    with pytest.raises(ValueError, match="upgrade morphpipe"):
        Profile.load(path)
    write(path, {**document, "schema_version": 0})
    with pytest.raises(ValueError, match="schema_version"):
        Profile.load(path)
    write(path, {key: value for key, value in document.items() if key != "schema_version"})
    with pytest.raises(ValueError, match="'schema_version' is missing"):
        Profile.load(path)


def test_load_rejects_a_plan_or_other_kind(tmp_path) -> None:
    path = tmp_path / "profile.json"
    write(path, {**gpu_profile().to_dict(), "kind": "morphpipe.plan"})
    with pytest.raises(ValueError, match="field 'kind'.*right file"):
        Profile.load(path)


def test_malformed_json_errors_name_the_file_and_position(tmp_path) -> None:
    path = tmp_path / "broken.json"
    path.write_text('{"kind": "morphpipe.profile",')
    with pytest.raises(ValueError, match=r"broken.json: not valid JSON .*line 1") as error:
        Profile.load(path)
    assert "morphpipe tune" in str(error.value)
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match="must be a JSON object"):
        Profile.load(path)
    with pytest.raises(FileNotFoundError, match="no such file"):
        Profile.load(tmp_path / "missing.json")


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d["dma"].update(mean_s=-1.0), r"field 'dma.mean_s' must be > 0, got -1.0"),
    (lambda d: d["dma"].update(cv=3.0), r"field 'dma.cv' must equal std_s / mean_s"),
    (lambda d: d.update(num_batches="many"), r"field 'num_batches' must be an integer, got 'many'"),
    (lambda d: d.update(device="tpu"), r"field 'device' must be one of 'cuda', 'cpu', got 'tpu'"),
    (lambda d: d["cpu_batching"][0].update(threads=0), r"field 'cpu_batching\[0\].threads' must be >= 1"),
    (lambda d: d["cpu_batching"].append(dict(d["cpu_batching"][0])), r"'cpu_batching\[2\].threads' is listed twice"),
    (lambda d: d.update(cpu_batching=[]), r"field 'cpu_batching' must list at least one thread count"),
    (lambda d: d["hardware"].update(usable_cores=0), r"field 'hardware.usable_cores' must be >= 1"),
    (lambda d: d.update(dma=None), r"needs dma"),
    (lambda d: d.pop("training"), r"needs training"),
    (lambda d: d["dma"].update(mean_s=float("nan")), r"field 'dma.mean_s' must be a finite number"),
])
def test_invalid_fields_are_reported_by_name(tmp_path, mutate, message) -> None:
    document = gpu_profile().to_dict()
    mutate(document)
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(document))
    with pytest.raises(ValueError, match=message):
        Profile.load(path)


def test_from_dict_validates_like_load() -> None:
    document = gpu_profile().to_dict()
    assert Profile.from_dict(document) == gpu_profile().replaced(created=document["created"])
    with pytest.raises(ValueError, match="field 'batch_bytes' must be >= 0"):
        Profile.from_dict({**document, "batch_bytes": -5})


def test_hardware_detect_without_a_gpu_says_why() -> None:
    facts = HardwareFacts.detect()
    assert facts.usable_cores >= 1
    assert facts.logical_cores >= facts.usable_cores or facts.notes
    assert facts.memory_bytes > 0
    if not facts.gpus:
        assert facts.gpu_note


def test_hardware_round_trips_through_a_profile(tmp_path) -> None:
    facts = HardwareFacts.detect()
    profile = gpu_profile().replaced(hardware=facts, device="cuda")
    path = tmp_path / "profile.json"
    profile.save(path)
    assert Profile.load(path).hardware == facts


def test_pcie_bandwidth_table() -> None:
    assert pcie_bandwidth_gbps(3, 16) == pytest.approx(15.75, rel=1e-3)
    assert pcie_bandwidth_gbps(4, 16) == pytest.approx(31.5, rel=1e-3)
    assert pcie_bandwidth_gbps(5, 16) == pytest.approx(63.0, rel=1e-3)
    assert pcie_bandwidth_gbps(None, 16) is None
    gpu = GpuFacts(0, "gpu", 1, pcie_gen=1, pcie_width=16, pcie_max_gen=4, pcie_max_width=16)
    assert gpu.pcie_gbps == pytest.approx(31.5, rel=1e-3), "an idle link's low generation must not be used"


def test_gpu_detection_through_nvml(monkeypatch) -> None:
    class NVMLError(Exception):
        pass

    fake = types.SimpleNamespace(
        NVMLError=NVMLError,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlSystemGetDriverVersion=lambda: b"550.54",
        nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda index: index,
        nvmlDeviceGetName=lambda handle: "NVIDIA H100 80GB HBM3",
        nvmlDeviceGetMemoryInfo=lambda handle: types.SimpleNamespace(total=80 << 30),
        nvmlDeviceGetCurrPcieLinkGeneration=lambda handle: 1,
        nvmlDeviceGetCurrPcieLinkWidth=lambda handle: 16,
        nvmlDeviceGetMaxPcieLinkGeneration=lambda handle: 5,
        nvmlDeviceGetMaxPcieLinkWidth=lambda handle: (_ for _ in ()).throw(NVMLError("not supported")),
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    facts = HardwareFacts.detect()
    assert facts.gpu_note == ""
    assert facts.driver_version == "550.54"
    (gpu,) = facts.gpus
    assert gpu.name == "NVIDIA H100 80GB HBM3" and gpu.memory_bytes == 80 << 30
    assert (gpu.pcie_gen, gpu.pcie_width, gpu.pcie_max_gen, gpu.pcie_max_width) == (1, 16, 5, None)
    assert gpu.pcie_gbps == pytest.approx(63.0, rel=1e-3)


def test_no_driver_is_not_an_error(monkeypatch) -> None:
    class NVMLError(Exception):
        pass

    def fail() -> None:
        raise NVMLError("NVML Shared Library Not Found")

    monkeypatch.setitem(sys.modules, "pynvml", types.SimpleNamespace(NVMLError=NVMLError, nvmlInit=fail))
    facts = HardwareFacts.detect()
    assert facts.gpus == ()
    assert "no NVIDIA driver" in facts.gpu_note and "CPU only" in facts.gpu_note
    assert math.isfinite(facts.memory_bytes)
