package postboxnats_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/pubtest"
	"github.com/postbox-go/postbox/internal/sqlitetest"
	"github.com/postbox-go/postbox/internal/testdb"
	"github.com/postbox-go/postbox/postboxdriver"
	"github.com/postbox-go/postbox/postboxmigrate"
	"github.com/postbox-go/postbox/postboxnats"
	"github.com/postbox-go/postbox/postboxpgx"
)

// The tests in this file run the Subscriber with a real Inbox, over
// PostgreSQL and over SQLite, against both NATS servers. The handler's
// effect is an outbox message written with a Client's WriteTx in the
// handler's transaction, so the number of committed effects is the
// number of pending outbox rows (the Client is never started).

// consumerDB is an inbox and its database, whatever the transaction type.
type consumerDB interface {
	// processor runs the effect for consumer; when fail returns an error
	// for a delivery, the handler writes the effect and then fails, so
	// that the effect is rolled back.
	processor(consumer string, fail func(d *postbox.Delivery) error) postbox.Processor
	// batchProcessor is processor with group commit.
	batchProcessor(t testing.TB, consumer string, fail func(d *postbox.Delivery) error, cfg *postbox.BatchConfig) postbox.Processor
	effects(t testing.TB) int64
	dead(t testing.TB, consumer string) []postbox.DeadMessage
}

type inboxDB[TTx any] struct {
	inbox  *postbox.Inbox[TTx]
	client *postbox.Client[TTx]
}

