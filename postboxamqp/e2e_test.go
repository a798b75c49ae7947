package postboxamqp_test

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/pubtest"
	"github.com/postbox-go/postbox/internal/testdb"
	"github.com/postbox-go/postbox/postboxamqp"
)

// pipeline is a PostgreSQL outbox relayed to RabbitMQ, consumed back
// through an inbox.
type pipeline struct {
	t      *testing.T
	pool   *pgxpool.Pool
	prefix string
	client *postbox.Client[pgx.Tx]
	queue  string
	url    string
	log    *ledger
	pub    *pubtest.Counting
}

func newPipeline(t *testing.T, ctx context.Context, url string, pubCfg postboxamqp.Config) *pipeline {
	t.Helper()
	conn := admin(t, url)
	x := uniqueName()
	ensure(t, conn, postboxamqp.Topology{Exchange: x, Queue: x + ".billing", Bindings: []string{"orders.*"},
		DeadLetterExchange: x + ".dlx", DeadLetterQueue: x + ".dead"})
	pool, prefix, d := pubtest.Tables(t)
	pubCfg.Exchange = x
	counted := &pubtest.Counting{Publisher: publisher(t, postboxamqp.URL(url), &pubCfg)}
	c, err := postbox.NewClient(d, &postbox.Config{Prefix: prefix, Publisher: counted, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	inboxClient, err := postbox.NewClient(d, &postbox.Config{Prefix: prefix, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	inbox := inboxClient.Inbox()
	p := &pipeline{t: t, pool: pool, prefix: prefix, client: c, queue: x + ".billing", url: url, log: newLedger(), pub: counted}
	sub := subscriber(t, url, p.queue, &postboxamqp.SubscriberConfig{PerKey: true, MaxInFlight: 16,
		ReconnectBackoff: 50 * time.Millisecond, ReconnectBackoffMax: 500 * time.Millisecond})
	running(t, sub, inbox.Processor("billing", func(ctx context.Context, tx pgx.Tx, d *postbox.Delivery) error {
		if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
			return err
		}
		p.log.add(d)
		return nil
	}))
	return p
}

// ledger records the handler's runs: the first delivery of each message
// through the inbox.
type ledger struct {
	mu      sync.Mutex
	runs    map[string]int   // id -> handler runs
	order   map[string][]int // key -> sequence numbers, in handling order
	changed chan struct{}
}

func newLedger() *ledger {
	return &ledger{runs: map[string]int{}, order: map[string][]int{}, changed: make(chan struct{}, 1)}
}

func (l *ledger) add(d *postbox.Delivery) {
	key, n, _ := strings.Cut(string(d.Payload), ":")
	seq, _ := strconv.Atoi(n)
	l.mu.Lock()
	l.runs[d.ID]++
	l.order[key] = append(l.order[key], seq)
	l.mu.Unlock()
	select {
	case l.changed <- struct{}{}:
	default:
	}
}

func (l *ledger) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.runs)
}

// waitFor waits, at most d, until the handler has run for n messages.
func (l *ledger) waitFor(t *testing.T, n int, d time.Duration) {
	t.Helper()
	deadline := time.After(d)
	for l.count() < n {
		select {
		case <-l.changed:
		case <-deadline:
			t.Fatalf("handled %d of %d messages within %s", l.count(), n, d)
		}
	}
}

func message(key string, seq int) postbox.Message {
	return postbox.Message{
		ID: postbox.NewID(), Topic: "orders.changed", Key: key,
		Payload: fmt.Appendf(nil, "%s:%d", key, seq), ContentType: "text/plain",
	}
}

// check verifies that every written message was handled exactly once,
// nothing is pending or dead, and no attempt was spent.
func (p *pipeline) check(ctx context.Context, ids map[string]bool) {
	t := p.t
	t.Helper()
	st, err := p.client.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Pending != 0 || st.Dead != 0 || st.Published != int64(len(ids)) {
		t.Fatalf("stats %+v, want %d published and nothing pending or dead", st, len(ids))
	}
	var spent int
	if err := p.pool.QueryRow(ctx, "SELECT count(*) FROM "+p.prefix+"published WHERE attempts > 0").Scan(&spent); err != nil {
		t.Fatal(err)
	}
	if spent != 0 {
		t.Fatalf("%d messages spent attempts", spent)
	}
	p.log.mu.Lock()
	defer p.log.mu.Unlock()
	for id, n := range p.log.runs {
		if !ids[id] {
			t.Fatalf("handled unknown message %s", id)
		}
		if n != 1 {
			t.Fatalf("message %s handled %d times", id, n)
		}
	}
	if len(p.log.runs) != len(ids) {
		t.Fatalf("handled %d of %d messages", len(p.log.runs), len(ids))
	}
}

func (p *pipeline) stop(ctx context.Context) {
	if err := p.client.Stop(ctx); err != nil && !errors.Is(err, postbox.ErrNotStarted) {
		p.t.Errorf("stop: %v", err)
	}
}

// TestEndToEnd writes 2,000 messages over 50 keys to PostgreSQL, relays
// them to RabbitMQ with this Publisher, and consumes them back through
// the inbox with this Subscriber: every message handled exactly once,
// each key's first deliveries in write order.
func TestEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test skipped in -short mode")
	}
	url := brokerURL(t)
	const keys, perKey = 50, 40
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := newPipeline(t, ctx, url, postboxamqp.Config{})
	ids := map[string]bool{}
	for i := range perKey {
		msgs := make([]postbox.Message, 0, keys)
		for k := range keys {
			m := message(fmt.Sprintf("order-%02d", k), i)
			ids[m.ID] = true
			msgs = append(msgs, m)
		}
		if err := p.client.Write(ctx, msgs...); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.client.Start(ctx); err != nil {
		t.Fatal(err)
	}
	p.log.waitFor(t, len(ids), time.Minute)
	p.stop(ctx)
	p.check(ctx, ids)
	p.log.mu.Lock()
	defer p.log.mu.Unlock()
	for key, seqs := range p.log.order {
		for i, s := range seqs {
			if s != i {
				t.Fatalf("key %s: handled %v, want write order", key, seqs)
			}
		}
	}
}

