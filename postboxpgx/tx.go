package postboxpgx

import (
	"context"
	"errors"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-go/postbox/internal/pgxdriver"
)

// Tx is a transaction whose Commit sends the messages written into it with
// WriteTx in the same round trip as the COMMIT, so that a write costs the
// domain transaction no round trip of its own:
//
//	tx, err := postboxpgx.Begin(ctx, pool)
//	if err != nil { ... }
//	defer tx.Rollback(ctx)
//	// write domain rows with tx, then:
//	if err := client.WriteTx(ctx, tx, msg); err != nil { ... } // checked now, sent at Commit
//	err = tx.Commit(ctx) // the messages' insert and the COMMIT, one round trip
//
// The relay in the writing Client's process is woken once Commit has
// committed, rather than when WriteTx returns: its lanes read once and find
// the rows, instead of polling fast until the commit.
//
// WriteTx checks the messages at once, as with any transaction; the insert
// itself runs at Commit, which returns its error (and then rolls back, so
// neither the domain rows nor the messages are written). Until then the
// transaction's own statements do not see the messages in the outbox. Once
// a savepoint is made (tx.Begin, or SAVEPOINT through Exec, as the inbox's
// batches do), WriteTx inserts at once, so that rolling a savepoint back
// takes its messages with it.
//
// A Tx holds one of the pool's connections from Begin to Commit or
// Rollback, as pgxpool's transactions do; after either, every method but
// Conn returns pgx.ErrTxClosed.
type Tx struct {
	tx     pgx.Tx
	c      *pgxpool.Conn
	batch  pgx.Batch
	closed bool
	// savepoints: a savepoint was made (Begin, or SAVEPOINT through Exec),
	// so writes no longer wait for Commit.
	savepoints bool
	// committed run after a successful Commit (pgsql.CommitHooker).
	committed []func()
}

var _ pgx.Tx = (*Tx)(nil)

// Begin starts a Tx on one of pool's connections.
func Begin(ctx context.Context, pool *pgxpool.Pool) (*Tx, error) {
	return BeginTx(ctx, pool, pgx.TxOptions{})
}

// BeginTx starts a Tx with opts on one of pool's connections.
func BeginTx(ctx context.Context, pool *pgxpool.Pool, opts pgx.TxOptions) (*Tx, error) {
	c, err := pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	tx, err := c.BeginTx(ctx, opts)
	if err != nil {
		c.Release()
		return nil, err
	}
	return &Tx{tx: tx, c: c}, nil
}

// deferStatement queues a statement for Commit (pgsql.Deferrer, through
// the querier UnwrapExecutor makes), unless a savepoint was made: from
// then on a write runs at once, so that rolling a savepoint back takes its
// messages with it. What was queued before belongs to the transaction
// itself, which no savepoint made later can undo.
func (t *Tx) deferStatement(sql string, args ...any) bool {
	if t.savepoints {
		return false
	}
	t.batch.Queue(sql, args...)
	return true
}

// isSavepoint says whether sql makes a savepoint: the inbox's batches make
// theirs with SQL through Exec.
func isSavepoint(sql string) bool {
	s := strings.TrimSpace(sql)
	return len(s) >= 9 && strings.EqualFold(s[:9], "SAVEPOINT")
}

// Commit sends the queued inserts and the COMMIT together and reads their
// outcome. Without queued inserts it is an ordinary commit. Once it has
// committed, it wakes the relay of each Client that wrote in it.
func (t *Tx) Commit(ctx context.Context) error {
	if t.closed {
		return pgx.ErrTxClosed
	}
	t.closed = true
	err := func() error {
		defer t.c.Release()
		return t.commit(ctx)
	}()
	if err == nil {
		for _, fn := range t.committed {
			fn()
		}
	}
	return err
}

