"""Kill soak: SIGKILL `morphpipe train --checkpoint-dir` at random moments, resume, and compare with an uninterrupted run.

One uninterrupted run gives the reference. Then trials: each trains the same command into a fresh
checkpoint directory, kills it some times at a random moment (anywhere from start-up to the end, or
in a targeted window: inside a checkpoint write, held open by the MORPHPIPE_TEST_STALL_BEFORE_REPLACE
hook; during a step, on the epoch bar's first partial count; during evaluation, on the evaluation bar
(validation after an epoch, or the final test); during profiling, on the `--auto` profiler's bar
partly done), resumes the same command, and finally lets it finish. The `sigterm` target sends
SIGTERM instead, during a step: with no grace period (`--stop-grace 0`) the run must stop at the
next step with status 143 and a mid-epoch checkpoint, which the next run continues from the step
after. After every kill the checkpoint must be readable (or absent before the first epoch); after
each completed resume the parameters, each epoch's loss and validation
accuracy and the test accuracy must equal the reference's exactly, and no `.partial` entry may be
left beside the checkpoint or the stats file. Where each kill landed is read from the last line
the process printed (start-up, profiling, a training step, evaluation, after an epoch's line).

Deterministic mode: every op choice is forced (MORPHPIPE_FORCE_CHOICE) because the ops' cost model
is calibrated per process, and a choice made differently after a resume changes floating-point sums.

usage: python scripts/soak_kill.py [--kills 20] [--epochs 4] [--batch-size 128] [--eval-batch-size 2] [--seed 0]
                                   [--targets random,checkpoint-write,step,evaluation,profiling,sigterm]
                                   [--workdir DIR]
                                   [--dataset DIR] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from dgl_peer import positive_int, writable_file
from morphpipe.data import PRESETS, generate
from morphpipe.executor.checkpoint import CHECKPOINT_FILE, load_checkpoint
from morphpipe.executor.stopping import STOP_EXIT_STATUS
from morphpipe.ops.choice import DECISIONS, FORCE_ENV
from morphpipe.outputs import STALL_BEFORE_REPLACE_ENV, STALL_ONLY_ENV

FORCED_CHOICES = ",".join(f"{decision}={options[0]}" for decision, options in DECISIONS.items())
PROGRESS = re.compile(r"epoch (\d+)/\d+:\s+\d+%\|.*\| (\d+)/(\d+)")
EVALUATING = re.compile(r"^evaluating:\s+\d+%\|.*\| (\d+)/(\d+)")  # sampled evaluation's bar
PROFILING = re.compile(r"^profiling:\s+\d+%\|.*\| (\d+)/(\d+)")  # the --auto profiler's bar
STATS_FILE = "stats.json"
TARGETS = ("random", "checkpoint-write", "step", "evaluation", "profiling", "sigterm")
STOPPED = re.compile(r"morphpipe train: stopped by SIGTERM ([^;]*);")  # the stop message, and where it stopped
MID_EPOCH = re.compile(r"holds epoch (\d+) up to step (\d+) of (\d+)")


@dataclass
class SoakRun:
    """The command every run of a soak executes; `directory` holds its checkpoint and stats file."""

    dataset: Path
    directory: Path
    epochs: int = 4
    batch_size: int = 128
    seed: int = 0
    extra: tuple[str, ...] = ()
    eval_batch_size: int = 2  # many evaluation batches even on the tiny preset (300 of its 600): a window to kill in
    stop_grace: float = 0.0  # SIGTERM stops at the next step (a mid-epoch checkpoint); SIGKILL does not care

    def command(self) -> list[str]:
        return [sys.executable, "-m", "morphpipe", "train", str(self.dataset), "--auto", "--epochs", str(self.epochs),
                "--batch-size", str(self.batch_size), "--eval-batch-size", str(self.eval_batch_size),
                "--seed", str(self.seed), "--threads", "1", "--stop-grace", f"{self.stop_grace:g}",
                "--checkpoint-dir", str(self.directory / "checkpoint"), "--stats-json",
                str(self.directory / STATS_FILE), *self.extra]

    def environment(self, stall_marker: Path | None = None, stall_only: str = CHECKPOINT_FILE) -> dict[str, str]:
        # Every bar update printed (tqdm otherwise prints at most every 0.1 s): the watched windows open at a step's
        # or a batch's first count, not wherever the timer fell; a short epoch might otherwise show no partial count.
        environ = {**os.environ, FORCE_ENV: FORCED_CHOICES, "TQDM_MININTERVAL": "0"}
        if stall_marker is not None:
            environ.update({STALL_BEFORE_REPLACE_ENV: str(stall_marker), STALL_ONLY_ENV: stall_only})
        return environ


class Watched:
    """A running command whose output (progress bars included) is read line by line as it comes."""

    def __init__(self, command: list[str], environ: dict[str, str]) -> None:
        self.process = subprocess.Popen(command, env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        pending = b""
        assert self.process.stdout is not None
        while chunk := self.process.stdout.read1(65536):
            pending += chunk
            *complete, pending = re.split(rb"[\r\n]", pending)
            self.lines.extend(line.decode(errors="replace").strip() for line in complete if line.strip())
        if pending.strip():
            self.lines.append(pending.decode(errors="replace").strip())

    def wait_for(self, predicate, timeout_s: float) -> bool:
        """Polls until `predicate()` holds (True) or the process ends or time runs out (False)."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end and self.process.poll() is None:
            if predicate():
                return True
            time.sleep(0.005)
        return False

    def kill(self) -> str:
        """SIGKILL now; returns where the process was, read from what it had printed."""
        where = landing(self.lines)
        self.process.send_signal(signal.SIGKILL)
        self.finish()
        return where

    def finish(self, timeout_s: float | None = None) -> int:
        code = self.process.wait(timeout=timeout_s)
        self._reader.join(timeout=10)
        return code

    def in_step(self) -> bool:
        """The progress bar shows an epoch partly trained."""
        match = PROGRESS.search(self.lines[-1]) if self.lines else None
        return match is not None and 0 < int(match.group(2)) < int(match.group(3))

    def in_evaluation(self) -> bool:
        """The last line is the evaluation bar, not yet complete."""
        return _unfinished(EVALUATING, self.lines)

    def in_profiling(self) -> bool:
        """The last line is the profiler's bar, not yet complete."""
        return _unfinished(PROFILING, self.lines)


