"""First contact with a GPU: every GPU test, the Route 1 self-check and the GPU benchmarks, in one report.

On a CUDA machine it runs, each in its own process with a time limit, and keeps going when one fails:
1. the GPU tests (tests marked `cuda` skip elsewhere) plus the stream and self-check tests;
2. the Route 1 self-check on the device (kernels vs torch path, fused vs reference ops), fresh;
   then how long page-locking 1 MiB to 1 GiB of host memory (both ways) and copying it to the GPU take;
3. scripts/bench_gpu_batcher.py (PCIe copy and UVA gather bandwidth, GPU vs CPU batcher, cache sweep);
4. scripts/bench_ops.py on CUDA, where that script takes --device;
5. the GPU part of scripts/bench_pipeline.py (all-CPU, all-GPU and adaptive plans measured).
It writes `gpu_check.md` and `gpu_check.json` (machine, each step's status, time and output tail,
and the benchmarks' own JSON) into --out. Without CUDA it says why and exits 2, measuring nothing.

Usage: python scripts/gpu_check.py [--out gpu_check_report] [--quick] [--step-timeout 1800] [--only NAMES]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NO_CUDA_EXIT = 2
TAIL_CHARS = 4000
HANG_TAIL_CHARS = 16000  # a timed-out step's tail holds its threads' stacks
ABORT_GRACE_S = 15  # for a timed-out step to print its threads' stacks

SELF_CHECK = """
import json, torch
from dataclasses import asdict
import morphpipe.ops  # registers the fused ops' self-check
from morphpipe.sampling import backend_check as check
device = torch.device("cuda", torch.cuda.current_device())
with check.cuda_makers(device) as (kernels, reference, gather):
    verdict = check.run_self_check(device, kernels, reference, gather)
