#!/usr/bin/env bash
# Long crash torture, outside CI: random SIGKILLs of `steadfast run` and
# `steadfast worker` process groups on each store, then every run finished
# and checked (crates/steadfast-bench/src/bin/torture.rs says what).
#
#   scripts/torture.sh [KILLS] [STORE...]      default: 2000 kills; file sqlite postgres cosmos
#   SEED=N scripts/torture.sh ...              replay a printed seed
#   LARGE=1 scripts/torture.sh ...             steps also print 100 KB documents (blobs)
#   COSMOS_FAULTS=0.05 scripts/torture.sh 2000 cosmos
#                                              cosmos through the fault proxy, that
#                                              share of requests faulted
#
# postgres needs $STEADFAST_TEST_PG; cosmos needs $STEADFAST_TEST_COSMOS,
# $STEADFAST_TEST_COSMOS_CA and $STEADFAST_COSMOS_KEY (ci/cosmos/start.sh
# starts a local server, and the fault proxy: $STEADFAST_TEST_COSMOS_PROXY).
# One summary line per store; exit 1 on a violation.
set -euo pipefail
cd "$(dirname "$0")/.."
kills="${1:-2000}"
shift || true
stores=("$@")
[ ${#stores[@]} -gt 0 ] || stores=(file sqlite postgres cosmos)
cargo build -q --release -p steadfast-cli -p steadfast-bench
status=0
for s in "${stores[@]}"; do
  faults=()
  [ "$s" = cosmos ] && [ -n "${COSMOS_FAULTS:-}" ] && faults=(--faults "$COSMOS_FAULTS")
  target/release/torture --store "$s" --kills "$kills" ${SEED:+--seed "$SEED"} ${LARGE:+--large} "${faults[@]}" | grep -v '^torture: [0-9]* kills' || status=1
done
exit $status
