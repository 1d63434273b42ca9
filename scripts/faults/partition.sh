#!/usr/bin/env bash
# A worker cut off from PostgreSQL mid-step, outside CI (docs/scaling.md
# says what it shows). Makes a PostgreSQL cluster on port 5443 and two
# network namespaces, each joined to this machine by a veth pair; runs one
# worker in each; cuts worker A's link (every packet dropped both ways, no
# connection closed) for longer than the lease, then heals it; and checks
# with crates/steadfast-bench's `partition` binary that A stopped its steps
# before B took its runs over, acknowledged nothing while cut off, and
# reconnected by itself.
#
#   scripts/faults/partition.sh [ROUNDS]      default: 1
#   STEADFAST_BIN=PATH scripts/faults/partition.sh   another build's CLI (a
#                                             negative control: an older one)
#
# Needs root (namespaces, links) and PostgreSQL's server binaries; it runs
# them as the user postgres.
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds="${1:-1}"
[ "$(id -u)" = 0 ] || { echo "partition: needs root (network namespaces)" >&2; exit 2; }
pgbin="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)"
[ -x "$pgbin/initdb" ] || { echo "partition: PostgreSQL's server binaries were not found under /usr/lib/postgresql" >&2; exit 2; }
port=5443
base="$(mktemp -d /tmp/steadfast-partition.XXXXXX)"
chmod 755 "$base"
chown postgres "$base"
net_down() {
  for w in a b; do
    # Workers a failed harness left behind.
    ip netns pids "sfp-$w" 2>/dev/null | xargs -r kill -KILL 2>/dev/null || true
    ip link del "sfp-$w-h" 2>/dev/null || true
    ip netns del "sfp-$w" 2>/dev/null || true
  done
}
cleanup() {
  [ -f "$base/pg/postmaster.pid" ] && runuser -u postgres -- "$pgbin/pg_ctl" -D "$base/pg" -m immediate stop >/dev/null 2>&1 || true
  net_down
  rm -rf "$base"
}
trap cleanup EXIT
# FAULTS_PROFILE=debug uses a debug build (CI's short run, which has one).
profile="${FAULTS_PROFILE:-release}"
case "$profile" in
  release) cargo build -q --release -p steadfast-cli -p steadfast-bench ;;
  debug) cargo build -q -p steadfast-cli -p steadfast-bench ;;
  *) echo "FAULTS_PROFILE is release or debug, not '$profile'" >&2; exit 2 ;;
esac

net_down
i=0
for w in a b; do
  i=$((i + 1))
  ip netns add "sfp-$w"
  ip link add "sfp-$w-h" type veth peer name "sfp-$w-n"
  ip link set "sfp-$w-n" netns "sfp-$w"
  ip addr add "10.77.$i.1/24" dev "sfp-$w-h"
  ip link set "sfp-$w-h" up
  ip netns exec "sfp-$w" ip addr add "10.77.$i.2/24" dev "sfp-$w-n"
  ip netns exec "sfp-$w" ip link set "sfp-$w-n" up
  ip netns exec "sfp-$w" ip link set lo up
done

runuser -u postgres -- "$pgbin/initdb" -D "$base/pg" -A trust -U postgres --no-sync >/dev/null
cat >> "$base/pg/postgresql.conf" <<CONF
port = $port
listen_addresses = '127.0.0.1,10.77.1.1,10.77.2.1'
unix_socket_directories = '$base'
fsync = on
synchronous_commit = on
CONF
echo "host all all 10.77.0.0/16 trust" >> "$base/pg/pg_hba.conf"
runuser -u postgres -- "$pgbin/pg_ctl" -D "$base/pg" -l "$base/pg.log" -w start >/dev/null

# A cut drops every packet on both ends of A's link: a queue of length 0.
cut="tc qdisc add dev sfp-a-h root pfifo limit 0 && ip netns exec sfp-a tc qdisc add dev sfp-a-n root pfifo limit 0"
heal="tc qdisc del dev sfp-a-h root && ip netns exec sfp-a tc qdisc del dev sfp-a-n root"
# The cut must cut: nothing gets through while it holds, and it heals.
probe() { ip netns exec sfp-a timeout 3 psql -h 10.77.1.1 -p $port -U postgres -d postgres -Atc "select 1" 2>/dev/null || true; }
[ "$(probe)" = 1 ] || { echo "partition: worker A's namespace does not reach the server" >&2; exit 2; }
sh -c "$cut"
[ -z "$(probe)" ] || { echo "partition: the cut let a query through" >&2; exit 2; }
sh -c "$heal"
[ "$(probe)" = 1 ] || { echo "partition: the heal did not restore the link" >&2; exit 2; }

status=0
for r in $(seq 1 "$rounds"); do
  schema="partition_$r"
  "target/$profile/partition" \
    --url "postgres://postgres@127.0.0.1:$port/postgres?schema=$schema" \
    --url-a "postgres://postgres@10.77.1.1:$port/postgres?schema=$schema" --netns-a sfp-a \
    --url-b "postgres://postgres@10.77.2.1:$port/postgres?schema=$schema" --netns-b sfp-b \
    --cut "$cut" --heal "$heal" ${STEADFAST_BIN:+--bin "$STEADFAST_BIN"} || status=1
done
exit $status
