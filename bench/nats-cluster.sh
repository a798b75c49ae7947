#!/usr/bin/env bash
# Starts a three-node NATS cluster with JetStream on loopback (client ports
# 4301-4303, cluster ports 6301-6303), for `postbox bench drain --replicas 3
# --nats-url nats://127.0.0.1:4301,nats://127.0.0.1:4302,nats://127.0.0.1:4303`.
#
#   bench/nats-cluster.sh start [always|default]   # sync_interval; default: default
#   bench/nats-cluster.sh stop
#
# The nats-server is the module graph's (v2.15, built into $DIR/nats-server):
# Debian's 2.9 lacks sync_interval. Stores and logs live in $DIR
# (default /tmp/postbox-nats-cluster), removed by stop.
set -euo pipefail
dir=${DIR:-/tmp/postbox-nats-cluster}
repo=$(cd "$(dirname "$0")/.." && pwd)

case "${1:-}" in
start)
  sync=${2:-default}
  mkdir -p "$dir"
  if [ ! -x "$dir/nats-server" ]; then
    (cd "$repo/cmd/postbox" && go build -o "$dir/nats-server" github.com/nats-io/nats-server/v2)
  fi
  line=""
  [ "$sync" = always ] && line="sync_interval: always"
  for i in 1 2 3; do
    routes=""
    for j in 1 2 3; do
      [ "$i" = "$j" ] || routes="$routes nats-route://127.0.0.1:630$j,"
    done
    mkdir -p "$dir/n$i"
    cat > "$dir/n$i.conf" <<CONF
server_name: "n$i"
listen: "127.0.0.1:430$i"
log_file: "$dir/n$i.log"
jetstream { store_dir: "$dir/n$i"
  $line
}
cluster { name: "bench", listen: "127.0.0.1:630$i", routes: [${routes%,}] }
CONF
    "$dir/nats-server" -c "$dir/n$i.conf" &
    echo $! > "$dir/n$i.pid"
  done
  for i in 1 2 3; do
    for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/430$i") 2>/dev/null && break; sleep 0.1; done
  done
  echo "nats://127.0.0.1:4301,nats://127.0.0.1:4302,nats://127.0.0.1:4303 (sync_interval $sync)"
  ;;
stop)
  for i in 1 2 3; do
    [ -f "$dir/n$i.pid" ] && kill "$(cat "$dir/n$i.pid")" 2>/dev/null || true
  done
  sleep 1
  rm -rf "$dir"/n[123] "$dir"/n[123].* 
  ;;
*)
  echo "usage: $0 start [always|default] | stop" >&2; exit 2 ;;
esac
