#!/usr/bin/env bash
# setup.sh DATADIR: a PostgreSQL cluster of its own with the tables the
# statements of this directory use: postbox's (prefix n_, every migration),
# a domain table and a bare outbox row's table, a 25,600-row backlog
# leased to relay 'r', and an append-only log with a position per
# partition. The cluster is left stopped, for count.sh. WAL_LEVEL=logical
# sets wal_level for the WAL-path statements.
set -euo pipefail
data=$1 port=${PORT:-5499}
bin=$(ls -d /usr/lib/postgresql/*/bin | tail -1)
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$data" && chown postgres "$data"
su postgres -c "$bin/initdb -D $data -A trust -U postgres >/dev/null"
# WAL_LEVEL=logical makes a cluster for the WAL-path statements (wal-*.sql).
if [ -n "${WAL_LEVEL:-}" ]; then echo "wal_level = $WAL_LEVEL" >> "$data/postgresql.conf"; fi
su postgres -c "$bin/pg_ctl -D $data -o '-p $port -k /tmp -c listen_addresses=127.0.0.1' -l $data/log -w start >/dev/null"
url=postgres://postgres@127.0.0.1:$port/postgres
(cd "$here/../.." && go run ./cmd/postbox migrate up --database "$url" --prefix n_ >/dev/null)
psql -q "$url" -f "$here/setup.sql"
su postgres -c "$bin/pg_ctl -D $data -m fast stop >/dev/null"
