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
	"github.com/postbox-go/postbox/postboxdriver"
)

// ErrUnsupportedDriver is returned by New for a *sql.DB that is not backed
// by pgx's stdlib driver.
var ErrUnsupportedDriver = errors.New("postboxsql: the *sql.DB must use pgx's stdlib driver (github.com/jackc/pgx/v5/stdlib)")

// Driver adapts a *sql.DB opened with pgx's stdlib driver.
type Driver struct {
	db *sql.DB
}

// New returns a driver over db.
func New(db *sql.DB) (*Driver, error) {
	if _, ok := db.Driver().(*stdlib.Driver); !ok {
		return nil, fmt.Errorf("%w; got %T", ErrUnsupportedDriver, db.Driver())
	}
	return &Driver{db: db}, nil
}

// Open implements postboxdriver.Driver.
func (d *Driver) Open(prefix string) (postboxdriver.Store[*sql.Tx], error) {
	core, err := pgsql.New(dbQuerier{d.db}, prefix)
	if err != nil {
		return nil, err
	}
	return &store{Core: core, db: d.db}, nil
}

type store struct {
	*pgsql.Core
	db *sql.DB
}

func (s *store) InsertTx(ctx context.Context, tx *sql.Tx, rows []postboxdriver.Row) error {
	return s.Insert(ctx, txQuerier{tx}, rows)
}

func (s *store) InTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	return inTx(ctx, s.db, fn)
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

type sqlQuerier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

func exec(ctx context.Context, q sqlQuerier, query string, args []any) error {
	_, err := q.ExecContext(ctx, query, args...)
	return err
}

func query(ctx context.Context, q sqlQuerier, query string, args []any) (pgsql.Rows, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return sqlRows{rows}, nil
}

type txQuerier struct{ tx *sql.Tx }

func (q txQuerier) Exec(ctx context.Context, s string, args ...any) error {
	return exec(ctx, q.tx, s, args)
}

func (q txQuerier) Query(ctx context.Context, s string, args ...any) (pgsql.Rows, error) {
	return query(ctx, q.tx, s, args)
}

type dbQuerier struct{ db *sql.DB }

func (q dbQuerier) Exec(ctx context.Context, s string, args ...any) error {
	return exec(ctx, q.db, s, args)
}

func (q dbQuerier) Query(ctx context.Context, s string, args ...any) (pgsql.Rows, error) {
	return query(ctx, q.db, s, args)
}

func (q dbQuerier) Tx(ctx context.Context, fn func(pgsql.Querier) error) error {
	return inTx(ctx, q.db, func(tx *sql.Tx) error { return fn(txQuerier{tx}) })
}

// sqlRows adapts *sql.Rows, whose Close returns an error the core has no
// use for: Err reports what matters after iteration.
type sqlRows struct{ *sql.Rows }

func (r sqlRows) Close() { _ = r.Rows.Close() }

// DB returns the *sql.DB the driver was made with.
func (d *Driver) DB() *sql.DB { return d.db }

func (s *store) InboxInsertTx(ctx context.Context, tx *sql.Tx, consumer, messageID string) (bool, error) {
	return s.InboxInsert(ctx, txQuerier{tx}, consumer, messageID)
}

func (s *store) TakeDeadTx(ctx context.Context, tx *sql.Tx, consumer, messageID string) (postboxdriver.DeadLetter, error) {
	return s.TakeDead(ctx, txQuerier{tx}, consumer, messageID)
}

var _ postboxdriver.Inboxer[*sql.Tx] = (*store)(nil)

func affected(res sql.Result, err error) (int64, error) {
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (s *store) ExecTx(ctx context.Context, tx *sql.Tx, query string, args ...any) (int64, error) {
	return affected(tx.ExecContext(ctx, query, args...))
}

func (s *store) QueryTx(ctx context.Context, tx *sql.Tx, query string, args ...any) (postboxdriver.Rows, error) {
	rows, err := tx.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return sqlRows{rows}, nil
}

func (s *store) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	return affected(s.db.ExecContext(ctx, query, args...))
}

func (s *store) Query(ctx context.Context, query string, args ...any) (postboxdriver.Rows, error) {
	rows, err := s.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return sqlRows{rows}, nil
}

var _ postboxdriver.Raw[*sql.Tx] = (*store)(nil)
