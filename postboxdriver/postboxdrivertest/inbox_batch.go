package postboxdrivertest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/postboxdriver"
)

func (s *suite[TTx]) runInboxBatch(t *testing.T) {
	t.Run("InsertManyAndDelete", s.batchInsertMany)
	t.Run("Savepoints", s.batchSavepoints)
	t.Run("BatchCopiesApplyOnce", s.batchCopies)
	t.Run("BatchFailingHandlerIsolated", s.batchFailingIsolated)
	t.Run("BatchHandlerOneCall", s.batchHandlerOneCall)
	t.Run("BatchReported", s.batchReported)
	t.Run("BatchKilledBetweenCommitAndAck", s.batchKilledBeforeAck)
	t.Run("BatchPoisonDeadLettered", s.batchPoison)
	t.Run("BatchConfigRejected", s.batchConfig)
}

func (s *suite[TTx]) batchInsertMany(t *testing.T) {
	ie := s.inboxSetup(t, postbox.Config{})
	ctx := context.Background()
	a, c, d, x := postbox.NewID(), postbox.NewID(), postbox.NewID(), postbox.NewID()

	insert := func(tx TTx, consumer string, ids ...string) []bool {
		t.Helper()
		got, err := ie.store.UnwrapExecutor(tx).InboxInsertMany(ctx, consumer, ids)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	tx, commit, _ := s.h.Begin(t, ctx, ie.d)
	if got := insert(tx, "billing", c, a); fmt.Sprint(got) != "[true true]" {
		t.Fatalf("first insert = %v", got)
	}
	if got := insert(tx, "billing"); len(got) != 0 {
		t.Fatalf("empty insert = %v", got)
	}
	if err := commit(); err != nil {
		t.Fatal(err)
	}
	// Known ids report false, in the order given; another consumer's
	// records are its own.
	tx, commit, _ = s.h.Begin(t, ctx, ie.d)
	if got := insert(tx, "billing", d, a, x, c); fmt.Sprint(got) != "[true false true false]" {
		t.Fatalf("mixed insert = %v, want [true false true false]", got)
	}
	if got := insert(tx, "shipping", a); fmt.Sprint(got) != "[true]" {
		t.Fatalf("other consumer = %v", got)
	}
	if err := ie.store.UnwrapExecutor(tx).InboxDelete(ctx, "billing", []string{x, a}); err != nil {
		t.Fatal(err)
	}
	if err := ie.store.UnwrapExecutor(tx).InboxDelete(ctx, "billing", nil); err != nil {
		t.Fatal(err)
	}
	if err := commit(); err != nil {
		t.Fatal(err)
	}
	// The deleted records are gone, the others stay, and the single
	// insert agrees.
	tx, _, rollback := s.h.Begin(t, ctx, ie.d)
	defer func() { _ = rollback() }()
	if got := insert(tx, "billing", a, c, d, x); fmt.Sprint(got) != "[true false false true]" {
		t.Fatalf("after delete = %v, want [true false false true]", got)
	}
	if first, err := ie.inbox.ProcessTx(ctx, tx, "shipping", a, func(context.Context, TTx) error { return nil }); err != nil || first {
		t.Fatalf("single insert of a batch-recorded id: first=%v err=%v", first, err)
	}
}

func (s *suite[TTx]) batchSavepoints(t *testing.T) {
	ie := s.inboxSetup(t, postbox.Config{})
	ctx := context.Background()
	write := func(tx TTx, n int) {
		t.Helper()
		if err := ie.client.WriteTx(ctx, tx, postbox.Message{Topic: "effect", Payload: []byte(fmt.Sprint(n))}); err != nil {
			t.Fatal(err)
		}
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	tx, commit, _ := s.h.Begin(t, ctx, ie.d)
	ex := ie.store.UnwrapExecutor(tx)
	write(tx, 1)
	must(ex.Savepoint(ctx, "sp"))
	write(tx, 2) // undone
	must(ex.RollbackToSavepoint(ctx, "sp"))
	write(tx, 3) // kept: the savepoint stays open after a rollback to it
	must(ex.Savepoint(ctx, "sp"))
	write(tx, 4) // kept: nested under the first, released with it
	must(ex.Savepoint(ctx, "sp"))
	write(tx, 5) // undone: a name used again names the latest savepoint
	must(ex.RollbackToSavepoint(ctx, "sp"))
	must(ex.ReleaseSavepoint(ctx, "sp"))
	// A failed statement inside a savepoint is undone by a rollback to
	// it, and the transaction goes on (PostgreSQL aborts it otherwise).
	must(ex.Savepoint(ctx, "other"))
	if err := ie.failStatement(t, ctx, tx); !errors.Is(err, postboxdriver.ErrNotMigrated) {
		t.Fatalf("a statement on missing tables: %v, want ErrNotMigrated", err)
	}
	must(ex.RollbackToSavepoint(ctx, "other"))
	write(tx, 6)
	must(ex.ReleaseSavepoint(ctx, "other"))
	must(commit())
	if n := ie.effects(t); n != 4 {
		t.Fatalf("%d rows committed, want 4 (1, 3, 4, 6)", n)
	}
	// Names that are not identifiers are refused, and change nothing.
	tx, _, rollback := s.h.Begin(t, ctx, ie.d)
	defer func() { _ = rollback() }()
	ex = ie.store.UnwrapExecutor(tx)
	for _, bad := range []string{"", "1sp", "sp; DROP TABLE x", "Sp", "sp-1"} {
		if err := ex.Savepoint(ctx, bad); err == nil {
			t.Fatalf("savepoint name %q accepted", bad)
		}
		if err := ex.RollbackToSavepoint(ctx, bad); err == nil {
			t.Fatalf("rollback to savepoint name %q accepted", bad)
		}
		if err := ex.ReleaseSavepoint(ctx, bad); err == nil {
			t.Fatalf("release of savepoint name %q accepted", bad)
		}
	}
	// Outside a transaction, savepoints are refused.
	if err := ie.store.Savepoint(ctx, "sp"); !errors.Is(err, postboxdriver.ErrNotInTx) {
		t.Fatalf("savepoint on the store's own executor: %v, want ErrNotInTx", err)
	}
}

// batchOf hands deliveries to p at once, from goroutines of their own as
// a subscriber would, and returns the verdicts in the order of ds.
func batchOf(p postbox.Processor, ds []*postbox.Delivery) []postbox.Verdict {
	out := make([]postbox.Verdict, len(ds))
	var wg sync.WaitGroup
	for i, d := range ds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cp := *d
			out[i] = p.Process(context.Background(), &cp)
		}()
	}
	wg.Wait()
	return out
}

