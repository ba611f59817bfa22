#!/usr/bin/env bash
# What the test suite needs from the machine, checked before the tests (scripts/test.sh): each
# missing piece is named with the fix. Without them the tests that need them skip; under CI
# (CI=true) a skip fails the run (tests/conftest.py), so this says why up front.
# Exit status: 0 when everything is there, 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
missing=0
need() {  # need NAME FIX COMMAND...
  local name=$1 fix=$2
  shift 2
  if "$@" >/dev/null 2>&1; then
    echo "  ok       $name"
  else
    echo "  MISSING  $name: $fix"
    missing=1
  fi
}
netns() {
  local name="corral-prereq-$$"
  ip netns add "$name" && ip netns del "$name"
}
cgroups() {  # a group can be made under this process's own cgroup v2 group (what the agent does)
  local mount own probe
  mount=$(awk '$3 == "cgroup2" {print $2; exit}' /proc/self/mounts)
  own=$(sed -n 's/^0:://p' /proc/self/cgroup)
  [ -n "$mount" ] && [ -n "$own" ] || return 1
  probe="$mount${own%/}/corral-prereq-$$"
  mkdir "$probe" && rmdir "$probe"
}
traces() {
  local dir=${CORRAL_TRACES_DIR:-../shared/traces}
  [ -f "$dir/README.md" ]
}
echo "== prerequisites of the test suite"
need "root" "run the tests as root (the sandbox's uid tests, namespaces, cgroups)" test "$(id -u)" = 0
need "network namespaces (tests/multihost)" "root, and the iproute2 package (ip netns add)" netns
need "a writable cgroup v2 hierarchy (tests/agent/test_sandbox.py)" "root on a machine with cgroup2 mounted" cgroups
need "../shared/traces (tests/sim)" "put the shared traces there, or set CORRAL_TRACES_DIR" traces
need "bubblewrap (tests/agent/test_sandbox.py)" "bash scripts/bwrap.sh" command -v bwrap
need "Chromium (tests/web)" "bash scripts/browser.sh" test -x /usr/bin/chromium
need "PyTorch (tests/multihost)" "bash scripts/torch.sh" .venv/bin/python -c "import torch"
need "PostgreSQL (tests/server, tests/store, tests/scenarios)" \
  'eval "$(bash scripts/postgres.sh start)" (sets CORRAL_TEST_DATABASE_URL)' test -n "${CORRAL_TEST_DATABASE_URL:-}"
exit "$missing"
