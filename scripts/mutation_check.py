"""Mutation check: put each small deliberate bug of scripts/mutants.py into a scratch copy and run its tests.

A mutant is killed when its tests fail (or time out), survives when they pass. Every mutant's
`find` text must occur exactly once in its file; one that does not is "stale" (the code moved
on: re-anchor it) and fails the check loudly, as a survivor does.

- Python mutants: the mutated module is written to a scratch directory and imported from there
  by a pytest plugin (scripts/mutation_overlay.py) in a fresh pytest process; the working tree
  and the native build are untouched, so no recompilation is needed.
- C++ mutants (csrc/): the working tree (tracked and untracked, not ignored, files) is copied to
  a scratch directory, mutated there, and tested with its own MORPHPIPE_BUILD_DIR (one native
  compile, about 60 s on 2 cores, each); they run only with --all.

Usage:
  python scripts/mutation_check.py            # every Python mutant
  python scripts/mutation_check.py --all      # every mutant, C++ too
  python scripts/mutation_check.py --ci       # the fixed CI subset plus one rotating Python mutant
  python scripts/mutation_check.py --only NAME [NAME ...]   |   --list   |   --json out.json
Exit status: 0 when every selected mutant is killed and no mutant is stale, 1 otherwise.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"
sys.path.insert(0, str(SCRIPTS))

from mutants import MUTANTS  # noqa: E402  (the table lives beside this script)

NATIVE_SUFFIXES = (".cpp", ".h", ".cu", ".cuh")


@dataclass
class Outcome:
    """What happened to one mutant."""

    name: str
    file: str
    status: str  # killed | survived | stale | error
    tests: list[str]
    seconds: float = 0.0
    detail: str = ""
    failed: list[str] = field(default_factory=list)


def is_native(mutant: dict) -> bool:
    return mutant["file"].endswith(NATIVE_SUFFIXES)


def anchor_count(mutant: dict, root: Path = ROOT) -> int:
    """How often the mutant's `find` text occurs in its file (0 when the file is gone)."""
    path = root / mutant["file"]
    return path.read_text().count(mutant["find"]) if path.exists() else 0


def mutated_text(mutant: dict, root: Path = ROOT) -> str:
    return (root / mutant["file"]).read_text().replace(mutant["find"], mutant["replace"], 1)


def module_name(relative: str) -> str:
    parts = list(Path(relative).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def failed_tests(output: str) -> list[str]:
    return [line.split(" ", 2)[1] for line in output.splitlines() if line.startswith(("FAILED ", "ERROR "))][:5]


def run_pytest(tests: list[str], cwd: Path, env: dict[str, str], timeout_s: float) -> tuple[str, str, list[str]]:
    """Runs the tests; (status, detail, failed test ids): killed on failures or timeout, survived on a pass."""
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p", "mutation_overlay",
               "--rootdir", str(cwd), *tests]
    try:
        done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return "killed", f"timed out after {timeout_s:.0f} s", []
    output = done.stdout + done.stderr
    if done.returncode == 0:
        return "survived", output.strip().splitlines()[-1] if output.strip() else "", []
    if done.returncode == 1:
        return "killed", "", failed_tests(output)
    return "error", f"pytest exit status {done.returncode}: {output[-1500:]}", []


def base_env(scratch: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SCRIPTS), env.get("PYTHONPATH")]))
    env["MORPHPIPE_MUTANT_REPORT"] = str(scratch / "report.json")
    for name in ("MORPHPIPE_MUTANT_MODULE", "MORPHPIPE_MUTANT_FILE", "MORPHPIPE_MUTANT_PACKAGE_DIR"):
        env.pop(name, None)
    return env


def read_report(scratch: Path) -> dict:
    path = scratch / "report.json"
    return json.loads(path.read_text()) if path.exists() else {}


def check_python(mutant: dict, scratch: Path, timeout_s: float) -> Outcome:
    """Imports the mutated module from a scratch copy while its tests run."""
    copy = scratch / mutant["file"]
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_text(mutated_text(mutant))
    env = base_env(scratch)
    env["MORPHPIPE_MUTANT_MODULE"] = module_name(mutant["file"])
    env["MORPHPIPE_MUTANT_FILE"] = str(copy)
    env["MORPHPIPE_MUTANT_PACKAGE_DIR"] = str((ROOT / mutant["file"]).parent)
    started = time.perf_counter()
    for _ in range(mutant.get("runs", 1)):  # survived only if every run passes (a wall-clock trace may hide a bug once)
        status, detail, failed = run_pytest(mutant["tests"], ROOT, env, timeout_s)
        if status != "survived":
            break
    report = read_report(scratch)
    if status == "survived" and not report.get("mutant_imported"):
        status, detail = "error", "the selected tests never imported the mutated module"
    return Outcome(mutant["name"], mutant["file"], status, mutant["tests"], time.perf_counter() - started, detail,
                   failed)


