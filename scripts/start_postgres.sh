#!/usr/bin/env bash
# Starts a throwaway PostgreSQL for the tests (idempotent: a second call finds it running) and prints
# its URL as the last stdout line, e.g. ECDYSIS_TEST_PG_URL=$(bash scripts/start_postgres.sh | tail -n 1)
#   ECDYSIS_PG_DIR   cluster folder (default /tmp/ecdysis-pg)    ECDYSIS_PG_PORT   port (default 54329)
# Trust authentication on 127.0.0.1 only: this cluster is for tests, never for data you keep.
set -euo pipefail
PGDIR=${ECDYSIS_PG_DIR:-/tmp/ecdysis-pg}
PORT=${ECDYSIS_PG_PORT:-54329}
DB=ecdysis_test
URL="postgresql+psycopg2://postgres@127.0.0.1:${PORT}/${DB}"

# Everything but the URL goes to stderr, so callers can take the last stdout line blindly.
exec 3>&1 1>&2

pg_bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1; }

if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
BIN=$(pg_bin)
if [ -z "$BIN" ] || [ ! -x "$BIN/initdb" ] || [ ! -x "$BIN/pg_ctl" ]; then
  echo "== installing postgresql"
  export DEBIAN_FRONTEND=noninteractive
  # A fresh container has empty package lists: update only when the first attempt cannot find it.
  $SUDO apt-get install -y -q postgresql || { $SUDO apt-get update -q && $SUDO apt-get install -y -q postgresql; }
  BIN=$(pg_bin)
fi

# initdb and postgres refuse to run as root: run the server as the `postgres` user the package made.
if [ "$(id -u)" = 0 ]; then
  OWNER=postgres
  as_owner() { runuser -u postgres -- "$@"; }
else
  OWNER=$(id -un)
  as_owner() { "$@"; }
fi

mkdir -p "$PGDIR"
chown "$OWNER" "$PGDIR"
chmod 700 "$PGDIR"
# Two callers at once (parallel CI steps) must not both run initdb or pg_ctl start.
exec 9>"$PGDIR.lock"
flock 9

DATA="$PGDIR/data"
if [ ! -f "$DATA/PG_VERSION" ]; then
  echo "== creating a test cluster in $DATA"
  as_owner "$BIN/initdb" -D "$DATA" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >/dev/null
fi

if ! as_owner "$BIN/pg_ctl" status -D "$DATA" >/dev/null 2>&1; then
  echo "== starting postgresql on 127.0.0.1:$PORT"
  # The socket lives in the cluster folder so the system's /var/run/postgresql is not needed.
  # The server must not inherit our stdout (a caller's $(...) would wait for it forever) nor the lock.
  if ! as_owner "$BIN/pg_ctl" start -D "$DATA" -l "$PGDIR/server.log" -w -t 60 \
      -o "-c listen_addresses=127.0.0.1 -p $PORT -c unix_socket_directories=$PGDIR" \
      </dev/null 3>&- 9>&-; then
    echo "error: postgresql did not start; the end of $PGDIR/server.log:"
    tail -n 20 "$PGDIR/server.log" || true
    exit 1
  fi
fi

for _ in $(seq 1 60); do
  pg_isready -q -h 127.0.0.1 -p "$PORT" && break
  sleep 0.5
done
pg_isready -h 127.0.0.1 -p "$PORT"

exists=$(psql -X -qtA -h 127.0.0.1 -p "$PORT" -U postgres -d postgres \
  -c "SELECT 1 FROM pg_database WHERE datname = '$DB'")
if [ "$exists" != 1 ]; then
  echo "== creating database $DB"
  psql -X -q -h 127.0.0.1 -p "$PORT" -U postgres -d postgres -c "CREATE DATABASE $DB"
fi

echo "$URL" >&3
