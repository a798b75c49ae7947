package postboxdrivertest

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/postboxdriver"
)

// runInboxFailures tests the failures a handler can name (docs/design.md
// §4) and what a late copy of a dead message does (§5).
func (s *suite[TTx]) runInboxFailures(t *testing.T) {
	t.Run("PermanentDeadAtOnce", s.inboxPermanent)
	t.Run("RetryAfter", s.inboxRetryAfter)
	t.Run("LateCopyOfDeadMessage", s.inboxLateCopyOfDead)
	t.Run("PruneOneAtATime", s.inboxPruneOneAtATime)
	t.Run("PruneKeepsDeadUntilHandled", s.inboxPruneKeepsDeadUntilHandled)
}

func (s *suite[TTx]) inboxPermanent(t *testing.T) {
	ie := s.inboxSetup(t, postbox.Config{MaxAttempts: 25})
	ctx := context.Background()
	never := func(context.Context, TTx, *postbox.Delivery) error {
		return postbox.Permanent(errors.New("unknown schema version"))
	}
	d := delivery(postbox.NewID())
	v := ie.inbox.Handle(ctx, "billing", d, never)
	if v.Action != postbox.DeadLettered || v.Attempts != 1 || !postbox.IsPermanent(v.Err) {
		t.Fatalf("Handle = %+v, want dead-lettered on attempt 1", v)
	}
	dm, err := ie.inbox.GetDead(ctx, "billing", d.ID)
	if err != nil || dm.Attempts != 1 || dm.Error != "unknown schema version" {
		t.Fatalf("GetDead = %+v, %v", dm, err)
	}
	// The same through the batching inbox, beside a message that applies.
	p, err := ie.inbox.BatchProcessor("billing", func(ctx context.Context, tx TTx, d *postbox.Delivery) error {
		if string(d.Payload) == "never" {
			return never(ctx, tx, d)
		}
		return ie.effect(ctx, tx, d)
	}, wideBatches(2))
	if err != nil {
		t.Fatal(err)
	}
	bad, good := delivery(postbox.NewID()), delivery(postbox.NewID())
	bad.Payload = []byte("never")
	vs := batchOf(p, []*postbox.Delivery{bad, good})
	if vs[0].Action != postbox.DeadLettered || vs[0].Attempts != 1 || vs[1].Action != postbox.Ack {
		t.Fatalf("batch verdicts = %+v", vs)
	}
	if n := ie.effects(t); n != 1 {
		t.Fatalf("effects = %d, want 1", n)
	}
}

func (s *suite[TTx]) inboxRetryAfter(t *testing.T) {
	ie := s.inboxSetup(t, postbox.Config{MaxAttempts: 2})
	ctx := context.Background()
	d := delivery(postbox.NewID())
	uncounted := func(context.Context, TTx, *postbox.Delivery) error {
		return postbox.RetryAfter(errors.New("downstream busy"), 7*time.Minute, false)
	}
	// Uncounted: any number of them spends nothing of a budget of 2.
	for range 5 {
		v := ie.inbox.Handle(ctx, "billing", d, uncounted)
		if v.Action != postbox.Retry || v.Delay != 7*time.Minute || v.Attempts != 0 {
			t.Fatalf("uncounted: %+v, want a retry after 7m with no attempt", v)
		}
	}
	counted := func(context.Context, TTx, *postbox.Delivery) error {
		return postbox.RetryAfter(errors.New("rate limited"), 3*time.Second, true)
	}
	v := ie.inbox.Handle(ctx, "billing", d, counted)
	if v.Action != postbox.Retry || v.Delay != 3*time.Second || v.Attempts != 1 {
		t.Fatalf("counted: %+v, want a retry after 3s, attempt 1", v)
	}
	// The budget is spent by the second counted failure, delay or not.
	v = ie.inbox.Handle(ctx, "billing", d, counted)
	if v.Action != postbox.DeadLettered || v.Attempts != 2 {
		t.Fatalf("counted, last: %+v, want dead-lettered", v)
	}
}