// failAs ends a handler's run in tx the way kind says: "error" returns an
// error, "statement" runs a statement that fails, "panic" panics; "" returns
// nil.
func (ie *inboxEnv[TTx]) failAs(t *testing.T, ctx context.Context, tx TTx, kind string) error {
	switch kind {
	case "error":
		return errors.New("cannot apply")
	case "statement":
		return ie.failStatement(t, ctx, tx)
	case "panic":
		panic("oops")
	}
	return nil
}

// txCounter counts the handler runs per transaction, to report how the
// deliveries were batched.
type txCounter struct {
	mu   sync.Mutex
	runs map[any]int
}

func (c *txCounter) add(tx any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.runs == nil {
		c.runs = map[any]int{}
	}
	c.runs[tx]++
}

func (c *txCounter) shape() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []int
	for _, n := range c.runs {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// wideBatches gathers the n deliveries a test hands over at once
// (batchOf) into one batch where the scheduler allows: a batch waits up to
// a second for the others to queue up, and closes as soon as all n have.
func wideBatches(n int) *postbox.BatchConfig {
	return &postbox.BatchConfig{MaxBatch: n, MaxWait: time.Second, Concurrency: 1}
}

// Copies in the same batch and across batches run one handler per id.
func (s *suite[TTx]) batchCopies(t *testing.T) {
	ie := s.inboxSetup(t, postbox.Config{})
	var txs txCounter
	const n = 20
	p, err := ie.inbox.BatchProcessor("billing", func(ctx context.Context, tx TTx, d *postbox.Delivery) error {
		txs.add(any(tx))
		return ie.effect(ctx, tx, d)
	}, wideBatches(3*n))
	if err != nil {
		t.Fatal(err)
	}
	var ds []*postbox.Delivery
	for range n {
		d := delivery(postbox.NewID())
		ds = append(ds, d, d, d) // three copies each, in one batch
	}
	vs := batchOf(p, ds)
	firsts := map[string]int{}
	for i, v := range vs {
		if v.Action == postbox.Retry {
			// A store that serializes writers may report a busy store
			// for a copy handled on its own; the broker redelivers it.
			v = p.Process(context.Background(), ds[i])
		}
		if v.Action != postbox.Ack {
			t.Fatalf("delivery %d: %+v", i, v)
		}
		if !v.Duplicate {
			firsts[ds[i].ID]++
		}
	}
	// Every copy again, as redeliveries: all duplicates.
	for i, v := range batchOf(p, ds) {
		if v.Action != postbox.Ack || !v.Duplicate {
			t.Fatalf("redelivery %d: %+v", i, v)
		}
	}
	if len(firsts) != n {
		t.Fatalf("%d ids ran their handler, want %d", len(firsts), n)
	}
	for id, k := range firsts {
		if k != 1 {
			t.Fatalf("id %s ran its handler %d times", id, k)
		}
	}
	if got := ie.effects(t); got != n {
		t.Fatalf("effects = %d, want %d", got, n)
	}
	t.Logf("handler runs per transaction: %v", txs.shape())
}

// A handler that fails in a batch, also after a failed statement, rolls
// back its own message only; the others commit, and the failed one runs
// again on its redelivery.
func (s *suite[TTx]) batchFailingIsolated(t *testing.T) {
	ie := s.inboxSetup(t, postbox.Config{})
	var ds []*postbox.Delivery
	for range 30 {
		ds = append(ds, delivery(postbox.NewID()))
	}
	bad := map[string]string{ds[0].ID: "error", ds[7].ID: "statement", ds[19].ID: "panic"}
	var mu sync.Mutex
	healed := false
	ran := map[string]int{}
	var txs txCounter
	p, err := ie.inbox.BatchProcessor("billing", func(ctx context.Context, tx TTx, d *postbox.Delivery) error {
		txs.add(any(tx))
		mu.Lock()
		ran[d.ID]++
		h := healed
		mu.Unlock()
		if err := ie.effect(ctx, tx, d); err != nil {
			return err
		}
		if h {
			return nil
		}
		return ie.failAs(t, ctx, tx, bad[d.ID])
	}, wideBatches(len(ds)))
	if err != nil {
		t.Fatal(err)
	}
	vs := batchOf(p, ds)
	for i, v := range vs {
		want := postbox.Ack
		if bad[ds[i].ID] != "" {
			want = postbox.Retry
		}
		if v.Action != want || v.Duplicate {
			t.Fatalf("delivery %d (%s): %+v, want %s", i, bad[ds[i].ID], v, want)
		}
		if want == postbox.Retry && (v.Attempts != 1 || v.Err == nil || v.Delay <= 0) {
			t.Fatalf("failed delivery %d: %+v, want one attempt counted and a backoff", i, v)
		}
	}
	if n := ie.effects(t); n != 27 {
		t.Fatalf("effects = %d, want 27 (the failed handlers' rolled back)", n)
	}
	t.Logf("handler runs per transaction: %v", txs.shape())
	mu.Lock()
	// A failing handler runs once: the batch runs again without it. The
	// others ran at most twice, their first run rolled back with the
	// batch's first pass.
	for i, d := range ds {
		if k := ran[d.ID]; bad[d.ID] != "" && k != 1 || k < 1 || k > 2 {
			mu.Unlock()
			t.Fatalf("delivery %d (%q) ran its handler %d times", i, bad[d.ID], k)
		}
	}
	healed = true
	mu.Unlock()
	// Everything redelivered: the three failed ones run now, the rest are
	// copies.
	runs := 0
	for i, v := range batchOf(p, ds) {
		if v.Action != postbox.Ack {
			t.Fatalf("redelivery %d: %+v", i, v)
		}
		if !v.Duplicate {
			runs++
			if bad[ds[i].ID] == "" {
				t.Fatalf("delivery %d ran its handler twice", i)
			}
		}
	}
	if n := ie.effects(t); runs != 3 || n != 30 {
		t.Fatalf("%d handlers ran on redelivery and %d effects; want 3 and 30", runs, n)
	}
}

// A BatchHandler applies a batch's first copies in one call, in key order,
// so that a key's deliveries are adjacent. When the call fails, whether by an error, a failed statement or a panic,
// the batch runs again with a call a delivery: only the deliveries it
// fails on are retried, and the rest commit.
func (s *suite[TTx]) batchHandlerOneCall(t *testing.T) {
	ie := s.inboxSetup(t, postbox.Config{})
	fresh := func() []*postbox.Delivery {
		var ds []*postbox.Delivery
		for i := range 12 {
			d := delivery(postbox.NewID())
			// Two deliveries a key; arrival order is not key order.
			d.Key = fmt.Sprintf("order-%02d", (12-i)/2)
			ds = append(ds, d)
		}
		return ds
	}
	var mu sync.Mutex
	bad := map[string]string{}
	var sizes []int
	p, err := ie.inbox.BatchHandlerProcessor("billing", func(ctx context.Context, tx TTx, ds []*postbox.Delivery) error {
		mu.Lock()
		sizes = append(sizes, len(ds))
		mu.Unlock()
		for i, d := range ds {
			if i > 0 && ds[i-1].Key > d.Key {
				// Sorted by key, a key's deliveries are adjacent.
				t.Errorf("deliveries out of key order: %q before %q", ds[i-1].Key, d.Key)
			}
			if err := ie.effect(ctx, tx, d); err != nil {
				return err
			}
		}
		mu.Lock()
		defer mu.Unlock()
		for _, d := range ds {
			if err := ie.failAs(t, ctx, tx, bad[d.ID]); err != nil {
				return err
			}
		}
		return nil
	}, wideBatches(12))
	if err != nil {
		t.Fatal(err)
	}
	// settle hands ds over at once and returns the verdicts.
	settle := func(ds []*postbox.Delivery) []postbox.Verdict {
		vs := batchOf(p, ds)
		for i, v := range vs {
			if v.Action == postbox.Retry && v.Attempts == 0 {
				// A store that serializes writers may report a busy
				// store for a copy handled on its own.
				vs[i] = p.Process(context.Background(), ds[i])
			}
		}
		return vs
	}

	// Healthy, ten messages and two copies: one call applies every first
	// copy.
	ds := fresh()[:10]
	vs := settle(append(ds, ds[3], ds[5]))
	for i, v := range vs {
		if v.Action != postbox.Ack {
			t.Fatalf("delivery %d: %+v", i, v)
		}
	}
	for _, pair := range [][2]int{{3, 10}, {5, 11}} {
		if vs[pair[0]].Duplicate == vs[pair[1]].Duplicate {
			t.Fatalf("two copies of one message: %+v and %+v, want one applied and one duplicate", vs[pair[0]], vs[pair[1]])
		}
	}
	if n := ie.effects(t); n != 10 {
		t.Fatalf("effects = %d, want 10", n)
	}
	mu.Lock()
	t.Logf("deliveries a call: %v", sizes)
	if slices.Max(sizes) < 2 {
		t.Errorf("no call applied more than one delivery: %v", sizes)
	}
	sizes = nil
	mu.Unlock()

	// Twelve new messages, three of which fail their call, each in its own
	// way: the nine others commit.
	ds = fresh()
	failing := map[int]bool{0: true, 5: true, 9: true}
	mu.Lock()
	bad[ds[0].ID], bad[ds[5].ID], bad[ds[9].ID] = "error", "statement", "panic"
	mu.Unlock()
	for i, v := range settle(ds) {
		want := postbox.Ack
		if failing[i] {
			want = postbox.Retry
		}
		if v.Action != want || v.Duplicate {
			t.Fatalf("failing round: delivery %d (%q): %+v, want %s", i, bad[ds[i].ID], v, want)
		}
		if want == postbox.Retry && (v.Attempts != 1 || v.Err == nil || v.Delay <= 0) {
			t.Fatalf("failed delivery %d: %+v, want one attempt counted and a backoff", i, v)
		}
	}
	if n := ie.effects(t); n != 10+9 {
		t.Fatalf("effects = %d, want 19 (the failing calls' rolled back)", n)
	}
	mu.Lock()
	t.Logf("deliveries a call: %v", sizes)
	clear(bad)
	mu.Unlock()

	// Redelivered once healed: the three failed ones apply, the rest are
	// duplicates.
	for i, v := range settle(ds) {
		if v.Action != postbox.Ack || v.Duplicate == failing[i] {
			t.Fatalf("healed round: delivery %d: %+v, want an ack, duplicate %v", i, v, !failing[i])
		}
	}
	if n := ie.effects(t); n != 22 {
		t.Fatalf("effects = %d, want 22", n)
	}
}

// batchReports records what a batch processor reports (Config.Metrics).
type batchReports struct {
	mu       sync.Mutex
	batches  []postbox.InboxBatchReport
	verdicts int
}

func (r *batchReports) RelayBatch(*postbox.BatchReport) {}

func (r *batchReports) InboxHandled(string, postbox.Verdict, time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.verdicts++
}

func (r *batchReports) InboxBatch(b *postbox.InboxBatchReport) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.batches = append(r.batches, *b)
}

