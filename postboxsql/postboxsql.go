// Package postboxsql is the postbox driver for PostgreSQL through
// database/sql, with pgx's stdlib driver ("pgx" as the driver name, from
// github.com/jackc/pgx/v5/stdlib). Transactions are *sql.Tx.
//
// Other database/sql drivers for PostgreSQL (lib/pq) cannot carry the typed
// arrays postbox binds; New refuses them with a clear error.
//
// With WithLog the driver's relays read the log (design §3, "The next
// storage model"), as postboxpgx.WithLog's do, and its writers write the
// log in the caller's *sql.Tx while the database says so (`postbox storage
// log`).
package postboxsql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/postbox-go/postbox/internal/pglog"
	"github.com/postbox-go/postbox/internal/pgsql"
	"github.com/postbox-go/postbox/internal/pgxq"
	"github.com/postbox-go/postbox/internal/sqlkit"
	"github.com/postbox-go/postbox/postboxdriver"
)

// ErrUnsupportedDriver is returned by New for a *sql.DB that is not backed
// by pgx's stdlib driver.
var ErrUnsupportedDriver = errors.New("postboxsql: the *sql.DB must use pgx's stdlib driver (github.com/jackc/pgx/v5/stdlib)")

// ErrNoLogPool is returned by New for WithLog(nil).
var ErrNoLogPool = errors.New("postboxsql: WithLog needs a *pgxpool.Pool on the database of the *sql.DB")

// Driver adapts a *sql.DB opened with pgx's stdlib driver.
type Driver struct {
	db *sql.DB
	// log is the pool of WithLog, on which the log's statements run; nil
	// keeps the outbox.
	log *pgxpool.Pool
	// err is an option's error, which New returns.
	err error
}

// An Option sets how a Driver stores messages.
type Option func(*Driver)

// WithLog makes the Driver's Stores work over the log of PostgreSQL
// migration 12 beside the outbox, as postboxpgx.WithLog does, with the
// same steps to move a database to it and back and the same differences
// for users (see postboxpgx.WithLog): their relays read the log by
// snapshot bands and advance a position per partition once a batch
// instead of moving each message into the published table, and their
// writers write the log, in the caller's *sql.Tx, while the database says
// log.
//
// The log's own statements (the relay's reads and records, its chunks)
// are pgx's batches and transactions, which database/sql cannot carry:
// they run on pool, a pgx pool on the same database as the *sql.DB,
// which stays the caller's to close. A *sql.DB made from a pool
// (stdlib.OpenDBFromPool) can share it. The relay checks at its start that
// both reach one database and refuses to start otherwise
// (postboxdriver.ErrOtherDatabase), since a pool elsewhere would leave
// every message the writers log unread.
func WithLog(pool *pgxpool.Pool) Option {
	return func(d *Driver) {
		if pool == nil {
			d.err = ErrNoLogPool
		}
		d.log = pool
	}
}

var (
	_ postboxdriver.Driver[*sql.Tx]      = (*Driver)(nil)
	_ postboxdriver.ConnChecker[*sql.Tx] = (*store)(nil)
)

// New returns a driver over db.
func New(db *sql.DB, opts ...Option) (*Driver, error) {
	if _, ok := db.Driver().(*stdlib.Driver); !ok {
		return nil, fmt.Errorf("%w; got %T", ErrUnsupportedDriver, db.Driver())
	}
	d := &Driver{db: db}
	for _, o := range opts {
		o(d)
	}
	if d.err != nil {
		return nil, d.err
	}
	return d, nil
}

// DB returns the *sql.DB the driver was made with.
func (d *Driver) DB() *sql.DB { return d.db }

// Open implements postboxdriver.Driver.
func (d *Driver) Open(prefix string) (postboxdriver.Store[*sql.Tx], error) {
	if d.log != nil {
		return pglog.New(outbox{d.db}, d.log, 0).Open(prefix)
	}
	return outbox{d.db}.Open(prefix)
}

// outbox opens the Stores over the outbox, which the log's wrap.
type outbox struct{ db *sql.DB }

func (o outbox) Open(prefix string) (postboxdriver.Store[*sql.Tx], error) {
	core, err := pgsql.New(poolDB{querier[*sql.DB]{o.db}}, prefix)
	if err != nil {
		return nil, err
	}
	return &store{Core: core, db: o.db}, nil
}

type store struct {
	*pgsql.Core
	db *sql.DB
}

func (s *store) UnwrapExecutor(tx *sql.Tx) postboxdriver.Executor {
	return s.WithTx(querier[*sql.Tx]{tx})
}

func (s *store) InTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	return inTx(ctx, s.db, fn)
}

// ConnLost implements postboxdriver.ConnChecker.
func (s *store) ConnLost(ctx context.Context, tx *sql.Tx) bool {
	return sqlkit.ConnLost(ctx, tx)
}

func inTx(ctx context.Context, db *sql.DB, fn func(tx *sql.Tx) error) (err error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	if err = fn(tx); err != nil {
		return err
	}
	return tx.Commit()
}

// conn is what a *sql.DB and a *sql.Tx share.
type conn interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// querier adapts a *sql.DB or a *sql.Tx to pgsql.Querier.
type querier[C conn] struct{ c C }

func (q querier[C]) Exec(ctx context.Context, s string, args ...any) (int64, error) {
	res, err := q.c.ExecContext(ctx, s, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (q querier[C]) Query(ctx context.Context, s string, args ...any) (pgsql.Rows, error) {
	rows, err := q.c.QueryContext(ctx, s, args...)
	if err != nil {
		return nil, err
	}
	return sqlRows{rows}, nil
}

// poolDB runs pgsql's transactions of its own on the *sql.DB.
type poolDB struct{ querier[*sql.DB] }

func (d poolDB) Tx(ctx context.Context, fn func(pgsql.Querier) error) error {
	return inTx(ctx, d.c, func(tx *sql.Tx) error { return fn(querier[*sql.Tx]{tx}) })
}

// Pin runs fn on one of the *sql.DB's connections, through pgx.
func (d poolDB) Pin(ctx context.Context, fn func(q pgsql.Querier, named bool) error) error {
	c, err := d.c.Conn(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }()
	return c.Raw(func(dc any) error {
		sc, ok := dc.(*stdlib.Conn)
		if !ok {
			return fmt.Errorf("%w; got a %T connection", ErrUnsupportedDriver, dc)
		}
		return fn(pgxq.Unnamed(sc.Conn()), pgxq.NamesStatements(sc.Conn().Config()))
	})
}

// sqlRows adapts *sql.Rows, whose Close returns an error the core has no
// use for: Err reports what matters after iteration.
type sqlRows struct{ *sql.Rows }

func (r sqlRows) Close() { _ = r.Rows.Close() }
