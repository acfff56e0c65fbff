"""scripts/gpu_check.sh: without CUDA it says so and exits non-zero; its steps and report are well formed."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on machines without CUDA")
def test_without_cuda_it_says_so_and_exits_non_zero(tmp_path):
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--out", str(tmp_path / "report")],
                          capture_output=True, text=True, env={**os.environ, "PYTHON": sys.executable}, timeout=120)
    assert done.returncode == 2
    assert "no CUDA GPU here" in done.stderr and "nothing was run or measured" in done.stderr
    assert not (tmp_path / "report").exists()


def test_steps_cover_tests_self_check_and_benchmarks(tmp_path):
    script = load_script()
    names = [name for name, _, _ in script.steps(tmp_path, quick=True)]
    assert names == ["GPU tests", "Route 1 self-check", "pinned memory probe", "bench_gpu_batcher.py",
                     "bench_ops.py on CUDA", "bench_pipeline.py GPU part"]
    step = script.run_step("echo", [sys.executable, "-c", "print('VERDICT {\"kernels_ok\": true}')"], None, 60)
    assert step["status"] == "passed" and step["results"] == {"kernels_ok": True}
    report = {"date": "d", "machine": {"gpu": "none"}, "steps": [step]}
    text = script.markdown(report)
    assert "| echo | passed |" in text and '"kernels_ok": true' in text


def test_a_step_out_of_time_reports_where_it_was(tmp_path):
    """A hung step is stopped with its threads' stacks in the report, not as silence."""
    script = load_script()
    hang = "import time\ndef waiting_for_the_gpu():\n    time.sleep(60)\nprint('started', flush=True)\nwaiting_for_the_gpu()"
    step = script.run_step("hang", [sys.executable, "-c", hang], None, 3)
    assert step["status"] == "TIMED OUT" and step["seconds"] < 30
    assert "started" in step["output_tail"] and "waiting_for_the_gpu" in step["output_tail"]


@pytest.mark.parametrize("flags, message", [(["--only", "bench_nothing"], "names no step"),
                                            (["--step-timeout", "-5"], "above 0"),
                                            (["--step-timeout", "soon"], "above 0")])
def test_bad_flags_are_refused_before_anything_runs(tmp_path, capsys, flags, message):
    script = load_script()
    with pytest.raises(SystemExit):
        script.main(["--out", str(tmp_path / "report"), *flags])
    assert message in capsys.readouterr().err and not (tmp_path / "report").exists()
