package postboxdrivertest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/postboxdriver"
)

func (s *suite[TTx]) runInbox(t *testing.T) {
	t.Run("ProcessFirstCopyOnly", s.inboxProcess)
	t.Run("ThreeDeliveriesOneEffect", s.inboxThreeDeliveries)
	t.Run("KilledBetweenCommitAndAck", s.inboxKilledBeforeAck)
	t.Run("ConcurrentCopies", s.inboxConcurrentCopies)
	t.Run("PoisonDeadLettered", s.inboxPoison)
	t.Run("LongErrorsStored", s.inboxLongErrors)
	t.Run("DeadLetterOperations", s.inboxDeadOps)
	t.Run("RequestedRequeue", s.inboxRequestedRequeue)
	t.Run("Retention", s.inboxRetention)
	t.Run("ConfigRetentionHorizon", s.inboxConfig)
	t.Run("ReplayHorizon", s.inboxReplayHorizon)
	t.Run("Batch", s.runInboxBatch)
	t.Run("Failures", s.runInboxFailures)
	t.Run("Crashes", s.runInboxCrashes)
}

// inboxEnv is a consumer whose handler's effect is an outbox message
// written in the handler's transaction: the number of committed effects is
// the number of pending outbox rows.
type inboxEnv[TTx any] struct {
	*env[TTx]
	inbox  *postbox.Inbox[TTx]
	client *postbox.Client[TTx]
}

func (s *suite[TTx]) inboxSetup(t *testing.T, cfg postbox.Config) *inboxEnv[TTx] {
	t.Helper()
	e := s.setup(t)
	cfg.BackoffBase, cfg.BackoffMax = time.Millisecond, 5*time.Millisecond
	c := e.client(t, nil, cfg)
	return &inboxEnv[TTx]{env: e, inbox: c.Inbox(), client: c}
}

// effect is a handler whose effect is one outbox message per run.
func (ie *inboxEnv[TTx]) effect(ctx context.Context, tx TTx, d *postbox.Delivery) error {
	return ie.client.WriteTx(ctx, tx, postbox.Message{Topic: "effect", Key: d.ID, Payload: d.Payload})
}

func (ie *inboxEnv[TTx]) effects(t *testing.T) int64 { return ie.stats(t).Pending }

func delivery(id string) *postbox.Delivery {
	return &postbox.Delivery{ID: id, Topic: "orders.paid", Key: "order-1", Payload: []byte(`{"n":1}`), Headers: map[string]string{"h": "v"}}
}

func (s *suite[TTx]) inboxProcess(t *testing.T) {
	ie := s.inboxSetup(t, postbox.Config{})
	ctx := context.Background()
	id := postbox.NewID()
	for i, wantRan := range []bool{true, false} {
		tx, commit, _ := s.h.Begin(t, ctx, ie.d)
		ran, err := ie.inbox.ProcessTx(ctx, tx, "billing", id, func(ctx context.Context, tx TTx) error {
			return ie.effect(ctx, tx, delivery(id))
		})
		if err != nil || ran != wantRan {
			t.Fatalf("copy %d: ran=%v err=%v, want ran=%v", i, ran, err, wantRan)
		}
		if err := commit(); err != nil {
			t.Fatal(err)
		}
	}
	// Another consumer has an inbox of its own.
	tx, commit, _ := s.h.Begin(t, ctx, ie.d)
	if ran, err := ie.inbox.ProcessTx(ctx, tx, "shipping", id, func(context.Context, TTx) error { return nil }); err != nil || !ran {
		t.Fatalf("other consumer: ran=%v err=%v", ran, err)
	}
	_ = commit()
	// A rolled-back first run leaves no record: the next copy runs.
	id2 := postbox.NewID()
	tx, _, rollback := s.h.Begin(t, ctx, ie.d)
	if _, err := ie.inbox.ProcessTx(ctx, tx, "billing", id2, func(context.Context, TTx) error { return errors.New("boom") }); err == nil {
		t.Fatal("handler error not returned")
	}
	_ = rollback()
	tx, commit, _ = s.h.Begin(t, ctx, ie.d)
	if ran, err := ie.inbox.ProcessTx(ctx, tx, "billing", id2, func(context.Context, TTx) error { return nil }); err != nil || !ran {
		t.Fatalf("after rollback: ran=%v err=%v", ran, err)
	}
	_ = commit()
	var ve *postbox.ValidationError
	tx, _, rollback = s.h.Begin(t, ctx, ie.d)
	defer func() { _ = rollback() }()
	if _, err := ie.inbox.ProcessTx(ctx, tx, "", id, func(context.Context, TTx) error { return nil }); !errors.As(err, &ve) {
		t.Fatalf("empty consumer: %v, want *ValidationError", err)
	}
}

