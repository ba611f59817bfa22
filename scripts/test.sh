#!/usr/bin/env bash
# Everything CI checks, from a fresh clone: set-up, lint, types, layer contracts, tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/torch.sh  # CPU PyTorch for the multi-host tests (tests/multihost)
bash scripts/bwrap.sh  # bubblewrap: the agent binds jobs' mounts with it
bash scripts/browser.sh  # Debian's Chromium for the dashboard's browser tests (tests/web)
echo "== ruff"; .venv/bin/ruff check src tests bench
echo "== ruff format"; .venv/bin/ruff format --check src tests bench
echo "== mypy"; .venv/bin/mypy
echo "== import-linter"; .venv/bin/lint-imports
echo "== compiled core"
[ "$(.venv/bin/python -m corral.build_native status)" = compiled ] || { echo "the core did not compile (scripts/setup.sh)" >&2; exit 1; }
echo "== postgresql (the control plane's tests run on SQLite and on PostgreSQL)"
if [ -z "${CORRAL_TEST_DATABASE_URL:-}" ]; then
  eval "$(bash scripts/postgres.sh start)"
  trap 'bash scripts/postgres.sh stop' EXIT
fi
if ! bash scripts/prerequisites.sh; then
  if [ "${CI:-}" = true ]; then
    echo "CI=true: provide what is missing above (under CI a skipped test fails the run: tests/conftest.py)" >&2
    exit 1
  fi
  echo "the tests that need what is missing will skip (under CI=true they would fail)" >&2
fi
echo "== pytest"
set +e
.venv/bin/pytest -q -p no:cacheprovider "$@"
rc=$?
if [ "$rc" -eq 0 ] && [ "$#" -eq 0 ]; then
  echo "== pytest: the core and the simulator interpreted (CORRAL_PURE_PYTHON=1), as where nothing compiled"
  CORRAL_PURE_PYTHON=1 .venv/bin/pytest -q -p no:cacheprovider tests/core tests/sim
  rc=$?
fi
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure here" >&2
  exit 1
fi
exit "$rc"
