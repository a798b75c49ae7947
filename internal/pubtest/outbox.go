package pubtest

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/testdb"
	"github.com/postbox-go/postbox/postboxmigrate"
	"github.com/postbox-go/postbox/postboxpgx"
)

// Tables makes the postbox tables, under a prefix of the test's own, in the
// test database, dropping any left by an earlier run. It returns the pool,
// the prefix and a driver on the pool.
func Tables(t testing.TB, ctx context.Context) (*pgxpool.Pool, string, *postboxpgx.Driver) {
	t.Helper()
	pool := testdb.Pool(t)
	prefix := testdb.Prefix(t)
	testdb.DropPrefix(t, pool, prefix)
	d := postboxpgx.New(pool)
	m, err := postboxmigrate.New(d, &postboxmigrate.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	return pool, prefix, d
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
