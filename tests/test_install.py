"""morphpipe installed as users install it: a wheel, with the native ops compiled in or their sources packaged.

The fast tests check how native.py chooses between a prebuilt module and building sources (packaged or
the checkout's csrc/) on first use. The slow ones build both wheels, install each into a fresh venv and
run commands that need the native ops from a directory that is not the repository: the prebuilt wheel
(`--no-build-isolation`, one compile of the native ops) and the plain isolated build's wheel, whose
packaged sources compile on first use; that second compile is skipped in CI (CI=true) to keep it to
one extra compile, and the CI test of that wheel checks its sources and build choice without it.
"""
from __future__ import annotations

import argparse
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

import morphpipe
from morphpipe import native
from morphpipe.commands import info
from morphpipe.sampling.backend_check import verdict_rows

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
    assert native.build_info().startswith(f"built on first use from the source checkout in {native.CSRC_DIR} (")
    assert capsys.readouterr().err.count("compiled for torch 2.11.0+cu130") == 1, "said once"


def test_sources_changed_since_the_prebuilt_module_are_built_instead(prebuilt):
    prebuilt(torch.__version__, "stale")
    assert native.build_config().prebuilt_torch is None


def test_packaged_sources_are_built_and_named_as_such(prebuilt, monkeypatch, tmp_path):
    packaged = tmp_path / "morphpipe" / "_csrc"
    shutil.copytree(native.CSRC_DIR, packaged)
    monkeypatch.setattr(native, "PACKAGED_CSRC", packaged)
    monkeypatch.setattr(native, "CSRC_DIR", packaged)
    prebuilt("2.11.0+cu130", native.source_hash())  # a module for another torch gives way to them too
    config = native.build_config()
    assert config.prebuilt_torch is None and all(path.is_relative_to(packaged) for path in config.sources)
    assert native.build_info().startswith(f"built on first use from the packaged sources in {packaged} (")


