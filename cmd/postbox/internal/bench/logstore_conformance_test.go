package bench

import (
	"context"
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
		return &suiteLogDriver{logDriver{pool: pool}}, nil
	})
	goleak.VerifyTestMain(m)
}

// suiteLogDriver opens the log store with the log's schema among its
// migrations, so that the suite's own migration creates it.
type suiteLogDriver struct{ logDriver }

type suiteLogStore struct{ *logStore }

func (d *suiteLogDriver) Open(prefix string) (postboxdriver.Store[pgx.Tx], error) {
	s, err := d.logDriver.Open(prefix)
	if err != nil {
		return nil, err
	}
	return suiteLogStore{s.(*logStore)}, nil
}

// Migrations is the outbox's migrations and the log's schema after them.
func (s suiteLogStore) Migrations() []postboxdriver.Migration {
	return append(s.logStore.Migrations(), postboxdriver.Migration{Version: 1000, Name: "log", SQL: logSchema(s.prefix)})
}

// logUnbuilt are the operations not built on the log yet, which the
// suite skips (postboxdrivertest.RunExcept): the operator's view of the
// history and of what is pending, which still read only the outbox's
// tables.
var logUnbuilt = map[string]string{
	"SQLInjection":                   "replay reads the published table only, not the log's history",
	"Admin/StatusByTopic":            "TopicStats counts the outbox's pending rows and the published table's recent ones only",
	"Admin/PruneKeepsPendingAndDead": "retention prunes the published table only, not the log",
	"Admin/Replay":                   "replay reads the published table only, not the log's history",
	"Admin/ReplayAsNewAndPreview":    "replay reads the published table only, not the log's history",
}

// The storage conformance suite against the log store: everything the
// relay, the writer and the inbox rely on, with the operations of
// logUnbuilt skipped.
func TestLogStoreConformance(t *testing.T) {
	postboxdrivertest.RunExcept(t, testdb.PgxHarness(testdb.PostgresURL(),
		func(pool *pgxpool.Pool) postboxdriver.Driver[pgx.Tx] { return &suiteLogDriver{logDriver{pool: pool}} },
		func(d postboxdriver.Driver[pgx.Tx]) *pgxpool.Pool { return d.(*suiteLogDriver).pool }),
		logUnbuilt)
}
