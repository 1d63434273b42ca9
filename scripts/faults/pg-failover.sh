#!/usr/bin/env bash
# PostgreSQL failover under load, outside CI (docs/scaling.md says what it
# shows). Makes a primary and a standby on this machine (two clusters, ports
# 5441 and 5442), runs workers and `steadfast run` processes through a
# multi-host URL, stops the primary's WAL sender for a second, SIGKILLs the
# primary, promotes the standby and checks with crates/steadfast-bench's
# `failover` binary that every acknowledged checkpoint is on the new primary.
#
#   scripts/faults/pg-failover.sh [sync|async|both] [ROUNDS]     default: both 1
#
# sync:  synchronous_standby_names names the standby, synchronous_commit=on:
#        no acknowledged checkpoint may be lost (exit 1 if one is).
# async: no synchronous standby: the checker must find the checkpoints the
#        stall lost (the negative control; exit 1 if it finds none).
# Needs PostgreSQL's server binaries (initdb, pg_ctl, pg_basebackup); run as
# root it runs them as the user postgres.
set -euo pipefail
cd "$(dirname "$0")/../.."
mode="${1:-both}"
rounds="${2:-1}"
case "$mode" in sync|async) modes=("$mode") ;; both) modes=(sync async) ;; *) echo "usage: $0 [sync|async|both] [ROUNDS]" >&2; exit 2 ;; esac
pgbin="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)"
[ -x "$pgbin/initdb" ] || { echo "pg-failover: PostgreSQL's server binaries were not found under /usr/lib/postgresql" >&2; exit 2; }
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
pa=5441
pb=5442
base="$(mktemp -d /tmp/steadfast-failover.XXXXXX)"
chmod 755 "$base"
[ "$(id -u)" = 0 ] && chown postgres "$base"
stop_all() {
  # Clients a failed harness left behind (stopped ones too).
  pkill -KILL -f -- "--store postgres://postgres@127.0.0.1:$pa," 2>/dev/null || true
  for d in "$base/a" "$base/b"; do
    [ -f "$d/postmaster.pid" ] && as_pg "$pgbin/pg_ctl" -D "$d" -m immediate stop >/dev/null 2>&1 || true
  done
}
trap 'stop_all; rm -rf "$base"' EXIT
# FAULTS_PROFILE=debug uses a debug build (CI's short run, which has one).
profile="${FAULTS_PROFILE:-release}"
case "$profile" in
  release) cargo build -q --release -p steadfast-cli -p steadfast-bench ;;
  debug) cargo build -q -p steadfast-cli -p steadfast-bench ;;
  *) echo "FAULTS_PROFILE is release or debug, not '$profile'" >&2; exit 2 ;;
esac

one_round() {
  local m="$1" names=""
  [ "$m" = sync ] && names="standby"
  stop_all
  rm -rf "$base/a" "$base/b"
  # Called as `one_round … || status=1`, where `set -e` does not hold:
  # each step that must work says so itself.
  as_pg "$pgbin/initdb" -D "$base/a" -A trust -U postgres --no-sync >/dev/null || return 2
  cat >> "$base/a/postgresql.conf" <<CONF
port = $pa
listen_addresses = '127.0.0.1'
unix_socket_directories = '$base'
wal_level = replica
max_wal_senders = 4
fsync = on
synchronous_commit = on
synchronous_standby_names = '$names'
CONF
  as_pg "$pgbin/pg_ctl" -D "$base/a" -l "$base/a.log" -w start >/dev/null || return 2
  as_pg "$pgbin/pg_basebackup" -d "host=127.0.0.1 port=$pa user=postgres application_name=standby" \
    -D "$base/b" -R -X stream >/dev/null || return 2
  # Once promoted, the standby has no standby of its own: it must not wait
  # for one (as an operator, or a failover manager, would set it).
  printf "port = %s\nsynchronous_standby_names = ''\n" "$pb" >> "$base/b/postgresql.conf"
  as_pg "$pgbin/pg_ctl" -D "$base/b" -l "$base/b.log" -w start >/dev/null || return 2
  local want=async
  [ "$m" = sync ] && want=sync
  for _ in $(seq 1 100); do
    state="$(psql -h 127.0.0.1 -p $pa -U postgres -d postgres -Atc "select sync_state from pg_stat_replication where application_name = 'standby'" 2>/dev/null || true)"
    [ "$state" = "$want" ] && break
    sleep 0.1
  done
  [ "$state" = "$want" ] || { echo "pg-failover: the standby did not reach state $want (it is '$state')" >&2; exit 2; }
  local sender="psql -h 127.0.0.1 -p $pa -U postgres -d postgres -Atc \"select pid from pg_stat_replication\""
  local flags=()
  [ "$m" = async ] && flags=(--expect-loss)
  echo "pg-failover: $m standby"
  # The postmaster must die; a backend of it may have exited on its own
  # between the listing and the kill, which is no failure.
  "target/$profile/failover" \
    --url "postgres://postgres@127.0.0.1:$pa,127.0.0.1:$pb/postgres?target_session_attrs=read-write" \
    --standby-url "postgres://postgres@127.0.0.1:$pb/postgres" \
    --stall "kill -STOP \$($sender)" \
    --kill-primary "pm=\$(head -1 $base/a/postmaster.pid); kids=\$(pgrep -P \$pm); kill -KILL \$pm && { kill -KILL \$kids 2>/dev/null || true; }" \
    --promote "$(if [ "$(id -u)" = 0 ]; then echo "runuser -u postgres -- "; fi)$pgbin/pg_ctl -D $base/b -w promote >/dev/null" \
    "${flags[@]}"
}

status=0
for r in $(seq 1 "$rounds"); do
  for m in "${modes[@]}"; do
    one_round "$m" || status=1
  done
done
exit $status
