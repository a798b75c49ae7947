//go:build faults

package faults

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/pgbouncer"
	"github.com/postbox-go/postbox/internal/pglog"
	"github.com/postbox-go/postbox/internal/tcpproxy"
	"github.com/postbox-go/postbox/postboxdriver"
	"github.com/postbox-go/postbox/postboxmigrate"
	"github.com/postbox-go/postbox/postboxpgx"
)

// The databases a run can use (POSTBOX_FAULTS_DB).
const (
	dbPostgres = "postgres"
	dbMariaDB  = "mariadb"
)

// databaseName is the database the run uses: POSTBOX_FAULTS_DB, postgres
// (the default) or mariadb.
func databaseName() (string, error) { return envChoice("POSTBOX_FAULTS_DB", dbPostgres, dbMariaDB) }

// envChoice is the value of the variable name, one of values, the first
// when it is unset or empty.
func envChoice(name string, values ...string) (string, error) {
	v := os.Getenv(name)
	if v == "" {
		return values[0], nil
	}
	if slices.Contains(values, v) {
		return v, nil
	}
	return "", fmt.Errorf("%s=%q: want %s", name, v, strings.Join(values, " or "))
}

// The storages a run's relays read and its writers write
// (POSTBOX_FAULTS_STORAGE).
const (
	storageTable = "table"
	storageLog   = "log"
)

// storageName is the storage of the run: POSTBOX_FAULTS_STORAGE, table
// (the default: the outbox) or log (PostgreSQL: the writers insert into
// the log of design §3, and the relays run with storage: log, reading it
// beside the outbox).
func storageName() (string, error) {
	return envChoice("POSTBOX_FAULTS_STORAGE", storageTable, storageLog)
}

// mariaDBFaults are the fault kinds that a run on MariaDB injects: on it,
// pg_terminate is KILL CONNECTION of the relays' (and the consumer's)
// database user, pg_restart stops mariadbd (SIGTERM, or SIGKILL for the
// immediate mode) and starts it on the same data directory, xmin_hold an
// open START TRANSACTION WITH CONSISTENT SNAPSHOT. PgBouncer, replicas
// and their failover, and the fleet's lease watch are PostgreSQL's.
var mariaDBFaults = []string{
	faultKill, faultStop, faultPGTerm, faultBlackhole, faultReset, faultXmin, faultBrokerRestart,
	faultPGRestart, faultPGBlackhole, faultPGReset, faultCrashRelay, faultCrashConsumer,
}

// refuseOnMariaDB says why a run cannot be made on MariaDB, or "".
func refuseOnMariaDB(prof profile, sched []*fault, fleet bool) string {
	switch {
	case prof.Replica != "":
		return "a streaming replica and its failover are PostgreSQL's"
	case fleet:
		return "the fleet's lease watch reads PostgreSQL"
	}
	if pooler, _ := poolerName(); pooler != "" {
		return "POSTBOX_FAULTS_POOLER (PgBouncer) is PostgreSQL's"
	}
	if storage, _ := storageName(); storage == storageLog {
		return "POSTBOX_FAULTS_STORAGE=log: the log is PostgreSQL's"
	}
	for _, f := range sched {
		if !slices.Contains(mariaDBFaults, f.Kind) {
			return fmt.Sprintf("the %s fault is PostgreSQL's (on MariaDB: %v)", f.Kind, mariaDBFaults)
		}
	}
	return ""
}

