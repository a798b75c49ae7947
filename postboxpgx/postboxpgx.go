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
//
// With WithLog the driver's relays read the log (design §3, "The next
// storage model"), which PostgreSQL drains without moving each message
// into a history, and its writers write the log while the database says
// so (`postbox storage log`).
package postboxpgx

import (
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-go/postbox/internal/pglog"
	"github.com/postbox-go/postbox/internal/pgsql"
	"github.com/postbox-go/postbox/internal/pgxdriver"
	"github.com/postbox-go/postbox/postboxdriver"
)

// Driver adapts a pgx pool. Transactions are pgx.Tx.
type Driver struct {
	pool *pgxpool.Pool
	log  bool
}

var _ postboxdriver.Driver[pgx.Tx] = (*Driver)(nil)

// An Option sets how a Driver stores messages.
type Option func(*Driver)

// WithLog makes the Driver's Stores work over the log of PostgreSQL
// migration 12 (design §3, "The next storage model") beside the outbox.
// Their relays read the log by snapshot bands and advance a position per
// partition once a batch, instead of moving each message from the outbox
// into the published table: PostgreSQL's CPU a drained message falls by
// half or more (BENCHMARKS.md, "The log in the driver, and other writers'
// rows"). History, replay, dead messages and retention read the log
// beside the outbox and the published table.
//
// The writers follow the database's setting (migration 13): they write
// the log while it says log and the outbox while it says table, deciding
// in the writer's own transaction. A relay over the log reads both, so it
// runs under either setting, and a relay without WithLog is refused while
// the database says log. To move a database to the log: run every relay
// of it with WithLog (or `storage: log` in `postbox relay`), then `postbox
// storage log`. The way back: `postbox storage table`, then relays without
// WithLog once the log holds nothing pending.
//
// What changes for a user (design §3, "What changes for users"): the log
// has no unique index on id, so a second pending message under an id
// already pending is no longer refused at insert; and while the database
// says log, the rows writers in other languages insert into the outbox
// move into the log (migration 14), so their INSERT reports no row.
func WithLog() Option { return func(d *Driver) { d.log = true } }

// New returns a driver over pool.
func New(pool *pgxpool.Pool, opts ...Option) *Driver {
	d := &Driver{pool: pool}
	for _, o := range opts {
		o(d)
	}
	return d
}

// Pool returns the pool the driver was made with.
func (d *Driver) Pool() *pgxpool.Pool { return d.pool }

// Open implements postboxdriver.Driver.
func (d *Driver) Open(prefix string) (postboxdriver.Store[pgx.Tx], error) {
	outbox := pgxdriver.New(d.pool, unwrap)
	if d.log {
		return pglog.New(outbox, d.pool, 0).Open(prefix)
	}
	return outbox.Open(prefix)
}

// unwrap is the Querier of a caller's transaction: a Tx's defers its
// inserts to the COMMIT.
func unwrap(tx pgx.Tx) pgsql.Querier {
	if t, ok := tx.(*Tx); ok {
		return deferring{pgxdriver.Querier[pgx.Tx]{C: t}, t}
	}
	return pgxdriver.Querier[pgx.Tx]{C: tx}
}
