package bench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/cmd/postbox/internal/relayd"
	"github.com/postbox-go/postbox/internal/mysqltest"
	"github.com/postbox-go/postbox/postboxdriver"
	"github.com/postbox-go/postbox/postboxmigrate"
	"github.com/postbox-go/postbox/postboxpgx"
)

// database is what the drain and write benchmarks need of the database
// they run against, chosen by the URL's scheme (openDatabase): PostgreSQL
// through pgx, MySQL or MariaDB through database/sql. Everything else of
// the two benchmarks is the same code for both.
type database interface {
	// name is the server's, for output: PostgreSQL, MariaDB or MySQL.
	name() string
	// procs are the names of the server's processes, whose CPU the
	// benchmarks count as the database's.
	procs() []string
	// migrate makes the postbox tables under prefix and returns the
	// clean-up that drops them (and every other table under prefix);
	// when it fails, nothing is left to drop.
	migrate(ctx context.Context, prefix string) (drop func(), err error)
	// newClient is a postbox client on the database.
	newClient(cfg *postbox.Config) (benchClient, error)
	// count counts table's rows; empty reports whether it has none.
	count(ctx context.Context, table string) (int64, error)
	empty(ctx context.Context, table string) (bool, error)
	// counter counts table's rows on a connection of its own, until
	// release.
	counter(ctx context.Context) (count func(ctx context.Context, table string) (int64, error), release func(), err error)
	// analyze refreshes table's planner statistics (VACUUM ANALYZE,
	// ANALYZE TABLE).
	analyze(ctx context.Context, table string) error
	// createWriteTables makes the write benchmark's domain table and its
	// bare outbox row's table.
	createWriteTables(ctx context.Context, orders, bare string) error
	// writeTx commits one transaction of the write benchmark: the domain
	// rows r holds, with one statement, and as mode says, nothing else,
	// r's messages through c's WriteTx (one more statement), or as many
	// bare rows with one plain INSERT.
	writeTx(ctx context.Context, c benchClient, t writeTables, rows *writeRows, mode writeMode) error
	// sizes are the tables' average stored row and total sizes with
	// their indexes, in bytes.
	sizes(ctx context.Context, tables ...string) (rowBytes []float64, totalBytes []int64, err error)
	close()
}

// benchClient is the part of a postbox.Client, whatever its transaction
// type, that the benchmarks use outside a transaction.
type benchClient interface {
	Write(ctx context.Context, msgs ...postbox.Message) error
	Start(ctx context.Context) error
	Stop(ctx context.Context) error
	Config() postbox.Config
}

// databaseKind is the database a URL names: relayd.KindPostgres or
// relayd.KindMySQL, or an error for any other.
func databaseKind(url string) (string, error) {
	switch k := relayd.URLKind(url); k {
	case relayd.KindPostgres, relayd.KindMySQL:
		return k, nil
	}
	return "", fmt.Errorf("--database-url: %q is not a database these benchmarks run on: want postgres://... or mysql://user@host:3306/dbname", relayd.Redact(url))
}

// openDatabase opens the database at url for conns concurrent users (0:
// the client library's default pool), and checks that it connects.
// synchronousCommit, when set, is PostgreSQL's synchronous_commit for
// every connection.
func openDatabase(ctx context.Context, url string, conns int, synchronousCommit string) (database, error) {
	kind, err := databaseKind(url)
	if err != nil {
		return nil, err
	}
	if kind == relayd.KindMySQL {
		return openMySQL(ctx, url, conns)
	}
	mod := func(cfg *pgxpool.Config) {
		if synchronousCommit != "" {
			cfg.ConnConfig.RuntimeParams["synchronous_commit"] = synchronousCommit
		}
	}
	var pool *pgxpool.Pool
	if conns > 0 {
		pool, err = writersPool(ctx, url, conns, mod)
	} else {
		pool, err = pgxpool.New(ctx, url)
	}
	if err != nil {
		return nil, err
	}
	return &pgDatabase{pool: pool, url: url}, nil
}

// pgDatabase is PostgreSQL through a pgx pool.
type pgDatabase struct {
	pool *pgxpool.Pool
	url  string
	// pipeline begins the write benchmark's postbox transactions with
	// postboxpgx.Begin.
	pipeline bool
}

func (d *pgDatabase) name() string    { return "PostgreSQL" }
func (d *pgDatabase) procs() []string { return []string{"postgres"} }
func (d *pgDatabase) close()          { d.pool.Close() }

func (d *pgDatabase) migrate(ctx context.Context, prefix string) (func(), error) {
	_, drop, err := migrated(ctx, d.pool, prefix)
	return drop, err
}

func (d *pgDatabase) newClient(cfg *postbox.Config) (benchClient, error) {
	return postbox.NewClient(postboxpgx.New(d.pool), cfg)
}

