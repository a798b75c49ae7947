package pubtest

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/testdb"
	"github.com/postbox-go/postbox/postboxpgx"
)

// Tables makes the postbox tables, under a prefix of the test's own, in the
// test database (testdb.Migrated). It returns the pool, the prefix and a
// driver on the pool.
func Tables(t testing.TB) (*pgxpool.Pool, string, *postboxpgx.Driver) {
	t.Helper()
	pool, prefix := testdb.Migrated(t)
	return pool, prefix, postboxpgx.New(pool)
}

// Counting is a Publisher that counts the failures the relay sees, by
// class.
type Counting struct {
	postbox.Publisher
	Infra, Message atomic.Int64
}

// Publish publishes through the wrapped Publisher and counts its failure,
// if any, before passing it on.
func (c *Counting) Publish(ctx context.Context, env *postbox.Envelope, done func(error)) {
	c.Publisher.Publish(ctx, env, func(err error) {
		switch {
		case err == nil:
		case postbox.IsMessageError(err):
			c.Message.Add(1)
		default:
			c.Infra.Add(1)
		}
		done(err)
	})
}