// rabbitmqctl runs one command against the machine's RabbitMQ node.
func rabbitmqctl(ctx context.Context, args ...string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "rabbitmqctl", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("rabbitmqctl %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// awaitBroker waits, at most d, until url accepts a connection.
func awaitBroker(url string, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		conn, err := postboxamqp.URL(url)(ctx)
		cancel()
		if err == nil {
			return conn.Close()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("broker not back within %s: %w", d, err)
		}
		time.Sleep(100 * time.Millisecond) // polling the broker's port: no event to wait on
	}
}

// TestBrokerRestart stops and starts RabbitMQ's application while the
// relay publishes and the subscriber consumes: nothing is lost, nothing
// is dead, and no message spent an attempt.
func TestBrokerRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("broker restart test skipped in -short mode")
	}
	// Other packages' tests use this RabbitMQ too: they wait while it restarts.
	testdb.ExclusiveService(t, "rabbitmq")
	url := brokerURL(t)
	if _, err := exec.LookPath("rabbitmqctl"); err != nil {
		t.Skip("rabbitmqctl not installed")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	p := newPipeline(t, ctx, url, postboxamqp.Config{ReconnectBackoff: 50 * time.Millisecond, ReconnectBackoffMax: 500 * time.Millisecond})
	if err := p.client.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer p.stop(ctx)

	// A writer keeps writing while the broker goes and comes back.
	var mu sync.Mutex
	ids := map[string]bool{}
	written := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(ids)
	}
	stopWriter := make(chan struct{})
	writerDone := make(chan error, 1)
	go func() {
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			msgs := make([]postbox.Message, 0, 10)
			for k := range 10 {
				msgs = append(msgs, message(fmt.Sprintf("order-%02d", (i*10+k)%50), i))
			}
			if err := p.client.Write(ctx, msgs...); err != nil {
				writerDone <- err
				return
			}
			mu.Lock()
			for _, m := range msgs {
				ids[m.ID] = true
			}
			mu.Unlock()
			select {
			case <-stopWriter:
				writerDone <- nil
				return
			case <-tick.C:
			}
		}
	}()
	waitWritten := func(n int) {
		deadline := time.After(20 * time.Second)
		for written() < n {
			select {
			case err := <-writerDone:
				t.Fatalf("writer stopped: %v", err)
			case <-deadline:
				t.Fatalf("wrote %d of %d", written(), n)
			case <-time.After(10 * time.Millisecond): // the writer's pace
			}
		}
	}

	p.log.waitFor(t, 200, 20*time.Second)
	t.Cleanup(func() {
		// Whatever happened, leave the broker running.
		if err := rabbitmqctl(context.Background(), "start_app"); err != nil {
			t.Errorf("start_app: %v", err)
		}
		if err := awaitBroker(url, 30*time.Second); err != nil {
			t.Error(err)
		}
	})
	start := time.Now()
	if err := rabbitmqctl(ctx, "stop_app"); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	down := written()
	waitWritten(down + 200) // messages written while the broker is down
	if err := rabbitmqctl(ctx, "start_app"); err != nil {
		t.Fatal(err)
	}
	if err := awaitBroker(url, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	waitWritten(written() + 200) // and after it is back
	close(stopWriter)
	if err := <-writerDone; err != nil {
		t.Fatal(err)
	}
	p.log.waitFor(t, written(), 45*time.Second)
	if n := p.pub.Message.Load(); n != 0 {
		t.Fatalf("%d publishes failed as message failures", n)
	}
	if p.pub.Infra.Load() == 0 {
		t.Fatal("the relay saw no infrastructure failure: the restart did not meet a publish")
	}
	t.Logf("%d publishes failed as infrastructure failures", p.pub.Infra.Load())
	t.Logf("stop_app %s, down %s, caught up %s after the broker was back",
		stopped.Sub(start).Round(time.Millisecond), back.Sub(stopped).Round(time.Millisecond), time.Since(back).Round(time.Millisecond))
	p.stop(ctx)
	p.check(ctx, ids)
	t.Logf("%d messages, all handled once, none dead, no attempt spent", len(ids))
}
