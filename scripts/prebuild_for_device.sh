#!/usr/bin/env bash
# Compiles the native ops, CUDA kernels included, for the lent GPU machine (Python 3.12, torch 2.11.0+cu130,
# sm_90) on this machine, so that a short lease spends no time compiling. It makes a Python 3.12 venv with that
# torch, builds the wheel with `pip wheel --no-build-isolation` and unpacks the module and its
# _native_build.json into .devbuild/ (ignored by git). On the device: carry .devbuild and run
# `cp .devbuild/* morphpipe/` first; native.py then loads it as a prebuilt module (same torch, same csrc/ hash).
# Usage: scripts/prebuild_for_device.sh [VENV]   (VENV default: .device-venv; PYTHON312, CUDA_HOME may be set)
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-.device-venv}"
torch_version="2.11.0"   # the device image's torch (docs/gpu-route.md, 'First contact with a GPU')
arch="9.0"               # H100 and H200
runs_312() { [ -n "$1" ] && "$1" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; }
python312=""
for candidate in "${PYTHON312:-}" "$(command -v python3.12 || true)" \
    $(command -v pyenv >/dev/null && ls -d "$(pyenv root)"/versions/3.12*/bin/python3.12 2>/dev/null); do
  if runs_312 "$candidate"; then python312="$candidate"; break; fi
done
[ -n "$python312" ] || { echo "prebuild_for_device: no working Python 3.12 found; set PYTHON312" >&2; exit 1; }
cuda_home="${CUDA_HOME:-$(ls -d /usr/local/cuda-13* 2>/dev/null | tail -1)}"
[ -f "$cuda_home/include/cuda_runtime.h" ] || {
  echo "prebuild_for_device: no CUDA 13 toolkit (set CUDA_HOME to a root with include/cuda_runtime.h)" >&2; exit 1; }
if [ ! -x "$venv/bin/python" ]; then
  mkdir -p "$venv" 2>/dev/null && [ -w "$venv" ] || {
    echo "prebuild_for_device: VENV $venv cannot be created or written; give a writable folder" >&2; exit 2; }
  "$python312" -m venv "$venv"
  "$venv/bin/pip" install -q "torch==$torch_version" numpy ninja setuptools wheel
fi
"$venv/bin/python" -c "import torch, sys; v = torch.__version__
sys.exit(0 if v == '$torch_version+cu130' else f'prebuild_for_device: {v} in $venv, not $torch_version+cu130')"
dist="$(mktemp -d)"
CUDA_HOME="$cuda_home" PATH="$cuda_home/bin:$PATH" TORCH_CUDA_ARCH_LIST="$arch" MAX_JOBS="$(nproc)" \
  "$venv/bin/pip" wheel -q --no-build-isolation --no-deps . -w "$dist"
rm -rf .devbuild && mkdir -p .devbuild
unzip -o -j -q "$dist"/morphpipe-*.whl 'morphpipe/_native*' -d .devbuild
rm -rf "$dist"
echo "prebuild_for_device: .devbuild/ holds $(ls .devbuild | tr '\n' ' ')"
