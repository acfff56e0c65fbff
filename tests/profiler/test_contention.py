"""The profiler's contention monitor: flags a profile taken beside a CPU-burning process, not one on a quiet machine."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from morphpipe.profiler.contention import OTHER_CPU_SHARE, ContentionMonitor, CpuSample, our_cpus


def fake_machine(other_cores: float, steal_share: float = 0.0, cores: int = 2):
    """A sampler whose machine runs `other_cores` cores of other work and this process's own 1 core."""
    clock = {"t": 0.0}

    def sample(cpus: list[int]) -> CpuSample:
        t = clock["t"]
        clock["t"] += 10.0
        return CpuSample(wall_s=t, busy_s=t * (other_cores + 1.0), steal_s=t * steal_share * cores, own_s=t)

    return ContentionMonitor(sample=sample, cpus=list(range(cores)), load_average=lambda: 1.0)


def test_a_quiet_machine_is_not_flagged() -> None:
    contention = fake_machine(other_cores=0.05).start().stop()
    assert contention.other_cores == pytest.approx(0.05)
    assert not contention.busy
    assert "quiet machine" in contention.describe()


def test_other_processes_or_steal_are_flagged() -> None:
    assert fake_machine(other_cores=OTHER_CPU_SHARE * 2 + 0.01).start().stop().busy
    assert fake_machine(other_cores=0.0, steal_share=0.2).start().stop().busy
    with pytest.raises(RuntimeError, match="before start"):
        ContentionMonitor().stop()


def test_shares_are_of_our_cores() -> None:
    """On 8 cores, one core of other work is 12.5% of them and 5% stolen per core is under the 10% threshold:
    quiet; two and a half cores of other work (31%) is busy."""
    one_of_eight = fake_machine(other_cores=1.0, cores=8).start().stop()
    assert one_of_eight.other_cores == pytest.approx(1.0) and not one_of_eight.busy
    stolen = fake_machine(other_cores=0.0, steal_share=0.05, cores=4).start().stop()
    assert stolen.steal_share == pytest.approx(0.05) and not stolen.busy
    assert fake_machine(other_cores=2.5, cores=8).start().stop().busy


def test_a_cpu_burner_beside_us_is_flagged() -> None:
    cpus = our_cpus()
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in cpus]
    try:
        time.sleep(0.5)
        contention = ContentionMonitor(cpus=cpus).measure(1.5)
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    assert contention.busy, contention.describe()
    assert contention.other_cores >= 0.5 * len(cpus)


def test_profiler_repeats_a_busy_measurement_and_records_the_verdict() -> None:
    from morphpipe.data import load_dataset
    from morphpipe.profiler import Profile
    from morphpipe.profiler import Profiler

    tiny_graph = load_dataset("tiny", progress=False)

    messages: list[str] = []
    busy = Profiler(tiny_graph, fanouts=[3, 2], batch_size=64, device="cpu", thread_counts=[1], warmup=0, steps=2,
                    progress=False, monitor=fake_machine(other_cores=1.5), log=messages.append).run()
    assert busy.taken_on_busy_machine and busy.contention["other_cores"] == pytest.approx(1.5)
    assert sum("measuring again" in m for m in messages) == 1 and any("busy machine" in m for m in messages)
    assert Profile.from_dict(busy.to_dict()).taken_on_busy_machine
    quiet = Profiler(tiny_graph, fanouts=[3, 2], batch_size=64, device="cpu", thread_counts=[1], warmup=0, steps=2,
                     progress=False, monitor=fake_machine(other_cores=0.0), log=messages.append).run()
    assert not quiet.taken_on_busy_machine and quiet.summary()["busy_machine"] is False