// take returns the batches reported since the last take, the deliveries
// they held and how many of them ended as outcome.
func (r *batchReports) take(outcome postbox.InboxBatchOutcome) (batches []postbox.InboxBatchReport, deliveries, ended int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	batches, r.batches = r.batches, nil
	for _, b := range batches {
		deliveries += b.Size + b.Copies
		if b.Outcome == outcome {
			ended++
		}
	}
	return batches, deliveries, ended
}

// Each batch is reported with its size, its copies and how it ended: its
// first transaction committed, a handler's failure cost it a second pass,
// or its transaction failed and its deliveries went one by one.
func (s *suite[TTx]) batchReported(t *testing.T) {
	var rep batchReports
	ie := s.inboxSetup(t, postbox.Config{Metrics: &rep})
	var mu sync.Mutex
	fail, sever := "", false
	// Calls of more than one delivery, by how they ended.
	calls := map[string]int{}
	p, err := ie.inbox.BatchHandlerProcessor("billing", func(ctx context.Context, tx TTx, ds []*postbox.Delivery) error {
		for _, d := range ds {
			if err := ie.effect(ctx, tx, d); err != nil {
				return err
			}
		}
		mu.Lock()
		defer mu.Unlock()
		if len(ds) == 1 {
			return nil
		}
		switch {
		case sever:
			// The batch's connection is lost after its handler's work:
			// its transaction fails, not its handler.
			sever = false
			calls["severed"]++
			s.h.Sever(t, ie.d, tx)
		case fail != "":
			calls["failed"]++
			return ie.failAs(t, ctx, tx, fail)
		default:
			calls["applied"]++
		}
		return nil
	}, wideBatches(10))
	if err != nil {
		t.Fatal(err)
	}
	// round hands ds over at once and returns how many batches ended as
	// outcome.
	handed := 0 // calls of Process
	round := func(name string, outcome postbox.InboxBatchOutcome, ds []*postbox.Delivery) int {
		t.Helper()
		vs := batchOf(p, ds)
		again := 0
		defer func() { handed += len(ds) + again }()
		for i, v := range vs {
			if v.Action == postbox.Retry && v.Attempts == 0 {
				// A busy store (SQLite) or a lost connection: the broker
				// would deliver it again, and it forms a batch of its own.
				again++
				vs[i] = p.Process(context.Background(), ds[i])
			}
			if vs[i].Action != postbox.Ack {
				t.Fatalf("%s: delivery %d: %+v", name, i, vs[i])
			}
		}
		batches, n, ended := rep.take(outcome)
		t.Logf("%s: %+v", name, batches)
		if n != len(ds)+again {
			t.Errorf("%s: the batches reported %d deliveries, want %d", name, n, len(ds)+again)
		}
		for _, b := range batches {
			if b.Consumer != "billing" || b.Size < 1 || b.Duration <= 0 || b.Outcome.String() == "unknown" {
				t.Errorf("%s: report %+v", name, b)
			}
			if (b.Size+b.Copies == 1) != (b.Outcome == postbox.BatchAlone) {
				t.Errorf("%s: a batch of %d+%d reported %s", name, b.Size, b.Copies, b.Outcome)
			}
		}
		return ended
	}
	fresh := func(n int) []*postbox.Delivery {
		var ds []*postbox.Delivery
		for range n {
			ds = append(ds, delivery(postbox.NewID()))
		}
		return ds
	}

	// Eight messages and two copies: each batch of more than one message
	// committed at once.
	ds := fresh(8)
	committed := round("healthy", postbox.BatchCommitted, append(ds, ds[0], ds[1]))
	mu.Lock()
	applied := calls["applied"]
	mu.Unlock()
	if applied == 0 || committed < applied {
		t.Errorf("%d batches committed at once, %d calls applied more than one delivery; want as many at least, and one", committed, applied)
	}
	// A failing handler: each batch whose call failed ran a second pass.
	mu.Lock()
	fail = "error"
	mu.Unlock()
	second := round("failing", postbox.BatchSecondPass, fresh(8))
	mu.Lock()
	fail = ""
	failed := calls["failed"]
	mu.Unlock()
	if failed == 0 || second != failed {
		t.Errorf("%d batches ran a second pass, %d calls of more than one delivery failed; want as many, and one", second, failed)
	}
	if s.h.Sever == nil {
		t.Log("the database has no connections to lose: no batch transaction failed")
	} else {
		// A lost connection: the batch's deliveries went one by one.
		mu.Lock()
		sever = true
		mu.Unlock()
		if n := round("severed", postbox.BatchOneByOne, fresh(8)); n != 1 {
			t.Errorf("%d batches went one by one, want the severed one", n)
		}
	}
	rep.mu.Lock()
	verdicts := rep.verdicts
	rep.mu.Unlock()
	if verdicts != handed {
		t.Errorf("%d verdicts reported, want one a delivery (%d)", verdicts, handed)
	}
}