check.record_verdict(verdict)
print(verdict.summary())
print("VERDICT " + json.dumps(asdict(verdict)))
"""


# Times page-locking host memory and copying it to the GPU, size by size, printing each as it completes. On the
# first H200 lent here (2026-11-26) both GPU benchmarks stalled for over 110 s at their first pinned 256 MiB
# allocation or its copy, in a call that SIGABRT could not interrupt for 15 s; this step tells which, and at
# which size, before they run.
PINNING_PROBE = """
import time, torch
from morphpipe.sampling.pinning import HostPinning
torch.cuda.init()
for mib in (1, 16, 64, 256, 1024):
    start = time.perf_counter()
    host = torch.empty(mib << 20, dtype=torch.uint8).pin_memory()
    pinned = time.perf_counter() - start
    device = torch.empty(mib << 20, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    start = time.perf_counter()
    device.copy_(host)
    torch.cuda.synchronize()
    copied = time.perf_counter() - start
    start = time.perf_counter()
    plain = torch.ones(mib << 20, dtype=torch.uint8)  # first touch of fresh pages, the control
    touched = time.perf_counter() - start
    start = time.perf_counter()
    with HostPinning({"plain": plain}):
        registered = time.perf_counter() - start
    print(f"{mib:>5} MiB: pin_memory() {pinned * 1e3:9.1f} ms, copy to the GPU {copied * 1e3:9.1f} ms "
          f"({(mib << 20) / copied / 1e9:6.2f} GB/s), plain first touch {touched * 1e3:9.1f} ms, "
          f"cudaHostRegister {registered * 1e3:9.1f} ms", flush=True)
    del host, device
"""


def cuda_problem() -> str | None:
    """Why this machine cannot run the GPU check, or None (imports torch only)."""
    import torch

    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU-only build"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no CUDA device"
    return None


def machine() -> dict:
    import torch

    facts = {"host": platform.node(), "python": platform.python_version(), "torch": torch.__version__,
             "cuda": torch.version.cuda}
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        facts |= {"gpu": torch.cuda.get_device_name(), "capability": f"sm_{major}{minor}",
                  "gpu_count": torch.cuda.device_count()}
    return facts


def steps(out: Path, quick: bool) -> list[tuple[str, list[str], Path | None]]:
    """(name, command, JSON it writes) of every step, in order."""
    python = sys.executable
    gpu_batcher = [python, "scripts/bench_gpu_batcher.py", "--out", str(out / "bench_gpu_batcher.json")]
    pipeline = [python, "scripts/bench_pipeline.py", "--parts", "gpu", "--json", str(out / "bench_pipeline_gpu.json")]
    ops = [python, "scripts/bench_ops.py", "--device", "cuda", "--out", str(out / "bench_ops_cuda.json")]
    if quick:
        gpu_batcher += ["--dataset", "default", "--batches", "8", "--cache-fractions", "0,0.25"]
        pipeline += ["--threads", "2", "--epochs", "1", "--train-batches", "8"]
        ops += ["--datasets", "default", "--repeats", "2", "--no-memory", "--no-full-graph"]
    tests = [python, "-m", "pytest", "-q", "-rs", "tests/sampling/test_gpu_batcher.py", "tests/ops/test_cuda.py",
             "tests/executor/test_stream_discipline.py", "tests/sampling/test_backend_check.py",
             "tests/sampling/test_cpu_batcher.py"]
    return [("GPU tests", tests, None), ("Route 1 self-check", [python, "-c", SELF_CHECK], None),
            ("pinned memory probe", [python, "-c", PINNING_PROBE], None),
            ("bench_gpu_batcher.py", gpu_batcher, out / "bench_gpu_batcher.json"),
            ("bench_ops.py on CUDA", ops, out / "bench_ops_cuda.json"),
            ("bench_pipeline.py GPU part", pipeline, out / "bench_pipeline_gpu.json")]


def supports_device_flag(script: str) -> bool:
    """Whether a benchmark script takes --device (bench_ops.py measures the CPU only unless it does)."""
    return "--device" in (ROOT / script).read_text()


def run_step(name: str, command: list[str], writes: Path | None, timeout: float) -> dict:
    """Runs one step; its status, time, output tail and the JSON it wrote."""
    if name.startswith("bench_ops.py") and not supports_device_flag("scripts/bench_ops.py"):
        return {"step": name, "status": "not run", "command": command,
                "note": "scripts/bench_ops.py has no --device option yet, so it cannot measure the CUDA ops"}
    print(f"gpu_check: {name} ...", flush=True)
    start = time.perf_counter()
    # faulthandler in the child: a step that runs out of time is sent SIGABRT first, which makes it print where
    # each of its threads was, so that a hang is reported with its place rather than as silence.
    child = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env={**os.environ, "PYTHONFAULTHANDLER": "1", "PYTHONUNBUFFERED": "1"})
    try:
        output, _ = child.communicate(timeout=timeout)
        code = child.returncode
        status = "passed" if code == 0 else "FAILED"
    except subprocess.TimeoutExpired:
        status, code = "TIMED OUT", None
        child.send_signal(signal.SIGABRT)
        try:
            output, _ = child.communicate(timeout=ABORT_GRACE_S)
        except subprocess.TimeoutExpired:
            child.kill()
            output, _ = child.communicate()
    result = {"step": name, "status": status, "returncode": code, "seconds": round(time.perf_counter() - start, 1),
              "command": command, "output_tail": output[-(TAIL_CHARS if code is not None else HANG_TAIL_CHARS):]}
    if writes is not None and writes.exists():
        result["results"] = json.loads(writes.read_text())
    verdicts = [line[len("VERDICT "):] for line in output.splitlines() if line.startswith("VERDICT ")]
    if verdicts:
        result["results"] = json.loads(verdicts[-1])
    print(f"gpu_check: {name}: {status}", flush=True)
    return result


def positive_seconds(text: str) -> float:
    """--step-timeout's value: a number of seconds above 0."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = float("nan")
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds above 0 (e.g. 600)")
    return seconds


def markdown(report: dict) -> str:
    lines = ["# morphpipe GPU check", "", f"Date: {report['date']}", "",
             "| machine | |", "|---|---|", *[f"| {key} | {value} |" for key, value in report["machine"].items()], "",
             "| step | status | seconds |", "|---|---|---|"]
    lines += [f"| {step['step']} | {step['status']} | {step.get('seconds', '')} |" for step in report["steps"]]
    for step in report["steps"]:
        lines += ["", f"## {step['step']}: {step['status']}", "", f"`{' '.join(step['command'])}`", ""]
        if "note" in step:
            lines.append(step["note"])
        if "results" in step:
            lines += ["```json", json.dumps(step["results"], indent=1)[:20_000], "```"]
        if step.get("output_tail"):
            lines += ["Output (tail):", "```", step["output_tail"], "```"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="gpu_check_report", help="directory for the report and benchmark JSON")
    parser.add_argument("--quick", action="store_true", help="small benchmark settings (a smoke run)")
    parser.add_argument("--step-timeout", type=positive_seconds, default=1800.0, help="seconds each step may take")
    parser.add_argument("--only", type=lambda text: [part.strip() for part in text.split(",") if part.strip()],
                        default=[], help="comma-separated step names (or their first words) to run, e.g. "
                                         "'GPU tests,Route 1'; default: every step")
    args = parser.parse_args(argv)
    out = Path(args.out).resolve()
    chosen = [step for step in steps(out, args.quick) if not args.only or step[0].startswith(tuple(args.only))]
    if not chosen:
        parser.error(f"--only {','.join(args.only)} names no step; the steps are: "
                     + ", ".join(name for name, _, _ in steps(out, args.quick)))
    problem = cuda_problem()
    if problem is not None:
        print(f"gpu_check: no CUDA GPU here ({problem}); nothing was run or measured. Run this on a machine with "
              "a CUDA GPU, a CUDA build of torch and nvcc (see docs/gpu-route.md, 'First contact with a GPU').",
              file=sys.stderr)
        return NO_CUDA_EXIT
    out.mkdir(parents=True, exist_ok=True)
    report = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": machine(), "steps": []}
    for name, command, writes in chosen:  # the report is rewritten after each step: a lease may end mid-way
        report["steps"].append(run_step(name, command, writes, args.step_timeout))
        (out / "gpu_check.json").write_text(json.dumps(report, indent=1))
        (out / "gpu_check.md").write_text(markdown(report))
    print(f"gpu_check: report in {out / 'gpu_check.md'} and {out / 'gpu_check.json'}")
    return 0 if all(step["status"] in ("passed", "not run") for step in report["steps"]) else 1


if __name__ == "__main__":
    sys.exit(main())
