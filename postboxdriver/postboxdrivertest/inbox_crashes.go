package postboxdrivertest

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/postbox-go/postbox"
)

// runInboxCrashes tests the bound on a message whose handler runs end with
// the consuming process gone (Config.MaxCrashes). A crashed run is what a
// run leaves behind when its process exits after the run began: the
// count InboxStart recorded and nothing else; the child-process tests of
// the broker adapters make the same state by exiting for real.
func (s *suite[TTx]) runInboxCrashes(t *testing.T) {
	t.Run("CountsOnlyRunsWithNoOutcome", s.crashCount)
	t.Run("CrashLoopDeadLettered", s.crashLoopDead)
	t.Run("CrashLoopBoundedAcrossRetries", s.crashLoopAcrossRetries)
	t.Run("CrashLoopBoundedAcrossLostConnections", s.crashLoopAcrossLostConnections)
	t.Run("OrdinaryRedeliveriesNeverCrashes", s.crashOrdinaryRedeliveries)
	t.Run("SlowRunThatCommitsNeverDead", s.crashSlowRun)
	t.Run("BatchHonoursTheBound", s.crashBatch)
	t.Run("SuspectRunsAlone", s.crashSuspectAlone)
}

// A redelivery whose earlier run ended with the process gone (a suspect)
// runs with no other handler running in the process, so that a crash it
// causes is counted against it alone: it waits for the run in progress.
// An ordinary redelivery runs beside others.
func (s *suite[TTx]) crashSuspectAlone(t *testing.T) {
	if !s.h.Features.ConcurrentWriters {
		t.Skip("the database runs one writing transaction at a time: no two handler runs overlap")
	}
	ie := s.inboxSetup(t, postbox.Config{MaxCrashes: 3})
	ctx := context.Background()
	var running atomic.Int32
	release, beside := make(chan struct{}), make(chan int32, 2)
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	defer free() // a failure must not leave the first run holding its transaction
	blocking := func(ctx context.Context, tx TTx, d *postbox.Delivery) error {
		running.Add(1)
		defer running.Add(-1)
		<-release
		return ie.effect(ctx, tx, d)
	}
	counting := func(ctx context.Context, tx TTx, d *postbox.Delivery) error {
		beside <- running.Load()
		return ie.effect(ctx, tx, d)
	}
	first := delivery(postbox.NewID())
	first.Delivered = 1
	done := make(chan postbox.Verdict, 1)
	go func() { done <- ie.inbox.Handle(ctx, "billing", first, blocking) }()
	for running.Load() == 0 {
		runtime.Gosched()
	}

	// An ordinary redelivery runs while the first run holds.
	plain := delivery(postbox.NewID())
	plain.Delivered = 2
	if v := ie.inbox.Handle(ctx, "billing", plain, counting); v.Action != postbox.Ack {
		t.Fatalf("ordinary redelivery: %+v", v)
	}
	if n := <-beside; n != 1 {
		t.Fatalf("the ordinary redelivery ran beside %d runs, want the 1 in progress", n)
	}

	// A suspect waits for it: its handler sees nobody else running.
	suspect := delivery(postbox.NewID())
	ie.crashed(t, "billing", suspect.ID)
	suspect.Delivered = 3
	sv := make(chan postbox.Verdict, 1)
	go func() { sv <- ie.inbox.Handle(ctx, "billing", suspect, counting) }()
	// The suspect is given a moment to reach the gate; on a machine so
	// slow that it has not by then, the test proves less but cannot fail.
	select {
	case n := <-beside:
		t.Fatalf("the suspect ran beside %d runs while the first one held", n)
	case v := <-sv:
		t.Fatalf("the suspect finished while the first run held: %+v", v)
	case <-time.After(300 * time.Millisecond):
	}
	free()
	if v := <-done; v.Action != postbox.Ack {
		t.Fatalf("first run: %+v", v)
	}
	if n := <-beside; n != 0 {
		t.Fatalf("the suspect ran beside %d runs, want none", n)
	}
	if v := <-sv; v.Action != postbox.Ack {
		t.Fatalf("suspect: %+v", v)
	}
}

