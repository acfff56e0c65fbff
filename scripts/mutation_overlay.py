"""pytest plugin for `scripts/mutation_check.py`: imports one module from its mutated scratch copy.

`MORPHPIPE_MUTANT_MODULE` names the module (e.g. `morphpipe.executor.executor`) and
`MORPHPIPE_MUTANT_FILE` the mutated copy of its source. The plugin is loaded with `-p` before
any test imports morphpipe, so every import of that module gets the copy; the working tree is
never touched. At the end it writes to `MORPHPIPE_MUTANT_REPORT` whether the copy was imported
(a mutant whose module no selected test imports is not exercised, and says so). Without
`MORPHPIPE_MUTANT_MODULE` it only reports where morphpipe was imported from.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import json
import os
import sys
from pathlib import Path

_MODULE = os.environ.get("MORPHPIPE_MUTANT_MODULE")
_FILE = os.environ.get("MORPHPIPE_MUTANT_FILE")
_ORIGINAL_DIR = os.environ.get("MORPHPIPE_MUTANT_PACKAGE_DIR")


class _MutantFinder(importlib.abc.MetaPathFinder):
    """Finds the mutated module at its scratch path; every other import goes on as usual."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != _MODULE:
            return None
        locations = [_ORIGINAL_DIR] if _FILE.endswith("__init__.py") and _ORIGINAL_DIR else None
        return importlib.util.spec_from_file_location(fullname, _FILE, submodule_search_locations=locations)


if _MODULE and _FILE:
    if _MODULE in sys.modules:
        raise RuntimeError(f"{_MODULE} was imported before the mutation overlay; load it with -p first")
    sys.meta_path.insert(0, _MutantFinder())


def pytest_unconfigure(config) -> None:
    """Records which files the session actually imported."""
    report = os.environ.get("MORPHPIPE_MUTANT_REPORT")
    if not report:
        return
    module = sys.modules.get(_MODULE) if _MODULE else None
    package = sys.modules.get("morphpipe")
    Path(report).write_text(json.dumps({
        "mutant_imported": bool(module is not None and getattr(module, "__file__", None) == _FILE),
        "morphpipe_file": getattr(package, "__file__", None),
    }))
