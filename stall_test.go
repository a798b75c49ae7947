package postbox_test

import (
	"context"
	"errors"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/pubtest"
	"github.com/postbox-go/postbox/internal/tcpproxy"
	"github.com/postbox-go/postbox/internal/testdb"
	"github.com/postbox-go/postbox/postboxpgx"
	"github.com/postbox-go/postbox/postboxtest"
)

// A network partition between the relay and PostgreSQL that the socket
// does not report (the bytes are held, nothing is reset): the relay must
// notice within its lease, say so, and carry on once the network is back,
// instead of hanging in a statement until TCP gives up.
func TestRelayReportsStalledDatabaseAndRecovers(t *testing.T) {
	ctx, pr := startProxiedRelay(t, postbox.Config{LeaseDuration: time.Second, BatchDeadline: 300 * time.Millisecond})
	relay, writer, proxy, broker, logs := pr.relay, pr.writer, pr.proxy, pr.broker, pr.logs
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

// pausedLine is a lane's pause after a failure to reach the database or
// the broker, as the relay logs it.
var pausedLine = regexp.MustCompile(`msg="postbox relay paused" .*\blane=(\d+) .*\bpause=(\S+)`)

// firstPauses returns each lane's first pause logged in log.
func firstPauses(t *testing.T, log string) map[string]time.Duration {
	t.Helper()
	out := map[string]time.Duration{}
	for _, m := range pausedLine.FindAllStringSubmatch(log, -1) {
		d, err := time.ParseDuration(m[2])
		if err != nil {
			t.Fatalf("pause %q: %v", m[2], err)
		}
		if _, ok := out[m[1]]; !ok {
			out[m[1]] = d
		}
	}
	return out
}

// Once a lane's read works again after an outage, even a read that finds
// nothing, its next failure pauses it for the shortest pause, not for
// twice the longest pause the outage had reached.
func TestRelayPauseStartsOverAfterAnOutage(t *testing.T) {
	// A lease long enough to outlast the outage: the lanes keep their
	// partitions and read through it.
	ctx, pr := startProxiedRelay(t, postbox.Config{LeaseDuration: 30 * time.Second})
	relay, writer, proxy, logs := pr.relay, pr.writer, pr.proxy, pr.logs

	// The lanes hold their partitions and read: a message goes through.
	if err := writer.Write(ctx, postbox.Message{Topic: "orders.paid", Key: "k", Payload: []byte("before")}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, func() bool { return len(payloadsOf(pr.broker, "k")) == 1 })

	// The outage: the database refuses every connection until a lane's
	// pause has grown past a fifth of a second.
	proxy.Refuse(true)
	proxy.Reset()
	waitFor(t, ctx, func() bool {
		for _, m := range pausedLine.FindAllStringSubmatch(logs.String(), -1) {
			if d, err := time.ParseDuration(m[2]); err == nil && d > 200*time.Millisecond {
				return true
			}
		}
		return false
	})
	proxy.Refuse(false)
	// Every source of the relay's failure reached the database again: the
	// lanes with reads that found nothing to publish.
	waitFor(t, ctx, func() bool { return relay.RelayState().Err == nil })

	// A blip: the connections are reset once.
	mark := len(logs.String())
	proxy.Reset()
	waitFor(t, ctx, func() bool { return len(firstPauses(t, logs.String()[mark:])) > 0 })
	for lane, d := range firstPauses(t, logs.String()[mark:]) {
		if d > 50*time.Millisecond {
			t.Errorf("lane %s paused %v after one failure, want at most the shortest pause (50ms)", lane, d)
		}
	}
}

// proxiedRelay is a relay that reaches PostgreSQL through a proxy the test
// controls, publishing to a test broker and logging to logs, beside a
// writer that reaches the database directly.
type proxiedRelay struct {
	relay, writer *postbox.Client[pgx.Tx]
	proxy         *tcpproxy.Proxy
	broker        *postboxtest.Broker
	logs          *pubtest.Logs
}

// startProxiedRelay starts a proxiedRelay on freshly migrated tables, with
// cfg's settings (PollInterval 20ms unless set); it is stopped, and its log
// shown on failure, when t ends. The context returned ends after a minute.
func startProxiedRelay(t *testing.T, cfg postbox.Config) (context.Context, *proxiedRelay) {
	t.Helper()
	direct, prefix := testdb.Migrated(t)
	proxied, proxy := testdb.Proxied(t, testdb.PostgresURL())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	pool, err := pgxpool.New(ctx, proxied)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	pr := &proxiedRelay{proxy: proxy, broker: postboxtest.NewBroker(nil), logs: &pubtest.Logs{}}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("relay log:\n%s", pr.logs.String())
		}
	})
	cfg.Prefix, cfg.Publisher, cfg.Logger = prefix, pr.broker, slog.New(slog.NewTextHandler(pr.logs, nil))
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 20 * time.Millisecond
	}
	if pr.relay, err = postbox.NewClient(postboxpgx.New(pool), &cfg); err != nil {
		t.Fatal(err)
	}
	// The writes go straight to PostgreSQL, past the proxy.
	if pr.writer, err = postbox.NewClient(postboxpgx.New(direct), &postbox.Config{Prefix: prefix}); err != nil {
		t.Fatal(err)
	}
	if err := pr.relay.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer scancel()
		if err := pr.relay.Stop(sctx); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	return ctx, pr
}

// A Drain whose context ends while its leases are being granted waits for
// the database's answer and lets go of what it was granted. Abandoned, the
// grant reached the database all the same and held every partition for a
// lease with no one to release them: the next Drain failed with
// ErrPartitionsHeld. A proxy holds the grant's answer back once its
// statement has reached the database (the exec mode sends a statement and
// its parameters in one write).
func TestDrainCancelledWhileTakingLeasesHoldsNone(t *testing.T) {
	_, prefix := testdb.Migrated(t)
	proxied, proxy := testdb.Proxied(t, testdb.PostgresURL())
	sent := make(chan func(), 1)
	var once sync.Once
	proxy.Inspect(func() tcpproxy.Inspector {
		return func(chunk []byte) bool {
			if strings.Contains(string(chunk), "UPDATE "+prefix+"leases SET\n  generation") {
				once.Do(func() { sent <- proxy.Blackhole() })
			}
			return true
		}
	})
	pool := testdb.PoolAt(t, proxied+"&default_query_exec_mode=exec")
	client, err := postbox.NewClient(postboxpgx.New(pool), &postbox.Config{Prefix: prefix, Publisher: postboxtest.NewBroker(nil),
		NoSignals: true, LeaseDuration: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	drained := make(chan error, 1)
	go func() {
		_, err := client.Drain(ctx)
		drained <- err
	}()
	var lift func()
	select {
	case lift = <-sent:
	case <-time.After(30 * time.Second):
		t.Fatal("the leases' grant was never sent")
	}
	cancel()
	// The answer stays held a moment after the cancel, long enough for a
	// Drain that does not wait for it to have returned.
	select {
	case err := <-drained:
		lift()
		t.Logf("returned before the answer: %v", err)
		drained <- err
	case <-time.After(200 * time.Millisecond):
		lift()
	}
	select {
	case err := <-drained:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled drain: %v, want context.Canceled", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the cancelled drain did not return")
	}
	if _, err := client.Drain(context.Background()); err != nil {
		t.Fatalf("the next drain: %v", err)
	}
}