// InboxStart counts a run and returns the runs before it that recorded no
// outcome; a failure clears the count, a settle takes its own run out of
// it (a store failure between two crashes must not restart the count),
// and a bury forgets it.
func (s *suite[TTx]) crashCount(t *testing.T) {
	e := s.setup(t)
	ctx := context.Background()
	st := e.store
	start := func(id string, wantAttempts, wantCrashes int) {
		t.Helper()
		if n, err := st.InboxCrashes(ctx, "billing", id); err != nil || n != wantCrashes {
			t.Fatalf("InboxCrashes(%s) = %d, %v; want %d, what InboxStart then returns", id, n, err, wantCrashes)
		}
		a, err := st.InboxStart(ctx, "billing", id)
		if err != nil || a.Attempts != wantAttempts || a.Crashes != wantCrashes {
			t.Fatalf("InboxStart(%s) = %+v, %v; want %d attempts, %d crashes", id, a, err, wantAttempts, wantCrashes)
		}
	}
	start("m1", 0, 0)
	start("m1", 0, 1)
	start("m1", 0, 2)
	start("m2", 0, 0) // per message
	if a, err := st.RecordFailure(ctx, "billing", "m1", "boom"); err != nil || a.Attempts != 1 {
		t.Fatalf("RecordFailure = %+v, %v", a, err)
	}
	start("m1", 1, 0) // the failure was an outcome
	start("m1", 1, 1)
	if err := st.InboxSettle(ctx, "billing", "m1"); err != nil {
		t.Fatal(err)
	}
	start("m1", 1, 1) // the settled run is out of the count, the one before it stays
	if err := st.InboxSettle(ctx, "billing", "m1"); err != nil {
		t.Fatal(err)
	}
	if err := st.InboxSettle(ctx, "billing", "m1"); err != nil {
		t.Fatal(err)
	}
	if err := st.InboxSettle(ctx, "billing", "m1"); err != nil {
		t.Fatal(err)
	}
	start("m1", 1, 0) // settles beyond the runs counted take nothing below zero
	if err := st.InboxSettle(ctx, "billing", "never-started"); err != nil {
		t.Fatalf("settle of a message with no count: %v", err)
	}
	if a, err := st.InboxStart(ctx, "shipping", "m1"); err != nil || a.Crashes != 0 || a.Attempts != 0 {
		t.Fatalf("another consumer's count = %+v, %v", a, err)
	}
	d := postbox.DeadMessage{Consumer: "billing", ID: "m1", Topic: "t", Payload: []byte("x"), Error: "dead", Attempts: 3}
	if err := st.BuryConsumerDead(ctx, d); err != nil {
		t.Fatal(err)
	}
	start("m1", 0, 0) // the bury forgot it
}

// crashed leaves what a redelivery whose process exited while running it
// leaves: its start, and no outcome.
func (ie *inboxEnv[TTx]) crashed(t *testing.T, consumer, id string) {
	t.Helper()
	if _, err := ie.store.InboxStart(context.Background(), consumer, id); err != nil {
		t.Fatal(err)
	}
}

// A run that ends with an outcome recording nothing else (here an
// uncounted retry; a store failure takes the same path) between the
// crashes of a message does not restart their count: the message is
// still dead-lettered once MaxCrashes runs have died.
func (s *suite[TTx]) crashLoopAcrossRetries(t *testing.T) {
	ie := s.inboxSetup(t, postbox.Config{MaxCrashes: 2})
	ctx := context.Background()
	d := delivery(postbox.NewID())
	ran := 0
	later := func(context.Context, TTx, *postbox.Delivery) error {
		ran++
		return postbox.RetryAfter(errors.New("later"), 0, false)
	}
	// Delivery 1 died recording nothing, delivery 2 died, delivery 3
	// asked for a later delivery, delivery 4 died.
	ie.crashed(t, "billing", d.ID)
	d.Delivered = 3
	if v := ie.inbox.Handle(ctx, "billing", d, later); v.Action != postbox.Retry || ran != 1 {
		t.Fatalf("uncounted retry: %+v, runs %d", v, ran)
	}
	ie.crashed(t, "billing", d.ID)
	d.Delivered = 5
	v := ie.inbox.Handle(ctx, "billing", d, later)
	var ce *postbox.CrashLoopError
	if v.Action != postbox.DeadLettered || !errors.As(v.Err, &ce) || ce.Crashes != 2 || ran != 1 {
		t.Fatalf("verdict %+v (err %v), handler runs %d; want dead-lettered after 2 crashes, no run", v, v.Err, ran)
	}
}