// The consumer commits a batch and dies before acking: every delivery
// comes back, to a new Inbox, and is a copy.
func (s *suite[TTx]) batchKilledBeforeAck(t *testing.T) {
	ie := s.inboxSetup(t, postbox.Config{})
	var ds []*postbox.Delivery
	for range 10 {
		ds = append(ds, delivery(postbox.NewID()))
	}
	p, err := ie.inbox.BatchProcessor("billing", ie.effect, wideBatches(len(ds)))
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range batchOf(p, ds) {
		if v.Action != postbox.Ack || v.Duplicate {
			t.Fatalf("delivery %d: %+v", i, v)
		}
	}
	in2 := ie.env.client(t, nil, postbox.Config{}).Inbox()
	p2, err := in2.BatchProcessor("billing", ie.effect, wideBatches(len(ds)))
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range batchOf(p2, ds) {
		if v.Action != postbox.Ack || !v.Duplicate {
			t.Fatalf("redelivery %d after restart: %+v", i, v)
		}
	}
	if n := ie.effects(t); n != 10 {
		t.Fatalf("effects = %d, want 10", n)
	}
}

// A message whose handler always fails is retried, then dead-lettered
// after its budget, while the messages batched with it commit.
func (s *suite[TTx]) batchPoison(t *testing.T) {
	ie := s.inboxSetup(t, postbox.Config{MaxAttempts: 3})
	poison := delivery(postbox.NewID())
	const healthy = 5 // batched with the poison message each time
	p, err := ie.inbox.BatchProcessor("billing", func(ctx context.Context, tx TTx, d *postbox.Delivery) error {
		if err := ie.effect(ctx, tx, d); err != nil {
			return err
		}
		if d.ID == poison.ID {
			return errors.New("cannot apply")
		}
		return nil
	}, wideBatches(1+healthy))
	if err != nil {
		t.Fatal(err)
	}
	for attempt := 1; attempt <= 3; attempt++ {
		ds := []*postbox.Delivery{poison}
		for range healthy {
			ds = append(ds, delivery(postbox.NewID()))
		}
		vs := batchOf(p, ds)
		want := postbox.Retry
		if attempt == 3 {
			want = postbox.DeadLettered
		}
		if v := vs[0]; v.Action != want || v.Attempts != attempt || v.Err == nil {
			t.Fatalf("attempt %d: %+v, want %s", attempt, v, want)
		}
		for i, v := range vs[1:] {
			if v.Action != postbox.Ack || v.Duplicate {
				t.Fatalf("attempt %d, healthy delivery %d: %+v", attempt, i, v)
			}
		}
	}
	if n := ie.effects(t); n != 15 {
		t.Fatalf("effects = %d, want 15 (the healthy ones)", n)
	}
	dl, err := ie.inbox.GetDead(context.Background(), "billing", poison.ID)
	if err != nil {
		t.Fatal(err)
	}
	if dl.Attempts != 3 || dl.Error != "cannot apply" || string(dl.Payload) != string(poison.Payload) {
		t.Fatalf("dead message = %+v", dl)
	}
	// A delivery the inbox cannot record is buried at once, as with the
	// single-message processor.
	if v := p.Process(context.Background(), delivery("")); v.Action != postbox.DeadLettered {
		t.Fatalf("delivery without an id: %+v", v)
	}
}

