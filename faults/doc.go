// Package faults is the fault-injection harness: real relay processes
// against a PostgreSQL cluster and a nats-server or RabbitMQ node that the
// run starts for itself, writers that commit and roll back keyed
// messages, a consumer process that applies them through the inbox,
// faults on a schedule drawn from a seed, and a checker that judges the
// recorded history on its own. See RELIABILITY.md. The checker names each
// violation after the guarantee it breaks (G1 to G9, docs/design.md §1).
//
// Two faults write crash-looping messages (crash_test.go): crash_relay,
// whose publish ends the relay process (the harness SIGKILLs the relay,
// as the kernel kills a process out of memory, when the relay's broker
// proxy sees its payload), and crash_consumer, whose handler ends the
// consumer process (os.Exit). The checker counts the deaths each caused
// from the supervisors' records and holds each to its bound: a dead
// message after at most MaxCrashes+2 relay deaths (one more for each relay
// killed for it that had logged giving up its crash marks) or
// MaxCrashes+1 consumer exits (one more for each run of a copy the broker
// sent again as a first delivery, which the inbox cannot count; the
// consumer records the count its handler saw), its key moving on.
//
//	go test -tags faults -run TestFaults -v ./faults/
//
// TestFleet runs a fleet of 16 relays (POSTBOX_FLEET_PROFILE), and
// TestFailover kills the primary under load and promotes its streaming
// replica (POSTBOX_FAILOVER_PROFILE: failover-sync or failover-async).
// TestShards runs one relay daemon serving two databases while faults hit
// one of them (POSTBOX_SHARDS_PROFILE: shards), each shard judged on its
// own and the other shard's waits reported.
//
// Environment: POSTBOX_FAULTS_PROFILE (short, the default, or soak),
// POSTBOX_FAULTS_DB (postgres, the default, or mariadb: a mariadbd of the
// run's own, made with mariadb-install-db on a data directory and port of
// its own, the relays connecting as the user fxrelay and the consumer as
// fxconsumer, so that pg_terminate is KILL CONNECTION of their process
// list entries, pg_restart stops mariadbd with SIGTERM or, immediate,
// SIGKILL and starts it again on the same data, and xmin_hold is an open
// START TRANSACTION WITH CONSISTENT SNAPSHOT; TestFaults only, and
// PgBouncer, replicas and their failover, and the fleet are refused),
// POSTBOX_FAULTS_BROKER (nats, the default, nats-cluster with the cluster
// profile, or rabbitmq), POSTBOX_FAULTS_NATS_SYNC (nats-cluster: always),
// POSTBOX_FAULTS_POOLER (pgbouncer: every connection through PgBouncer),
// POSTBOX_FAULTS_STORAGE (table, the default, or log: the writers insert
// into the log of design §3 through internal/pglog and the relays run
// with storage: log; PostgreSQL only, and not TestShards),
// POSTBOX_FAULTS_SEED (a run with the same seed draws the same schedule
// and the same writer decisions), POSTBOX_FAULTS_DEDUPE (NATS: broker or
// inbox), POSTBOX_FAULTS_REPORT (the JSON report's path),
// POSTBOX_FAULTS_DIR (keep the run's files: logs, history, stream), and
// POSTBOX_FAULTS_NATS_SERVER, POSTBOX_FAULTS_PG_BINDIR,
// POSTBOX_FAULTS_MARIADB_BINDIR and POSTBOX_FAULTS_RABBITMQ_SBIN (where
// the server binaries are).
package faults
