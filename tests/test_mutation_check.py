"""The bounded mutation check CI runs: no mutant is stale, and the CI subset of mutants is killed.

`scripts/mutation_check.py --ci` runs the fixed subset (the mutants marked `ci` in
scripts/mutants.py: one per bug class the suite once missed) plus one more Python mutant that
rotates with the date; `python scripts/mutation_check.py --all` runs every mutant, C++ too.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import mutation_check  # noqa: E402


def test_every_mutant_is_anchored_exactly_once() -> None:
    stale = {m["name"]: mutation_check.anchor_count(m) for m in mutation_check.MUTANTS
             if mutation_check.anchor_count(m) != 1}
    assert stale == {}, f"stale mutants (text found that many times; re-anchor them in scripts/mutants.py): {stale}"
    assert len({m["name"] for m in mutation_check.MUTANTS}) == len(mutation_check.MUTANTS) >= 25


def test_mutated_text_changes_exactly_the_anchor() -> None:
    for mutant in mutation_check.MUTANTS:
        original = (ROOT / mutant["file"]).read_text()
        mutated = mutation_check.mutated_text(mutant)
        assert mutated != original and mutated.count(mutant["replace"]) >= 1, mutant["name"]
        assert len(mutated) - len(original) == len(mutant["replace"]) - len(mutant["find"])


@pytest.mark.mutation
def test_ci_subset_of_mutants_is_killed(tmp_path) -> None:
    report = tmp_path / "mutation.json"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "mutation_check.py"), "--ci", "--timeout", "300",
                           "--json", str(report)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert report.exists(), done.stdout + done.stderr
    results = json.loads(report.read_text())
    survivors = [m for m in results["mutants"] if m["status"] != "killed"]
    assert survivors == [] and done.returncode == 0, done.stdout + done.stderr
    assert results["counts"]["killed"] >= 7
