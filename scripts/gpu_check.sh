#!/usr/bin/env bash
# First contact with a GPU: runs the GPU tests, the Route 1 self-check and the GPU benchmarks, and writes one
# report (markdown + JSON); see scripts/gpu_check.py. Exits 2 without CUDA. Python: $PYTHON, else .venv's.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
exec "$PYTHON" scripts/gpu_check.py "$@"
