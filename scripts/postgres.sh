#!/usr/bin/env bash
# Start a throw-away PostgreSQL (Debian's packages; installed when missing) for the tests, and
# print `export CORRAL_TEST_DATABASE_URL=...`. Usage: eval "$(bash scripts/postgres.sh start)";
# bash scripts/postgres.sh stop. Needs root (initdb runs as the postgres user).
set -euo pipefail
STATE=${CORRAL_PG_STATE:-/tmp/corral-test-pg}
PGPORT=${CORRAL_PG_PORT:-55432}
case "${1:-start}" in
start)
  if ! ls -d /usr/lib/postgresql/*/bin >/dev/null 2>&1; then
    echo "installing postgresql from Debian's packages" >&2
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null) >&2
  fi
  PGBIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
  if [ -f "$STATE/data/postmaster.pid" ] && runuser -u postgres -- "$PGBIN/pg_ctl" -D "$STATE/data" status >/dev/null 2>&1; then
    :
  else
    rm -rf "$STATE"; mkdir -p "$STATE"; chown postgres: "$STATE"
    runuser -u postgres -- "$PGBIN/initdb" -D "$STATE/data" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 -N >/dev/null
    runuser -u postgres -- "$PGBIN/pg_ctl" -D "$STATE/data" -l "$STATE/log" -w -t 30 \
      -o "-h 127.0.0.1 -p $PGPORT -k $STATE -c fsync=off -c max_connections=300" start >&2
  fi
  echo "export CORRAL_TEST_DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:$PGPORT/postgres"
  ;;
stop)
  PGBIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
  runuser -u postgres -- "$PGBIN/pg_ctl" -D "$STATE/data" -m immediate -w stop >/dev/null 2>&1 || true
  rm -rf "$STATE"
  ;;
esac