def _unfinished(bar: re.Pattern[str], lines: list[str]) -> bool:
    """The last of `lines` is `bar` with its count below its total (the bar is printed at 0 when work starts)."""
    match = bar.search(lines[-1]) if lines else None
    return match is not None and int(match.group(1)) < int(match.group(2))


def landing(lines: list[str]) -> str:
    """Where a run was when it printed `lines` last: start-up, profiling, step, evaluation or after-epoch."""
    if not lines:
        return "start-up"
    last = lines[-1]
    if EVALUATING.search(last):
        return "evaluation"
    if PROFILING.search(last):
        return "profiling"
    progress = PROGRESS.search(last)
    if progress is not None:
        done, total = int(progress.group(2)), int(progress.group(3))
        return f"evaluation (epoch {progress.group(1)})" if done == total else f"step (epoch {progress.group(1)})"
    if re.match(r"epoch \d+/\d+: [\d.]+ s", last):
        return "after an epoch's line (checkpoint write / re-planning)"
    if "profil" in last or "CPU batching" in last or "CPU training" in last or "measured phases" in last:
        return "profiling"
    if last.startswith(("dataset", "note:", "resumed from", "plan:", "  ")):
        return "start-up (data, plan, resume)"
    return f"after: {last[:60]}"


@dataclass
class Outcome:
    """A finished run's result: parameters, per-epoch loss and validation accuracy, test accuracy."""

    params: dict[str, torch.Tensor]
    metrics: list[tuple[float, float | None]]
    test_acc: float | None

    @classmethod
    def of(cls, run: SoakRun) -> Outcome:
        state = load_checkpoint(run.directory / "checkpoint")
        assert state is not None and state.epoch == run.epochs, f"{run.directory}: no final checkpoint"
        stats = json.loads((run.directory / STATS_FILE).read_text())
        metrics = [(item["loss"], item["val_acc"]) for item in state.history]
        assert metrics == [(item["loss"], item["val_acc"]) for item in stats["epochs"]]
        return cls(state.model, metrics, stats["test_acc"])

    def differences(self, other: Outcome) -> list[str]:
        found = [f"parameter {key}" for key in self.params
                 if key not in other.params or not torch.equal(self.params[key], other.params[key])]
        if self.metrics != other.metrics:
            found.append(f"epoch metrics {self.metrics} vs {other.metrics}")
        if self.test_acc != other.test_acc:
            found.append(f"test accuracy {self.test_acc} vs {other.test_acc}")
        return found