func newInboxDB[TTx any](t testing.TB, d postboxdriver.Driver[TTx], prefix string, cfg postbox.Config) consumerDB {
	t.Helper()
	ctx := context.Background()
	m, err := postboxmigrate.New(d, &postboxmigrate.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Up(ctx); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	cfg.Prefix = prefix
	cfg.Logger = testLogger(t)
	inClient, err := postbox.NewClient(d, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	in := inClient.Inbox()
	c, err := postbox.NewClient(d, &postbox.Config{Prefix: prefix, Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	return &inboxDB[TTx]{inbox: in, client: c}
}

func (db *inboxDB[TTx]) processor(consumer string, fail func(d *postbox.Delivery) error) postbox.Processor {
	return db.inbox.Processor(consumer, func(ctx context.Context, tx TTx, d *postbox.Delivery) error {
		if err := db.client.WriteTx(ctx, tx, postbox.Message{Topic: "effect", Payload: d.Payload}); err != nil {
			return err
		}
		if fail != nil {
			return fail(d)
		}
		return nil
	})
}

func (db *inboxDB[TTx]) batchProcessor(t testing.TB, consumer string, fail func(d *postbox.Delivery) error, cfg *postbox.BatchConfig) postbox.Processor {
	t.Helper()
	p, err := db.inbox.BatchProcessor(consumer, func(ctx context.Context, tx TTx, d *postbox.Delivery) error {
		if err := db.client.WriteTx(ctx, tx, postbox.Message{Topic: "effect", Payload: d.Payload}); err != nil {
			return err
		}
		if fail != nil {
			return fail(d)
		}
		return nil
	}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func (db *inboxDB[TTx]) effects(t testing.TB) int64 {
	t.Helper()
	st, err := db.client.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return st.Pending
}

func (db *inboxDB[TTx]) dead(t testing.TB, consumer string) []postbox.DeadMessage {
	t.Helper()
	out, err := db.inbox.ListDead(context.Background(), postbox.DeadFilter{Consumer: consumer})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// eachDatabase runs fn against a fresh inbox on PostgreSQL and on SQLite.
func eachDatabase(t *testing.T, cfg postbox.Config, fn func(t *testing.T, db consumerDB)) {
	t.Run("postgres", func(t *testing.T) {
		pool := testdb.Pool(t)
		prefix := testdb.Prefix(t)
		testdb.DropPrefix(t, pool, prefix)
		fn(t, newInboxDB[pgx.Tx](t, postboxpgx.New(pool), prefix, cfg))
	})
	t.Run("sqlite", func(t *testing.T) {
		fn(t, newInboxDB[*sql.Tx](t, sqlitetest.Driver(t), postbox.DefaultPrefix, cfg))
	})
}

// eachSetup runs fn for every NATS server and database.
func eachSetup(t *testing.T, cfg postbox.Config, fn func(t *testing.T, url string, db consumerDB)) {
	eachTarget(t, func(t *testing.T, url string) {
		eachDatabase(t, cfg, func(t *testing.T, db consumerDB) { fn(t, url, db) })
	})
}

// fastRetries keeps the inbox's backoff short.
var fastRetries = postbox.Config{BackoffBase: 5 * time.Millisecond, BackoffMax: 20 * time.Millisecond}

// verdicts records what a wrapped Processor returned, with the delivery.
type verdicts struct {
	mu   sync.Mutex
	list []verdictOf
}

type verdictOf struct {
	d *postbox.Delivery
	v postbox.Verdict
}

func (vs *verdicts) add(d *postbox.Delivery, v postbox.Verdict) {
	vs.mu.Lock()
	vs.list = append(vs.list, verdictOf{d, v})
	vs.mu.Unlock()
}

func (vs *verdicts) all() []verdictOf {
	vs.mu.Lock()
	defer vs.mu.Unlock()
	return append([]verdictOf(nil), vs.list...)
}

func (vs *verdicts) count(match func(verdictOf) bool) int {
	n := 0
	for _, x := range vs.all() {
		if match(x) {
			n++
		}
	}
	return n
}

// settledAll waits until the consumer has nothing pending or unacked.
func settledAll(t testing.TB, c jetstream.Consumer) {
	t.Helper()
	waitUntil(t, 15*time.Second, "every delivery settled with the server", func() bool {
		info := consumerInfo(t, c)
		return info.NumAckPending == 0 && info.NumPending == 0
	})
}

// TestInboxThreeDeliveriesOneEffect: the server delivers one message
// three times (the first two acks "lost": the handler's transaction
// committed, then the delivery was nak'd), and the handler's effect
// happens once.
func TestInboxThreeDeliveriesOneEffect(t *testing.T) {
	eachSetup(t, fastRetries, func(t *testing.T, url string, db consumerDB) {
		_, js := connect(t, url)
		_, base := stream(t, js, nil)
		c := ensureConsumer(t, js, base, "billing", nil)
		inner := db.processor("billing", nil)
		var vs verdicts
		p := processorFunc(func(ctx context.Context, d *postbox.Delivery) postbox.Verdict {
			v := inner.Process(ctx, d)
			vs.add(d, v)
			if v.Action == postbox.Ack && d.Delivered < 3 {
				return postbox.Verdict{Action: postbox.Retry, Delay: 10 * time.Millisecond}
			}
			return v
		})
		runSubscriber(t, subscriber(t, c, nil), p)
		pub := publisher(t, js, &postboxnats.Config{SubjectPrefix: base + "."})
		env := envelope("orders.paid", `{"order":1}`)
		if err := publish(t, pub, context.Background(), env); err != nil {
			t.Fatal(err)
		}
		waitUntil(t, 15*time.Second, "three deliveries", func() bool { return len(vs.all()) == 3 })
		settledAll(t, c)
		for i, x := range vs.all() {
			if x.d.ID != env.ID || x.d.Delivered != i+1 || x.v.Action != postbox.Ack || x.v.Duplicate != (i > 0) {
				t.Fatalf("delivery %d: id %s, delivered %d, verdict %+v", i+1, x.d.ID, x.d.Delivered, x.v)
			}
		}
		if n := db.effects(t); n != 1 {
			t.Fatalf("%d effects, want 1", n)
		}
	})
}

// TestInboxKilledBetweenCommitAndAck: a consumer commits the handler's
// transaction and dies (its connection closes) before its ack reaches
// the server. The message comes back after AckWait to a second consumer
// process, which finds the inbox record and runs nothing.
func TestInboxKilledBetweenCommitAndAck(t *testing.T) {
	eachSetup(t, fastRetries, func(t *testing.T, url string, db consumerDB) {
		ncA, jsA := connect(t, url)
		_, base := stream(t, jsA, nil)
		// The stream and consumer outlive connection A.
		_, js := connect(t, url)
		t.Cleanup(func() { deleteStream(t, js, base) })
		const ackWait = time.Second
		c := ensureConsumer(t, js, base, "billing", func(cc *jetstream.ConsumerConfig) { cc.AckWait = ackWait })

		inner := db.processor("billing", nil)
		var first verdicts
		killer := processorFunc(func(ctx context.Context, d *postbox.Delivery) postbox.Verdict {
			v := inner.Process(ctx, d)
			first.add(d, v)
			ncA.Close() // the process dies after its commit, before its ack
			return v
		})
		cA, err := jsA.Consumer(context.Background(), base, "billing")
		if err != nil {
			t.Fatal(err)
		}
		doneA := make(chan error, 1)
		go func() {
			doneA <- subscriber(t, cA, &postboxnats.SubscriberConfig{Logger: discardLogger()}).Run(context.Background(), killer)
		}()

		pub := publisher(t, js, &postboxnats.Config{SubjectPrefix: base + "."})
		env := envelope("orders.paid", `{"order":2}`)
		if err := publish(t, pub, context.Background(), env); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-doneA:
			if !errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				t.Fatalf("the killed subscriber's Run: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Fatal("the killed subscriber's Run did not return")
		}
		if got := first.all(); len(got) != 1 || got[0].v.Action != postbox.Ack || got[0].v.Duplicate {
			t.Fatalf("first delivery: %+v", got)
		}
		if n := db.effects(t); n != 1 {
			t.Fatalf("%d effects after the commit, want 1", n)
		}

		var second verdicts
		innerB := db.processor("billing", nil)
		runSubscriber(t, subscriber(t, c, nil), processorFunc(func(ctx context.Context, d *postbox.Delivery) postbox.Verdict {
			v := innerB.Process(ctx, d)
			second.add(d, v)
			return v
		}))
		waitUntil(t, 15*time.Second, "the redelivery after AckWait", func() bool { return len(second.all()) == 1 })
		settledAll(t, c)
		if x := second.all()[0]; x.d.ID != env.ID || x.d.Delivered != 2 || x.v.Action != postbox.Ack || !x.v.Duplicate {
			t.Fatalf("redelivery: delivered %d, verdict %+v; want the second delivery acked as a copy", x.d.Delivered, x.v)
		}
		if n := db.effects(t); n != 1 {
			t.Fatalf("%d effects, want 1", n)
		}
	})
}

// TestInboxConcurrentCopies: eight copies of one message id, stored as
// eight stream messages (a producer sent it again past any dedupe
// window), reach eight subscribers of one durable consumer at once; the
// effect happens once.
func TestInboxConcurrentCopies(t *testing.T) {
	eachSetup(t, fastRetries, func(t *testing.T, url string, db consumerDB) {
		_, js := connect(t, url)
		_, base := stream(t, js, nil)
		c := ensureConsumer(t, js, base, "billing", nil)
		const copies = 8
		id := postbox.NewID()
		inner := db.processor("billing", nil)
		var vs verdicts
		var mu sync.Mutex
		arrived, all := 0, make(chan struct{})
		subs := map[int]bool{}
		for i := range copies {
			// Each on a connection of its own, as eight processes would.
			_, jsi := connect(t, url)
			ci, err := jsi.Consumer(context.Background(), base, "billing")
			if err != nil {
				t.Fatal(err)
			}
			runSubscriber(t, subscriber(t, ci, nil), processorFunc(func(ctx context.Context, d *postbox.Delivery) postbox.Verdict {
				if d.Delivered == 1 {
					// Hold every first copy until all eight are in
					// flight, then let them race for the inbox record.
					mu.Lock()
					subs[i] = true
					if arrived++; arrived == copies {
						close(all)
					}
					mu.Unlock()
					select {
					case <-all:
					case <-time.After(15 * time.Second):
						t.Error("the eight copies were never in flight at once")
					}
				}
				v := inner.Process(ctx, d)
				vs.add(d, v)
				return v
			}))
		}
		for range copies {
			publishMsg(t, js, base+".orders.paid", `{"order":3}`, map[string]string{postbox.HeaderID: id, postbox.HeaderType: "orders.paid"})
		}
		// A store that serializes writers may answer an overlapping copy
		// with a retry; its redelivery is then a plain copy.
		waitUntil(t, 15*time.Second, "eight acks", func() bool {
			return vs.count(func(x verdictOf) bool { return x.v.Action == postbox.Ack }) == copies
		})
		settledAll(t, c)
		if n := vs.count(func(x verdictOf) bool { return x.v.Action == postbox.Ack && !x.v.Duplicate }); n != 1 {
			t.Fatalf("%d copies ran the handler, want 1", n)
		}
		for _, x := range vs.all() {
			if x.d.ID != id || x.v.Action == postbox.DeadLettered {
				t.Fatalf("delivery %s: %+v", x.d.ID, x.v)
			}
		}
		if n := db.effects(t); n != 1 {
			t.Fatalf("%d effects, want 1", n)
		}
		mu.Lock()
		t.Logf("first copies handled by %d subscribers", len(subs))
		mu.Unlock()
	})
}

// TestInboxPoisonDeadLettered: a message whose handler always fails is
// retried through the broker with the inbox's backoff and, after
// MaxAttempts runs, dead-lettered and acked; it is not redelivered after
// that. The messages around it are handled while it still has budget.
func TestInboxPoisonDeadLettered(t *testing.T) {
	cfg := fastRetries
	cfg.MaxAttempts = 3
	eachSetup(t, cfg, func(t *testing.T, url string, db consumerDB) {
		pc := newPoisonCase(t, url)
		c, poison := pc.consumer, pc.poison
		poison.Key = "order-9"
		poison.Headers[postbox.HeaderPartitionKey] = poison.Key
		inner := db.processor("billing", pc.handle)
		const healthy = 20
		var vs verdicts
		flowed := make(chan struct{})
		var once sync.Once
		p := processorFunc(func(ctx context.Context, d *postbox.Delivery) postbox.Verdict {
			if d.ID == poison.ID && d.Delivered == 2 {
				// The poison's second run waits until every healthy
				// message was handled: they flow past it.
				select {
				case <-flowed:
				case <-time.After(15 * time.Second):
					t.Error("the healthy messages did not flow while the poison was retried")
				}
			}
			v := inner.Process(ctx, d)
			vs.add(d, v)
			if vs.count(func(x verdictOf) bool { return x.d.ID != poison.ID && x.v.Action == postbox.Ack }) == healthy {
				once.Do(func() { close(flowed) })
			}
			return v
		})
		runSubscriber(t, subscriber(t, c, nil), p)
		pc.publishAll(t, healthy)
		waitUntil(t, 15*time.Second, "the poison dead-lettered", func() bool { return len(db.dead(t, "billing")) == 1 })
		settledAll(t, c)

		dl := db.dead(t, "billing")[0]
		if dl.ID != poison.ID || dl.Attempts != 3 || dl.Error != "cannot apply" || dl.Topic != "orders.paid" ||
			dl.Key != "order-9" || string(dl.Payload) != "poison" {
			t.Fatalf("dead letter %+v", dl)
		}
		var runs []postbox.Verdict
		for _, x := range vs.all() {
			if x.d.ID == poison.ID {
				runs = append(runs, x.v)
			}
		}
		if len(runs) != 3 || runs[0].Action != postbox.Retry || runs[1].Action != postbox.Retry || runs[2].Action != postbox.DeadLettered {
			t.Fatalf("poison runs %+v, want retry, retry, dead-lettered", runs)
		}
		if n := db.effects(t); n != healthy {
			t.Fatalf("%d effects, want %d (the healthy ones; the poison's rolled back)", n, healthy)
		}
		// Nothing is pending for the consumer (checked above), so the
		// server has no redelivery of the poison scheduled; a message
		// published after it arrives while the poison does not.
		sentinel := envelope("orders.paid", "sentinel")
		if err := publish(t, pc.pub, context.Background(), sentinel); err != nil {
			t.Fatal(err)
		}
		waitUntil(t, 15*time.Second, "the sentinel", func() bool {
			return vs.count(func(x verdictOf) bool { return x.d.ID == sentinel.ID }) == 1
		})
		if n := vs.count(func(x verdictOf) bool { return x.d.ID == poison.ID }); n != 3 {
			t.Fatalf("the poison ran %d times, want 3", n)
		}
	})
}

// TestInboxPerKeyPoison: with PerKey, a poison message holds back the
// later messages of its key, through the inbox's retries, until it is
// dead-lettered; then they are handled, in order. Other keys flow
// meanwhile.
func TestInboxPerKeyPoison(t *testing.T) {
	cfg := fastRetries
	cfg.MaxAttempts = 3
	eachSetup(t, cfg, func(t *testing.T, url string, db consumerDB) {
		_, js := connect(t, url)
		_, base := stream(t, js, nil)
		c := ensureConsumer(t, js, base, "billing", nil)
		pub := publisher(t, js, &postboxnats.Config{SubjectPrefix: base + "."})
		keyed := func(key, payload string) *postbox.Envelope {
			env := envelope("orders.paid", payload)
			env.Key = key
			env.Headers[postbox.HeaderPartitionKey] = key
			return env
		}
		poison := keyed("k1", "k1:poison")
		envs := []*postbox.Envelope{poison, keyed("k1", "k1:1"), keyed("k2", "k2:0"), keyed("k1", "k1:2"), keyed("k2", "k2:1")}
		inner := db.processor("billing", func(d *postbox.Delivery) error {
			if d.ID == poison.ID {
				return errors.New("cannot apply")
			}
			return nil
		})
		var vs verdicts
		k2done := make(chan struct{})
		var once sync.Once
		runSubscriber(t, subscriber(t, c, &postboxnats.SubscriberConfig{PerKey: true}), processorFunc(func(ctx context.Context, d *postbox.Delivery) postbox.Verdict {
			if d.ID == poison.ID && d.Delivered == 2 {
				// Key k2 is handled while k1 waits for its poison.
				select {
				case <-k2done:
				case <-time.After(15 * time.Second):
					t.Error("key k2 did not flow while key k1 was blocked")
				}
			}
			v := inner.Process(ctx, d)
			vs.add(d, v)
			if vs.count(func(x verdictOf) bool { return x.d.Key == "k2" && x.v.Action == postbox.Ack }) == 2 {
				once.Do(func() { close(k2done) })
			}
			return v
		}))
		for _, env := range envs {
			if err := publish(t, pub, context.Background(), env); err != nil {
				t.Fatal(err)
			}
		}
		waitUntil(t, 15*time.Second, "every message settled", func() bool {
			return vs.count(func(x verdictOf) bool { return x.v.Action != postbox.Retry }) == len(envs)
		})
		settledAll(t, c)
		var k1 []string
		for _, x := range vs.all() {
			if x.d.Key == "k1" {
				k1 = append(k1, fmt.Sprintf("%s/%s", x.d.Payload, x.v.Action))
			}
		}
		want := []string{"k1:poison/retry", "k1:poison/retry", "k1:poison/dead-lettered", "k1:1/ack", "k1:2/ack"}
		if fmt.Sprint(k1) != fmt.Sprint(want) {
			t.Fatalf("key k1 handled as %v, want %v", k1, want)
		}
		if n := db.effects(t); n != 4 {
			t.Fatalf("%d effects, want 4", n)
		}
		if dead := db.dead(t, "billing"); len(dead) != 1 || dead[0].ID != poison.ID || dead[0].Attempts != 3 {
			t.Fatalf("dead letters %+v", dead)
		}
	})
}

// TestEndToEndThroughInbox: a producer writes messages over several keys
// to its PostgreSQL outbox; its relay publishes them with the Publisher;
// consumer services, with their inbox on PostgreSQL or on SQLite, consume
// them with a PerKey Subscriber whose handler fails some first runs. Every message
// takes effect exactly once, each key's in write order.
func TestEndToEndThroughInbox(t *testing.T) {
	eachTarget(t, func(t *testing.T, url string) {
		ctx := context.Background()
		_, js := connect(t, url)
		_, base := stream(t, js, nil)

		// The producer.
		_, prefix, d := pubtest.Tables(t)
		producer, err := postbox.NewClient(d, &postbox.Config{
			Prefix: prefix, Publisher: publisher(t, js, &postboxnats.Config{SubjectPrefix: base + "."}),
			Logger: discardLogger(), PollInterval: 10 * time.Millisecond,
		})
		if err != nil {
			t.Fatal(err)
		}
		const keys, per = 10, 20
		for i := range per {
			msgs := make([]postbox.Message, 0, keys)
			for k := range keys {
				msgs = append(msgs, postbox.Message{Topic: "orders.changed", Key: fmt.Sprintf("order-%d", k), Payload: fmt.Appendf(nil, "%d", i)})
			}
			if err := producer.Write(ctx, msgs...); err != nil {
				t.Fatal(err)
			}
		}
		if err := producer.Start(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := producer.Stop(stopCtx); err != nil {
				t.Errorf("stop the relay: %v", err)
			}
		})

		// A consumer service with its inbox on PostgreSQL, another on
		// SQLite; each has a durable consumer of its own.
		eachDatabase(t, fastRetries, func(t *testing.T, db consumerDB) {
			c := ensureConsumer(t, js, base, fmt.Sprintf("shipping%d", nameSeq.Add(1)), nil)
			var mu sync.Mutex
			fails := map[string]bool{}
			next := map[string]int{}
			var violation string
			inner := db.processor("shipping", func(d *postbox.Delivery) error {
				mu.Lock()
				defer mu.Unlock()
				if d.Delivered == 1 && len(fails)%3 == 0 && !fails[d.ID] {
					fails[d.ID] = true
					return errors.New("not yet")
				}
				fails[d.ID] = true
				return nil
			})
			p := processorFunc(func(ctx context.Context, d *postbox.Delivery) postbox.Verdict {
				v := inner.Process(ctx, d)
				if v.Action == postbox.Ack && !v.Duplicate {
					mu.Lock()
					n := 0
					_, _ = fmt.Sscanf(string(d.Payload), "%d", &n)
					if n != next[d.Key] && violation == "" {
						violation = fmt.Sprintf("key %s: message %d took effect when %d was due", d.Key, n, next[d.Key])
					}
					next[d.Key] = n + 1
					mu.Unlock()
				}
				return v
			})
			runSubscriber(t, subscriber(t, c, &postboxnats.SubscriberConfig{PerKey: true, SubjectPrefix: base + "."}), p)
			waitUntil(t, 30*time.Second, "every message to take effect", func() bool { return db.effects(t) == keys*per })
			settledAll(t, c)
			mu.Lock()
			defer mu.Unlock()
			if violation != "" {
				t.Fatal(violation)
			}
			for k := range keys {
				if key := fmt.Sprintf("order-%d", k); next[key] != per {
					t.Fatalf("key %s: %d messages took effect, want %d", key, next[key], per)
				}
			}
			if n := db.effects(t); n != keys*per {
				t.Fatalf("%d effects, want %d", n, keys*per)
			}
		})
	})
}

// poisonCase is the set-up of the poison tests: a consumer "billing" on a
// stream of its own, a publisher to that stream, and the poison, a
// message whose handler always fails.
type poisonCase struct {
	consumer jetstream.Consumer
	pub      *postboxnats.Publisher
	poison   *postbox.Envelope
}

func newPoisonCase(t testing.TB, url string) poisonCase {
	t.Helper()
	_, js := connect(t, url)
	_, base := stream(t, js, nil)
	return poisonCase{
		consumer: ensureConsumer(t, js, base, "billing", nil),
		pub:      publisher(t, js, &postboxnats.Config{SubjectPrefix: base + "."}),
		poison:   envelope("orders.paid", "poison"),
	}
}

// handle is the handler: it fails on the poison and applies the rest.
func (pc poisonCase) handle(d *postbox.Delivery) error {
	if d.ID == pc.poison.ID {
		return errors.New("cannot apply")
	}
	return nil
}

// publishAll publishes the poison, then healthy messages on its topic.
func (pc poisonCase) publishAll(t testing.TB, healthy int) {
	t.Helper()
	if err := publish(t, pc.pub, context.Background(), pc.poison); err != nil {
		t.Fatal(err)
	}
	for i := range healthy {
		if err := publish(t, pc.pub, context.Background(), envelope(pc.poison.Topic, fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
}
