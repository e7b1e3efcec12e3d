#!/usr/bin/env bash
# Create .venv and install haloflow with its test extra.
# torch==2.13.0 goes in first: it is the CPU build; a bare `torch` requirement would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check "torch==${HALOFLOW_TORCH_VERSION:-2.13.0}" 2> >(grep -v "is ignored" >&2)
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[test]" 2> >(grep -v "is ignored" >&2)
