"""morphpipe installed as users install it: a wheel with the native ops compiled in, used outside the source tree.

The fast tests check how native.py chooses between a prebuilt module and building csrc/ on first use;
the slow one builds a wheel (one compile of the native ops), installs it into a fresh venv and runs
commands that need the native ops from a directory that is not the repository.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from morphpipe import native

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def prebuilt(monkeypatch, tmp_path):
    """Writes a prebuilt module's record (`_native_build.json`) for the given torch and source hash."""
    monkeypatch.setattr(native, "_announced_mismatch", False)

    def record(torch_version: str, source_hash: str = "0" * 64) -> None:
        path = tmp_path / "_native_build.json"
        path.write_text(json.dumps({"torch": torch_version, "torch_cuda": None, "cuda_arch_list": None,
                                    "cuda_skip_reason": "a CPU-only build", "source_hash": source_hash}))
        monkeypatch.setattr(native, "PREBUILT_INFO", path)

    return record


@pytest.fixture
def without_sources(monkeypatch, tmp_path):
    """csrc/ absent, as in an installed wheel."""
    monkeypatch.setattr(native, "CSRC_DIR", tmp_path / "csrc")


def test_a_prebuilt_module_for_this_torch_is_used(prebuilt, without_sources):
    prebuilt(torch.__version__)
    config = native.build_config()
    assert config.prebuilt_torch == torch.__version__ and config.module_name == native.PREBUILT_MODULE
    assert not config.with_cuda and config.cuda_skip_reason == "a CPU-only build"
    assert native.build_info() == f"prebuilt wheel (torch {torch.__version__}, cpu)"


def test_a_prebuilt_module_for_another_torch_is_refused_naming_both(prebuilt, without_sources):
    prebuilt("2.11.0+cu130")
    both = rf"torch 2\.11\.0\+cu130.*torch {re.escape(torch.__version__)}"
    with pytest.raises(native.NativeBuildError, match=both):
        native.build_config()


def test_without_a_prebuilt_module_or_sources_the_error_says_how_to_install(without_sources, monkeypatch, tmp_path):
    monkeypatch.setattr(native, "PREBUILT_INFO", tmp_path / "absent.json")
    with pytest.raises(native.NativeBuildError, match="--no-build-isolation"):
        native.build_config()


def test_with_sources_a_prebuilt_module_for_another_torch_gives_way_to_building_them(prebuilt, capsys):
    prebuilt("2.11.0+cu130", native.source_hash())
    first, second = native.build_config(), native.build_config()
    assert first.prebuilt_torch is None and first == second and first.sources
    assert native.build_info().startswith("built on first use in ")
    assert capsys.readouterr().err.count("compiled for torch 2.11.0+cu130") == 1, "said once"


def test_sources_changed_since_the_prebuilt_module_are_built_instead(prebuilt):
    prebuilt(torch.__version__, "stale")
    assert native.build_config().prebuilt_torch is None


def run_checked(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    completed = subprocess.run(command, capture_output=True, text=True, timeout=900, **kwargs)
    assert completed.returncode == 0, f"{command} failed:\n{completed.stdout}\n{completed.stderr}"
    return completed


@pytest.mark.slow
def test_a_wheel_installs_and_runs_outside_the_source_tree(tmp_path):
    """`pip wheel --no-build-isolation .`, installed into a fresh venv that reuses this venv's dependencies."""
    wheels = tmp_path / "wheels"
    # In-tree build: ninja reuses the objects in build/temp.* of an earlier run, so only changed sources
    # recompile; build/lib.* is copied anew, so that a module moved away since then is not packaged.
    for stale in REPO.glob("build/lib.*"):
        shutil.rmtree(stale)
    run_checked([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q", "-w", str(wheels),
                 str(REPO)], cwd=REPO)
    (wheel,) = wheels.glob("morphpipe-*.whl")
    assert f"+torch{torch.__version__.replace('+', '.')}-" in wheel.name, "tagged with the torch it was built for"

    venv = tmp_path / "venv"
    run_checked([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    (venv_site,) = (venv / "lib").glob("python*/site-packages")
    # torch & co. from this venv; its .pth files (the editable morphpipe) are not processed from there.
    (venv_site / "dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    run_checked([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q", "--no-deps",
                 "--ignore-installed", str(wheel)])

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    env |= {"MORPHPIPE_BUILD_DIR": str(tmp_path / "build"), "MORPHPIPE_DATA_DIR": str(tmp_path / "data")}
    where = run_checked([str(venv / "bin" / "python"), "-c", "import morphpipe; print(morphpipe.__file__)"],
                        cwd=elsewhere, env=env)
    assert Path(where.stdout.strip()).is_relative_to(venv_site)
    info = run_checked([str(venv / "bin" / "morphpipe"), "info"], cwd=elsewhere, env=env)
    assert f"prebuilt wheel (torch {torch.__version__}" in info.stdout
    bench = run_checked([str(venv / "bin" / "morphpipe"), "bench", "tiny", "--threads", "1", "--batches", "2",
                         "--batch-size", "64"], cwd=elsewhere, env=env)
    assert "batches/s" in bench.stdout
    assert not (tmp_path / "build").exists() or not any((tmp_path / "build").rglob("*.so")), "nothing compiled"
