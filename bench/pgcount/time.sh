#!/usr/bin/env bash
# time.sh DATADIR ROUNDS FILE.sql...
#
# The timed cross-check of count.sh: starts a copy of the (stopped) cluster
# DATADIR on port $PORT (default 5498) and runs each FILE.sql, one client,
# prepared, for 4 s with pgbench, the files alternating, ROUNDS times; prints
# the mean latency of each run and the load average. Timed, so other work on
# the machine moves it. Run as root (it runs postgres as postgres).
set -euo pipefail
data=$1 rounds=$2; shift 2
port=${PORT:-5498}
bin=$(ls -d /usr/lib/postgresql/*/bin | tail -1)
work=$(mktemp -d) && trap 'su postgres -c "$bin/pg_ctl -D $work/data -m fast stop >/dev/null" || true; rm -rf "$work"' EXIT
cp -a "$data" "$work/data" && chown -R postgres "$work"
su postgres -c "$bin/pg_ctl -D $work/data -o '-p $port -k /tmp -c listen_addresses=127.0.0.1' -l $work/log -w start >/dev/null"
for _ in $(seq 1 "$rounds"); do
  for f in "$@"; do
    printf '%s: ' "$(basename "$f" .sql)"
    "$bin/pgbench" -n -M prepared -f "$f" -T 4 -h 127.0.0.1 -p "$port" -U postgres postgres 2>&1 | awk '/latency average/ {print $4, $5}'
  done
done
uptime
