#!/usr/bin/env bash
# Shards at scale: N PostgreSQL databases, each with a backlog, drained to
# NATS JetStream by one `postbox relay` daemon serving them all, or by two
# daemons sharing them; optionally one database made slow (its outbox held
# by a lock for a while). Prints the time each database took to drain and
# the total rate.
#
#   bench/shards.sh [databases=8] [messages per database=20000] [daemons=1|2] [slow=0|1]
#
# Needs the machine's PostgreSQL (127.0.0.1:5432, trust) and NATS
# (127.0.0.1:4222). Uses `postbox` from PATH or $POSTBOX. The databases
# are dropped at the end; the JetStream stream PBSHARDS that the daemon
# made is left (`nats stream rm PBSHARDS`).
set -euo pipefail
n=${1:-8}; per=${2:-20000}; daemons=${3:-1}; slow=${4:-0}
postbox=${POSTBOX:-postbox}
dir=$(mktemp -d); trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$dir"' EXIT
psql_() { psql -qAt -h 127.0.0.1 -U postgres "$@"; }
cfg="$dir/relay.yaml"
{
  echo "databases:"
  for i in $(seq 1 "$n"); do echo "  - {url: \"postgres://postgres@127.0.0.1:5432/pbshard$i?sslmode=disable\", prefix: pb_}"; done
  echo "nats: {url: \"nats://127.0.0.1:4222\", subject_prefix: \"pbshards.\", streams: [{name: PBSHARDS, subjects: [\"pbshards.>\"], duplicates: 1m}]}"
  echo "admin: {listen: \"off\"}"
  echo "log: {level: warn}"
} > "$cfg"
for i in $(seq 1 "$n"); do
  psql_ -d postgres -c "DROP DATABASE IF EXISTS pbshard$i" -c "CREATE DATABASE pbshard$i"
  "$postbox" migrate up --database "postgres://postgres@127.0.0.1:5432/pbshard$i?sslmode=disable" --prefix pb_ >/dev/null
  psql_ -d "pbshard$i" -c "INSERT INTO pb_outbox (id, topic, key, payload) SELECT gen_random_uuid(), 'orders.created', 'k' || (g % 1000), convert_to(repeat('x', 256), 'UTF8') FROM generate_series(1, $per) g"
done
if [ "$slow" = 1 ]; then
  # Database 1 is slow: a transaction holds its outbox locked for 10 s.
  psql_ -d pbshard1 -c "BEGIN; LOCK TABLE pb_outbox IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(10); COMMIT;" &
  sleep 0.5
fi
start=$(date +%s.%N)
for d in $(seq 1 "$daemons"); do
  POSTBOX_CONFIG="$cfg" "$postbox" relay > "$dir/daemon$d.log" 2>&1 &
done
declare -A done_at
left=$n
while [ "$left" -gt 0 ]; do
  for i in $(seq 1 "$n"); do
    [ -n "${done_at[$i]:-}" ] && continue
    if [ "$(psql_ -d "pbshard$i" -c "SELECT count(*) FROM pb_outbox")" = 0 ]; then
      done_at[$i]=$(date +%s.%N); left=$((left - 1))
    fi
  done
  sleep 0.2
done
end=$(date +%s.%N)
for i in $(seq 1 "$n"); do printf "database %d drained in %.1f s\n" "$i" "$(echo "${done_at[$i]} - $start" | bc)"; done
printf "all %d databases (%d messages) in %.1f s: %.0f msg/s with %d daemon(s); load %s\n" "$n" "$((n * per))" \
  "$(echo "$end - $start" | bc)" "$(echo "$n * $per / ($end - $start)" | bc -l)" "$daemons" "$(cut -d' ' -f1-3 /proc/loadavg)"
kill $(jobs -p) 2>/dev/null || true
wait 2>/dev/null || true
for i in $(seq 1 "$n"); do psql_ -d postgres -c "DROP DATABASE IF EXISTS pbshard$i WITH (FORCE)"; done
