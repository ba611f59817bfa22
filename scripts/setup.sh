#!/usr/bin/env bash
# Create .venv and install Corral with its development tools (idempotent; about 10 s with uv).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
if [ ! -x .venv/bin/uv ]; then
  .venv/bin/pip install --quiet --disable-pip-version-check uv==0.13.8 || .venv/bin/pip install --quiet uv
fi
.venv/bin/uv pip install --quiet --python .venv/bin/python --compile-bytecode -e '.[dev]'
