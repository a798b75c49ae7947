package pglog

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/postbox-go/postbox/internal/testdb"
	"github.com/postbox-go/postbox/postboxdriver"
	"github.com/postbox-go/postbox/postboxdriver/postboxdrivertest"
)

func TestMain(m *testing.M) {
	// The conformance suite's crash tests run relays over the log store
	// in processes of their own.
	postboxdrivertest.Child(func(url string) (postboxdriver.Driver[pgx.Tx], error) {
		pool, err := pgxpool.New(context.Background(), url)
		if err != nil {
			return nil, err
		}
		return &suiteLogDriver{Driver[pgx.Tx]{pool: pool, chunks: suiteChunks}}, nil
	})
	goleak.VerifyTestMain(m)
}

// suiteLogDriver opens the log store with the log's chunks among its
// migrations, so that the suite's own migration makes them.
type suiteLogDriver struct{ Driver[pgx.Tx] }

type suiteLogStore struct{ *logStore[pgx.Tx] }

func (d *suiteLogDriver) Open(prefix string) (postboxdriver.Store[pgx.Tx], error) {
	s, err := d.Driver.Open(prefix)
	if err != nil {
		return nil, err
	}
	return suiteLogStore{s.(*logStore[pgx.Tx])}, nil
}

// Migrations is the drivers' migrations, then the log of migration 12
// split into chunks of suiteChunks' width from seq 4 on, so that the
// suite's rows lie in the default partition (seqs 1–3 and past the
// chunks) and in chunks. The harness (testdb.OverTheLog) switches the
// database to the log once migrated, so that the Store writes the log.
func (s suiteLogStore) Migrations() []postboxdriver.Migration {
	return append(s.logStore.Migrations(), postboxdriver.Migration{Version: 1000, Name: "log", SQL: ChunkLog(s.prefix) + fmt.Sprintf(`
DO $$ BEGIN FOR i IN 1..%[2]d LOOP
  EXECUTE format('CREATE TABLE %[1]slog_c%%1$s PARTITION OF %[1]slog FOR VALUES FROM (%%1$s) TO (%%2$s)', i * %[3]d, (i + 1) * %[3]d);
  INSERT INTO %[1]slog_chunks (lo, hi) VALUES (i * %[3]d, (i + 1) * %[3]d);
END LOOP; END $$`, s.prefix, suiteChunks.ahead, suiteChunks.width)})
}

// suiteChunks splits the suite's logs: sixteen chunks of four seqs.
var suiteChunks = chunking{width: 4, ahead: 16}

// The storage conformance suite against the log store, whole.
func TestLogStoreConformance(t *testing.T) {
	postboxdrivertest.Run(t, testdb.OverTheLog(logHarness(testdb.PostgresURL())))
}

// TestLogStoreConformanceThroughPgBouncer runs the whole suite over the
// log with every connection through PgBouncer in transaction pooling
// mode, pgx set to cache_describe (no statement prepared under a name), as
// README's "Behind PgBouncer" says: the read's settings, made for its
// transaction alone, and its statements planned at each execution.
func TestLogStoreConformanceThroughPgBouncer(t *testing.T) {
	postboxdrivertest.Run(t, testdb.OverTheLog(logHarness(testdb.BouncerURL(t, "default_query_exec_mode=cache_describe"))))
}

func logHarness(databaseURL string) postboxdrivertest.Harness[pgx.Tx] {
	return testdb.PgxHarness(databaseURL,
		func(pool *pgxpool.Pool) postboxdriver.Driver[pgx.Tx] {
			return &suiteLogDriver{Driver[pgx.Tx]{pool: pool, chunks: suiteChunks}}
		},
		func(d postboxdriver.Driver[pgx.Tx]) *pgxpool.Pool { return d.(*suiteLogDriver).pool })
}
