package postbox_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/pubtest"
	"github.com/postbox-go/postbox/internal/testdb"
	"github.com/postbox-go/postbox/postboxpgx"
	"github.com/postbox-go/postbox/postboxtest"
)

// A network partition between the relay and PostgreSQL that the socket
// does not report (the bytes are held, nothing is reset): the relay must
// notice within its lease, say so, and carry on once the network is back,
// instead of hanging in a statement until TCP gives up.
func TestRelayReportsStalledDatabaseAndRecovers(t *testing.T) {
	direct, prefix := testdb.Migrated(t)
	proxied, proxy := testdb.Proxied(t, testdb.PostgresURL())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	relayPool, err := pgxpool.New(ctx, proxied)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(relayPool.Close)

	logs := &pubtest.Logs{}
	broker := postboxtest.NewBroker(nil)
	relay, err := postbox.NewClient(postboxpgx.New(relayPool), &postbox.Config{
		Prefix: prefix, Publisher: broker, LeaseDuration: time.Second, BatchDeadline: 300 * time.Millisecond,
		PollInterval: 20 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	// The writes go straight to PostgreSQL, past the proxy.
	writer, err := postbox.NewClient(postboxpgx.New(direct), &postbox.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	if err := relay.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer scancel()
		if err := relay.Stop(sctx); err != nil {
			t.Errorf("stop: %v", err)
		}
	}()
	if err := writer.Write(ctx, postbox.Message{Topic: "orders.paid", Key: "k", Payload: []byte("before")}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, func() bool { return len(payloadsOf(broker, "k")) == 1 })
	if st := relay.RelayState(); !st.Running || st.Err != nil {
		t.Fatalf("relay state before the partition: %+v, want running without a failure", st)
	}

	lift := proxy.Blackhole()
	cut := time.Now()
	if err := writer.Write(ctx, postbox.Message{Topic: "orders.paid", Key: "k", Payload: []byte("during")}); err != nil {
		t.Fatal(err)
	}
	// The renewal is bounded by half the lease: a warning, not a hang.
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("relay log:\n%s", logs.String())
		}
	})
	waitFor(t, ctx, func() bool {
		return strings.Contains(logs.String(), "could not renew its leases") &&
			strings.Contains(logs.String(), "deadline exceeded")
	})
	if got := payloadsOf(broker, "k"); len(got) != 1 {
		t.Fatalf("published %v while the database was unreachable", got)
	}
	// The relay says it is failing, since the partition began.
	waitFor(t, ctx, func() bool { return relay.RelayState().Err != nil })
	if st := relay.RelayState(); !st.Running || st.Since.Before(cut) || !strings.Contains(st.Err.Error(), "deadline exceeded") {
		t.Fatalf("relay state during the partition: %+v, want running, failing on a deadline since after %v", st, cut)
	}
	lift()

	if err := writer.Write(ctx, postbox.Message{Topic: "orders.paid", Key: "k", Payload: []byte("after")}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, func() bool { return len(payloadsOf(broker, "k")) >= 3 })
	got := payloadsOf(broker, "k")
	var first []string
	seen := map[string]bool{}
	for _, p := range got {
		if !seen[p] {
			seen[p] = true
			first = append(first, p)
		}
	}
	if strings.Join(first, ",") != "before,during,after" {
		t.Fatalf("first copies in the order %v, want before, during, after", first)
	}
	// Once its renewals, reads and records work again, the failure is
	// gone.
	waitFor(t, ctx, func() bool { return relay.RelayState().Err == nil })
}

// A broker that stores each message at once but acknowledges it only
// after the batch deadline (a quorum queue's fsync under load): the relay
// starts nothing new past the deadline, but waits for what it has sent
// until its lease ends, so each message is sent once and none is given up
// and sent again.
func TestSlowAcksPastBatchDeadlineAreAwaited(t *testing.T) {
	pool, prefix := testdb.Migrated(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var (
		mu   sync.Mutex
		sent = map[string]int{}
		acks sync.WaitGroup
	)
	defer acks.Wait()
	pub := publisherFunc(func(_ context.Context, env *postbox.Envelope, done func(error)) {
		mu.Lock()
		sent[env.ID]++
		mu.Unlock()
		acks.Add(1)
		go func() {
			defer acks.Done()
			time.Sleep(150 * time.Millisecond)
			done(nil)
		}()
	})
	client, err := postbox.NewClient(postboxpgx.New(pool), &postbox.Config{
		Prefix: prefix, Publisher: pub, LeaseDuration: 3 * time.Second, BatchDeadline: 50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	const n = 20
	msgs := make([]postbox.Message, n)
	for i := range msgs {
		msgs[i] = postbox.Message{Topic: "orders.paid", Payload: []byte("p")}
	}
	if err := client.Write(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	res, err := client.Drain(ctx)
	if err != nil {
		t.Fatalf("drain: %v", err)
	}
	if res.Published != n {
		t.Fatalf("published %d, want %d", res.Published, n)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(sent) != n {
		t.Fatalf("%d distinct messages sent, want %d", len(sent), n)
	}
	for id, c := range sent {
		if c != 1 {
			t.Errorf("message %s sent %d times", id, c)
		}
	}
}

// publisherFunc is a Publisher whose done may come later, from another
// goroutine.
type publisherFunc func(ctx context.Context, env *postbox.Envelope, done func(error))

func (f publisherFunc) Publish(ctx context.Context, env *postbox.Envelope, done func(error)) {
	f(ctx, env, done)
}