func (d *pgDatabase) count(ctx context.Context, table string) (int64, error) {
	var n int64
	err := d.pool.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n)
	return n, err
}

func (d *pgDatabase) empty(ctx context.Context, table string) (bool, error) {
	var empty bool
	err := d.pool.QueryRow(ctx, "SELECT NOT EXISTS (SELECT 1 FROM "+table+")").Scan(&empty)
	return empty, err
}

func (d *pgDatabase) counter(ctx context.Context) (func(context.Context, string) (int64, error), func(), error) {
	conn, err := pgx.Connect(ctx, d.url)
	if err != nil {
		return nil, nil, err
	}
	count := func(ctx context.Context, table string) (int64, error) {
		var n int64
		err := conn.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n)
		return n, err
	}
	return count, func() { _ = conn.Close(context.WithoutCancel(ctx)) }, nil
}

func (d *pgDatabase) analyze(ctx context.Context, table string) error {
	_, err := d.pool.Exec(ctx, "VACUUM ANALYZE "+table)
	return err
}

func (d *pgDatabase) createWriteTables(ctx context.Context, orders, bare string) error {
	if _, err := d.pool.Exec(ctx, `CREATE TABLE `+orders+` (
		id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		customer text NOT NULL,
		amount_cents bigint NOT NULL,
		status text NOT NULL,
		created_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return err
	}
	// The outbox's columns, with the primary key alone: no rule, no
	// other index (bench/pgcount's bare row).
	_, err := d.pool.Exec(ctx, `CREATE TABLE `+bare+` (
		seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		id uuid NOT NULL,
		topic text NOT NULL,
		key text,
		payload bytea NOT NULL,
		headers jsonb NOT NULL DEFAULT '{}',
		created_at timestamptz NOT NULL DEFAULT now())`)
	return err
}

// execer runs a statement: a pgx.Tx, or a connection inside a transaction.
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// emitSQL emits the messages of a transaction into the WAL, in order, as
// an outbox kept there would: transactional, so decoding hands them over
// at the commit, and never for a rollback.
const emitSQL = "SELECT pg_logical_emit_message(true, 'postbox', m) FROM unnest($1::bytea[]) WITH ORDINALITY AS e(m, i) ORDER BY i"

// checkLogical refuses a server whose WAL cannot be decoded: a message
// emitted there could never be read back, so its write is not the WAL
// path's.
func (d *pgDatabase) checkLogical(ctx context.Context) error {
	var level string
	if err := d.pool.QueryRow(ctx, "SHOW wal_level").Scan(&level); err != nil {
		return err
	}
	if level != "logical" {
		return fmt.Errorf("--emit needs a server with wal_level = logical, where emitted messages can be decoded; this one has wal_level = %s", level)
	}
	return nil
}

func (d *pgDatabase) writeTx(ctx context.Context, c benchClient, t writeTables, r *writeRows, mode writeMode) error {
	client, ok := c.(*postbox.Client[pgx.Tx])
	if !ok {
		return fmt.Errorf("bench: a %T on PostgreSQL", c)
	}
	domain := func(tx execer) error {
		var err error
		if len(r.customers) == 1 {
			_, err = tx.Exec(ctx, "INSERT INTO "+t.orders+" (customer, amount_cents, status) VALUES ($1, $2, 'new')", r.customers[0], r.amounts[0])
		} else {
			_, err = tx.Exec(ctx, "INSERT INTO "+t.orders+" (customer, amount_cents, status) SELECT unnest($1::text[]), unnest($2::bigint[]), 'new'", r.customers, r.amounts)
		}
		return err
	}
	body := func(tx pgx.Tx) error {
		if err := domain(tx); err != nil {
			return err
		}
		var err error
		switch mode {
		case withPostbox:
			return client.WriteTx(ctx, tx, r.msgs...)
		case bareRow:
			if len(r.ids) == 1 {
				_, err = tx.Exec(ctx, "INSERT INTO "+t.bare+" (id, topic, key, payload, headers) VALUES ($1::text::uuid, $2, $3, $4, $5::text::jsonb)",
					r.ids[0], r.msgs[0].Topic, r.customers[0], r.msgs[0].Payload, r.headers[0])
			} else {
				_, err = tx.Exec(ctx, "INSERT INTO "+t.bare+" (id, topic, key, payload, headers) SELECT unnest($1::text[])::uuid, $2, unnest($3::text[]), $4, unnest($5::text[])::jsonb",
					r.ids, r.msgs[0].Topic, r.customers, r.msgs[0].Payload, r.headers)
			}
		case emitted:
			_, err = tx.Exec(ctx, emitSQL, r.emitted())
		}
		return err
	}
	switch {
	case mode == emitted && d.pipeline:
		return d.emitWithCommit(ctx, r, domain)
	case mode != withPostbox || !d.pipeline:
		return pgx.BeginFunc(ctx, d.pool, body)
	}
	tx, err := postboxpgx.Begin(ctx, d.pool)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if err := body(tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// emitWithCommit commits a transaction of domain rows whose messages are
// emitted in the COMMIT's round trip, as postboxpgx.Tx sends its inserts.
func (d *pgDatabase) emitWithCommit(ctx context.Context, r *writeRows, domain func(execer) error) error {
	c, err := d.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer c.Release()
	if _, err := c.Exec(ctx, "BEGIN"); err != nil {
		return err
	}
	var b pgx.Batch
	if err = domain(c); err == nil {
		b.Queue(emitSQL, r.emitted())
		b.Queue("COMMIT")
		err = c.SendBatch(ctx, &b).Close()
	}
	if err != nil && c.Conn().PgConn().TxStatus() != 'I' {
		_, rb := c.Exec(ctx, "ROLLBACK")
		err = errors.Join(err, rb)
	}
	return err
}

func (d *pgDatabase) sizes(ctx context.Context, tables ...string) ([]float64, []int64, error) {
	rowBytes := make([]float64, len(tables))
	total := make([]int64, len(tables))
	for i, t := range tables {
		if err := d.pool.QueryRow(ctx, `SELECT (SELECT coalesce(avg(pg_column_size(t.*)), 0) FROM `+t+` t), pg_total_relation_size($1)`, t).Scan(&rowBytes[i], &total[i]); err != nil {
			return nil, nil, err
		}
	}
	return rowBytes, total, nil
}

// mysqlDatabase is MySQL or MariaDB through database/sql.
type mysqlDatabase struct {
	db     *sql.DB
	driver postboxdriver.Driver[*sql.Tx]
	server string // MariaDB or MySQL
}

func openMySQL(ctx context.Context, url string, conns int) (database, error) {
	drv, db, err := relayd.OpenSQL(url)
	if err != nil {
		return nil, fmt.Errorf("--database-url: %w", err)
	}
	// Connections kept for reuse, as a pgx pool keeps them: database/sql
	// keeps two idle by default and would reconnect for most statements
	// of concurrent writers.
	idle := 16
	if conns > 0 {
		idle = conns + 2
		db.SetMaxOpenConns(idle)
	}
	db.SetMaxIdleConns(idle)
	var version string
	if err := db.QueryRowContext(ctx, "SELECT VERSION()").Scan(&version); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("connect to MySQL: %w", err)
	}
	server := "MySQL"
	if strings.Contains(strings.ToLower(version), "mariadb") {
		server = "MariaDB"
	}
	return &mysqlDatabase{db: db, driver: drv, server: server}, nil
}

func (d *mysqlDatabase) name() string { return d.server }

// procs: mariadbd since MariaDB 10.5, mysqld before it and on MySQL.
func (d *mysqlDatabase) procs() []string { return []string{"mariadbd", "mysqld"} }
func (d *mysqlDatabase) close()          { _ = d.db.Close() }

func (d *mysqlDatabase) migrate(ctx context.Context, prefix string) (func(), error) {
	drop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		d.endStatements(ctx, prefix)
		_ = mysqltest.DropTables(ctx, d.db, prefix)
	}
	m, err := postboxmigrate.New(d.driver, &postboxmigrate.Config{Prefix: prefix})
	if err != nil {
		return nil, err
	}
	if _, err := m.Up(ctx); err != nil {
		drop()
		return nil, err
	}
	return drop, nil
}

// endStatements ends the statements still running on the tables under
// prefix, and waits for them to end, until ctx does. A statement whose
// client gave up (a fetch of the relay, cancelled by its deadline or by
// the stop) runs on in the server until it has its rows: it would hold
// the tables' metadata lock against the DROP, keep its read view open
// against the purge, and its CPU would count in the next run. They are
// given 5 s, then stopped with KILL QUERY.
func (d *mysqlDatabase) endStatements(ctx context.Context, prefix string) {
	like := "%" + strings.ReplaceAll(prefix, "_", `\_`) + "%"
	deadline := time.Now().Add(5 * time.Second)
	for {
		rows, err := d.db.QueryContext(ctx, `SELECT id FROM information_schema.processlist
			WHERE id <> CONNECTION_ID() AND command <> 'Sleep' AND info LIKE ?`, like)
		if err != nil {
			return
		}
		var ids []int64
		for rows.Next() {
			var id int64
			if rows.Scan(&id) == nil {
				ids = append(ids, id)
			}
		}
		if rows.Close() != nil || len(ids) == 0 {
			return
		}
		if time.Now().After(deadline) {
			for _, id := range ids {
				_, _ = d.db.ExecContext(ctx, fmt.Sprintf("KILL QUERY %d", id))
			}
		}
		select {
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
			return
		}
	}
}

func (d *mysqlDatabase) newClient(cfg *postbox.Config) (benchClient, error) {
	return postbox.NewClient(d.driver, cfg)
}

func (d *mysqlDatabase) count(ctx context.Context, table string) (int64, error) {
	var n int64
	err := d.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+table).Scan(&n)
	return n, err
}

func (d *mysqlDatabase) empty(ctx context.Context, table string) (bool, error) {
	var empty bool
	err := d.db.QueryRowContext(ctx, "SELECT NOT EXISTS (SELECT 1 FROM "+table+")").Scan(&empty)
	return empty, err
}

func (d *mysqlDatabase) counter(ctx context.Context) (func(context.Context, string) (int64, error), func(), error) {
	conn, err := d.db.Conn(ctx)
	if err != nil {
		return nil, nil, err
	}
	count := func(ctx context.Context, table string) (int64, error) {
		var n int64
		err := conn.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+table).Scan(&n)
		return n, err
	}
	return count, func() { _ = conn.Close() }, nil
}

func (d *mysqlDatabase) analyze(ctx context.Context, table string) error {
	// ANALYZE TABLE answers with a result set, which must be read.
	rows, err := d.db.QueryContext(ctx, "ANALYZE TABLE "+table)
	if err != nil {
		return err
	}
	for rows.Next() {
		// The rows say what was done; an error would be in rows.Err.
	}
	if err := rows.Err(); err != nil {
		_ = rows.Close()
		return err
	}
	return rows.Close()
}

func (d *mysqlDatabase) createWriteTables(ctx context.Context, orders, bare string) error {
	if _, err := d.db.ExecContext(ctx, `CREATE TABLE `+orders+` (
		id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
		customer VARCHAR(255) NOT NULL,
		amount_cents BIGINT NOT NULL,
		status VARCHAR(32) NOT NULL,
		created_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
	) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin`); err != nil {
		return err
	}
	// The outbox's columns, with the primary key alone: no CHECK, no
	// generated partition, no trigger, no other index.
	_, err := d.db.ExecContext(ctx, `CREATE TABLE `+bare+` (
		seq        BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
		id         VARCHAR(36) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
		topic      VARCHAR(1024) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
		`+"`key`"+`      VARCHAR(766),
		payload    LONGBLOB NOT NULL,
		headers    LONGTEXT NOT NULL DEFAULT '{}',
		created_at BIGINT NOT NULL DEFAULT (TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) DIV 1000)
	) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin`)
	return err
}

// values is n rows of VALUES of a multi-row INSERT, each row tuple.
func values(tuple string, n int) string {
	return strings.TrimSuffix(strings.Repeat(tuple+", ", n), ", ")
}

func (d *mysqlDatabase) writeTx(ctx context.Context, c benchClient, t writeTables, r *writeRows, mode writeMode) error {
	client, ok := c.(*postbox.Client[*sql.Tx])
	if !ok {
		return fmt.Errorf("bench: a %T on %s", c, d.server)
	}
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	n := len(r.customers)
	args := make([]any, 0, 5*n)
	for i := range n {
		args = append(args, r.customers[i], r.amounts[i])
	}
	domain := "INSERT INTO " + t.orders + " (customer, amount_cents, status) VALUES " + values("(?, ?, 'new')", n) //nolint:gosec // the run's table and placeholders
	if _, err := tx.ExecContext(ctx, domain, args...); err != nil {
		return err
	}
	switch mode {
	case withPostbox:
		if err := client.WriteTx(ctx, tx, r.msgs...); err != nil {
			return err
		}
	case bareRow:
		args = args[:0]
		for i := range n {
			args = append(args, r.ids[i], r.msgs[i].Topic, r.customers[i], r.msgs[i].Payload, r.headers[i])
		}
		bare := "INSERT INTO " + t.bare + " (id, topic, `key`, payload, headers) VALUES " + values("(?, ?, ?, ?, ?)", n) //nolint:gosec // the run's table and placeholders
		if _, err := tx.ExecContext(ctx, bare, args...); err != nil {
			return err
		}
	}
	return tx.Commit()
}

func (d *mysqlDatabase) sizes(ctx context.Context, tables ...string) ([]float64, []int64, error) {
	rowBytes := make([]float64, len(tables))
	total := make([]int64, len(tables))
	for i, t := range tables {
		// InnoDB's own estimates, refreshed first: the average row of the
		// clustered index, and the pages of the table and its indexes.
		if err := d.analyze(ctx, t); err != nil {
			return nil, nil, err
		}
		if err := d.db.QueryRowContext(ctx, `SELECT avg_row_length, data_length + index_length FROM information_schema.tables
			WHERE table_schema = DATABASE() AND table_name = ?`, t).Scan(&rowBytes[i], &total[i]); err != nil {
			return nil, nil, err
		}
	}
	return rowBytes, total, nil
}
