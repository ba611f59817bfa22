#!/usr/bin/env bash
# Set up Corral in .venv and run it on the example cluster: validate it, then dry-run one cycle.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/corral cluster check examples/lab.yaml
set +e
.venv/bin/corral plan --cluster examples/lab.yaml examples/jobs/*.yaml
rc=$?
set -e
# exit code 1 means "a job was rejected": the example includes one on purpose
[ "$rc" -le 1 ] || exit "$rc"
