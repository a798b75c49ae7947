package postboxsql_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"
	_ "modernc.org/sqlite"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/testdb"
	"github.com/postbox-go/postbox/postboxdriver"
	"github.com/postbox-go/postbox/postboxdriver/postboxdrivertest"
	"github.com/postbox-go/postbox/postboxsql"
	"github.com/postbox-go/postbox/postboxtest"
)

func TestMain(m *testing.M) {
	postboxdrivertest.Child(func(url string) (postboxdriver.Driver[*sql.Tx], error) {
		url, log := strings.CutPrefix(url, overTheLog)
		db, err := sql.Open("pgx", url)
		if err != nil {
			return nil, err
		}
		if !log {
			return postboxsql.New(db)
		}
		pool, err := pgxpool.New(context.Background(), url)
		if err != nil {
			return nil, err
		}
		return postboxsql.New(db, postboxsql.WithLog(pool))
	})
	goleak.VerifyTestMain(m)
}

// overTheLog marks the database the crash tests' relays reach as one to
// open WithLog.
const overTheLog = "log:"

func TestConformance(t *testing.T) {
	postboxdrivertest.Run(t, harness(testdb.PostgresURL(), false))
}

// TestConformanceThroughPgBouncer runs the whole suite through PgBouncer
// in transaction pooling mode, pgx's stdlib set to cache_describe.
func TestConformanceThroughPgBouncer(t *testing.T) {
	postboxdrivertest.Run(t, harness(testdb.BouncerURL(t, "default_query_exec_mode=cache_describe"), false))
}

// TestConformanceOverTheLog runs the whole suite with WithLog: the
// writes in the caller's *sql.Tx go to the log, which the relays read on
// the pgx pool beside the *sql.DB.
func TestConformanceOverTheLog(t *testing.T) {
	postboxdrivertest.Run(t, testdb.OverTheLog(harness(testdb.PostgresURL(), true)))
}

func harness(databaseURL string, log bool) postboxdrivertest.Harness[*sql.Tx] {
	return postboxdrivertest.Harness[*sql.Tx]{
		New: func(t *testing.T) (postboxdriver.Driver[*sql.Tx], string) {
			prefix := testdb.Prefix(t)
			testdb.DropPrefix(t, testdb.Pool(t), prefix)
			var opts []postboxsql.Option
			if log {
				opts = append(opts, postboxsql.WithLog(testdb.PoolAt(t, databaseURL)))
			}
			d, err := postboxsql.New(testdb.SQLDBAt(t, databaseURL), opts...)
			if err != nil {
				t.Fatal(err)
			}
			return d, prefix
		},
		Begin: func(t *testing.T, ctx context.Context, d postboxdriver.Driver[*sql.Tx]) (*sql.Tx, func() error, func() error) {
			tx, err := d.(*postboxsql.Driver).DB().BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = tx.Rollback() })
			return tx, tx.Commit, tx.Rollback
		},
		Backdate: func(t *testing.T, d postboxdriver.Driver[*sql.Tx], prefix, table, column string, age time.Duration) {
			sql := fmt.Sprintf("UPDATE %s%s SET %s = %s - interval '%d milliseconds'", prefix, table, column, column, age.Milliseconds())
			if _, err := d.(*postboxsql.Driver).DB().ExecContext(context.Background(), sql); err != nil {
				t.Fatal(err)
			}
		},
		Exec: func(_ *testing.T, d postboxdriver.Driver[*sql.Tx], query string, args ...any) error {
			_, err := d.(*postboxsql.Driver).DB().ExecContext(context.Background(), query, args...)
			return err
		},
		Locate: func(*testing.T, postboxdriver.Driver[*sql.Tx]) string {
			if log {
				return overTheLog + testdb.PostgresURL()
			}
			return testdb.PostgresURL()
		},
		Sever: func(t *testing.T, _ postboxdriver.Driver[*sql.Tx], tx *sql.Tx) {
			var pid int
			if err := tx.QueryRowContext(context.Background(), "SELECT pg_backend_pid()").Scan(&pid); err != nil {
				t.Fatal(err)
			}
			testdb.Terminate(t, pid)
		},
		Features: postboxdrivertest.Features{ConcurrentWriters: true},
	}
}

// TestRelayRefusesNamedStatementsThroughPgBouncer: database/sql through
// pgx's stdlib prepares named statements by default too; through a
// transaction pooler the relay refuses to start and names the setting.
func TestRelayRefusesNamedStatementsThroughPgBouncer(t *testing.T) {
	ctx := context.Background()
	through := testdb.BouncerURL(t, "")
	_, prefix := testdb.Migrated(t)
	start := func(databaseURL string) error {
		d, err := postboxsql.New(testdb.SQLDBAt(t, databaseURL))
		if err != nil {
			t.Fatal(err)
		}
		c, err := postbox.NewClient(d, &postbox.Config{Prefix: prefix, Publisher: postboxtest.NewBroker(nil)})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Start(ctx); err != nil {
			return err
		}
		return c.Stop(ctx)
	}
	if err := start(through); !errors.Is(err, postboxdriver.ErrPooledStatements) {
		t.Fatalf("start through PgBouncer with named statements: %v; want ErrPooledStatements", err)
	}
	if err := start(through + "&default_query_exec_mode=cache_describe"); err != nil {
		t.Fatalf("start through PgBouncer with cache_describe: %v", err)
	}
}

func TestRefusesOtherDrivers(t *testing.T) {
	db, err := sql.Open("sqlite", ":memory:")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := postboxsql.New(db); !errors.Is(err, postboxsql.ErrUnsupportedDriver) {
		t.Fatalf("err = %v, want ErrUnsupportedDriver", err)
	}
}