// inboxLateCopyOfDead: a copy of a message that arrives after its dead
// message was written runs nothing, and leaves the dead message as it
// was; RequeueDead runs it, and copies after that are copies.
func (s *suite[TTx]) inboxLateCopyOfDead(t *testing.T) {
	ie := s.inboxSetup(t, postbox.Config{MaxAttempts: 2})
	ctx := context.Background()
	d := delivery(postbox.NewID())
	fail := func(context.Context, TTx, *postbox.Delivery) error { return errors.New("cannot apply") }
	ie.inbox.Handle(ctx, "billing", d, fail)
	if v := ie.inbox.Handle(ctx, "billing", d, fail); v.Action != postbox.DeadLettered {
		t.Fatalf("second failure: %+v", v)
	}
	before, err := ie.inbox.GetDead(ctx, "billing", d.ID)
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	count := func(ctx context.Context, tx TTx, d *postbox.Delivery) error {
		runs.Add(1)
		return ie.effect(ctx, tx, d)
	}
	for range 2 {
		if v := ie.inbox.Handle(ctx, "billing", d, count); v.Action != postbox.Ack || !v.Duplicate {
			t.Fatalf("late copy: %+v, want an ack of a copy", v)
		}
		if v := ie.inbox.Handle(ctx, "billing", d, fail); v.Action != postbox.Ack || !v.Duplicate {
			t.Fatalf("late copy with a failing handler: %+v, want an ack of a copy", v)
		}
	}
	p, err := ie.inbox.BatchProcessor("billing", count, wideBatches(2))
	if err != nil {
		t.Fatal(err)
	}
	if vs := batchOf(p, []*postbox.Delivery{d, d}); vs[0].Action != postbox.Ack || !vs[0].Duplicate || !vs[1].Duplicate {
		t.Fatalf("late copies in a batch: %+v", vs)
	}
	if runs.Load() != 0 {
		t.Fatalf("the handler ran %d times for late copies of a dead message", runs.Load())
	}
	after, err := ie.inbox.GetDead(ctx, "billing", d.ID)
	if err != nil {
		t.Fatal(err)
	}
	if after.Attempts != before.Attempts || !after.FirstFailureAt.Equal(before.FirstFailureAt) || after.Error != before.Error {
		t.Fatalf("dead message changed by late copies: %+v, was %+v", after, before)
	}
	// Another consumer is not concerned by billing's dead message.
	if v := ie.inbox.Handle(ctx, "shipping", d, count); v.Action != postbox.Ack || v.Duplicate {
		t.Fatalf("another consumer: %+v", v)
	}
	if err := ie.inbox.RequeueDead(ctx, "billing", d.ID, count); err != nil {
		t.Fatal(err)
	}
	if _, err := ie.inbox.GetDead(ctx, "billing", d.ID); !errors.Is(err, postboxdriver.ErrNotFound) {
		t.Fatalf("GetDead after requeue: %v", err)
	}
	if v := ie.inbox.Handle(ctx, "billing", d, count); v.Action != postbox.Ack || !v.Duplicate {
		t.Fatalf("copy after the requeue: %+v", v)
	}
	if runs.Load() != 2 || ie.effects(t) != 2 {
		t.Fatalf("runs = %d, effects = %d; want 2 (shipping, and billing's requeue)", runs.Load(), ie.effects(t))
	}
}

// inboxPruneOneAtATime: three consumers, each a Client of its own (over
// the one driver, in this one process), prune the same tables at once.
// One pass at a time holds the claim: while another holds it, a pass
// deletes nothing and says so; together they delete every old record
// exactly once.
func (s *suite[TTx]) inboxPruneOneAtATime(t *testing.T) {
	ie := s.inboxSetup(t, postbox.Config{PruneBatch: 7, MaxAttempts: 1})
	ctx := context.Background()
	inboxes := []*postbox.Inbox[TTx]{ie.inbox}
	for range 2 {
		c := ie.env.client(t, nil, postbox.Config{PruneBatch: 7, MaxAttempts: 1})
		inboxes = append(inboxes, c.Inbox())
	}
	for i := range 30 {
		in := inboxes[i%3]
		if v := in.Handle(ctx, []string{"billing", "shipping", "audit"}[i%3], delivery(postbox.NewID()), ie.effect); v.Action != postbox.Ack {
			t.Fatal(v)
		}
	}
	for range 4 {
		if v := ie.inbox.Handle(ctx, "billing", delivery(postbox.NewID()), func(context.Context, TTx, *postbox.Delivery) error { return errors.New("x") }); v.Action != postbox.DeadLettered {
			t.Fatal(v)
		}
	}
	s.h.Backdate(t, ie.d, ie.prefix, "inbox", "received_at", 9*24*time.Hour)
	s.h.Backdate(t, ie.d, ie.prefix, "consumer_dead", "dead_at", 31*24*time.Hour)

	// Another process holds the claim: every pass stands aside.
	if ok, err := ie.store.ClaimMaintenance(ctx, "inbox-prune", "elsewhere", time.Minute); err != nil || !ok {
		t.Fatalf("claim = %v, %v", ok, err)
	}
	for i, in := range inboxes {
		res, err := in.Prune(ctx)
		if err != nil || !res.Busy || res.Inbox+res.Dead != 0 {
			t.Fatalf("inbox %d while another holds the claim: %+v, %v; want busy, nothing deleted", i, res, err)
		}
	}
	if err := ie.store.ReleaseMaintenance(ctx, "inbox-prune", "elsewhere"); err != nil {
		t.Fatal(err)
	}

	// All three at once: together they delete everything once.
	results := make([]postbox.PruneResult, 3)
	errs := make([]error, 3)
	var ready, wg sync.WaitGroup
	ready.Add(3)
	startLine := make(chan struct{})
	for i, in := range inboxes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ready.Done()
			<-startLine
			results[i], errs[i] = in.Prune(ctx)
		}()
	}
	ready.Wait()
	close(startLine)
	wg.Wait()
	var inbox, dead int
	for i := range results {
		if errs[i] != nil {
			t.Fatalf("inbox %d: %v", i, errs[i])
		}
		if results[i].Busy && results[i].Inbox+results[i].Dead != 0 {
			t.Fatalf("inbox %d: busy but deleted %+v", i, results[i])
		}
		inbox += results[i].Inbox
		dead += results[i].Dead
	}
	if inbox != 30 || dead != 4 {
		t.Fatalf("three passes at once deleted %d inbox records and %d dead messages (%+v); want 30 and 4, each once", inbox, dead, results)
	}
	// A claim left by a process that died expires: the next pass takes it.
	if ok, err := ie.store.ClaimMaintenance(ctx, "inbox-prune", "crashed", 0); err != nil || !ok {
		t.Fatalf("claim = %v, %v", ok, err)
	}
	if res, err := ie.inbox.Prune(ctx); err != nil || res.Busy {
		t.Fatalf("prune after an expired claim = %+v, %v", res, err)
	}
}

