#!/usr/bin/env bash
# Shards at scale: N PostgreSQL databases, each with a backlog, drained to
# NATS JetStream by one `postbox relay` daemon serving them all, or by two
# daemons sharing them; optionally one database made slow (its outbox held
# by a lock for a while). Prints the time each database took to drain, the
# total rate, the CPU per message of each kind of process (the daemons,
# every postgres process, nats-server) and the load average.
#
#   bench/shards.sh [databases=8] [messages per database=20000] [daemons=1|2] [slow=0|1]
#
# BASELINE=1 first drains one database of the same size with one daemon, in
# the same way, and prints the run's rate as a ratio to that one's.
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
# ticks PID...: CPU clock ticks the processes and their reaped children
# used (utime, stime, cutime, cstime of /proc/PID/stat). Summed over every
# postgres process, the postmaster's children's fields count the backends
# that have exited.
ticks() {
  local t=0 pid f
  for pid in "$@"; do
    f=$(cut -d')' -f2 "/proc/$pid/stat" 2>/dev/null) || continue
    set -- $f
    t=$((t + ${12} + ${13} + ${14} + ${15}))
  done
  echo "$t"
}
hz=$(getconf CLK_TCK)

# drain N DAEMONS SLOW: one measured run over databases pbshard1..N.
drain() {
  local n=$1 daemons=$2 slow=$3 cfg="$dir/relay.yaml" i d
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
  psql_ -d postgres -c "CHECKPOINT"
  local lock=""
  if [ "$slow" = 1 ]; then
    # Database 1 is slow: a transaction holds its outbox locked for 10 s.
    psql_ -d pbshard1 -c "BEGIN; LOCK TABLE pb_outbox IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(10); COMMIT;" &
    lock=$!
    sleep 0.5
  fi
  local load0 pg0 nats0 pids=()
  load0=$(cut -d' ' -f1-3 /proc/loadavg)
  pg0=$(ticks $(pgrep -x postgres)); nats0=$(ticks $(pgrep -x nats-server))
  local start end
  start=$(date +%s.%N)
  for d in $(seq 1 "$daemons"); do
    POSTBOX_CONFIG="$cfg" "$postbox" relay > "$dir/daemon$d.log" 2>&1 &
    pids+=($!)
  done
  declare -A done_at
  local left=$n
  while [ "$left" -gt 0 ]; do
    for i in $(seq 1 "$n"); do
      [ -n "${done_at[$i]:-}" ] && continue
      if [ "$(psql_ -d "pbshard$i" -c "SELECT NOT EXISTS (SELECT 1 FROM pb_outbox)")" = t ]; then
        done_at[$i]=$(date +%s.%N); left=$((left - 1))
      fi
    done
    sleep 0.2
  done
  end=$(date +%s.%N)
  local relay pg nats msgs=$((n * per))
  relay=$(ticks "${pids[@]}"); pg=$(($(ticks $(pgrep -x postgres)) - pg0)); nats=$(($(ticks $(pgrep -x nats-server)) - nats0))
  for i in $(seq 1 "$n"); do printf "database %d drained in %.1f s\n" "$i" "$(echo "${done_at[$i]} - $start" | bc)"; done
  rate=$(echo "$msgs / ($end - $start)" | bc -l)
  printf "all %d databases (%d messages) in %.1f s: %.0f msg/s with %d daemon(s); load %s before, %s after\n" "$n" "$msgs" \
    "$(echo "$end - $start" | bc)" "$rate" "$daemons" "$load0" "$(cut -d' ' -f1-3 /proc/loadavg)"
  printf "CPU µs per message: daemons %.1f, postgres %.1f, nats-server %.1f, total %.1f\n" \
    "$(echo "$relay * 1000000 / $hz / $msgs" | bc -l)" "$(echo "$pg * 1000000 / $hz / $msgs" | bc -l)" \
    "$(echo "$nats * 1000000 / $hz / $msgs" | bc -l)" "$(echo "($relay + $pg + $nats) * 1000000 / $hz / $msgs" | bc -l)"
  kill "${pids[@]}" 2>/dev/null || true
  wait "${pids[@]}" $lock 2>/dev/null || true
  for i in $(seq 1 "$n"); do psql_ -d postgres -c "DROP DATABASE IF EXISTS pbshard$i WITH (FORCE)"; done
}

if [ "${BASELINE:-0}" = 1 ]; then
  echo "baseline: one database of $per messages, one daemon"
  drain 1 1 0
  base=$rate
  echo "run: $n database(s), $daemons daemon(s), slow $slow"
fi
drain "$n" "$daemons" "$slow"
if [ -n "${base:-}" ]; then
  printf "ratio of the run's rate to the baseline's: %.2f\n" "$(echo "$rate / $base" | bc -l)"
fi
