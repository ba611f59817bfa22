#!/usr/bin/env bash
# Offline demonstrations: a dry-run cycle of the example jobs, and a real trace through the
# simulator under four policies side by side (needs ../shared/traces beside the checkout).
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
# Sia's Philly-derived workload 1 (160 jobs) on the 32 GPUs of the lab cluster: busy enough that
# the policies differ (the Tiresias testbed trace fits its 60 GPUs without queueing: all four tie)
if .venv/bin/corral trace convert sia workload-1.csv -o .venv/sia-1.csv 2>/dev/null; then
  .venv/bin/corral simulate --cluster examples/lab.yaml --trace .venv/sia-1.csv \
    --policy default --policy fifo --policy las --policy sjf
fi
