#!/usr/bin/env bash
# Creates ./.venv (once) with torch pinned to the CPU build on local disk, then installs
# morphpipe in editable mode (the native ops compile from csrc/ on first use); with --test also
# its test extras (pytest, hypothesis, torch_geometric). Safe to run again; prints what it does.
# --no-build-isolation: setup.py must see the torch of .venv (see setup.py), never download another.
# MORPHPIPE_TORCH overrides the torch requirement (e.g. "torch==2.11.0" on a CUDA machine).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
torch_requirement=${MORPHPIPE_TORCH:-torch==2.13.0}
target="."
case "${1:-}" in
  "") ;;
  --test) target=".[test]" ;;
  *) echo "usage: bash scripts/setup_venv.sh [--test]   (--test also installs the test dependencies)" >&2; exit 2 ;;
esac

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $($python --version)"
  "$python" -m venv .venv
fi
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  echo "setup: installing $torch_requirement"
  .venv/bin/python -m pip install -q "$torch_requirement"
fi
if [ "$target" = "." ]; then
  echo "setup: installing morphpipe (editable)"
else
  echo "setup: installing morphpipe (editable) and test dependencies"
fi
.venv/bin/python -m pip install -q "setuptools>=70.1"  # the build backend, with bdist_wheel
.venv/bin/python -m pip install -q --no-build-isolation -e "$target"
