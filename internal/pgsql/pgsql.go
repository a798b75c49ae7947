// Package pgsql holds the PostgreSQL dialect shared by the pgx and the
// database/sql drivers: the SQL, the migrations and the logic around them,
// over a small query interface that each driver adapts. It implements
// postboxdriver.Executor once; a driver wraps its pool, or the caller's
// transaction, in a DB and hands it to Core.
package pgsql

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/postbox-go/postbox/postboxdriver"
)

// Querier runs statements. pgx.Tx, *pgxpool.Pool, *sql.Tx and *sql.DB are
// adapted to it by the drivers.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (int64, error)
	Query(ctx context.Context, sql string, args ...any) (Rows, error)
}

// Rows is the part of a result set the core reads.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close()
}

// DB is a Querier that can also run a function in a transaction: a new one
// on a pool, the same one when the Querier is a transaction already.
type DB interface {
	Querier
	Tx(ctx context.Context, fn func(q Querier) error) error
	// Pin runs fn on one client connection held for fn's duration, its
	// statements outside any transaction and never prepared under a name.
	// named says whether the connection's ordinary statements are
	// prepared under a name (pgx's cache_statement mode).
	Pin(ctx context.Context, fn func(q Querier, named bool) error) error
}

// InTx adapts a transaction to DB: its Tx runs fn in the transaction
// itself, whose outcome is the caller's.
type InTx struct{ Querier }

// Tx implements DB.
func (t InTx) Tx(_ context.Context, fn func(q Querier) error) error { return fn(t.Querier) }

// Pin implements DB: a transaction has no connection of its own to lend.
func (t InTx) Pin(context.Context, func(Querier, bool) error) error {
	return postboxdriver.ErrNotInTx
}

//go:embed migrations/*.sql
var migrationFS embed.FS

// dialect is what every Core bound to one prefix shares: the statements.
type dialect struct {
	prefix string
	// signalID names this Core's change signals, and written holds the
	// partitions written since its last one (signal.go).
	signalID string
	written  atomic.Uint64
	// storage is StorageLog for the Core of the log's Store (ReadsLog),
	// "" otherwise: what its relays read.
	storage string
	q       queries
	aq      adminQueries
	iq      inboxQueries
	idq     idempotencyQueries
}

// Core implements postboxdriver.Executor for PostgreSQL over a DB: the
// driver's pool, or (WithTx) the caller's transaction.
type Core struct {
	*dialect
	db   DB
	inTx bool
}

var _ postboxdriver.Executor = (*Core)(nil)

// New binds db, the driver's pool, to the tables named with prefix.
func New(db DB, prefix string) (*Core, error) {
	if err := postboxdriver.CheckPrefix(prefix); err != nil {
		return nil, err
	}
	d := &dialect{prefix: prefix, signalID: newSignalID(), q: makeQueries(prefix), aq: makeAdminQueries(prefix), iq: makeInboxQueries(prefix), idq: makeIdempotencyQueries(prefix)}
	return &Core{dialect: d, db: db}, nil
}

// WithTx returns a Core with the same statements running in tx, the
// caller's transaction.
func (c *Core) WithTx(tx Querier) *Core {
	return &Core{dialect: c.dialect, db: InTx{tx}, inTx: true}
}

// Dialect implements postboxdriver.Executor.
func (c *Core) Dialect() string { return "postgres" }

// Migrations implements postboxdriver.Executor.
func (c *Core) Migrations() []postboxdriver.Migration {
	return postboxdriver.LoadMigrations(migrationFS, "migrations", c.prefix)
}

// AppliedMigrations implements postboxdriver.Executor. It looks for the
// migrations table first rather than reading it and failing: a failed
// statement would abort a caller's transaction.
func (c *Core) AppliedMigrations(ctx context.Context) ([]int, error) {
	var exists bool
	if err := c.queryRow(ctx, c.db, `SELECT to_regclass($1) IS NOT NULL`, []any{c.prefix + "migrations"}, &exists); err != nil || !exists {
		return nil, err
	}
	rows, err := c.db.Query(ctx, `SELECT version FROM `+c.prefix+`migrations ORDER BY version`)
	if err != nil {
		return nil, err
	}
	var vs []int
	err = scanAll(rows, func(r Rows) error {
		var v int
		if err := r.Scan(&v); err != nil {
			return err
		}
		vs = append(vs, v)
		return nil
	})
	return vs, err
}

