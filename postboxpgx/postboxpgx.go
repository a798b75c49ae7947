// Package postboxpgx is the postbox driver for PostgreSQL through pgx v5.
//
//	client, err := postbox.NewClient(postboxpgx.New(pool), &postbox.Config{...})
//	...
//	tx, _ := pool.Begin(ctx)
//	// write domain rows with tx, then:
//	err = client.WriteTx(ctx, tx, postbox.Message{Topic: "orders.created", Key: orderID, Payload: body})
//	tx.Commit(ctx)
//
// A transaction begun with Begin (a *Tx) sends the messages with its
// COMMIT, in one round trip, instead of in a statement of their own.
package postboxpgx

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-go/postbox/internal/pgsql"
	"github.com/postbox-go/postbox/internal/pgxq"
	"github.com/postbox-go/postbox/postboxdriver"
)

// Driver adapts a pgx pool. Transactions are pgx.Tx.
type Driver struct {
	pool *pgxpool.Pool
}

var (
	_ postboxdriver.Driver[pgx.Tx]      = (*Driver)(nil)
	_ postboxdriver.ConnChecker[pgx.Tx] = (*store)(nil)
)

// New returns a driver over pool.
func New(pool *pgxpool.Pool) *Driver { return &Driver{pool: pool} }

// Pool returns the pool the driver was made with.
func (d *Driver) Pool() *pgxpool.Pool { return d.pool }

// Open implements postboxdriver.Driver.
func (d *Driver) Open(prefix string) (postboxdriver.Store[pgx.Tx], error) {
	core, err := pgsql.New(poolDB{querier[*pgxpool.Pool]{d.pool}}, prefix)
	if err != nil {
		return nil, err
	}
	return &store{Core: core, pool: d.pool}, nil
}

type store struct {
	*pgsql.Core
	pool *pgxpool.Pool
}

func (s *store) UnwrapExecutor(tx pgx.Tx) postboxdriver.Executor {
	if t, ok := tx.(*Tx); ok {
		return s.WithTx(deferring{querier[pgx.Tx]{t}, t})
	}
	return s.WithTx(querier[pgx.Tx]{tx})
}

func (s *store) InTx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, s.pool, fn)
}

// ConnLost implements postboxdriver.ConnChecker: pgx closes a connection
// that failed or that the server ended, so asking costs no round trip.
func (s *store) ConnLost(_ context.Context, tx pgx.Tx) bool {
	c := tx.Conn()
	return c != nil && c.IsClosed()
}

// conn is what a pool and a transaction share.
type conn interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// querier adapts a pool or a transaction to pgsql.Querier.
type querier[C conn] struct{ c C }

func (q querier[C]) Exec(ctx context.Context, sql string, args ...any) (int64, error) {
	tag, err := q.c.Exec(ctx, sql, args...)
	return tag.RowsAffected(), err
}

func (q querier[C]) Query(ctx context.Context, sql string, args ...any) (pgsql.Rows, error) {
	return q.c.Query(ctx, sql, args...)
}

// poolDB runs pgsql's transactions of its own on the pool.
type poolDB struct{ querier[*pgxpool.Pool] }

func (d poolDB) Tx(ctx context.Context, fn func(q pgsql.Querier) error) error {
	return pgx.BeginFunc(ctx, d.c, func(tx pgx.Tx) error { return fn(querier[pgx.Tx]{tx}) })
}

// Pin runs fn on one of the pool's connections.
func (d poolDB) Pin(ctx context.Context, fn func(q pgsql.Querier, named bool) error) error {
	c, err := d.c.Acquire(ctx)
	if err != nil {
		return err
	}
	defer c.Release()
	return fn(pgxq.Unnamed(c.Conn()), pgxq.NamesStatements(c.Conn().Config()))
}