def partials(run: SoakRun) -> list[str]:
    """Partial entries left beside the checkpoint or the stats file."""
    return sorted(str(p) for folder in (run.directory, run.directory / "checkpoint") if folder.is_dir()
                  for p in folder.iterdir() if ".partial-" in p.name or ".old-" in p.name)


@dataclass
class Kill:
    trial: int
    target: str
    landed: str
    epochs_in_checkpoint: int
    partials_left: int


@dataclass
class SoakReport:
    kills: list[Kill] = field(default_factory=list)
    resumes: int = 0
    trials: int = 0
    unreadable: list[str] = field(default_factory=list)
    differences: list[str] = field(default_factory=list)
    stray_partials: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not (self.unreadable or self.differences or self.stray_partials)


WATCHED_TARGETS = {"step": "in_step", "evaluation": "in_evaluation", "profiling": "in_profiling",
                   "sigterm": "in_step"}


def kill_once(run: SoakRun, target: str, delay_s: float, timeout_s: float) -> tuple[str, int] | None:
    """One run of `run`'s command killed at `target`; None when it finished first. Returns (where, exit code)."""
    marker = run.directory / "stalled"
    marker.unlink(missing_ok=True)
    watched = Watched(run.command(), run.environment(marker if target == "checkpoint-write" else None))
    if target == "checkpoint-write":
        reached = watched.wait_for(marker.exists, timeout_s)
    elif target in WATCHED_TARGETS:
        reached = watched.wait_for(getattr(watched, WATCHED_TARGETS[target]), timeout_s)
    else:
        reached = not watched.wait_for(lambda: False, delay_s) and watched.process.poll() is None
    if not reached:
        code = watched.finish(timeout_s)
        if code != 0:
            raise RuntimeError(f"run ended with status {code}:\n" + "\n".join(watched.lines[-20:]))
        return None
    if target == "sigterm":
        return sigterm(watched, timeout_s)
    where = "checkpoint write (stalled before the rename)" if target == "checkpoint-write" else watched.kill()
    if target == "checkpoint-write":
        watched.kill()
    return where, watched.process.returncode


def sigterm(watched: Watched, timeout_s: float) -> tuple[str, int]:
    """SIGTERM now; the run must stop with status 143 and say where it stopped, which is returned."""
    watched.process.send_signal(signal.SIGTERM)
    code = watched.finish(timeout_s)
    stopped = next((match for line in watched.lines if (match := STOPPED.search(line))), None)
    if code != STOP_EXIT_STATUS or stopped is None:
        raise RuntimeError(f"after SIGTERM the run ended with status {code}, not {STOP_EXIT_STATUS} with a stop "
                           "message:\n" + "\n".join(watched.lines[-20:]))
    mid_epoch = MID_EPOCH.search(stopped.string)
    if mid_epoch is None:
        return f"SIGTERM, stopped {stopped.group(1)}", code
    return f"SIGTERM, stopped mid epoch (checkpoint at step {mid_epoch.group(2)} of {mid_epoch.group(3)})", code


def check_checkpoint(run: SoakRun, report: SoakReport) -> tuple[int, int]:
    """The checkpoint after a kill: readable (or absent); returns its completed epochs and the steps it holds of the
    next one (a mid-epoch checkpoint; 0 at an epoch's end)."""
    try:
        state = load_checkpoint(run.directory / "checkpoint")
    except ValueError as error:
        report.unreadable.append(str(error))
        return -1, 0
    if state is None:
        return 0, 0
    return state.epoch, len(state.partial_epoch["order"]) if state.partial_epoch else 0


def finish(run: SoakRun, timeout_s: float) -> None:
    """Runs the command to the end (a resume after the kills)."""
    result = subprocess.run(run.command(), env=run.environment(), capture_output=True, text=True, timeout=timeout_s)
    if result.returncode != 0:
        raise RuntimeError(f"the resumed run failed with status {result.returncode}:\n{result.stdout[-3000:]}"
                           f"{result.stderr[-3000:]}")


