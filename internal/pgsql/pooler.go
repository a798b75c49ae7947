package pgsql

import (
	"context"
	"fmt"

	"github.com/postbox-go/postbox/postboxdriver"
)

// poolerRounds is how many times CheckConnections looks for a server
// connection changing hands.
const poolerRounds = 3

// CheckConnections implements postboxdriver.Executor. A transaction
// pooler (PgBouncer's pool_mode = transaction) gives a client's
// connection a server connection per transaction, so a statement prepared
// under a name on one is missing on the next. Nothing in the protocol says
// a pooler is there; its behaviour does: with two client connections a
// and b, a reads its server's pid, b opens a transaction and reads its
// own, and a reads again. Directly, or through a session pooler, a keeps
// its server and b never sees a's; through a transaction pooler b is
// handed the server a just let go (PgBouncer reuses the most recent one
// first), or a comes back on another. Either is proof; a miss is not
// proof of the contrary, which is why it looks three times.
func (c *Core) CheckConnections(ctx context.Context) error {
	if c.inTx {
		return nil
	}
	return c.db.Pin(ctx, func(a Querier, named bool) error {
		if !named {
			// Unnamed statements work through any pooler.
			return nil
		}
		return c.db.Pin(ctx, func(b Querier, _ bool) error {
			for range poolerRounds {
				pooled, err := serverMoved(ctx, a, b)
				if err != nil || pooled {
					if pooled {
						err = fmt.Errorf("%w (a server connection changed hands between transactions of one client connection)", postboxdriver.ErrPooledStatements)
					}
					return err
				}
			}
			return nil
		})
	})
}

// serverMoved runs one round of CheckConnections' look.
func serverMoved(ctx context.Context, a, b Querier) (bool, error) {
	pid := func(q Querier) (int, error) {
		var p int
		rows, err := q.Query(ctx, `SELECT pg_backend_pid()`)
		if err != nil {
			return 0, err
		}
		err = scanAll(rows, func(r Rows) error { return r.Scan(&p) })
		return p, err
	}
	before, err := pid(a)
	if err != nil {
		return false, err
	}
	if _, err := b.Exec(ctx, `BEGIN`); err != nil {
		return false, err
	}
	held, err := pid(b)
	if err == nil {
		var after int
		if after, err = pid(a); err == nil {
			_, err = b.Exec(ctx, `COMMIT`)
			return after != before || held == before, err
		}
	}
	_, _ = b.Exec(ctx, `ROLLBACK`)
	return false, err
}

// databaseSQL names the database a connection reaches, and its server by
// the time the server started: localhost and 127.0.0.1 reach one server,
// and a replica holds its primary's databases under the same oids.
const databaseSQL = `SELECT format('%s (oid %s) of the server started at %s', d.datname, d.oid, pg_postmaster_start_time())
FROM pg_database d WHERE d.datname = current_database()`

// Database names the database the Core's connections reach, for a Store
// whose statements run on two kinds of connection (the log's over
// postboxsql: its *sql.DB and a pgx pool) to check that both reach one.
func (c *Core) Database(ctx context.Context) (string, error) {
	var name string
	err := c.queryRow(ctx, c.db, databaseSQL, nil, &name)
	return name, err
}
