// Package pgxdriver is postboxpgx's Store over the outbox on a pgx pool,
// apart from the public package so that the log's Store (internal/pglog),
// which wraps it, and postboxpgx, which offers both, can each import it.
// What postboxpgx adds is its Tx: it passes New the function that binds a
// Store's statements to one.
package pgxdriver

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-go/postbox/internal/pgsql"
	"github.com/postbox-go/postbox/internal/pgxq"
	"github.com/postbox-go/postbox/postboxdriver"
)

// Driver opens Stores over the outbox on a pgx pool.
type Driver struct {
	pool   *pgxpool.Pool
	unwrap func(pgx.Tx) pgsql.Querier
}

var (
	_ postboxdriver.Driver[pgx.Tx]      = (*Driver)(nil)
	_ postboxdriver.ConnChecker[pgx.Tx] = (*store)(nil)
	_ postboxdriver.Signaler            = (*store)(nil)
	_ postboxdriver.Listener            = (*store)(nil)
)

// New returns a Driver over pool. unwrap makes the Querier of a caller's
// transaction (postboxpgx's makes a Tx's defer its inserts to the
// COMMIT); nil runs a transaction's statements in it at once.
func New(pool *pgxpool.Pool, unwrap func(pgx.Tx) pgsql.Querier) *Driver {
	if unwrap == nil {
		unwrap = func(tx pgx.Tx) pgsql.Querier { return Querier[pgx.Tx]{tx} }
	}
	return &Driver{pool: pool, unwrap: unwrap}
}

// Open implements postboxdriver.Driver.
func (d *Driver) Open(prefix string) (postboxdriver.Store[pgx.Tx], error) {
	core, err := pgsql.New(poolDB{Querier[*pgxpool.Pool]{d.pool}}, prefix)
	if err != nil {
		return nil, err
	}
	return &store{Core: core, pool: d.pool, unwrap: d.unwrap}, nil
}

type store struct {
	*pgsql.Core
	pool   *pgxpool.Pool
	unwrap func(pgx.Tx) pgsql.Querier
}

func (s *store) UnwrapExecutor(tx pgx.Tx) postboxdriver.Executor {
	return s.WithTx(s.unwrap(tx))
}

// Pool returns the pool the Store's statements run on.
func (s *store) Pool() *pgxpool.Pool { return s.pool }

func (s *store) InTx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, s.pool, fn)
}

// ConnLost implements postboxdriver.ConnChecker: pgx closes a connection
// that failed or that the server ended, so asking costs no round trip.
func (s *store) ConnLost(_ context.Context, tx pgx.Tx) bool {
	c := tx.Conn()
	return c != nil && c.IsClosed()
}

// Listen implements postboxdriver.Listener on a connection of its own,
// made with the pool's connection settings and outside the pool, so that
// it takes none of the pool's connections.
func (s *store) Listen(ctx context.Context, ready func(), heard func(postboxdriver.Heard)) error {
	c, err := pgx.ConnectConfig(ctx, s.pool.Config().ConnConfig.Copy())
	if err != nil {
		return err
	}
	return s.Core.Listen(ctx, listenConn{Querier[*pgx.Conn]{c}}, ready, heard)
}

// conn is what a pool, a connection and a transaction share.
type conn interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Querier adapts a pool, a connection or a transaction to pgsql.Querier.
type Querier[C conn] struct{ C C }

// Exec implements pgsql.Querier.
func (q Querier[C]) Exec(ctx context.Context, sql string, args ...any) (int64, error) {
	tag, err := q.C.Exec(ctx, sql, args...)
	return tag.RowsAffected(), err
}

// Query implements pgsql.Querier.
func (q Querier[C]) Query(ctx context.Context, sql string, args ...any) (pgsql.Rows, error) {
	return q.C.Query(ctx, sql, args...)
}

// poolDB runs pgsql's transactions of its own on the pool.
type poolDB struct{ Querier[*pgxpool.Pool] }

func (d poolDB) Tx(ctx context.Context, fn func(q pgsql.Querier) error) error {
	return pgx.BeginFunc(ctx, d.C, func(tx pgx.Tx) error { return fn(Querier[pgx.Tx]{tx}) })
}

// Pin runs fn on one of the pool's connections.
func (d poolDB) Pin(ctx context.Context, fn func(q pgsql.Querier, named bool) error) error {
	c, err := d.C.Acquire(ctx)
	if err != nil {
		return err
	}
	defer c.Release()
	return fn(pgxq.Unnamed(c.Conn()), pgxq.NamesStatements(c.Conn().Config()))
}

// listenConn adapts a pgx connection to pgsql.ListenConn.
type listenConn struct{ Querier[*pgx.Conn] }

func (l listenConn) Wait(ctx context.Context) (string, error) {
	n, err := l.C.WaitForNotification(ctx)
	if err != nil {
		return "", err
	}
	return n.Payload, nil
}

func (l listenConn) Close(ctx context.Context) error { return l.C.Close(ctx) }