def soak(dataset: Path, workdir: Path, *, kills: int, kills_per_trial: int = 4, epochs: int = 4,
         batch_size: int = 128, eval_batch_size: int = SoakRun.eval_batch_size, seed: int = 0,
         targets: tuple[str, ...] = TARGETS,
         rng_seed: int = 0, timeout_s: float = 300.0, log=print) -> SoakReport:
    """Kills and resumes until `kills` kills have landed, taking `targets` in turn; every trial's end is compared
    with the reference."""
    unknown = [target for target in targets if target not in TARGETS]
    if unknown or not targets:
        raise ValueError(f"targets {list(targets)}: use one or more of {', '.join(TARGETS)}")
    reference_run = SoakRun(dataset, workdir / "reference", epochs, batch_size, seed, eval_batch_size=eval_batch_size)
    started = time.monotonic()
    finish(reference_run, timeout_s)
    reference_s = time.monotonic() - started
    reference = Outcome.of(reference_run)
    log(f"reference run: {reference_s:.1f} s, test accuracy {reference.test_acc}")
    chooser = random.Random(rng_seed)
    report = SoakReport()
    attempts = 0
    while len(report.kills) < kills:
        trial = report.trials
        run = SoakRun(dataset, workdir / f"trial{trial}", epochs, batch_size, seed, eval_batch_size=eval_batch_size)
        for _ in range(min(kills_per_trial, kills - len(report.kills))):
            target = targets[attempts % len(targets)]
            attempts += 1
            delay = chooser.uniform(0.0, 0.9 * reference_s)
            outcome = kill_once(run, target, delay, timeout_s)
            if outcome is None:
                break  # finished before the kill: that trial is complete
            epochs_done, steps = check_checkpoint(run, report)
            left = len(partials(run))
            report.kills.append(Kill(trial, target, outcome[0], epochs_done, left))
            held = f"{epochs_done} epochs" + (f" and {steps} steps of epoch {epochs_done + 1}" if steps else "")
            log(f"kill {len(report.kills)}: trial {trial}, {target} -> landed in {outcome[0]}; checkpoint holds "
                f"{held}; {left} partial entries left")
        finish(run, timeout_s)
        report.resumes += 1
        report.trials += 1
        report.differences += [f"trial {trial}: {item}" for item in Outcome.of(run).differences(reference)]
        report.stray_partials += partials(run)
        log(f"trial {trial} resumed to the end: {'equal to' if not report.differences else 'DIFFERENT from'} the "
            f"reference; stray partials: {partials(run) or 'none'}")
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=positive_int, default=20)
    parser.add_argument("--kills-per-trial", type=positive_int, default=4)
    parser.add_argument("--epochs", type=positive_int, default=4)
    parser.add_argument("--batch-size", type=positive_int, default=128)
    parser.add_argument("--eval-batch-size", type=positive_int, default=SoakRun.eval_batch_size)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--targets", default=",".join(TARGETS),
                        help=f"where kills aim, taken in turn (default: all of {','.join(TARGETS)})")
    parser.add_argument("--dataset", type=Path, default=None, help="default: the tiny preset, generated here")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--json", type=writable_file, default=None)
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="soak-kill-"))
    dataset = args.dataset or generate(PRESETS["tiny"].spec, workdir / "tiny", progress=False)
    started = time.monotonic()
    report = soak(dataset, workdir, kills=args.kills, kills_per_trial=args.kills_per_trial, epochs=args.epochs,
                  batch_size=args.batch_size, eval_batch_size=args.eval_batch_size, seed=args.seed,
                  targets=tuple(filter(None, args.targets.split(","))))
    where: dict[str, int] = {}
    for kill in report.kills:
        where[kill.landed] = where.get(kill.landed, 0) + 1
    print(f"\n{len(report.kills)} kills in {report.trials} trials, {report.resumes} completed resumes, "
          f"{time.monotonic() - started:.0f} s; landed: " + "; ".join(f"{k}: {v}" for k, v in sorted(where.items())))
    print(f"unreadable checkpoints: {len(report.unreadable)}; runs different from the reference: "
          f"{len(report.differences)}; stray partials after a completed resume: {len(report.stray_partials)}")
    if args.json is not None:
        args.json.write_text(json.dumps({**asdict(report), "landed": where, "passed": report.passed}, indent=2))
    print("PASS" if report.passed else "FAIL")
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