// database is what the harness, the writers and the checker need of the
// database a run uses (POSTBOX_FAULTS_DB): everything else of the harness
// is the same code for PostgreSQL and MariaDB. Table names are without
// the run's prefix.
type database interface {
	// name is the server's, for logs and the report.
	name() string
	// hosts are what the relays' proxies forward to, in the URL's order.
	hosts() []string
	// relayURL is relay n's URL over via, its proxies (one per host).
	relayURL(via []string, n int) string
	// consumer is what the consumer process is told of the database.
	consumer() consumerDB
	// begin opens a writer's transaction.
	begin(ctx context.Context) (dbTx, error)
	// count counts table's rows.
	count(ctx context.Context, table string) (int, error)
	// pending counts the messages not published yet, as the writers'
	// Store counts them: the outbox's, and over the log those no
	// position has passed.
	pending(ctx context.Context) (int64, error)
	// column reads column col, as text, of table's rows where cond holds
	// ("" for every row).
	column(ctx context.Context, table, col, cond string) ([]string, error)
	// effects reads the consumer's effects.
	effects(ctx context.Context) ([]effectRow, error)
	// terminate kills the relays' database connections, and the
	// consumer's when consumer is set, and counts them.
	terminate(ctx context.Context, consumer bool) (int, error)
	// snapshot opens a transaction that holds a snapshot, having read the
	// outbox, until release.
	snapshot(ctx context.Context) (release func(), err error)
	// restart stops the server, "fast" (a clean shutdown) or "immediate"
	// (a crash), waits hold, and starts it again on the same data.
	restart(ctx context.Context, mode string, hold time.Duration) error
}

// dbTx is one writer's transaction.
type dbTx interface {
	// lock takes key's entity row, adds n to its seq, and returns the new
	// seq.
	lock(ctx context.Context, key string, n int) (int, error)
	// write writes msgs with the client's WriteTx and a writes row for
	// each (its key and seq).
	write(ctx context.Context, key string, msgs []postbox.Message, seqs []int) error
	commit(ctx context.Context) error
	rollback(ctx context.Context) error
}

// consumerDB is what the consumer process needs of the database.
type consumerDB struct {
	Kind string `json:"kind"` // dbPostgres or dbMariaDB
	URL  string `json:"url"`
}

// prepare makes postbox's tables under prefix (postboxmigrate) and the
// domain's with the statements domain (in the database's dialect), and
// returns the writers' client.
func prepare[TTx any](ctx context.Context, driver postboxdriver.Driver[TTx], prefix string, exec func(ctx context.Context, q string) error, domain []string) (*postbox.Client[TTx], error) {
	m, err := postboxmigrate.New(driver, &postboxmigrate.Config{Prefix: prefix})
	if err != nil {
		return nil, err
	}
	if _, err := m.Up(ctx); err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	for _, q := range domain {
		if err := exec(ctx, q); err != nil {
			return nil, fmt.Errorf("domain tables: %w", err)
		}
	}
	return postbox.NewClient(driver, &postbox.Config{Prefix: prefix, Logger: slog.New(slog.DiscardHandler)})
}

// pgDatabase is PostgreSQL: the run's cluster (h.pg), reached through
// PgBouncer or with a replica when the run asks (h.pooler, h.replica),
// and the writers' pool (h.pool), which the PostgreSQL-only parts of the
// harness (the fleet's lease watch, the failover) use directly.
type pgDatabase struct {
	h      *harness
	via    []string // the hosts the processes connect to
	params string   // the URL's extra parameters
	client *postbox.Client[pgx.Tx]
}

