#!/usr/bin/env bash
# bubblewrap, with which the node agent makes a job's bind mounts (idempotent; a few seconds).
set -euo pipefail
if command -v bwrap >/dev/null 2>&1; then
  exit 0
fi
echo "== bubblewrap (Debian package)"
if [ "$(id -u)" -eq 0 ]; then
  apt-get install -y -q bubblewrap >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q bubblewrap >/dev/null; }
else
  sudo apt-get install -y -q bubblewrap >/dev/null
fi
