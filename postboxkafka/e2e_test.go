package postboxkafka_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/pubtest"
	"github.com/postbox-go/postbox/postboxkafka"
	"github.com/postbox-go/postbox/postboxpgx"
)

// store is a migrated table prefix on the machine's PostgreSQL, with an
// outbox client and an inbox on it.
type store struct {
	pool   *pgxpool.Pool
	prefix string
	driver *postboxpgx.Driver
	inbox  *postbox.Inbox[pgx.Tx]
}

func newStore(t *testing.T, ctx context.Context, inboxCfg postbox.Config) *store {
	t.Helper()
	pool, prefix, d := pubtest.Tables(t)
	inboxCfg.Prefix, inboxCfg.Logger = prefix, quiet
	c, err := postbox.NewClient(d, &inboxCfg)
	if err != nil {
		t.Fatal(err)
	}
	in := c.Inbox()
	return &store{pool: pool, prefix: prefix, driver: d, inbox: in}
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

// handler runs in the inbox's transaction and records the message.
func (l *ledger) handler(ctx context.Context, tx pgx.Tx, d *postbox.Delivery) error {
	if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
		return err
	}
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
	return nil
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

// TestEndToEnd writes 2,000 messages over 50 keys to PostgreSQL, relays
// them to Kafka with this Publisher, and consumes them back through the
// inbox with two Subscribers of one group, the second joining midway:
// every message handled exactly once, each key's messages handled in
// write order across the rebalance, nothing pending or dead, no attempt
// spent.
func TestEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test skipped in -short mode")
	}
	const keys, perKey = 50, 40
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := cluster(t)
	cl := client(t, c)
	const topic = "orders.changed"
	ensure(t, cl, topic, 8, nil)
	st := newStore(t, ctx, postbox.Config{})
	pub := &pubtest.Counting{Publisher: publisher(t, cl, nil)}
	out, err := postbox.NewClient(st.driver, &postbox.Config{Prefix: st.prefix, Publisher: pub, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}

	// Write order per key is the order of these writes: one key's
	// messages are spread over many transactions, interleaved with every
	// other key's.
	ids := map[string]bool{}
	for i := range perKey {
		msgs := make([]postbox.Message, 0, keys)
		for k := range keys {
			key := fmt.Sprintf("order-%02d", k)
			m := postbox.Message{ID: postbox.NewID(), Topic: topic, Key: key, Payload: fmt.Appendf(nil, "%s:%d", key, i), ContentType: "text/plain"}
			ids[m.ID] = true
			msgs = append(msgs, m)
		}
		if err := out.Write(ctx, msgs...); err != nil {
			t.Fatal(err)
		}
	}
	if err := out.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := out.Stop(ctx); err != nil && !errors.Is(err, postbox.ErrNotStarted) {
			t.Errorf("stop: %v", err)
		}
	}()

	log := newLedger()
	group := uniqueName("billing")
	// A small buffer, so fetching pauses and resumes often.
	cfg := &postboxkafka.SubscriberConfig{PartitionBuffer: 8, CommitInterval: 20 * time.Millisecond}
	var handled [2]atomic.Int64
	member := func(i int) postbox.Processor {
		p := st.inbox.Processor("billing", log.handler)
		return processorFunc(func(ctx context.Context, d *postbox.Delivery) postbox.Verdict {
			v := p.Process(ctx, d)
			if v.Action == postbox.Ack && !v.Duplicate {
				handled[i].Add(1)
			}
			return v
		})
	}
	running(t, subscriber(t, c, group, []string{topic}, cfg), member(0))
	log.waitFor(t, len(ids)/4, time.Minute)
	running(t, subscriber(t, c, group, []string{topic}, cfg), member(1))
	log.waitFor(t, len(ids), 2*time.Minute)
	// The last handler may still be on its way to its verdict: the counts
	// are for the log.
	t.Logf("handled by the first member %d, by the second %d", handled[0].Load(), handled[1].Load())
	if err := out.Stop(ctx); err != nil {
		t.Fatal(err)
	}

	stats, err := out.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if stats.Pending != 0 || stats.Dead != 0 || stats.Published != int64(len(ids)) {
		t.Fatalf("stats %+v, want %d published and nothing pending or dead", stats, len(ids))
	}
	var spent int
	if err := st.pool.QueryRow(ctx, "SELECT count(*) FROM "+st.prefix+"published WHERE attempts > 0").Scan(&spent); err != nil {
		t.Fatal(err)
	}
	if spent != 0 || pub.Message.Load() != 0 {
		t.Fatalf("%d messages spent attempts, %d message failures", spent, pub.Message.Load())
	}
	log.mu.Lock()
	defer log.mu.Unlock()
	for id, n := range log.runs {
		if !ids[id] {
			t.Fatalf("handled unknown message %s", id)
		}
		if n != 1 {
			t.Fatalf("message %s handled %d times", id, n)
		}
	}
	if len(log.runs) != len(ids) {
		t.Fatalf("handled %d of %d messages", len(log.runs), len(ids))
	}
	if len(log.order) != keys {
		t.Fatalf("%d keys handled, want %d", len(log.order), keys)
	}
	for key, seqs := range log.order {
		for i, s := range seqs {
			if s != i {
				t.Fatalf("key %s: handled %v, want write order", key, seqs)
			}
		}
	}
	if info := c.GroupInfo(group); info == nil || len(info.Members) != 2 {
		t.Fatalf("group %+v, want two members", info)
	}
}