func (s *suite[TTx]) inboxThreeDeliveries(t *testing.T) {
	ie := s.inboxSetup(t, postbox.Config{})
	ctx := context.Background()
	d := delivery(postbox.NewID())
	for i := range 3 {
		v := ie.inbox.Handle(ctx, "billing", d, ie.effect)
		if v.Action != postbox.Ack || v.Duplicate != (i > 0) {
			t.Fatalf("delivery %d: %+v", i, v)
		}
	}
	if n := ie.effects(t); n != 1 {
		t.Fatalf("effects = %d, want 1", n)
	}
}

// The consumer commits, then dies before acking: the broker redelivers,
// and the copy is acked without a second effect.
func (s *suite[TTx]) inboxKilledBeforeAck(t *testing.T) {
	ie := s.inboxSetup(t, postbox.Config{})
	ctx := context.Background()
	d := delivery(postbox.NewID())
	if v := ie.inbox.Handle(ctx, "billing", d, ie.effect); v.Action != postbox.Ack {
		t.Fatalf("first: %+v", v)
	}
	// A new Inbox, as after a restart, sees the same record.
	in2 := ie.env.client(t, nil, postbox.Config{}).Inbox()
	if v := in2.Handle(ctx, "billing", d, ie.effect); v.Action != postbox.Ack || !v.Duplicate {
		t.Fatalf("redelivery after restart: %+v", v)
	}
	if n := ie.effects(t); n != 1 {
		t.Fatalf("effects = %d, want 1", n)
	}
}

func (s *suite[TTx]) inboxConcurrentCopies(t *testing.T) {
	ie := s.inboxSetup(t, postbox.Config{})
	ctx := context.Background()
	d := delivery(postbox.NewID())
	var wg sync.WaitGroup
	verdicts := make(chan postbox.Verdict, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			copyOf := *d
			verdicts <- ie.inbox.Handle(ctx, "billing", &copyOf, func(ctx context.Context, tx TTx, d *postbox.Delivery) error {
				time.Sleep(5 * time.Millisecond) // widen the window in which copies overlap
				return ie.effect(ctx, tx, d)
			})
		}()
	}
	wg.Wait()
	close(verdicts)
	dups := 0
	for v := range verdicts {
		if v.Action == postbox.Retry {
			// A database that serializes writers may report a busy store
			// for an overlapping copy; the broker redelivers it.
			v = ie.inbox.Handle(ctx, "billing", d, ie.effect)
		}
		if v.Action != postbox.Ack {
			t.Fatalf("verdict %+v", v)
		}
		if v.Duplicate {
			dups++
		}
	}
	if n := ie.effects(t); n != 1 || dups != 7 {
		t.Fatalf("effects = %d, duplicates = %d; want 1 and 7", n, dups)
	}
}