// inboxPruneKeepsDeadUntilHandled: an Inbox whose DeadRetention is negative
// keeps consumers' dead messages through Prune, however old, while its
// InboxRetention still prunes the records; a kept dead message goes only
// when it is handled (deleted or requeued), and a late copy of one still
// runs nothing.
func (s *suite[TTx]) inboxPruneKeepsDeadUntilHandled(t *testing.T) {
	ie := s.inboxSetup(t, postbox.Config{DeadRetention: -1, PruneBatch: 2, MaxAttempts: 1})
	ctx := context.Background()
	var runs atomic.Int32
	count := func(ctx context.Context, tx TTx, d *postbox.Delivery) error {
		runs.Add(1)
		return ie.effect(ctx, tx, d)
	}
	fail := func(context.Context, TTx, *postbox.Delivery) error { return errors.New("cannot apply") }
	for range 5 {
		if v := ie.inbox.Handle(ctx, "billing", delivery(postbox.NewID()), count); v.Action != postbox.Ack {
			t.Fatal(v)
		}
	}
	dead := make([]*postbox.Delivery, 3)
	for i := range dead {
		dead[i] = delivery(postbox.NewID())
		if v := ie.inbox.Handle(ctx, "billing", dead[i], fail); v.Action != postbox.DeadLettered {
			t.Fatal(v)
		}
	}
	// Past the inbox's retention (8 days), and ten times the default
	// DeadRetention (30 days).
	s.h.Backdate(t, ie.d, ie.prefix, "inbox", "received_at", 9*24*time.Hour)
	s.h.Backdate(t, ie.d, ie.prefix, "consumer_dead", "dead_at", 300*24*time.Hour)
	kept := func() int {
		t.Helper()
		ds, err := ie.inbox.ListDead(ctx, postbox.DeadFilter{Consumer: "billing"})
		if err != nil {
			t.Fatal(err)
		}
		return len(ds)
	}
	res, err := ie.inbox.Prune(ctx)
	if err != nil || res.Busy || res.Inbox != 5 || res.Dead != 0 {
		t.Fatalf("Prune = %+v, %v; want the 5 inbox records deleted and no dead message", res, err)
	}
	if n := kept(); n != 3 {
		t.Fatalf("%d dead messages after Prune, want the 3 kept", n)
	}
	// A late copy of a kept dead message runs nothing, its inbox record
	// pruned or not.
	if v := ie.inbox.Handle(ctx, "billing", dead[0], count); v.Action != postbox.Ack || !v.Duplicate {
		t.Fatalf("late copy of a kept dead message: %+v, want an ack of a copy", v)
	}
	// Handled, they go: one deleted, one requeued; the third stays.
	if ok, err := ie.inbox.DeleteDead(ctx, "billing", dead[1].ID); err != nil || !ok {
		t.Fatalf("DeleteDead = %v, %v", ok, err)
	}
	if err := ie.inbox.RequeueDead(ctx, "billing", dead[2].ID, count); err != nil {
		t.Fatal(err)
	}
	if res, err := ie.inbox.Prune(ctx); err != nil || res.Dead != 0 {
		t.Fatalf("second Prune = %+v, %v; want no dead message deleted", res, err)
	}
	if n := kept(); n != 1 {
		t.Fatalf("%d dead messages, want the 1 not handled", n)
	}
	if _, err := ie.inbox.GetDead(ctx, "billing", dead[0].ID); err != nil {
		t.Fatalf("the dead message not handled: %v", err)
	}
	if runs.Load() != 6 {
		t.Fatalf("handler runs = %d, want 6 (5 messages and the requeue)", runs.Load())
	}
}
