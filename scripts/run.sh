#!/usr/bin/env bash
# Set up Corral in .venv and run it on its embedded default: the control plane on SQLite in the
# data directory, this machine registered as its node (`corral up`). Ctrl-C stops it.
# Extra arguments go to `corral up` (e.g. --gpus 8 --gpu-model H100-80GB, --port 8401).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/corral cluster check examples/lab.yaml
echo "Corral is starting. From another terminal: .venv/bin/corral submit --gpus 1 -- python train.py"
exec .venv/bin/corral up "$@"