func newPGDatabase(ctx context.Context, h *harness) *pgDatabase {
	t := h.t
	t.Helper()
	var err error
	h.pg = startPG(t, ctx)
	if h.pooler, err = poolerName(); err != nil {
		t.Fatal(err)
	}
	d := &pgDatabase{h: h, via: []string{h.pg.addr()}}
	switch {
	case h.pooler == "pgbouncer" && h.prof.Replica != "":
		t.Fatal("faults: a pooler and a replica in one run are not supported")
	case h.pooler == "pgbouncer":
		// Everyone (writers, consumer, relays through their proxies)
		// reaches PostgreSQL through PgBouncer in transaction pooling
		// mode, with the pgx setting README's "Behind PgBouncer" names.
		pb, err := pgbouncer.Start(ctx, pgbouncer.Config{Upstream: h.pg.addr(), Databases: []string{"postgres"}, PoolSize: 40})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pb.Stop)
		d.via = []string{fmt.Sprintf("127.0.0.1:%d", pb.Port)}
		d.params = "default_query_exec_mode=cache_describe"
		t.Logf("faults: PostgreSQL through PgBouncer (transaction pooling) at %s", d.via[0])
	case h.prof.Replica != "":
		// A streaming replica, synchronous or not, that a failover
		// promotes; everyone connects with both hosts and
		// target_session_attrs=read-write, so that they find the primary
		// wherever it is.
		rp, err := tcpproxy.New(h.pg.addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(rp.Close)
		h.replLink = rp
		h.replica = startReplica(t, ctx, h.pg, rp.Addr())
		if err := h.replicate(ctx, h.prof.Replica); err != nil {
			t.Fatal(err)
		}
		d.via = append(d.via, h.replica.addr())
		d.params = "target_session_attrs=read-write"
		t.Logf("faults: PostgreSQL %s, with a %s streaming replica at %s", d.via[0], h.prof.Replica, d.via[1])
	}
	h.dbURL = pgURL(d.via, d.params)
	h.pool = h.openPool(ctx, "writer", int32(h.prof.Writers+4))
	p := h.prefix
	domain := []string{
		// The domain: one row per key, locked by each writer, so that write
		// order per key is defined (docs/design.md §1, "write order").
		`CREATE TABLE ` + p + `entities (key text PRIMARY KEY, seq integer NOT NULL DEFAULT 0)`,
		// A domain row per message, in the writer's transaction: it settles
		// a commit whose outcome the writer could not see.
		`CREATE TABLE ` + p + `writes (message_id text PRIMARY KEY, key text NOT NULL, seq integer NOT NULL)`,
		// The consumer's effects, written with the inbox record.
		`CREATE TABLE ` + p + `effects (message_id text PRIMARY KEY, key text NOT NULL, seq integer NOT NULL, applied_at timestamptz NOT NULL)`,
		// A second application of a message lands here instead of failing.
		`CREATE TABLE ` + p + `dup_effects (message_id text NOT NULL, applied_at timestamptz NOT NULL)`,
		`INSERT INTO ` + p + `entities (key) SELECT 'k' || lpad(g::text, 4, '0') FROM generate_series(0, ` + fmt.Sprint(h.prof.Keys-1) + `) g`,
	}
	exec := func(ctx context.Context, q string) error {
		_, err := h.pool.Exec(ctx, q)
		return err
	}
	var driver postboxdriver.Driver[pgx.Tx] = postboxpgx.New(h.pool)
	if h.storage == storageLog {
		driver = postboxpgx.New(h.pool, postboxpgx.WithLog())
	}
	if d.client, err = prepare(ctx, driver, p, exec, domain); err != nil {
		t.Fatal(err)
	}
	if h.storage == storageLog {
		// The database says log, as `postbox storage log` leaves it
		// (migration 13): the writers write the log only then, and a
		// relay over the table would be refused.
		if err := pglog.UseLog(ctx, h.pool, p); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

func (d *pgDatabase) name() string    { return "PostgreSQL" }
func (d *pgDatabase) hosts() []string { return d.via }

func (d *pgDatabase) relayURL(via []string, n int) string {
	return withAppName(pgURL(via, d.params), appName(d.h.runID, fmt.Sprintf("relay%d", n)))
}

func (d *pgDatabase) consumer() consumerDB {
	return consumerDB{Kind: dbPostgres, URL: withAppName(d.h.dbURL, appName(d.h.runID, "consumer"))}
}

func (d *pgDatabase) begin(ctx context.Context) (dbTx, error) {
	tx, err := d.h.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &pgTx{tx: tx, d: d}, nil
}

func (d *pgDatabase) pending(ctx context.Context) (int64, error) {
	st, err := d.client.Stats(ctx)
	return st.Pending, err
}

func (d *pgDatabase) count(ctx context.Context, table string) (int, error) {
	var n int
	err := d.h.pool.QueryRow(ctx, `SELECT count(*) FROM `+d.h.prefix+table).Scan(&n)
	return n, err
}

func (d *pgDatabase) column(ctx context.Context, table, col, cond string) ([]string, error) {
	q := `SELECT ` + col + `::text FROM ` + d.h.prefix + table
	if cond != "" {
		q += ` WHERE ` + cond
	}
	rows, _ := d.h.pool.Query(ctx, q)
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

func (d *pgDatabase) effects(ctx context.Context) ([]effectRow, error) {
	rows, _ := d.h.pool.Query(ctx, `SELECT message_id, key, seq, applied_at FROM `+d.h.prefix+`effects`)
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (effectRow, error) {
		var e effectRow
		return e, r.Scan(&e.ID, &e.Key, &e.Seq, &e.At)
	})
}

func (d *pgDatabase) terminate(ctx context.Context, consumer bool) (int, error) {
	pattern := appName(d.h.runID, "relay") + "%"
	other := "-" // matches no application_name of ours
	if consumer {
		other = appName(d.h.runID, "consumer")
	}
	var n int
	err := d.h.pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE (application_name LIKE $1 OR application_name = $2) AND pid <> pg_backend_pid()`, pattern, other).Scan(&n)
	return n, err
}

// snapshot opens a REPEATABLE READ transaction holding an xid, so that
// it holds xmin back.
func (d *pgDatabase) snapshot(ctx context.Context) (func(), error) {
	tx, err := d.h.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		return nil, err
	}
	release := func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }
	var xid int64
	var n int
	if err := tx.QueryRow(ctx, `SELECT txid_current()`).Scan(&xid); err != nil {
		release()
		return nil, err
	}
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM `+d.h.prefix+`outbox`).Scan(&n); err != nil {
		release()
		return nil, err
	}
	return release, nil
}

func (d *pgDatabase) restart(ctx context.Context, mode string, hold time.Duration) error {
	return d.h.pg.restart(ctx, mode, hold)
}

// pgTx is a writer's transaction on PostgreSQL.
type pgTx struct {
	tx pgx.Tx
	d  *pgDatabase
}

func (x *pgTx) lock(ctx context.Context, key string, n int) (int, error) {
	var last int
	err := x.tx.QueryRow(ctx, `UPDATE `+x.d.h.prefix+`entities SET seq = seq + $2 WHERE key = $1 RETURNING seq`, key, n).Scan(&last)
	return last, err
}

func (x *pgTx) write(ctx context.Context, key string, msgs []postbox.Message, seqs []int) error {
	if err := x.d.client.WriteTx(ctx, x.tx, msgs...); err != nil {
		return err
	}
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = m.ID
	}
	_, err := x.tx.Exec(ctx, `INSERT INTO `+x.d.h.prefix+`writes (message_id, key, seq) SELECT u.id, $3, u.seq FROM unnest($1::text[], $2::int[]) AS u(id, seq)`, ids, seqs, key)
	return err
}

