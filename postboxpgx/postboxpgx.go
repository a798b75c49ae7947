// Package postboxpgx is the postbox driver for PostgreSQL through pgx v5.
//
//	client, err := postbox.NewClient(postboxpgx.New(pool), &postbox.Config{...})
//	...
//	tx, _ := pool.Begin(ctx)
//	// write domain rows with tx, then:
//	err = client.WriteTx(ctx, tx, postbox.Message{Topic: "orders.created", Key: orderID, Payload: body})
//	tx.Commit(ctx)
package postboxpgx

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-go/postbox/internal/pgsql"
	"github.com/postbox-go/postbox/postboxdriver"
)

// Driver adapts a pgx pool. Transactions are pgx.Tx.
type Driver struct {
	pool *pgxpool.Pool
}

// New returns a driver over pool.
func New(pool *pgxpool.Pool) *Driver { return &Driver{pool: pool} }

// Pool returns the pool the driver was made with.
func (d *Driver) Pool() *pgxpool.Pool { return d.pool }

// Open implements postboxdriver.Driver.
func (d *Driver) Open(prefix string) (postboxdriver.Store[pgx.Tx], error) {
	core, err := pgsql.New(poolDB{d.pool}, prefix)
	if err != nil {
		return nil, err
	}
	return &store{Core: core, pool: d.pool}, nil
}

type store struct {
	*pgsql.Core
	pool *pgxpool.Pool
}

func (s *store) InsertTx(ctx context.Context, tx pgx.Tx, rows []postboxdriver.Row) error {
	return s.Insert(ctx, querier{tx}, rows)
}

func (s *store) InTx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, s.pool, fn)
}

type querier struct{ q pgx.Tx }

func (q querier) Exec(ctx context.Context, sql string, args ...any) error {
	_, err := q.q.Exec(ctx, sql, args...)
	return err
}

func (q querier) Query(ctx context.Context, sql string, args ...any) (pgsql.Rows, error) {
	return q.q.Query(ctx, sql, args...)
}

type poolDB struct{ p *pgxpool.Pool }

func (d poolDB) Exec(ctx context.Context, sql string, args ...any) error {
	_, err := d.p.Exec(ctx, sql, args...)
	return err
}

func (d poolDB) Query(ctx context.Context, sql string, args ...any) (pgsql.Rows, error) {
	return d.p.Query(ctx, sql, args...)
}

func (d poolDB) Tx(ctx context.Context, fn func(q pgsql.Querier) error) error {
	return pgx.BeginFunc(ctx, d.p, func(tx pgx.Tx) error { return fn(querier{tx}) })
}

func (s *store) InboxInsertTx(ctx context.Context, tx pgx.Tx, consumer, messageID string) (bool, error) {
	return s.InboxInsert(ctx, querier{tx}, consumer, messageID)
}

func (s *store) TakeDeadTx(ctx context.Context, tx pgx.Tx, consumer, messageID string) (postboxdriver.DeadLetter, error) {
	return s.TakeDead(ctx, querier{tx}, consumer, messageID)
}

var _ postboxdriver.Inboxer[pgx.Tx] = (*store)(nil)

func (s *store) ExecTx(ctx context.Context, tx pgx.Tx, query string, args ...any) (int64, error) {
	tag, err := tx.Exec(ctx, query, args...)
	return tag.RowsAffected(), err
}

func (s *store) QueryTx(ctx context.Context, tx pgx.Tx, query string, args ...any) (postboxdriver.Rows, error) {
	return tx.Query(ctx, query, args...)
}

func (s *store) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	tag, err := s.pool.Exec(ctx, query, args...)
	return tag.RowsAffected(), err
}

func (s *store) Query(ctx context.Context, query string, args ...any) (postboxdriver.Rows, error) {
	return s.pool.Query(ctx, query, args...)
}

var _ postboxdriver.Raw[pgx.Tx] = (*store)(nil)