// A handler whose transaction lost its connection (the server restarted,
// or killed it) failed in the database, not in the handler: the run spends
// no attempt and keeps the crashes counted before it, so that a message
// that kills the consumer beside a database that fails now and then is
// still dead-lettered once MaxCrashes runs have died.
func (s *suite[TTx]) crashLoopAcrossLostConnections(t *testing.T) {
	if s.h.Sever == nil {
		t.Skip("the database has no connections to lose")
	}
	// One attempt: a lost connection taken for the handler's failure
	// would make the message dead at once.
	ie := s.inboxSetup(t, postbox.Config{MaxCrashes: 2, MaxAttempts: 1})
	ctx := context.Background()
	d := delivery(postbox.NewID())
	ran := 0
	severed := func(ctx context.Context, tx TTx, d *postbox.Delivery) error {
		ran++
		s.h.Sever(t, ie.d, tx)
		return ie.effect(ctx, tx, d)
	}
	// Delivery 1 died recording nothing, delivery 2 died, delivery 3 lost
	// its connection, delivery 4 died.
	ie.crashed(t, "billing", d.ID)
	d.Delivered = 3
	v := ie.inbox.Handle(ctx, "billing", d, severed)
	if v.Action != postbox.Retry || v.Attempts != 0 || v.Err == nil || ran != 1 {
		t.Fatalf("lost connection: %+v (err %v), handler runs %d; want a retry spending no attempt", v, v.Err, ran)
	}
	if _, err := ie.inbox.GetDead(ctx, "billing", d.ID); err == nil {
		t.Fatal("a lost connection made the message dead")
	}
	ie.crashed(t, "billing", d.ID)
	d.Delivered = 5
	v = ie.inbox.Handle(ctx, "billing", d, severed)
	var ce *postbox.CrashLoopError
	if v.Action != postbox.DeadLettered || !errors.As(v.Err, &ce) || ce.Crashes != 2 || ran != 1 {
		t.Fatalf("verdict %+v (err %v), handler runs %d; want dead-lettered after 2 crashes, no run", v, v.Err, ran)
	}
	if n := ie.effects(t); n != 0 {
		t.Fatalf("effects = %d, want none", n)
	}
}

// After MaxCrashes redeliveries that died, the next delivery writes a dead
// message naming the crashes, without running the handler; its key's next
// message runs.
func (s *suite[TTx]) crashLoopDead(t *testing.T) {
	ie := s.inboxSetup(t, postbox.Config{MaxCrashes: 2})
	ctx := context.Background()
	d := delivery(postbox.NewID())
	// Delivery 1 died too, recording nothing; deliveries 2 and 3 died.
	ie.crashed(t, "billing", d.ID)
	ie.crashed(t, "billing", d.ID)
	ran := 0
	h := func(ctx context.Context, tx TTx, d *postbox.Delivery) error {
		ran++
		return ie.effect(ctx, tx, d)
	}
	d.Delivered = 4
	v := ie.inbox.Handle(ctx, "billing", d, h)
	var ce *postbox.CrashLoopError
	if v.Action != postbox.DeadLettered || !errors.As(v.Err, &ce) || ce.Crashes != 2 || ran != 0 {
		t.Fatalf("verdict %+v (err %v), handler runs %d; want dead-lettered after 2 crashes, no run", v, v.Err, ran)
	}
	dm, err := ie.inbox.GetDead(ctx, "billing", d.ID)
	if err != nil || !strings.Contains(dm.Error, "never returned") || !strings.Contains(dm.Error, "2 redeliveries") || dm.Attempts != 2 {
		t.Fatalf("dead message = %+v, %v", dm, err)
	}
	// A late copy is a copy of a dead message: nothing runs.
	d.Delivered = 5
	if v := ie.inbox.Handle(ctx, "billing", d, h); v.Action != postbox.Ack || !v.Duplicate || ran != 0 {
		t.Fatalf("late copy: %+v, runs %d", v, ran)
	}
	// The key's next message runs.
	next := delivery(postbox.NewID())
	if v := ie.inbox.Handle(ctx, "billing", next, h); v.Action != postbox.Ack || ran != 1 {
		t.Fatalf("next message of the key: %+v, runs %d", v, ran)
	}
	// A requeue runs the handler again and removes the dead message.
	if err := ie.inbox.RequeueDead(ctx, "billing", d.ID, h); err != nil || ran != 2 {
		t.Fatalf("requeue: %v, runs %d", err, ran)
	}
	if n := ie.effects(t); n != 2 {
		t.Fatalf("effects = %d, want 2", n)
	}
}

