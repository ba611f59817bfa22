#!/usr/bin/env bash
# Debian's Chromium for the dashboard's browser tests (tests/web drive it with Playwright, which
# never downloads a browser: no `playwright install`). Idempotent: nothing to do when
# /usr/bin/chromium is there; otherwise about 30 s.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
  exit 0
fi
echo "== chromium (Debian package, for tests/web)"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get install -y -q chromium >/dev/null || { $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q chromium >/dev/null; }
/usr/bin/chromium --version