func (x *pgTx) commit(ctx context.Context) error   { return x.tx.Commit(ctx) }
func (x *pgTx) rollback(ctx context.Context) error { return x.tx.Rollback(ctx) }

// openPGConsumer is the consumer process's processor on PostgreSQL, and
// what closes its pool.
func openPGConsumer(ctx context.Context, c consumerCase, cfg *postbox.Config, a applier) (postbox.Processor, func(), error) {
	pcfg, err := pgxpool.ParseConfig(c.DB.URL)
	if err != nil {
		return nil, nil, err
	}
	pcfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, nil, err
	}
	client, err := postbox.NewClient(postboxpgx.New(pool), cfg)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	a.effect = `INSERT INTO ` + c.Prefix + `effects (message_id, key, seq, applied_at)
		VALUES ($1, $2, $3, clock_timestamp()) ON CONFLICT (message_id) DO NOTHING`
	a.dup = `INSERT INTO ` + c.Prefix + `dup_effects (message_id, applied_at) VALUES ($1, clock_timestamp())`
	return client.Inbox().Processor(consumerName, func(ctx context.Context, tx pgx.Tx, d *postbox.Delivery) error {
		return a.apply(func(q string, args ...any) (int64, error) {
			tag, err := tx.Exec(ctx, q, args...)
			return tag.RowsAffected(), err
		}, d)
	}), pool.Close, nil
}
