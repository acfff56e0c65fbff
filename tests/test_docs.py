"""The documentation builds without a warning, documents every public name, and says only what exists:
the README's links, its quick-start commands, and every documented command line.

`mkdocs build --strict` (mkdocs.yml: strict, with link, anchor and omitted-page validation) fails on any warning:
a broken link or anchor, a page left out of the navigation, a docstring griffe cannot parse. One build serves
every check here: 8 s on the project's 2-core machine under load 12-24 (about 2 s of CPU; mkdocstrings reads
every module's source, statically).
"""
from __future__ import annotations

import argparse
import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("data", "sampling", "ops", "nn", "profiler", "partitioner", "scheduler", "executor", "distributed")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site built from mkdocs.yml into a temporary directory (the checkout is left untouched)."""
    for module in ("mkdocs", "mkdocstrings", "mkdocstrings_handlers.python"):
        pytest.importorskip(module, reason=f"{module} is not installed: `pip install -e .[test]` (or .[docs]) "
                                           "installs the documentation tools")
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log
    warnings = [line for line in log.splitlines() if "WARNING" in line]
    assert not warnings, "\n".join(warnings)
    return out


@pytest.mark.parametrize("package", PACKAGES)
def test_every_public_name_has_an_entry(site: Path, package: str) -> None:
    """Each name in the package's __all__ is an anchor of its API page (a function named like its module, as
    `morphpipe.ops.aggregate`, is documented under the module's path)."""
    page = (site / "api" / package / "index.html").read_text()
    anchors = set(re.findall(r'id="(morphpipe\.[^"]+)"', page))
    module = importlib.import_module(f"morphpipe.{package}")
    missing = [name for name in module.__all__
               if f"morphpipe.{package}.{name}" not in anchors and f"morphpipe.{package}.{name}.{name}" not in anchors]
    assert not missing, f"docs/api/{package}.md does not document {missing}"


def test_every_package_face_has_a_page() -> None:
    """A new package face gets its page: every morphpipe sub-package with __all__ is listed in PACKAGES."""
    faces = {path.parent.name for path in (ROOT / "morphpipe").glob("*/__init__.py")
             if "__all__" in path.read_text()}
    missing = sorted(faces - set(PACKAGES))
    assert not missing, f"add docs/api/<name>.md, a nav entry in mkdocs.yml and PACKAGES here for {missing}"


def test_readme_links_exist() -> None:
    """Every relative link of README.md names a file of the checkout."""
    readme = (ROOT / "README.md").read_text()
    targets = [target.split("#")[0] for target in re.findall(r"\]\(([^)\s]+)\)", readme)
               if not re.match(r"[a-z]+:", target)]
    assert targets, "README.md links to no page"
    missing = [target for target in targets if target and not (ROOT / target).exists()]
    assert not missing, f"README.md links to missing files: {missing}"


def test_readme_is_short() -> None:
    """The README is for users (under 10 KB); design and robustness details live in docs/."""
    assert len((ROOT / "README.md").read_bytes()) < 10_000


def test_readme_quick_start_is_what_ci_runs() -> None:
    """.ci/run runs the README's test command verbatim, and the README keeps the one-line main job."""
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"```bash\n(.*?)\n```", readme, re.DOTALL)
    ci_command = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci_command in commands, f"README.md's test command must be .ci/run's last line: {ci_command}"
    assert "bash scripts/setup_venv.sh && .venv/bin/morphpipe tune" in commands


def documented_commands() -> list[tuple[str, list[str]]]:
    """Every `morphpipe ...` and `python examples/...` command in the README's and docs/' bash blocks, as
    (where, arguments after the program)."""
    found = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for block in re.findall(r"```bash\n(.*?)```", page.read_text(), re.DOTALL):
            for line in block.replace("\\\n", " ").splitlines():
                for command in re.split(r"&&|\|", line.split("  #")[0]):
                    words = shlex.split(command)
                    programs = [i for i, word in enumerate(words)
                                if word == "morphpipe" or word.endswith("/morphpipe") or word.startswith("examples/")]
                    if programs:
                        found.append((f"{page.name}: {command.strip()}", words[programs[0]:]))
    for page in [*sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "examples").glob("*.py"))]:
        text = page.read_text().replace("\\\\\n", " ").replace("\\\n", " ")  # continued lines, also in docstrings
        for command in re.findall(r"python (examples/[^`\n]+)", text):
            found.append((f"{page.name}: {command.strip()}", shlex.split(command.split("  #")[0])))
    return found


def test_documented_commands_parse() -> None:
    """Every documented command and flag exists: each parses with the real CLI's (or the example's) parser."""
    from morphpipe.commands.cli import build_parser

    commands = documented_commands()
    assert len(commands) > 20
    for where, words in commands:
        try:
            if words[0].startswith("examples/"):
                spec = importlib.util.spec_from_file_location("documented_example", ROOT / words[0])
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
                module.parse_args(words[1:])
            else:
                build_parser().parse_args(words[1:])
        except SystemExit as exit_:
            pytest.fail(f"{where}: does not parse (exit {exit_.code})")


# Flags the pages name that belong to other programs, with the program.
OTHER_PROGRAMS_FLAGS = {
    "--test": "scripts/setup_venv.sh", "--strict": "mkdocs build", "--no-build-isolation": "pip",
    "--no-deps": "pip", "--nproc-per-node": "torchrun", "--nnodes": "torchrun", "--rdzv-": "torchrun (--rdzv-*)",
    "--all": "scripts/mutation_check.py", "--list": "scripts/mutation_check.py", "--only": "scripts/mutation_check.py",
    "--quick": "scripts/gpu_check.sh", "--step-timeout": "scripts/gpu_check.sh", "--phases": "scripts/bench_link.py",
    "--rounds": "scripts/bench_sampler.py",
}


def option_strings(parser: argparse.ArgumentParser) -> set[str]:
    """Every option of a parser and of its sub-commands."""
    found = set()
    for action in parser._actions:
        found.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= option_strings(sub)
    return found


def test_every_documented_flag_exists(monkeypatch) -> None:
    """Each `--flag` the README or docs/ name, also in running text, is an option of the CLI or of an example
    (or of another program listed above)."""
    from morphpipe.commands.cli import build_parser

    known = option_strings(build_parser()) | set(OTHER_PROGRAMS_FLAGS)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", lambda self, args=None, namespace=None: self)
    for path in sorted((ROOT / "examples").glob("*.py")):
        spec = importlib.util.spec_from_file_location(f"documented_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        known |= option_strings(module.parse_args([]))
    unknown = [f"{page.relative_to(ROOT)}: {flag}"
               for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
               for flag in sorted(set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", page.read_text())))
               if flag not in known]
    assert not unknown, f"documented flags that no parser has: {unknown}"
