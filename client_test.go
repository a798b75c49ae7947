package postbox_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/testdb"
	"github.com/postbox-go/postbox/postboxdriver"
	"github.com/postbox-go/postbox/postboxpgx"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newDriver returns a pgx driver on the test database and a migrated,
// private table prefix.
func newDriver(t *testing.T) (*postboxpgx.Driver, string) {
	t.Helper()
	pool, prefix := testdb.Migrated(t)
	return postboxpgx.New(pool), prefix
}

func TestNewClientListsEveryBadField(t *testing.T) {
	d, _ := newDriver(t)
	_, err := postbox.NewClient(d, &postbox.Config{Prefix: "Bad-Prefix", BatchSize: -1, LeaseDuration: time.Second, BatchDeadline: 2 * time.Second})
	var ce *postbox.ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("err = %v, want *ConfigError", err)
	}
	var fields []string
	for _, p := range ce.Problems {
		fields = append(fields, p.Field)
	}
	if got := strings.Join(fields, ","); got != "Prefix,BatchSize,BatchDeadline" {
		t.Fatalf("fields = %s", got)
	}
}

func TestStartStopContract(t *testing.T) {
	d, prefix := newDriver(t)
	ctx := context.Background()
	c, err := postbox.NewClient(d, &postbox.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); !errors.Is(err, postbox.ErrNoPublisher) {
		t.Fatalf("Start without publisher = %v", err)
	}
	if err := c.Stop(ctx); !errors.Is(err, postbox.ErrNotStarted) {
		t.Fatalf("Stop before Start = %v", err)
	}
	pub := postbox.PublisherFunc(func(context.Context, *postbox.Envelope) error { return nil })
	c, err = postbox.NewClient(d, &postbox.Config{Prefix: prefix, Publisher: pub})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); !errors.Is(err, postbox.ErrStarted) {
		t.Fatalf("second Start = %v", err)
	}
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	// A stopped client starts again.
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestStartUnmigrated(t *testing.T) {
	pool := testdb.Pool(t)
	pub := postbox.PublisherFunc(func(context.Context, *postbox.Envelope) error { return nil })
	c, err := postbox.NewClient(postboxpgx.New(pool), &postbox.Config{Prefix: testdb.Prefix(t), Publisher: pub})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background()); !errors.Is(err, postboxdriver.ErrNotMigrated) {
		t.Fatalf("Start on missing tables = %v, want ErrNotMigrated", err)
	}
	if err := c.Write(context.Background(), postbox.Message{Topic: "x"}); !errors.Is(err, postboxdriver.ErrNotMigrated) {
		t.Fatalf("Write on missing tables = %v, want ErrNotMigrated", err)
	}
}

// The envelope carries the message's identity and its CloudEvents
// attributes in binary mode.
func TestEnvelope(t *testing.T) {
	d, prefix := newDriver(t)
	ctx := context.Background()
	got := make(chan *postbox.Envelope, 1)
	pub := postbox.PublisherFunc(func(_ context.Context, env *postbox.Envelope) error {
		got <- env
		return nil
	})
	c, err := postbox.NewClient(d, &postbox.Config{Prefix: prefix, Publisher: pub, Source: "urn:svc:orders"})
	if err != nil {
		t.Fatal(err)
	}
	id := postbox.NewID()
	when := time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC)
	if err := c.Write(ctx, postbox.Message{
		ID: id, Topic: "orders.created", Key: "order-7", Payload: []byte(`{"total":3}`),
		Headers: map[string]string{"tenant": "acme"}, Subject: "order-7", Time: when, ContentType: "application/json",
	}); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Stop(ctx) }()
	var env *postbox.Envelope
	select {
	case env = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("nothing published")
	}
	want := map[string]string{
		"ce-specversion": "1.0", "ce-id": id, "ce-type": "orders.created", "ce-source": "urn:svc:orders",
		"ce-subject": "order-7", "ce-time": "2026-01-02T03:04:05.000006Z", "ce-partitionkey": "order-7",
		"content-type": "application/json", "tenant": "acme",
		"postbox-replay-horizon": "604800", // the default retention, 7 days
	}
	for k, v := range want {
		if env.Headers[k] != v {
			t.Errorf("header %s = %q, want %q", k, env.Headers[k], v)
		}
	}
	if len(env.Headers) != len(want) {
		t.Errorf("headers = %v", env.Headers)
	}
	if env.ID != id || env.Key != "order-7" || string(env.Payload) != `{"total":3}` || env.Attempt != 1 {
		t.Errorf("envelope = %+v", env)
	}
}

// Every envelope carries the relay's replay horizon: its retention in
// seconds, or "forever" when it keeps its history forever (never a
// bounded horizon, which would let consumers forget ids a replay can
// still send). A writer cannot set the header: the name is reserved.
func TestReplayHorizonHeader(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		retention time.Duration
		want      string
	}{
		{30 * 24 * time.Hour, "2592000"},
		{-1, postbox.ReplayHorizonForever},
	} {
		d, prefix := newDriver(t)
		var got []string
		pub := postbox.PublisherFunc(func(_ context.Context, env *postbox.Envelope) error {
			got = append(got, env.Headers[postbox.HeaderReplayHorizon])
			return nil
		})
		c, err := postbox.NewClient(d, &postbox.Config{Prefix: prefix, Publisher: pub, Retention: tc.retention, Lanes: 1})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Write(ctx, postbox.Message{Topic: "orders.created", Payload: []byte("{}")}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Drain(ctx); err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 || got[0] != tc.want {
			t.Fatalf("retention %s: horizon headers %q, want [%s]", tc.retention, got, tc.want)
		}
		var ve *postbox.ValidationError
		if err := c.Write(ctx, postbox.Message{Topic: "orders.created", Headers: map[string]string{postbox.HeaderReplayHorizon: "1"}}); !errors.As(err, &ve) {
			t.Fatalf("a writer set the horizon: %v", err)
		}
	}
}