func (t *Tx) commit(ctx context.Context) error {
	n := t.batch.Len()
	if n == 0 {
		return t.tx.Commit(ctx)
	}
	t.batch.Queue("COMMIT")
	br := t.c.Conn().SendBatch(ctx, &t.batch)
	var err error
	var tag pgconn.CommandTag
	for range n + 1 {
		var e error
		if tag, e = br.Exec(); e != nil && err == nil {
			err = e
		}
	}
	if e := br.Close(); e != nil && err == nil {
		err = e
	}
	if err == nil && tag.String() == "ROLLBACK" {
		// The transaction had failed before Commit: the server rolled it
		// back, as pgx's own Commit reports.
		err = pgx.ErrTxCommitRollback
	}
	if err != nil && t.c.Conn().PgConn().TxStatus() != 'I' {
		// An insert failed: the COMMIT never ran and the transaction is
		// still open, aborted. End it, or the connection goes back to the
		// pool inside it (the pool would close such a connection anyway).
		err = errors.Join(err, t.tx.Rollback(ctx))
	}
	return err
}

// Rollback ends the transaction and forgets the queued inserts. After
// Commit it returns pgx.ErrTxClosed, so it can be deferred.
func (t *Tx) Rollback(ctx context.Context) error {
	if t.closed {
		return pgx.ErrTxClosed
	}
	t.closed = true
	defer t.c.Release()
	return t.tx.Rollback(ctx)
}

// Begin starts a savepoint (pgx.Tx), in which WriteTx inserts at once.
func (t *Tx) Begin(ctx context.Context) (pgx.Tx, error) {
	if t.closed {
		return nil, pgx.ErrTxClosed
	}
	t.savepoints = true
	return t.tx.Begin(ctx)
}

// CopyFrom implements pgx.Tx.
func (t *Tx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if t.closed {
		return 0, pgx.ErrTxClosed
	}
	return t.tx.CopyFrom(ctx, table, columns, src)
}

// SendBatch implements pgx.Tx.
func (t *Tx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if t.closed {
		return closedBatch{}
	}
	return t.tx.SendBatch(ctx, b)
}

// LargeObjects implements pgx.Tx.
func (t *Tx) LargeObjects() pgx.LargeObjects { return t.tx.LargeObjects() }

// Prepare implements pgx.Tx.
func (t *Tx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if t.closed {
		return nil, pgx.ErrTxClosed
	}
	return t.tx.Prepare(ctx, name, sql)
}

// Exec implements pgx.Tx.
func (t *Tx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if t.closed {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	if isSavepoint(sql) {
		t.savepoints = true
	}
	return t.tx.Exec(ctx, sql, args...)
}

// Query implements pgx.Tx.
func (t *Tx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if t.closed {
		return nil, pgx.ErrTxClosed
	}
	return t.tx.Query(ctx, sql, args...)
}

// QueryRow implements pgx.Tx.
func (t *Tx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if t.closed {
		return closedRow{}
	}
	return t.tx.QueryRow(ctx, sql, args...)
}

// Conn implements pgx.Tx.
func (t *Tx) Conn() *pgx.Conn { return t.tx.Conn() }

type closedRow struct{}

func (closedRow) Scan(...any) error { return pgx.ErrTxClosed }

type closedBatch struct{}

func (closedBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, pgx.ErrTxClosed }
func (closedBatch) Query() (pgx.Rows, error)         { return nil, pgx.ErrTxClosed }
func (closedBatch) QueryRow() pgx.Row                { return closedRow{} }
func (closedBatch) Close() error                     { return pgx.ErrTxClosed }
func (closedBatch) Tx() pgx.Tx                       { return nil }

// deferring is the querier of a Tx: its outbox inserts wait for Commit.
type deferring struct {
	pgxdriver.Querier[pgx.Tx]
	t *Tx
}

// Defer implements pgsql.Deferrer.
func (d deferring) Defer(sql string, args ...any) bool { return d.t.deferStatement(sql, args...) }

// OnCommit implements pgsql.CommitHooker.
func (d deferring) OnCommit(fn func()) bool {
	if d.t.closed {
		return false
	}
	d.t.committed = append(d.t.committed, fn)
	return true
}
