"""Kill -9 and SIGTERM at awkward moments: the resumed run equals an uninterrupted one, nothing is left damaged.

The short form of `scripts/soak_kill.py`: `morphpipe train --checkpoint-dir` on the tiny preset,
SIGKILLed inside a checkpoint write (held open by the stall hook), during `--auto` profiling, during
a training step and during evaluation, then resumed to the end, must reach the uninterrupted run's
parameters and metrics exactly, with every checkpoint readable and no partial file left. This is
the one long test here (about 40 s on 2 cores: five `morphpipe train` processes beside the reference); the
signal path cannot be checked in-process.
Stale-partial removal and SIGTERM (a mid-epoch checkpoint with no grace period, the epoch finished
within one, nothing kept without a checkpoint directory) are checked on their own.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from morphpipe.data import PRESETS, generate
from morphpipe.distributed.launcher import exit_description
from morphpipe.executor.checkpoint import load_checkpoint
from morphpipe.executor.stopping import STOP_EXIT_STATUS, StopRequest, epoch_finish_estimate_s
from morphpipe.outputs import partial_path, remove_stale_partials, replacing_file

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import soak_kill  # noqa: E402


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    return generate(PRESETS["tiny"].spec, tmp_path_factory.mktemp("kill") / "tiny", progress=False)


def dead_pid() -> int:
    """The PID of a process that has ended (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_partials_of_dead_writers_are_removed_and_live_ones_and_lookalikes_kept(tmp_path) -> None:
    target = tmp_path / "checkpoint.pt"
    dead, live = dead_pid(), os.getppid()
    dead_file = tmp_path / f".checkpoint.partial-{dead}.pt"
    dead_dir = tmp_path / f".checkpoint.pt.old-{dead}"
    live_file = tmp_path / f".checkpoint.partial-{live}.pt"
    other_target = tmp_path / f".plan.partial-{dead}.json"
    lookalike = tmp_path / f".checkpoint.partial-{dead}.pt.bak"
    for path in (dead_file, live_file, other_target, lookalike):
        path.write_bytes(b"half")
    dead_dir.mkdir()
    (dead_dir / "inside").write_bytes(b"x")
    assert sorted(remove_stale_partials(target)) == sorted([dead_file, dead_dir])
    assert live_file.exists() and other_target.exists() and lookalike.exists()
    with replacing_file(tmp_path / "plan.json") as temporary:  # a replacement clears its own target's leftovers
        assert temporary == partial_path(tmp_path / "plan.json")
        temporary.write_text("{}")
    assert not other_target.exists() and (tmp_path / "plan.json").read_text() == "{}"


def test_the_soak_names_where_a_kill_landed_from_the_last_line_printed() -> None:
    bar = "| 3/10 [00:01<00:02, 4.2batch/s]"
    assert soak_kill.landing([]) == "start-up"
    assert soak_kill.landing(["plan:", f"profiling:  30%|###    {bar}"]) == "profiling"
    assert soak_kill.landing([f"epoch 2/4:  30%|###    {bar}"]) == "step (epoch 2)"
    assert soak_kill.landing([f"epoch 2/4:  30%|###    {bar}", f"evaluating:  30%|###    {bar}"]) == "evaluation"
    assert soak_kill.landing(["epoch 1/4: 0.52 s, loss 1.3"]).startswith("after an epoch's line")
    with pytest.raises(ValueError, match="targets \\['eval'\\]: use one or more of random, checkpoint-write"):
        soak_kill.soak(Path("unused"), Path("unused"), kills=1, targets=("eval",))


@pytest.fixture(scope="module")
def reference_of_small_batches(dataset, tmp_path_factory) -> soak_kill.Outcome:
    """The uninterrupted run the kill and SIGTERM tests compare with: batches of 8 seeds, an epoch of 225 steps, so the
    signal lands inside an epoch on a quiet machine too."""
    run = soak_kill.SoakRun(dataset, tmp_path_factory.mktemp("reference"), epochs=2, batch_size=8)
    soak_kill.finish(run, 300)
    return soak_kill.Outcome.of(run)


def test_sigkill_in_a_checkpoint_write_profiling_a_step_and_evaluation_then_resume_equals_the_uninterrupted_run(
        dataset, tmp_path, reference_of_small_batches) -> None:
    # Batches of 8 seeds: the first epoch's steps last about a second, so a kill aimed at a step lands in that
    # epoch (at 128 seeds an epoch is 15 steps, a quarter of a second: a slow kill could land after its checkpoint).
    run = soak_kill.SoakRun(dataset, tmp_path, epochs=2, batch_size=8)
    where, code = soak_kill.kill_once(run, "checkpoint-write", 0.0, 300)
    assert code == -signal.SIGKILL and where.startswith("checkpoint write")
    assert load_checkpoint(run.directory / "checkpoint") is None, "the first checkpoint never replaced anything"
    assert len(soak_kill.partials(run)) == 1, "the killed writer's partial checkpoint is left behind"
    for target, landed in (("profiling", "profiling"), ("step", "step (epoch 1)"), ("evaluation", "evaluation")):
        where, code = soak_kill.kill_once(run, target, 0.0, 300)
        assert code == -signal.SIGKILL and where == landed, (target, where)
        assert load_checkpoint(run.directory / "checkpoint") is None, f"{target}: no epoch was completed yet"
    assert soak_kill.partials(run) == [], "the resume removed the dead writer's partial"
    soak_kill.finish(run, 300)
    assert soak_kill.Outcome.of(run).differences(reference_of_small_batches) == []
    assert soak_kill.partials(run) == []


def test_sigterm_mid_epoch_checkpoints_the_steps_applied_and_the_resume_equals_the_uninterrupted_run(
        dataset, tmp_path, reference_of_small_batches) -> None:
    run = soak_kill.SoakRun(dataset, tmp_path, epochs=2, batch_size=8)  # --stop-grace 0: stop at the next step
    watched = soak_kill.Watched(run.command(), run.environment())
    assert watched.wait_for(watched.in_step, 300), watched.lines[-10:]
    where, code = soak_kill.sigterm(watched, 60)  # the soak's sigterm target
    text = "\n".join(watched.lines)
    state = load_checkpoint(run.directory / "checkpoint")
    assert state is not None and state.partial_epoch is not None, text[-2000:]
    steps, total = len(state.partial_epoch["order"]), 225
    epoch = state.epoch + 1
    assert 0 < steps < total and state.partial_epoch["epoch"] == state.epoch
    assert code == STOP_EXIT_STATUS and where == f"SIGTERM, stopped mid epoch (checkpoint at step {steps} of {total})"
    assert (f"morphpipe train: stopped by SIGTERM during epoch {epoch} after {steps} of {total} steps; the checkpoint "
            f"in {run.directory / 'checkpoint'} holds epoch {epoch} up to step {steps} of {total}: run the same "
            "command again to resume from it") in text
    watched = soak_kill.Watched(run.command(), run.environment())
    assert watched.finish(300) == 0, watched.lines[-10:]
    assert f"resumed from {run.directory / 'checkpoint'} in epoch {epoch} after step {steps} of {total}" in \
        watched.lines
    assert soak_kill.Outcome.of(run).differences(reference_of_small_batches) == []
    assert soak_kill.partials(run) == []


def test_sigterm_without_a_checkpoint_directory_says_nothing_was_saved(dataset, tmp_path) -> None:
    run = soak_kill.SoakRun(dataset, tmp_path, epochs=2, batch_size=8)
    plain = [item for item in run.command() if item != "--checkpoint-dir" and not item.endswith("checkpoint")]
    watched = soak_kill.Watched(plain, run.environment())
    assert watched.wait_for(watched.in_step, 300)
    watched.process.send_signal(signal.SIGTERM)
    assert watched.finish(60) == STOP_EXIT_STATUS
    text = "\n".join(watched.lines)
    assert "stopped by SIGTERM during epoch 1 after" in text and "(that epoch is dropped)" in text
    assert "nothing was saved (no checkpoint directory was given)" in text


def test_sigterm_within_the_grace_period_finishes_and_checkpoints_the_epoch_and_the_resume_is_exact(
        dataset, tmp_path, reference_of_small_batches) -> None:
    run = soak_kill.SoakRun(dataset, tmp_path / "stopped", epochs=2, batch_size=8, extra=("--stop-grace", "600"))
    watched = soak_kill.Watched(run.command(), run.environment())
    assert watched.wait_for(watched.in_step, 300), watched.lines[-10:]
    watched.process.send_signal(signal.SIGTERM)
    assert watched.finish(300) == STOP_EXIT_STATUS
    text = "\n".join(watched.lines)
    assert "stop requested by SIGTERM: finishing epoch 1 (" in text and "within the 600 s grace period" in text
    assert (f"stopped by SIGTERM after epoch 1; the checkpoint in {run.directory / 'checkpoint'} holds 1 completed "
            "epochs: run the same command again to resume from it") in text
    assert load_checkpoint(run.directory / "checkpoint").epoch == 1
    soak_kill.finish(run, 300)
    assert soak_kill.Outcome.of(run).differences(reference_of_small_batches) == []


def test_the_grace_estimate_counts_the_remaining_steps_and_validation() -> None:
    assert epoch_finish_estimate_s(0, 10, 0.0, 1.0) == float("inf")
    assert epoch_finish_estimate_s(4, 10, 2.0, 1.5) == pytest.approx(6 * 0.5 + 1.5)
    request = StopRequest(grace_s=30.0)
    assert request.grace_left_s() == 30.0 and not request.requested
    request.request("SIGTERM")
    assert 29.0 < request.grace_left_s() <= 30.0 and request.reason == "SIGTERM"
    with pytest.raises(ValueError, match="grace_s=-1.0"):
        StopRequest(grace_s=-1.0)


def test_the_launcher_names_the_rank_a_signal_killed_and_stops_the_others(tmp_path) -> None:
    script = tmp_path / "rank.py"
    script.write_text("import os, signal, time\n"
                      "if os.environ['RANK'] == '1':\n    time.sleep(0.5); os.kill(os.getpid(), signal.SIGKILL)\n"
                      "time.sleep(120)\n")
    result = subprocess.run([sys.executable, "-c", f"import sys; from morphpipe.distributed.launcher import launch; "
                             f"sys.exit(launch([sys.executable, {str(script)!r}], 2, grace_s=1.0))"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 128 + signal.SIGKILL
    assert "rank 1 of 2 was killed by SIGKILL (signal 9); stopped the run" in result.stderr
    assert exit_description(3) == "exited with status 3"
