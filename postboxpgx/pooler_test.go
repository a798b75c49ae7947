package postboxpgx_test

import (
	"context"
	"errors"
	"testing"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/testdb"
	"github.com/postbox-go/postbox/postboxdriver"
	"github.com/postbox-go/postbox/postboxmigrate"
	"github.com/postbox-go/postbox/postboxpgx"
	"github.com/postbox-go/postbox/postboxtest"
)

// TestRelayRefusesNamedStatementsThroughPgBouncer: through a transaction
// pooler, pgx's default mode (statements prepared under a name) would fail
// at random once a statement lands on another server connection. The relay
// says so at start, naming the setting, and starts with it set.
func TestRelayRefusesNamedStatementsThroughPgBouncer(t *testing.T) {
	ctx := context.Background()
	through := testdb.BouncerURL(t, "")
	prefix := testdb.Prefix(t)
	testdb.DropPrefix(t, testdb.Pool(t), prefix)
	m, err := postboxmigrate.New(postboxpgx.New(testdb.Pool(t)), &postboxmigrate.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	start := func(databaseURL string) error {
		c, err := postbox.NewClient(postboxpgx.New(testdb.PoolAt(t, databaseURL)), &postbox.Config{Prefix: prefix, Publisher: postboxtest.NewBroker(nil)})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Start(ctx); err != nil {
			return err
		}
		return c.Stop(ctx)
	}
	err = start(through)
	if !errors.Is(err, postboxdriver.ErrPooledStatements) {
		t.Fatalf("start through PgBouncer with named statements: %v; want ErrPooledStatements", err)
	}
	t.Logf("refused: %v", err)
	if err := start(through + "&default_query_exec_mode=cache_describe"); err != nil {
		t.Fatalf("start through PgBouncer with cache_describe: %v", err)
	}
	// Directly, the default mode is right and nothing is refused.
	if err := start(testdb.PostgresURL()); err != nil {
		t.Fatalf("start on a direct connection: %v", err)
	}
}
