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
# The compiled core (src/corral/native.py): mypyc compiles the scheduling core, the policies and the
# simulator's hot loop to C (about a minute; skipped when already built for these sources). Without
# a C compiler everything runs interpreted, about half as fast.
if ! .venv/bin/python -m corral.build_native build; then
  echo "warning: the core could not be compiled (it needs gcc and Python's headers); Corral runs interpreted" >&2
fi