def test_info_without_native_ops_says_not_built(without_sources, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(native, "PREBUILT_INFO", tmp_path / "absent.json")
    assert verdict_rows() == [("Route 1 self-check", "unknown: the native ops are not built")]
    assert info.run(argparse.Namespace(verbose=False)) == 1
    rows = capsys.readouterr().out.splitlines()
    assert any(row.startswith("native ops") and "NOT BUILT: morphpipe was installed without" in row for row in rows)


def run_checked(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    completed = subprocess.run(command, capture_output=True, text=True, timeout=900, **kwargs)
    assert completed.returncode == 0, f"{command} failed:\n{completed.stdout}\n{completed.stderr}"
    return completed


def build_wheel(out: Path, *isolation: str) -> Path:
    """`pip wheel [ISOLATION] --no-deps .` of this repository into `out`. In-tree, so ninja reuses the objects in
    build/temp.* of an earlier run; build/lib* is copied anew, so that a module moved away since is not packaged."""
    for stale in REPO.glob("build/lib*"):
        shutil.rmtree(stale)
    run_checked([sys.executable, "-m", "pip", "wheel", *isolation, "--no-deps", "-q", "-w", str(out), str(REPO)],
                cwd=REPO)
    (wheel,) = out.glob("morphpipe-*.whl")
    return wheel


def install_in_fresh_venv(wheel: Path, venv: Path) -> Path:
    """Installs `wheel` alone into a new venv that reuses this venv's dependencies; returns its site-packages."""
    run_checked([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    (venv_site,) = (venv / "lib").glob("python*/site-packages")
    # torch & co. from this venv; its .pth files (the editable morphpipe) are not processed from there.
    (venv_site / "dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    run_checked([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q", "--no-deps",
                 "--ignore-installed", str(wheel)])
    return venv_site


def outside_env(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A working directory outside the repository, and an environment with a build and data dir of the test's own."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    env |= {"MORPHPIPE_BUILD_DIR": str(tmp_path / "build"), "MORPHPIPE_DATA_DIR": str(tmp_path / "data")}
    return elsewhere, env


def info_and_bench(venv: Path, tmp_path: Path) -> str:
    """`morphpipe info` (returned) and a short `morphpipe bench tiny`, run in the venv outside the source tree."""
    elsewhere, env = outside_env(tmp_path)
    info_run = run_checked([str(venv / "bin" / "morphpipe"), "info"], cwd=elsewhere, env=env)
    bench = run_checked([str(venv / "bin" / "morphpipe"), "bench", "tiny", "--threads", "1", "--batches", "2",
                         "--batch-size", "64"], cwd=elsewhere, env=env)
    assert "batches/s" in bench.stdout
    return info_run.stdout


def compiled(tmp_path: Path) -> bool:
    return (tmp_path / "build").exists() and any((tmp_path / "build").rglob("*.so"))


@pytest.mark.slow
def test_a_wheel_installs_and_runs_outside_the_source_tree(tmp_path):
    """`pip wheel --no-build-isolation .`, installed into a fresh venv that reuses this venv's dependencies."""
    wheel = build_wheel(tmp_path / "wheels", "--no-build-isolation")
    assert f"+torch{torch.__version__.replace('+', '.')}-" in wheel.name, "tagged with the torch it was built for"
    venv = tmp_path / "venv"
    venv_site = install_in_fresh_venv(wheel, venv)
    elsewhere, env = outside_env(tmp_path)
    where = run_checked([str(venv / "bin" / "python"), "-c", "import morphpipe; print(morphpipe.__file__)"],
                        cwd=elsewhere, env=env)
    assert Path(where.stdout.strip()).is_relative_to(venv_site)
    assert f"prebuilt wheel (torch {torch.__version__}" in info_and_bench(venv, tmp_path)
    assert not compiled(tmp_path), "nothing compiled"


@pytest.fixture(scope="module")
def packaged_sources_install(tmp_path_factory) -> tuple[Path, Path, Path]:
    """The plain `pip wheel --no-deps .` (isolated: setuptools from the index, no torch) installed into a fresh venv;
    returns the wheel, the venv and its site-packages."""
    root = tmp_path_factory.mktemp("packaged")
    wheel = build_wheel(root / "wheels")
    venv = root / "venv"
    return wheel, venv, install_in_fresh_venv(wheel, venv)


@pytest.mark.slow
def test_an_isolated_build_packages_the_sources_for_the_first_use(packaged_sources_install, tmp_path):
    """The wheel is pure and untagged; installed, native.py picks its packaged sources (same hash as csrc/)."""
    wheel, venv, venv_site = packaged_sources_install
    assert wheel.name == f"morphpipe-{morphpipe.__version__}-py3-none-any.whl"
    elsewhere, env = outside_env(tmp_path)
    probe = ("from morphpipe import native; config = native.build_config(); "
             "print(native.CSRC_DIR, config.source_hash, config.prebuilt_torch, native.build_info(), sep='\\n')")
    csrc, source_hash, prebuilt_torch, build_info = run_checked(
        [str(venv / "bin" / "python"), "-c", probe], cwd=elsewhere, env=env).stdout.splitlines()
    packaged = venv_site / "morphpipe" / "_csrc"
    assert (Path(csrc), source_hash, prebuilt_torch) == (packaged, native.source_hash(), "None")
    assert build_info.startswith(f"built on first use from the packaged sources in {packaged} (")
    assert not list(venv_site.glob("morphpipe/_native*")) and not compiled(tmp_path), "nothing compiled yet"


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("CI", "").lower() in {"true", "1"},
                    reason="a second compile of the native ops; CI compiles the prebuilt wheel's")
def test_packaged_sources_compile_on_first_use_outside_the_source_tree(packaged_sources_install, tmp_path):
    _, venv, venv_site = packaged_sources_install
    info_stdout = info_and_bench(venv, tmp_path)
    assert f"built on first use from the packaged sources in {venv_site / 'morphpipe' / '_csrc'} (" in info_stdout
    assert compiled(tmp_path)