// ApplyMigration implements postboxdriver.Executor. An advisory lock keyed
// on the prefix makes concurrent migrators queue up, and each re-checks the
// version under the lock, so two replicas starting together apply it once.
func (c *Core) ApplyMigration(ctx context.Context, m postboxdriver.Migration) error {
	return c.db.Tx(ctx, func(q Querier) error {
		if _, err := q.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, "postbox_migrate:"+c.prefix); err != nil {
			return err
		}
		if _, err := q.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+c.prefix+`migrations (
  version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
			return err
		}
		var done bool
		if err := c.queryRow(ctx, q, `SELECT EXISTS (SELECT 1 FROM `+c.prefix+`migrations WHERE version = $1)`, []any{m.Version}, &done); err != nil {
			return err
		}
		if done {
			return nil
		}
		if _, err := q.Exec(ctx, m.SQL); err != nil {
			return fmt.Errorf("migration %d (%s): %w", m.Version, m.Name, err)
		}
		_, err := q.Exec(ctx, `INSERT INTO `+c.prefix+`migrations (version, name) VALUES ($1, $2)`, m.Version, m.Name)
		return err
	})
}

// exec runs a statement on the Core's DB, wrapping its error.
func (c *Core) exec(ctx context.Context, sql string, args ...any) (int64, error) {
	n, err := c.db.Exec(ctx, sql, args...)
	return n, c.wrap(err)
}

// count runs a statement that returns one count.
func (c *Core) count(ctx context.Context, sql string, args ...any) (int, error) {
	var n int
	err := c.queryRow(ctx, c.db, sql, args, &n)
	return n, err
}

func (c *Core) queryRow(ctx context.Context, q Querier, sql string, args []any, dest ...any) error {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return c.wrap(err)
	}
	found := false
	err = scanAll(rows, func(r Rows) error {
		found = true
		return r.Scan(dest...)
	})
	if err == nil && !found {
		err = errors.New("pgsql: query returned no row")
	}
	return c.wrap(err)
}

// queryAll runs a query and scans every row with scan.
func queryAll[T any](ctx context.Context, c *Core, sql string, args []any, scan func(r Rows) (T, error)) ([]T, error) {
	rows, err := c.db.Query(ctx, sql, args...)
	if err != nil {
		return nil, c.wrap(err)
	}
	var out []T
	err = scanAll(rows, func(r Rows) error {
		v, err := scan(r)
		out = append(out, v)
		return err
	})
	return out, c.wrap(err)
}

// queryOne runs a query that returns at most one row, or ErrNotFound.
func queryOne[T any](ctx context.Context, c *Core, sql string, args []any, scan func(r Rows) (T, error)) (T, error) {
	out, err := queryAll(ctx, c, sql, args, scan)
	var v T
	switch {
	case err != nil:
		return v, err
	case len(out) == 0:
		return v, postboxdriver.ErrNotFound
	}
	return out[0], nil
}

func (c *Core) wrap(err error) error { return NotMigrated(c.prefix, err) }

// NotMigrated returns err wrapped in postboxdriver.ErrNotMigrated when a
// table under prefix it needs does not exist, or a column a later
// migration adds, and err itself otherwise.
func NotMigrated(prefix string, err error) error {
	if code := sqlState(err); code == "42P01" || code == "42703" {
		return fmt.Errorf("%w (prefix %q): %w", postboxdriver.ErrNotMigrated, prefix, err)
	}
	return err
}

// sqlState is the SQLSTATE of PostgreSQL's error in err, "" for none,
// through the SQLState method pgx's error has, so this package needs no
// client: 42P01 undefined_table, 42703 undefined_column (a column of a
// later migration, such as relays.storage of migration 13), 55P03
// lock_not_available (lock_timeout).
func sqlState(err error) string {
	var coded interface{ SQLState() string }
	if errors.As(err, &coded) {
		return coded.SQLState()
	}
	return ""
}

func scanAll(rows Rows, fn func(Rows) error) error {
	defer rows.Close()
	for rows.Next() {
		if err := fn(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}