def tree_files() -> list[str]:
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True,
                            check=True).stdout.decode()
    return [name for name in listed.split("\0") if name and (ROOT / name).is_file()]


def check_native(mutant: dict, scratch: Path, build_prefix: str, timeout_s: float) -> Outcome:
    """Copies the working tree, mutates the C++ source, rebuilds into its own build dir and runs the tests."""
    tree = scratch / "tree"
    for name in tree_files():
        target = tree / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target)
    (tree / mutant["file"]).write_text(mutated_text(mutant))
    env = base_env(scratch)
    env["PYTHONPATH"] = os.pathsep.join([str(tree), env["PYTHONPATH"]])
    env["MORPHPIPE_BUILD_DIR"] = f"{build_prefix}-{mutant['name']}"
    started = time.perf_counter()
    status, detail, failed = run_pytest(mutant["tests"], tree, env, timeout_s)
    imported_from = read_report(scratch).get("morphpipe_file") or ""
    if status == "survived" and not imported_from.startswith(str(tree)):
        status, detail = "error", f"morphpipe was imported from {imported_from}, not the scratch copy"
    return Outcome(mutant["name"], mutant["file"], status, mutant["tests"], time.perf_counter() - started, detail,
                   failed)


def select(args: argparse.Namespace) -> list[dict]:
    python = [m for m in MUTANTS if not is_native(m)]
    if args.only:
        unknown = set(args.only) - {m["name"] for m in MUTANTS}
        if unknown:
            raise SystemExit(f"--only: no mutant named {sorted(unknown)}; see --list")
        return [m for m in MUTANTS if m["name"] in args.only]
    if args.all:
        return list(MUTANTS)
    if args.ci:
        fixed = [m for m in python if m.get("ci")]
        others = [m for m in python if not m.get("ci")]
        day = args.rotate if args.rotate is not None else datetime.date.today().toordinal()
        return fixed + ([others[day % len(others)]] if others else [])
    return python


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--all", action="store_true", help="every mutant, C++ ones too (one native build each)")
    mode.add_argument("--ci", action="store_true", help="the fixed CI subset plus one rotating Python mutant")
    mode.add_argument("--only", nargs="+", metavar="NAME", help="just these mutants")
    parser.add_argument("--rotate", type=int, help="rotation index for --ci (default: today's date)")
    parser.add_argument("--list", action="store_true", help="list the mutants and their tests, run nothing")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds per mutant before it counts as killed")
    parser.add_argument("--build-prefix", default=None,
                        help="prefix of the C++ mutants' build dirs (default: $MORPHPIPE_BUILD_DIR-mut)")
    args = parser.parse_args(argv)

    if args.list:
        for m in MUTANTS:
            kind = "C++" if is_native(m) else ("py, ci" if m.get("ci") else "py")
            print(f"{m['name']:48s} {kind:7s} {m['file']:38s} {' '.join(m['tests'])}")
        return 0

    stale = [Outcome(m["name"], m["file"], "stale", m["tests"],
                     detail=f"its text occurs {anchor_count(m)} times in {m['file']}, expected once")
             for m in MUTANTS if anchor_count(m) != 1]
    stale_names = {o.name for o in stale}
    selected = [m for m in select(args) if m["name"] not in stale_names]
    build_prefix = args.build_prefix or (os.environ.get("MORPHPIPE_BUILD_DIR", str(Path.home() / ".cache" /
                                                                                  "morphpipe" / "build")) + "-mut")
    outcomes: list[Outcome] = []
    for mutant in selected:
        with tempfile.TemporaryDirectory(prefix=f"morphpipe-mutant-{mutant['name']}-") as scratch:
            if is_native(mutant):
                outcome = check_native(mutant, Path(scratch), build_prefix, args.timeout)
            else:
                outcome = check_python(mutant, Path(scratch), args.timeout)
        outcomes.append(outcome)
        print(f"{outcome.status:9s} {outcome.name:48s} {outcome.seconds:6.1f} s  "
              f"{', '.join(outcome.failed[:2]) or outcome.detail[:120]}", flush=True)

    for outcome in stale:
        print(f"STALE     {outcome.name:48s} {outcome.detail}  (re-anchor it in scripts/mutants.py)", flush=True)
    counts = {status: sum(o.status == status for o in outcomes + stale)
              for status in ("killed", "survived", "error", "stale")}
    print("mutation check: " + ", ".join(f"{count} {status}" for status, count in counts.items()))
    if args.json:
        args.json.write_text(json.dumps({"counts": counts, "mutants": [asdict(o) for o in outcomes + stale]},
                                        indent=2))
    return 0 if counts["killed"] == len(outcomes) and not stale else 1


if __name__ == "__main__":
    raise SystemExit(main())
