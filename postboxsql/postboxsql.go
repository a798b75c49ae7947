// Package postboxsql is the postbox driver for PostgreSQL through
// database/sql, with pgx's stdlib driver ("pgx" as the driver name, from
// github.com/jackc/pgx/v5/stdlib). Transactions are *sql.Tx.
//
// Other database/sql drivers for PostgreSQL (lib/pq) cannot carry the typed
// arrays postbox binds; New refuses them with a clear error.
package postboxsql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/postbox-go/postbox/internal/pgsql"
	"github.com/postbox-go/postbox/internal/pgxq"
	"github.com/postbox-go/postbox/internal/sqlkit"
	"github.com/postbox-go/postbox/postboxdriver"
)

// ErrUnsupportedDriver is returned by New for a *sql.DB that is not backed
// by pgx's stdlib driver.
var ErrUnsupportedDriver = errors.New("postboxsql: the *sql.DB must use pgx's stdlib driver (github.com/jackc/pgx/v5/stdlib)")

// Driver adapts a *sql.DB opened with pgx's stdlib driver.
type Driver struct {
	db *sql.DB
}

var (
	_ postboxdriver.Driver[*sql.Tx]      = (*Driver)(nil)
	_ postboxdriver.ConnChecker[*sql.Tx] = (*store)(nil)
)

// New returns a driver over db.
func New(db *sql.DB) (*Driver, error) {
	if _, ok := db.Driver().(*stdlib.Driver); !ok {
		return nil, fmt.Errorf("%w; got %T", ErrUnsupportedDriver, db.Driver())
	}
	return &Driver{db: db}, nil
}

// DB returns the *sql.DB the driver was made with.
func (d *Driver) DB() *sql.DB { return d.db }

// Open implements postboxdriver.Driver.
func (d *Driver) Open(prefix string) (postboxdriver.Store[*sql.Tx], error) {
	core, err := pgsql.New(poolDB{querier[*sql.DB]{d.db}}, prefix)
	if err != nil {
		return nil, err
	}
	return &store{Core: core, db: d.db}, nil
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