// A message whose handler always fails is retried with backoff, then
// dead-lettered after its budget; other messages keep flowing.
func (s *suite[TTx]) inboxPoison(t *testing.T) {
	ie := s.inboxSetup(t, postbox.Config{MaxAttempts: 3})
	ctx := context.Background()
	poison := delivery(postbox.NewID())
	fail := func(ctx context.Context, tx TTx, d *postbox.Delivery) error {
		if d.ID == poison.ID {
			if err := ie.effect(ctx, tx, d); err != nil { // rolled back with the failure
				return err
			}
			return errors.New("cannot apply")
		}
		return ie.effect(ctx, tx, d)
	}
	for attempt := 1; attempt <= 3; attempt++ {
		v := ie.inbox.Handle(ctx, "billing", poison, fail)
		want := postbox.Retry
		if attempt == 3 {
			want = postbox.DeadLettered
		}
		if v.Action != want || v.Attempts != attempt || v.Err == nil {
			t.Fatalf("attempt %d: %+v, want %s", attempt, v, want)
		}
		if want == postbox.Retry && v.Delay <= 0 {
			t.Fatalf("attempt %d: no backoff delay", attempt)
		}
		if v := ie.inbox.Handle(ctx, "billing", delivery(postbox.NewID()), fail); v.Action != postbox.Ack {
			t.Fatalf("a healthy message between poison attempts: %+v", v)
		}
	}
	if n := ie.effects(t); n != 3 {
		t.Fatalf("effects = %d, want 3 (the healthy ones; the poison's rolled back)", n)
	}
	dl, err := ie.inbox.GetDead(ctx, "billing", poison.ID)
	if err != nil {
		t.Fatal(err)
	}
	if dl.Attempts != 3 || dl.Error != "cannot apply" || dl.Topic != poison.Topic || dl.Key != poison.Key ||
		string(dl.Payload) != string(poison.Payload) || headerOf(t, dl.Headers, "h") != "v" ||
		dl.FirstFailureAt.IsZero() || dl.LastFailureAt.Before(dl.FirstFailureAt) {
		t.Fatalf("dead message = %+v", dl)
	}
	// Deliveries the inbox cannot record (no id, an id too long) are
	// buried at once, each in a dead message of its own.
	for _, id := range []string{"", "", strings.Repeat("x", 300), strings.Repeat("x", 300) + "y"} {
		d := delivery(id)
		if v := ie.inbox.Handle(ctx, "billing", d, ie.effect); v.Action != postbox.DeadLettered {
			t.Fatalf("id %.10q: %+v", id, v)
		}
	}
	letters, err := ie.inbox.ListDead(ctx, postboxdriver.DeadFilter{Consumer: "billing", Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	invalid := 0
	for _, l := range letters {
		if strings.HasPrefix(l.ID, "invalid-id:") {
			invalid++
		}
	}
	if invalid != 4 {
		t.Fatalf("%d dead messages for 4 deliveries without a usable id", invalid)
	}
	// A panicking handler counts as a failure, not a crash.
	v := ie.inbox.Handle(ctx, "billing", delivery(postbox.NewID()), func(context.Context, TTx, *postbox.Delivery) error { panic("oops") })
	if v.Action != postbox.Retry || v.Err == nil {
		t.Fatalf("panic: %+v", v)
	}
}

func (s *suite[TTx]) inboxDeadOps(t *testing.T) {
	ie := s.inboxSetup(t, postbox.Config{MaxAttempts: 1})
	ctx := context.Background()
	failing := func(context.Context, TTx, *postbox.Delivery) error { return errors.New("down") }
	var ids []string
	for i := range 4 {
		d := delivery(postbox.NewID())
		if i%2 == 1 {
			d.Topic = "orders.shipped"
		}
		ids = append(ids, d.ID)
		if v := ie.inbox.Handle(ctx, "billing", d, failing); v.Action != postbox.DeadLettered {
			t.Fatalf("%+v", v)
		}
	}
	if v := ie.inbox.Handle(ctx, "shipping", delivery(postbox.NewID()), failing); v.Action != postbox.DeadLettered {
		t.Fatalf("%+v", v)
	}
	list := func(f postboxdriver.DeadFilter) int {
		t.Helper()
		out, err := ie.inbox.ListDead(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		return len(out)
	}
	if n := list(postboxdriver.DeadFilter{}); n != 5 {
		t.Fatalf("all = %d", n)
	}
	if n := list(postboxdriver.DeadFilter{Consumer: "billing"}); n != 4 {
		t.Fatalf("billing = %d", n)
	}
	if n := list(postboxdriver.DeadFilter{Consumer: "billing", Topic: "orders.shipped"}); n != 2 {
		t.Fatalf("billing/shipped = %d", n)
	}
	if n := list(postboxdriver.DeadFilter{Until: time.Now().Add(-time.Hour)}); n != 0 {
		t.Fatalf("until an hour ago = %d", n)
	}
	if n := list(postboxdriver.DeadFilter{Since: time.Now().Add(-time.Hour), Limit: 2}); n != 2 {
		t.Fatalf("limit 2 = %d", n)
	}
	// Requeue with a handler that still fails: the dead message stays.
	if err := ie.inbox.RequeueDead(ctx, "billing", ids[0], failing); err == nil {
		t.Fatal("requeue with a failing handler succeeded")
	}
	if _, err := ie.inbox.GetDead(ctx, "billing", ids[0]); err != nil {
		t.Fatalf("dead message gone after a failed requeue: %v", err)
	}
	// Requeue with a working handler: the effect happens, the letter goes.
	var got *postbox.Delivery
	if err := ie.inbox.RequeueDead(ctx, "billing", ids[0], func(ctx context.Context, tx TTx, d *postbox.Delivery) error {
		got = d
		return ie.effect(ctx, tx, d)
	}); err != nil {
		t.Fatal(err)
	}
	if got == nil || got.ID != ids[0] || got.Topic != "orders.paid" || got.Headers["h"] != "v" {
		t.Fatalf("requeued delivery = %+v", got)
	}
	if _, err := ie.inbox.GetDead(ctx, "billing", ids[0]); !errors.Is(err, postboxdriver.ErrNotFound) {
		t.Fatalf("after requeue: %v, want ErrNotFound", err)
	}
	if n := ie.effects(t); n != 1 {
		t.Fatalf("effects = %d", n)
	}
	// A redelivery of the requeued message is now a copy.
	if v := ie.inbox.Handle(ctx, "billing", delivery(ids[0]), ie.effect); !v.Duplicate {
		t.Fatalf("redelivery after requeue: %+v", v)
	}
	var ve *postbox.ValidationError
	if _, err := ie.inbox.GetDead(ctx, "billing", "\xff"); !errors.As(err, &ve) {
		t.Fatalf("GetDead with a bad id: %v", err)
	}
	if _, err := ie.inbox.DeleteDead(ctx, "\x00", "x"); !errors.As(err, &ve) {
		t.Fatalf("DeleteDead with a bad consumer: %v", err)
	}
	if _, err := ie.inbox.ListDead(ctx, postboxdriver.DeadFilter{Topic: "bad topic"}); !errors.As(err, &ve) {
		t.Fatalf("ListDead with a bad topic: %v", err)
	}
	if err := ie.inbox.RequeueDead(ctx, "billing", "no-such-id", ie.effect); !errors.Is(err, postboxdriver.ErrNotFound) {
		t.Fatalf("requeue of a missing letter: %v", err)
	}
	if ok, err := ie.inbox.DeleteDead(ctx, "billing", ids[1]); err != nil || !ok {
		t.Fatalf("delete: %v %v", ok, err)
	}
	if ok, err := ie.inbox.DeleteDead(ctx, "billing", ids[1]); err != nil || ok {
		t.Fatalf("second delete: %v %v", ok, err)
	}
	if n := list(postboxdriver.DeadFilter{}); n != 3 {
		t.Fatalf("after requeue and delete: %d", n)
	}
}

// An operator's requeue request (from a process without the handler)
// waits for the consumer's Inbox, which runs the handler through the
// inbox and removes the dead message; a handler that fails again leaves
// it dead with the new error, and the request cleared; consumers this
// process has no handler for are left to the processes that have one.
func (s *suite[TTx]) inboxRequestedRequeue(t *testing.T) {
	ie := s.inboxSetup(t, postbox.Config{MaxAttempts: 1})
	ctx := context.Background()
	failing := func(context.Context, TTx, *postbox.Delivery) error { return errors.New("down") }
	ids := []string{postbox.NewID(), postbox.NewID(), postbox.NewID()}
	for _, d := range []struct{ consumer, id string }{{"billing", ids[0]}, {"billing", ids[1]}, {"shipping", ids[2]}} {
		if v := ie.inbox.Handle(ctx, d.consumer, delivery(d.id), failing); v.Action != postbox.DeadLettered {
			t.Fatalf("%+v", v)
		}
	}
	var ve *postbox.ValidationError
	if _, err := ie.inbox.RequestRequeue(ctx, postbox.DeadSelection{}); !errors.Is(err, postbox.ErrEmptySelection) {
		t.Fatalf("empty selection: %v", err)
	}
	if _, err := ie.inbox.RequestRequeue(ctx, postbox.DeadSelection{DeadFilter: postboxdriver.DeadFilter{IDs: ids[:1]}}); !errors.As(err, &ve) || ve.Field != "consumer" {
		t.Fatalf("ids without a consumer: %v", err)
	}
	// The request: from an operator's process, which has no handler.
	operator := ie.env.client(t, nil, postbox.Config{MaxAttempts: 1}).Inbox()
	for _, sel := range []postbox.DeadSelection{
		{DeadFilter: postboxdriver.DeadFilter{Consumer: "billing", IDs: ids[:1]}},
		{DeadFilter: postboxdriver.DeadFilter{Consumer: "billing", IDs: ids[:1]}}, // asked twice: one requeue
		{DeadFilter: postboxdriver.DeadFilter{Consumer: "shipping"}},
	} {
		if n, err := operator.RequestRequeue(ctx, sel); err != nil || n != 1 {
			t.Fatalf("RequestRequeue(%+v) = %d, %v", sel, n, err)
		}
	}
	if n, err := operator.RunRequeues(ctx); err != nil || n != 0 {
		t.Fatalf("a process without handlers ran %d requeues (%v)", n, err)
	}
	// The consumer's process: a Processor for billing registers its
	// handler; RunRequeues (what Start runs) carries the request out.
	ran := 0
	ie.inbox.Processor("billing", func(ctx context.Context, tx TTx, d *postbox.Delivery) error {
		ran++
		return ie.effect(ctx, tx, d)
	})
	if n, err := ie.inbox.RunRequeues(ctx); err != nil || n != 1 || ran != 1 {
		t.Fatalf("RunRequeues = %d, %v; handler ran %d times", n, err, ran)
	}
	if _, err := ie.inbox.GetDead(ctx, "billing", ids[0]); !errors.Is(err, postboxdriver.ErrNotFound) {
		t.Fatalf("dead message after its requeue: %v", err)
	}
	if n, err := ie.inbox.RunRequeues(ctx); err != nil || n != 0 || ran != 1 {
		t.Fatalf("second pass: %d, %v; handler ran %d times", n, err, ran)
	}
	if v := ie.inbox.Handle(ctx, "billing", delivery(ids[0]), ie.effect); !v.Duplicate {
		t.Fatalf("a copy after the requeue ran again: %+v", v)
	}
	if n := ie.effects(t); n != 1 {
		t.Fatalf("effects = %d", n)
	}
	// A handler that fails again: the message stays dead, with the new
	// error and one more attempt, and the request is cleared.
	before, err := ie.inbox.GetDead(ctx, "billing", ids[1])
	if err != nil {
		t.Fatal(err)
	}
	ie.inbox.Processor("billing", func(context.Context, TTx, *postbox.Delivery) error { return errors.New("still down") })
	if n, err := operator.RequestRequeue(ctx, postbox.DeadSelection{DeadFilter: postboxdriver.DeadFilter{Consumer: "billing"}}); err != nil || n != 1 {
		t.Fatalf("request: %d %v", n, err)
	}
	if n, err := ie.inbox.RunRequeues(ctx); err != nil || n != 0 {
		t.Fatalf("failing requeue: %d, %v", n, err)
	}
	after, err := ie.inbox.GetDead(ctx, "billing", ids[1])
	if err != nil || after.Error != "still down" || after.Attempts != before.Attempts+1 || after.LastFailureAt.Before(before.LastFailureAt) {
		t.Fatalf("after a failing requeue: %+v, %v (before %+v)", after, err, before)
	}
	if ds, err := ie.store.ListConsumerRequeues(ctx, []string{"billing", "shipping"}, 10); err != nil || len(ds) != 1 || ds[0].Consumer != "shipping" {
		t.Fatalf("requests left: %+v, %v", ds, err)
	}
	stats, err := operator.DeadStats(ctx)
	if err != nil || len(stats) != 2 ||
		stats[0] != (postbox.ConsumerDeadStat{Consumer: "billing", Topic: "orders.paid", Count: 1}) ||
		stats[1] != (postbox.ConsumerDeadStat{Consumer: "shipping", Topic: "orders.paid", Count: 1, RequeueRequested: 1}) {
		t.Fatalf("DeadStats = %+v, %v", stats, err)
	}
	// Delete by selection.
	if n, err := operator.DeleteDeadSelected(ctx, postbox.DeadSelection{All: true}); err != nil || n != 2 {
		t.Fatalf("DeleteDeadSelected(all) = %d, %v", n, err)
	}
}

func (s *suite[TTx]) inboxRetention(t *testing.T) {
	ie := s.inboxSetup(t, postbox.Config{PruneBatch: 7, MaxAttempts: 1})
	ctx := context.Background()
	for range 20 {
		if v := ie.inbox.Handle(ctx, "billing", delivery(postbox.NewID()), ie.effect); v.Action != postbox.Ack {
			t.Fatal(v)
		}
	}
	for range 3 {
		d := delivery(postbox.NewID())
		if v := ie.inbox.Handle(ctx, "billing", d, func(context.Context, TTx, *postbox.Delivery) error { return errors.New("x") }); v.Action != postbox.DeadLettered {
			t.Fatal(v)
		}
	}
	if res, err := ie.inbox.Prune(ctx); err != nil || res.Inbox != 0 || res.Dead != 0 {
		t.Fatalf("prune of fresh records = %+v, %v", res, err)
	}
	s.h.Backdate(t, ie.d, ie.prefix, "inbox", "received_at", 9*24*time.Hour)
	s.h.Backdate(t, ie.d, ie.prefix, "consumer_dead", "dead_at", 31*24*time.Hour)
	res, err := ie.inbox.Prune(ctx)
	if err != nil || res.Inbox != 20 || res.Dead != 3 {
		t.Fatalf("prune = %+v, %v; want 20 inbox records and 3 dead messages, in batches of 7", res, err)
	}
	if n := ie.effects(t); n != 20 {
		t.Fatalf("retention touched the outbox: %d pending, want 20", n)
	}
}

// A consumer keeping its inbox 8 days (its own history 7, plus the
// margin) receives messages from producers that keep theirs longer: the
// horizon each message carries keeps its record past the consumer's own
// retention, so a replay on day 9 is still absorbed as a copy, and a
// producer keeping its history forever makes the record never forgotten.
// A copy extends the hold: a replay republishes the message, which the
// producer's history then keeps for another horizon.
func (s *suite[TTx]) inboxReplayHorizon(t *testing.T) {
	ctx := context.Background()
	for _, batch := range []bool{false, true} {
		name := "Handle"
		if batch {
			name = "BatchProcessor"
		}
		t.Run(name, func(t *testing.T) {
			ie := s.inboxSetup(t, postbox.Config{Retention: 7 * 24 * time.Hour})
			p := ie.inbox.Processor("billing", ie.effect)
			if batch {
				var err error
				if p, err = ie.inbox.BatchProcessor("billing", ie.effect, nil); err != nil {
					t.Fatal(err)
				}
			}
			handle := func(d *postbox.Delivery) postbox.Verdict { return p.Process(ctx, d) }
			with := func(id, horizon string) *postbox.Delivery {
				d := delivery(id)
				if horizon != "" {
					d.Headers[postbox.HeaderReplayHorizon] = horizon
				}
				return d
			}
			month, week, none, forever, bad := postbox.NewID(), postbox.NewID(), postbox.NewID(), postbox.NewID(), postbox.NewID()
			// At once, so that the batching processor records several
			// horizons in one transaction.
			var wg sync.WaitGroup
			verdicts := make(chan string, 5)
			for id, h := range map[string]string{month: "2592000", week: "604800", none: "", forever: postbox.ReplayHorizonForever, bad: "soon"} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if v := handle(with(id, h)); v.Action != postbox.Ack || v.Duplicate {
						verdicts <- fmt.Sprintf("first copy of %s (horizon %q): %+v", id, h, v)
					}
				}()
			}
			wg.Wait()
			close(verdicts)
			for v := range verdicts {
				t.Fatal(v)
			}
			// Day 9: past the consumer's 8 days. The records of the week's,
			// the header-less and the unreadable horizon go; the month's and
			// forever's stay.
			s.h.Backdate(t, ie.d, ie.prefix, "inbox", "received_at", 9*24*time.Hour)
			if res, err := ie.inbox.Prune(ctx); err != nil || res.Inbox != 3 {
				t.Fatalf("prune on day 9 = %+v, %v; want the 3 records within the consumer's own retention", res, err)
			}
			for _, id := range []string{month, forever} {
				if v := handle(with(id, "")); v.Action != postbox.Ack || !v.Duplicate {
					t.Fatalf("a replay of %s on day 9 ran the handler again: %+v", id, v)
				}
			}
			if n := ie.effects(t); n != 5 {
				t.Fatalf("%d effects, want 5: one per message", n)
			}
			// The replay on day 9 came with the month's horizon again (a
			// copy always extends the hold): day 40 is still within it.
			if v := handle(with(month, "2592000")); v.Action != postbox.Ack || !v.Duplicate {
				t.Fatalf("replay with its horizon: %+v", v)
			}
			s.h.Backdate(t, ie.d, ie.prefix, "inbox", "received_at", 31*24*time.Hour)
			s.h.Backdate(t, ie.d, ie.prefix, "inbox", "keep_until", 29*24*time.Hour)
			if res, err := ie.inbox.Prune(ctx); err != nil || res.Inbox != 0 {
				t.Fatalf("prune within the extended hold = %+v, %v; want nothing", res, err)
			}
			// Past every horizon but forever.
			s.h.Backdate(t, ie.d, ie.prefix, "inbox", "keep_until", 40*24*time.Hour)
			if res, err := ie.inbox.Prune(ctx); err != nil || res.Inbox != 1 {
				t.Fatalf("prune past the month's horizon = %+v, %v; want the month's record only", res, err)
			}
			s.h.Backdate(t, ie.d, ie.prefix, "inbox", "received_at", 100*365*24*time.Hour)
			if v := handle(with(forever, "")); v.Action != postbox.Ack || !v.Duplicate {
				t.Fatalf("a producer keeping its history forever: the record was forgotten: %+v", v)
			}
			if n := ie.effects(t); n != 5 {
				t.Fatalf("%d effects, want 5", n)
			}
		})
	}
}

func (s *suite[TTx]) inboxConfig(t *testing.T) {
	e := s.setup(t)
	_, err := postbox.NewClient(e.d, &postbox.Config{Prefix: e.prefix, Retention: 7 * 24 * time.Hour, InboxRetention: 7 * 24 * time.Hour, MaxAttempts: -1})
	var ce *postbox.ConfigError
	if !errors.As(err, &ce) || len(ce.Problems) != 2 || ce.Problems[0].Field != "MaxAttempts" || ce.Problems[1].Field != "InboxRetention" {
		t.Fatalf("err = %v, want MaxAttempts and InboxRetention named", err)
	}
	// Derived, not copied: the default inbox retention follows the
	// history's, and keeping the history forever keeps the records too.
	c := e.client(t, nil, postbox.Config{Retention: 30 * 24 * time.Hour})
	if got := c.Config().InboxRetention; got != 31*24*time.Hour {
		t.Fatalf("InboxRetention = %s, want Retention plus a day", got)
	}
	if got := e.client(t, nil, postbox.Config{Retention: -1}).Config().InboxRetention; got >= 0 {
		t.Fatalf("InboxRetention = %s with the history kept forever, want negative", got)
	}
	if _, err := postbox.NewClient(e.d, &postbox.Config{Prefix: e.prefix, Retention: -1, InboxRetention: 30 * 24 * time.Hour}); !errors.As(err, &ce) || ce.Problems[0].Field != "InboxRetention" {
		t.Fatalf("a bounded inbox under a history kept forever: %v, want InboxRetention named", err)
	}
}

func headerOf(t *testing.T, raw []byte, name string) string {
	t.Helper()
	h, err := postbox.DecodeHeaders(raw)
	if err != nil {
		t.Fatal(err)
	}
	return h[name]
}

// longError is an error message over the 2,000 bytes postbox keeps of
// one, with a two-byte character across byte 2,000 (an odd start puts
// every character on odd offsets), so that a cut there would store
// invalid UTF-8, which PostgreSQL refuses.
func longError() error {
	return errors.New("x" + strings.Repeat("é", 1100))
}

// A handler error longer than what postbox stores is cut on a character
// boundary: the attempt is counted and the dead message written, instead
// of failing to store either and redelivering for ever.
func (s *suite[TTx]) inboxLongErrors(t *testing.T) {
	ie := s.inboxSetup(t, postbox.Config{MaxAttempts: 2})
	ctx := context.Background()
	d := delivery(postbox.NewID())
	fail := func(context.Context, TTx, *postbox.Delivery) error { return longError() }
	if v := ie.inbox.Handle(ctx, "billing", d, fail); v.Action != postbox.Retry || v.Attempts != 1 {
		t.Fatalf("first failure: %+v, want a retry with one attempt counted", v)
	}
	if v := ie.inbox.Handle(ctx, "billing", d, fail); v.Action != postbox.DeadLettered || v.Attempts != 2 {
		t.Fatalf("second failure: %+v, want a dead message", v)
	}
	dm, err := ie.inbox.GetDead(ctx, "billing", d.ID)
	if err != nil || !utf8.ValidString(dm.Error) || len(dm.Error) > 2000 || len(dm.Error) < 1990 {
		t.Fatalf("dead message error: %d bytes, valid UTF-8 %t, %v", len(dm.Error), utf8.ValidString(dm.Error), err)
	}
}