// TestInboxAbsorbsRedelivery: a subscriber whose offset commits fail (as
// when it dies between its handler's commit and the offset commit) leaves
// its records to be delivered again; the next member of the group gets
// them, and the inbox runs no handler for them a second time.
func TestInboxAbsorbsRedelivery(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := cluster(t)
	cl := client(t, c)
	topic := uniqueName("again")
	ensure(t, cl, topic, 2, nil)
	st := newStore(t, ctx, postbox.Config{})
	pub := publisher(t, cl, nil)
	const n = 20
	for i := range n {
		if err := publish(t, ctx, pub, envelope(topic, fmt.Sprintf("k%d", i%4), fmt.Sprintf("k%d:%d", i%4, i/4))); err != nil {
			t.Fatal(err)
		}
	}
	group := uniqueName("g")
	h := c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.OffsetCommit}, Group: group, Err: kerr.UnknownServerError, Count: -1})
	log := newLedger()
	var mu sync.Mutex
	var dups, acks int
	verdicts := make(chan struct{}, 1)
	proc := st.inbox.Processor("billing", log.handler)
	recording := processorFunc(func(ctx context.Context, d *postbox.Delivery) postbox.Verdict {
		v := proc.Process(ctx, d)
		mu.Lock()
		acks++
		if v.Duplicate {
			dups++
		}
		mu.Unlock()
		select {
		case verdicts <- struct{}{}:
		default:
		}
		return v
	})
	stop := running(t, subscriber(t, c, group, []string{topic}, nil), recording)
	log.waitFor(t, n, 30*time.Second)
	// The ledger counts a handler run before its transaction commits:
	// stop only once every first delivery has its verdict, or a stop that
	// rolls back the last one turns its redelivery into a first copy.
	settled := time.After(30 * time.Second)
	for {
		mu.Lock()
		a := acks
		mu.Unlock()
		if a >= n {
			break
		}
		select {
		case <-verdicts:
		case <-settled:
			t.Fatalf("%d of %d first deliveries settled within 30s", a, n)
		}
	}
	if err := h.Wait(ctx, 1); err != nil {
		t.Fatal("no commit was attempted")
	}
	stop()
	h.Remove()

	running(t, subscriber(t, c, group, []string{topic}, nil), recording)
	deadline := time.After(30 * time.Second)
	for {
		mu.Lock()
		d := dups
		mu.Unlock()
		if d == n {
			break
		}
		select {
		case <-verdicts:
		case <-deadline:
			t.Fatalf("%d of %d copies seen again within 30s", d, n)
		}
	}
	log.mu.Lock()
	defer log.mu.Unlock()
	for id, runs := range log.runs {
		if runs != 1 {
			t.Fatalf("message %s handled %d times", id, runs)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if acks != 2*n {
		t.Fatalf("%d verdicts, want %d (each message twice)", acks, 2*n)
	}
}

// TestPoisonMessageDeadLettered: a message whose handler always fails holds
// its partition through the inbox's backoff, is dead-lettered after the
// budget, and the partition goes on past it.
func TestPoisonMessageDeadLettered(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := cluster(t)
	cl := client(t, c)
	topic := uniqueName("poison")
	ensure(t, cl, topic, 1, nil)
	st := newStore(t, ctx, postbox.Config{MaxAttempts: 3, BackoffBase: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond})
	pub := publisher(t, cl, nil)
	poison := envelope(topic, "k", "k:0")
	after := envelope(topic, "k", "k:1")
	for _, env := range []*postbox.Envelope{poison, after} {
		if err := publish(t, ctx, pub, env); err != nil {
			t.Fatal(err)
		}
	}
	log := newLedger()
	var runs atomic.Int32
	group := uniqueName("g")
	running(t, subscriber(t, c, group, []string{topic}, nil), st.inbox.Processor("billing", func(ctx context.Context, tx pgx.Tx, d *postbox.Delivery) error {
		if d.ID == poison.ID {
			runs.Add(1)
			return errors.New("cannot handle this")
		}
		return log.handler(ctx, tx, d)
	}))
	log.waitFor(t, 1, 30*time.Second)
	if n := runs.Load(); n != 3 {
		t.Fatalf("poison message ran %d times before the next one, want the budget of 3", n)
	}
	dead, err := st.inbox.GetDead(ctx, "billing", poison.ID)
	if err != nil {
		t.Fatalf("no dead letter for the poison message: %v", err)
	}
	if dead.Attempts != 3 || string(dead.Payload) != "k:0" {
		t.Fatalf("dead letter %+v", dead)
	}
	waitCommitted(t, c, group, topic, 0, 2)
}
