#!/usr/bin/env bash
# What one save costs PostgreSQL, statement against statement: the raw
# upsert, an ordinary step's save shaped as the store writes it, the step's
# row alone, the row alone guarded by a lock on its run, and the row
# guarded by a shared advisory lock instead (docs/durability.md, "Where a
# step's time goes" under PostgreSQL). One client, prepared statements,
# each script for SECONDS, ROUNDS rounds interleaved. Needs psql and
# pgbench.
#
#   scripts/pgbench/compare.sh [URL] [SECONDS] [ROUNDS]
#   default: $STEADFAST_TEST_PG or postgres://postgres@127.0.0.1:5432/test, 8, 3
set -euo pipefail
cd "$(dirname "$0")"
url="${1:-${STEADFAST_TEST_PG:-postgres://postgres@127.0.0.1:5432/test}}"
seconds="${2:-8}"
rounds="${3:-3}"
for n in "$seconds" "$rounds"; do
  if ! [[ "$n" =~ ^[1-9][0-9]{0,3}$ ]]; then
    echo "compare.sh: SECONDS and ROUNDS are whole numbers from 1 to 9999, not '$n'" >&2
    exit 2
  fi
done
if ! psql -X -q -v ON_ERROR_STOP=1 "$url" -f setup.sql; then
  echo "compare.sh: setting up in $url failed (psql said why, above); a schema steadfast_pgbench that is there already is never dropped: if a run of this script left it, drop it by hand" >&2
  exit 1
fi
trap 'psql -X -q "$url" -c "SET client_min_messages = warning" -c "DROP SCHEMA IF EXISTS steadfast_pgbench CASCADE"' EXIT
for round in $(seq "$rounds"); do
  for s in raw step row locked advisory; do
    out=$(pgbench -n -M prepared -c 1 -T "$seconds" -f "$s.sql" "$url" 2>&1) || {
      echo "$out" >&2
      exit 1
    }
    printf '%s %-8s %s\n' "$round" "$s" "$(grep 'latency average' <<<"$out")"
  done
done
