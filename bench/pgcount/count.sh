#!/usr/bin/env bash
# count.sh DATADIR PREP.sql STMT.sql N
#
# Instructions PostgreSQL spends per execution of STMT.sql: runs a copy of
# the (stopped) cluster DATADIR in single-user mode under callgrind, once
# with PREP.sql alone and once with PREP.sql then STMT.sql N times, and
# prints the difference over N. Counted, not timed: other work on the
# machine does not move it. Run as root (it runs postgres as postgres).
set -euo pipefail
data=$1 prep=$2 stmt=$3 n=$4
bin=$(ls -d /usr/lib/postgresql/*/bin | tail -1)
work=$(mktemp -d) && chown postgres "$work" && trap 'rm -rf "$work"' EXIT
cat "$prep" > "$work/in0.sql"
{ cat "$prep"; for _ in $(seq 1 "$n"); do cat "$stmt"; done; } > "$work/in1.sql"
chmod a+r "$work"/*.sql
run() {
  rm -rf "$work/data" && cp -a "$data" "$work/data" && chown -R postgres "$work/data"
  su postgres -c "valgrind --tool=callgrind --callgrind-out-file=$work/cg.out $bin/postgres --single -D $work/data -c synchronous_commit=off postgres < $1 > /dev/null 2>&1"
  awk '/^summary:/ {print $2; exit}' "$work/cg.out"
}
a=$(run "$work/in0.sql"); b=$(run "$work/in1.sql")
echo "$(basename "$stmt" .sql): $(( (b - a) / n )) instructions per execution (n=$n)"
