#!/usr/bin/env bash
# stream.sh URL N: the WAL path's read, timed. Emits N messages into the
# WAL of the running server at URL (wal_level = logical), one transaction
# each, as the write benchmark's emitted phase does, then streams them from
# a slot with pg_recvlogical (pgoutput, messages on) to /dev/null, and
# prints the rate and the CPU per message of the walsender (the server's
# processes, its postmaster's reaped children included) and of
# pg_recvlogical, and the load average. Run as root, on the server's
# machine (it reads the postmaster's times from /proc).
set -euo pipefail
url=$1 n=$2
slot=stream_$$ pub=stream_$$
data=$(psql -Atc 'SHOW data_directory' "$url")
pm=$(head -1 "$data/postmaster.pid")
hz=$(getconf CLK_TCK)
# The CPU ticks of the server: the postmaster, its live children, and the
# children it has reaped (a walsender that ended).
ticks() {
  local t=0 p
  read -r -a s < "/proc/$pm/stat"
  t=$(( s[13] + s[14] + s[15] + s[16] ))
  for p in $(pgrep -P "$pm"); do
    read -r -a s < "/proc/$p/stat" 2>/dev/null || continue
    t=$(( t + s[13] + s[14] ))
  done
  echo "$t"
}
# The slot keeps the server's WAL: it goes at the end, however the run ends.
trap 'psql -q "$url" -c "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = '"'"'$slot'"'"'" -c "DROP PUBLICATION IF EXISTS $pub" >/dev/null 2>&1 || true' EXIT
psql -q "$url" -c "CREATE PUBLICATION $pub" -c "SELECT FROM pg_create_logical_replication_slot('$slot', 'pgoutput')" >/dev/null
msg="0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b\\\\000orders.created\\\\000k1\\\\000{\"ce-source\": \"/bench\", \"ce-time\": \"2026-12-01T22:20:01.123456789Z\"}\\\\000$(printf 'x%.0s' $(seq 1 256))"
psql -q "$url" -c "DO \$\$ BEGIN FOR g IN 1..$n LOOP PERFORM pg_logical_emit_message(true, 'postbox', E'$msg'::bytea); COMMIT; END LOOP; END \$\$"
end=$(psql -Atc "SELECT pg_current_wal_insert_lsn()" "$url")
before=$(ticks)
start=$(date +%s%N)
/usr/bin/time -f '%U %S' -o /tmp/stream.$$.time pg_recvlogical -d "$url" --slot "$slot" --start --endpos "$end" \
  -o proto_version=1 -o publication_names="$pub" -o messages=true -f /dev/null --no-loop
elapsed=$(( $(date +%s%N) - start ))
sleep 1 # the walsender ends and is reaped: its time moves to the postmaster's children's
after=$(ticks)
read -r u s < /tmp/stream.$$.time && rm -f /tmp/stream.$$.time
awk -v n="$n" -v e="$(( elapsed / 1000 ))e-6" -v srv="$(( after - before ))" -v hz="$hz" -v u="$u" -v s="$s" 'BEGIN {
  printf "%d messages streamed in %.2f s: %.0f msg/s; CPU per message: server %.2f µs, pg_recvlogical %.2f µs\n",
    n, e, n / e, srv / hz / n * 1e6, (u + s) / n * 1e6 }'
uptime