func (s *suite[TTx]) batchConfig(t *testing.T) {
	ie := s.inboxSetup(t, postbox.Config{})
	for _, cfg := range []postbox.BatchConfig{{MaxBatch: 65}, {MaxBatch: -1}, {MaxWait: -time.Second}, {MaxWait: time.Minute}, {Concurrency: -1}} {
		var ce *postbox.ConfigError
		if _, err := ie.inbox.BatchProcessor("billing", ie.effect, &cfg); !errors.As(err, &ce) {
			t.Fatalf("%+v: err = %v, want *ConfigError", cfg, err)
		}
	}
	var ve *postbox.ValidationError
	if _, err := ie.inbox.BatchProcessor("", ie.effect, nil); !errors.As(err, &ve) {
		t.Fatalf("empty consumer: %v, want *ValidationError", err)
	}
	if _, err := ie.inbox.BatchProcessor("billing", nil, nil); !errors.As(err, &ve) {
		t.Fatalf("nil handler: %v, want *ValidationError", err)
	}
	if _, err := ie.inbox.BatchHandlerProcessor("billing", nil, nil); !errors.As(err, &ve) {
		t.Fatalf("nil batch handler: %v, want *ValidationError", err)
	}
	many := func(context.Context, TTx, []*postbox.Delivery) error { return nil }
	var ce *postbox.ConfigError
	if _, err := ie.inbox.BatchHandlerProcessor("billing", many, &postbox.BatchConfig{MaxBatch: 65}); !errors.As(err, &ce) {
		t.Fatalf("batch handler, MaxBatch 65: %v, want *ConfigError", err)
	}
	if _, err := ie.inbox.BatchHandlerProcessor("", many, nil); !errors.As(err, &ve) {
		t.Fatalf("batch handler, empty consumer: %v, want *ValidationError", err)
	}
	// The processor asks subscribers for twice the deliveries of its
	// batches at once, so that the next batches fill while some commit.
	for _, c := range []struct {
		cfg  *postbox.BatchConfig
		want int
	}{
		{nil, 2 * postbox.DefaultBatchMax * postbox.DefaultBatchConcurrency},
		{&postbox.BatchConfig{MaxBatch: 8, Concurrency: 3}, 48},
	} {
		p, err := ie.inbox.BatchProcessor("billing", ie.effect, c.cfg)
		if err != nil {
			t.Fatalf("%+v: %v", c.cfg, err)
		}
		h, ok := p.(postbox.InFlightHinter)
		if !ok {
			t.Fatalf("%+v: the batch processor gives subscribers no in-flight hint", c.cfg)
		}
		if got := h.InFlightHint(); got != c.want {
			t.Fatalf("%+v: InFlightHint() = %d, want %d", c.cfg, got, c.want)
		}
		if got := postbox.InFlight(p, 64, 4096); got != max(64, c.want) {
			t.Fatalf("%+v: InFlight(p, 64, 4096) = %d, want %d", c.cfg, got, max(64, c.want))
		}
	}
	if got := postbox.InFlight(ie.inbox.Processor("billing", ie.effect), 64, 4096); got != 64 {
		t.Fatalf("InFlight of a processor without a hint = %d, want the default 64", got)
	}
	big, err := ie.inbox.BatchProcessor("billing", ie.effect, &postbox.BatchConfig{MaxBatch: 64, Concurrency: 64})
	if err != nil {
		t.Fatal(err)
	}
	if got := postbox.InFlight(big, 64, 4096); got != 4096 {
		t.Fatalf("InFlight of a hint over the limit = %d, want the limit 4096", got)
	}
}
