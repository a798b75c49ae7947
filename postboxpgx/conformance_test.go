package postboxpgx_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/postbox-go/postbox/internal/testdb"
	"github.com/postbox-go/postbox/postboxdriver"
	"github.com/postbox-go/postbox/postboxdriver/postboxdrivertest"
	"github.com/postbox-go/postbox/postboxpgx"
)

func TestMain(m *testing.M) {
	postboxdrivertest.Child(func(url string) (postboxdriver.Driver[pgx.Tx], error) {
		pool, err := pgxpool.New(context.Background(), url)
		if err != nil {
			return nil, err
		}
		return postboxpgx.New(pool), nil
	})
	goleak.VerifyTestMain(m)
}

func TestConformance(t *testing.T) {
	postboxdrivertest.Run(t, harness(testdb.PostgresURL()))
}

// TestConformanceThroughPgBouncer runs the whole suite with every
// connection going through PgBouncer in transaction pooling mode, pgx set
// to cache_describe (statements described once per connection, never
// prepared under a name), as README's "Behind PgBouncer" says.
func TestConformanceThroughPgBouncer(t *testing.T) {
	postboxdrivertest.Run(t, harness(testdb.BouncerURL(t, "default_query_exec_mode=cache_describe")))
}

func harness(databaseURL string) postboxdrivertest.Harness[pgx.Tx] {
	return testdb.PgxHarness(databaseURL,
		func(pool *pgxpool.Pool) postboxdriver.Driver[pgx.Tx] { return postboxpgx.New(pool) },
		func(d postboxdriver.Driver[pgx.Tx]) *pgxpool.Pool { return d.(*postboxpgx.Driver).Pool() })
}
