#!/usr/bin/env bash
# PyTorch (CPU build) for the multi-host tests' gloo all-reduce and torchrun (idempotent).
# pip, not uv: pip takes the CPU wheel these machines keep locally; uv would fetch a CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
if .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  exit 0
fi
echo "== torch (CPU build, about a minute)"
.venv/bin/pip install --quiet --disable-pip-version-check torch==2.13.0
