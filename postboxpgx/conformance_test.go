package postboxpgx_test

import (
	"context"
	"fmt"
	"testing"
	"time"

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
	return postboxdrivertest.Harness[pgx.Tx]{
		New: func(t *testing.T) (postboxdriver.Driver[pgx.Tx], string) {
			pool := testdb.PoolAt(t, databaseURL)
			prefix := testdb.Prefix(t)
			testdb.DropPrefix(t, testdb.Pool(t), prefix)
			return postboxpgx.New(pool), prefix
		},
		Begin: func(t *testing.T, ctx context.Context, d postboxdriver.Driver[pgx.Tx]) (pgx.Tx, func() error, func() error) {
			tx, err := d.(*postboxpgx.Driver).Pool().Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
			return tx, func() error { return tx.Commit(ctx) }, func() error { return tx.Rollback(ctx) }
		},
		Backdate: func(t *testing.T, d postboxdriver.Driver[pgx.Tx], prefix, table, column string, age time.Duration) {
			sql := fmt.Sprintf("UPDATE %s%s SET %s = %s - interval '%d milliseconds'", prefix, table, column, column, age.Milliseconds())
			if _, err := d.(*postboxpgx.Driver).Pool().Exec(context.Background(), sql); err != nil {
				t.Fatal(err)
			}
		},
		Exec: func(_ *testing.T, d postboxdriver.Driver[pgx.Tx], query string, args ...any) error {
			_, err := d.(*postboxpgx.Driver).Pool().Exec(context.Background(), query, args...)
			return err
		},
		Locate: func(*testing.T, postboxdriver.Driver[pgx.Tx]) string { return testdb.PostgresURL() },
		Sever: func(t *testing.T, _ postboxdriver.Driver[pgx.Tx], tx pgx.Tx) {
			var pid int
			if err := tx.QueryRow(context.Background(), "SELECT pg_backend_pid()").Scan(&pid); err != nil {
				t.Fatal(err)
			}
			testdb.Terminate(t, pid)
		},
		Features: postboxdrivertest.Features{ConcurrentWriters: true},
	}
}