// Redeliveries whose runs end with an outcome are never counted as
// crashes, however many: uncounted and counted retries, failures and
// recovered panics, copies of a message that committed (an ack lost).
func (s *suite[TTx]) crashOrdinaryRedeliveries(t *testing.T) {
	ie := s.inboxSetup(t, postbox.Config{MaxCrashes: 1, MaxAttempts: 100})
	ctx := context.Background()
	const deliveries = 6
	check := func(name string, h postbox.Handler[TTx], want postbox.Action) {
		t.Helper()
		d := delivery(postbox.NewID())
		for n := 1; n <= deliveries; n++ {
			d.Delivered = n
			if v := ie.inbox.Handle(ctx, "billing", d, h); v.Action != want {
				t.Fatalf("%s: delivery %d: %+v (err %v), want %v", name, n, v, v.Err, want)
			}
		}
		if _, err := ie.inbox.GetDead(ctx, "billing", d.ID); err == nil {
			t.Fatalf("%s: dead message written", name)
		}
	}
	later := errors.New("later")
	check("uncounted retry", func(context.Context, TTx, *postbox.Delivery) error {
		return postbox.RetryAfter(later, 0, false)
	}, postbox.Retry)
	check("counted retry", func(context.Context, TTx, *postbox.Delivery) error {
		return postbox.RetryAfter(later, 0, true)
	}, postbox.Retry)
	check("failure", func(context.Context, TTx, *postbox.Delivery) error { return later }, postbox.Retry)
	check("panic", func(context.Context, TTx, *postbox.Delivery) error { panic("recovered") }, postbox.Retry)
	// The first delivery committed and its ack was lost: every later one
	// is a copy.
	committed := false
	check("copies", func(ctx context.Context, tx TTx, d *postbox.Delivery) error {
		if committed {
			t.Fatal("a copy ran the handler")
		}
		committed = true
		return ie.effect(ctx, tx, d)
	}, postbox.Ack)
}

// A handler slower than the broker's redelivery wait: a redelivery
// counted its start and waits behind the run still in progress, and the
// next redelivery finds the bound reached. It waits for the running
// transaction (at the inbox record; on SQLite, for the write lock) and,
// once that commits, is a copy: a message that was applied is never also
// dead.
func (s *suite[TTx]) crashSlowRun(t *testing.T) {
	ie := s.inboxSetup(t, postbox.Config{MaxCrashes: 1})
	ctx := context.Background()
	d := delivery(postbox.NewID())
	// The second delivery's start, counted before it met the first run's
	// transaction (a SQLite writer could not count it during that
	// transaction).
	ie.crashed(t, "billing", d.ID)
	entered, release := make(chan struct{}), make(chan struct{})
	first := make(chan postbox.Verdict, 1)
	go func() {
		first <- ie.inbox.Handle(ctx, "billing", d, func(ctx context.Context, tx TTx, d *postbox.Delivery) error {
			close(entered)
			<-release
			return ie.effect(ctx, tx, d)
		})
	}()
	<-entered
	late := *d
	late.Delivered = 3
	third := make(chan postbox.Verdict, 1)
	go func() {
		third <- ie.inbox.Handle(ctx, "billing", &late, func(context.Context, TTx, *postbox.Delivery) error {
			t.Error("the third delivery ran the handler")
			return nil
		})
	}()
	close(release)
	if v := <-first; v.Action != postbox.Ack || v.Duplicate {
		t.Fatalf("first delivery: %+v (err %v)", v, v.Err)
	}
	if v := <-third; v.Action != postbox.Ack || !v.Duplicate {
		t.Fatalf("third delivery: %+v (err %v), want a copy", v, v.Err)
	}
	if _, err := ie.inbox.GetDead(ctx, "billing", d.ID); err == nil {
		t.Fatal("an applied message is also dead")
	}
	if n := ie.effects(t); n != 1 {
		t.Fatalf("effects = %d, want 1", n)
	}
}

// A BatchProcessor runs a redelivery on its own, under the same bound.
func (s *suite[TTx]) crashBatch(t *testing.T) {
	ie := s.inboxSetup(t, postbox.Config{MaxCrashes: 1})
	ctx := context.Background()
	p, err := ie.inbox.BatchProcessor("billing", ie.effect, nil)
	if err != nil {
		t.Fatal(err)
	}
	d := delivery(postbox.NewID())
	ie.crashed(t, "billing", d.ID)
	d.Delivered = 3
	v := p.Process(ctx, d)
	var ce *postbox.CrashLoopError
	if v.Action != postbox.DeadLettered || !errors.As(v.Err, &ce) || ce.Crashes != 1 {
		t.Fatalf("verdict %+v (err %v), want dead-lettered after 1 crash", v, v.Err)
	}
	if n := ie.effects(t); n != 0 {
		t.Fatalf("effects = %d, want 0", n)
	}
}