// A hard stop abandons what is in flight; nothing is lost, and the next
// relay publishes it.
func TestHardStopLosesNothing(t *testing.T) {
	d, prefix := newDriver(t)
	ctx := context.Background()
	block := make(chan struct{})
	var once sync.Once
	started := make(chan struct{})
	hung := postbox.PublisherFunc(func(ctx context.Context, _ *postbox.Envelope) error {
		once.Do(func() { close(started) })
		select {
		case <-block:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	c, err := postbox.NewClient(d, &postbox.Config{Prefix: prefix, Publisher: hung, LeaseDuration: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Write(ctx, postbox.Message{Topic: "t.hard"}, postbox.Message{Topic: "t.hard"}); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	<-started
	stopCtx, cancel := context.WithCancel(ctx)
	cancel()
	if err := c.Stop(stopCtx); !errors.Is(err, context.Canceled) {
		t.Fatalf("hard Stop = %v", err)
	}
	close(block)
	st, err := c.Stats(ctx)
	if err != nil || st.Pending != 2 {
		t.Fatalf("after a hard stop: %+v, %v; want both messages still pending", st, err)
	}
	var n int
	var mu sync.Mutex
	ok := postbox.PublisherFunc(func(context.Context, *postbox.Envelope) error { mu.Lock(); n++; mu.Unlock(); return nil })
	c2, err := postbox.NewClient(d, &postbox.Config{Prefix: prefix, Publisher: ok})
	if err != nil {
		t.Fatal(err)
	}
	if err := c2.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c2.Stop(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := c2.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.Pending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not drained: %+v", st)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestDurabilityWarnings(t *testing.T) {
	d, prefix := newDriver(t)
	st, err := d.Open(prefix)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	w, err := st.DurabilityWarnings(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The machine's server runs with the durable defaults; sessions that
	// turn synchronous_commit off are seen.
	if len(w) != 0 {
		t.Fatalf("warnings on a durable server: %v", w)
	}
	cfg, err := pgxpool.ParseConfig(testdb.PostgresURL())
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	weak, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer weak.Close()
	st, err = postboxpgx.New(weak).Open(prefix)
	if err != nil {
		t.Fatal(err)
	}
	if w, err = st.DurabilityWarnings(ctx); err != nil || len(w) != 1 {
		t.Fatalf("warnings with synchronous_commit off: %v, %v", w, err)
	}
}

// The relay holding partition 0 deletes published rows past the retention,
// and nothing pending.
func TestRelayRetention(t *testing.T) {
	d, prefix := newDriver(t)
	ctx := context.Background()
	pub := postbox.PublisherFunc(func(context.Context, *postbox.Envelope) error { return nil })
	c, err := postbox.NewClient(d, &postbox.Config{Prefix: prefix, Publisher: pub, Retention: time.Hour, PruneInterval: time.Second, PruneBatch: 4, LeaseDuration: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var msgs []postbox.Message
	for range 10 {
		msgs = append(msgs, postbox.Message{Topic: "t.old"})
	}
	if err := c.Write(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Pool().Exec(ctx, "UPDATE "+prefix+"published SET published_at = published_at - interval '2 hours'"); err != nil {
		t.Fatal(err)
	}
	if err := c.Write(ctx, postbox.Message{Topic: "t.new"}); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Stop(ctx) }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		st, err := c.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.Published == 1 && st.Pending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("history not pruned: %+v", st)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A write wakes the relay in its process after its commit where the Client
// can tell when that is (Write's own transaction, a postboxpgx.Tx), and
// early, before the commit, in a transaction it cannot see commit.
func TestWriteWakesTheRelayAfterTheCommitItSees(t *testing.T) {
	pool, prefix := testdb.Migrated(t)
	c, err := postbox.NewClient(postboxpgx.New(pool), &postbox.Config{Prefix: prefix, NoSignals: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	msg := postbox.Message{Topic: "orders.created", Key: "1", Payload: []byte("{}")}
	want := func(what string, woken, early bool) {
		t.Helper()
		if w, e := postbox.ClientWoken(c); w != woken || e != early {
			t.Errorf("%s: woken %v, early %v; want %v, %v", what, w, e, woken, early)
		}
	}

	tx, err := postboxpgx.Begin(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WriteTx(ctx, tx, msg); err != nil {
		t.Fatal(err)
	}
	want("postboxpgx.Tx before Commit", false, false)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	want("postboxpgx.Tx after Commit", true, false)

	tx, err = postboxpgx.Begin(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WriteTx(ctx, tx, msg); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	want("postboxpgx.Tx rolled back", false, false)

	ptx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ptx.Rollback(ctx) }()
	if err := c.WriteTx(ctx, ptx, msg); err != nil {
		t.Fatal(err)
	}
	want("pgx.Tx, before its commit", true, true)

	if err := c.Write(ctx, msg); err != nil {
		t.Fatal(err)
	}
	want("Write", true, false)
}
