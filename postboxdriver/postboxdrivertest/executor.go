package postboxdrivertest

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/postboxdriver"
)

// runExecutor tests operations of postboxdriver.Executor directly, where
// the end-to-end tests reach them only through the Client, the Inbox, the
// Admin or the Idempotency-Key middleware.
func (s *suite[TTx]) runExecutor(t *testing.T) {
	t.Run("InsertInCallersTransaction", s.execInsertTx)
	t.Run("Coordinate", s.execCoordinate)
	t.Run("ExpireLeasesFencesOwner", s.execExpireLeases)
	t.Run("ConsumerDeadMessages", s.execConsumerDead)
	t.Run("FailedOperationLeavesTransactionAsItWas", s.execFailedOpInTx)
	t.Run("Idempotency", s.execIdempotency)
	t.Run("SnapshotAndDurability", s.execSnapshotAndDurability)
	t.Run("NotMigrated", s.execNotMigrated)
	t.Run("MaintenanceClaims", s.execMaintenanceClaims)
	t.Run("CrashMarks", s.execCrashMarks)
	t.Run("ReadSpanningKeyWriters", s.execReadSpanningWriters)
}

// A lease is Crashed when taken from an owner whose lease ran out, not
// when taken free, released or renewed. Crash marks: a row in flight alone
// when its relay died counts a crash, one in flight with others becomes a
// suspect, each once, unless the relay that marked them is live again;
// marks are fenced, clears are not; a failed publish clears the mark and
// keeps the count.
func (s *suite[TTx]) execCrashMarks(t *testing.T) {
	e := s.setup(t)
	ctx := context.Background()
	ex := e.store
	coordinate := func(id string, ttl time.Duration, want, drop []int) postboxdriver.Membership {
		t.Helper()
		m, err := ex.Coordinate(ctx, id, ttl, want, drop, nil)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	crashed := func(m postboxdriver.Membership, owner string) (n int) {
		for _, l := range m.Leases {
			if l.Owner == owner && !l.Expired && l.Crashed {
				n++
			}
		}
		return n
	}
	m := coordinate("a", 300*time.Millisecond, []int{0, 1}, nil)
	if owned(m, "a") != 2 || crashed(m, "a") != 0 {
		t.Fatalf("free partitions taken: %d owned, %d crashed; want 2, 0", owned(m, "a"), crashed(m, "a"))
	}
	m = coordinate("a", 300*time.Millisecond, []int{0}, []int{1}) // renews 0, releases 1
	if crashed(m, "a") != 0 {
		t.Fatal("a renewal reported a crashed takeover")
	}
	time.Sleep(400 * time.Millisecond) // a's lease on 0 runs out: a "died"
	m = coordinate("b", time.Minute, []int{0, 1}, nil)
	if owned(m, "b") != 2 || crashed(m, "b") != 1 {
		t.Fatalf("takeover: %d owned, %d crashed; want 2, 1 (partition 0 expired, 1 released)", owned(m, "b"), crashed(m, "b"))
	}
	for _, l := range m.Leases {
		if l.Partition == 0 && !l.Crashed || l.Partition == 1 && l.Crashed {
			t.Fatalf("lease %+v: only partition 0 was taken after an expiry", l)
		}
	}
	m = coordinate("b", time.Minute, []int{0, 1}, nil)
	if crashed(m, "b") != 1 {
		t.Fatal("a renewal by the owner that took it after an expiry lost Crashed")
	}
	// Released before its owner settled its marks, a lease passes Crashed
	// on; the partitions the caller settled lose it, held or released.
	crashedOn := func(m postboxdriver.Membership, p int) bool { return leaseIn(t, m, p).Crashed }
	var err error
	coordinate("a", 300*time.Millisecond, []int{2, 3, 4}, nil)
	time.Sleep(400 * time.Millisecond)
	if m = coordinate("c", time.Minute, []int{2, 3, 4}, nil); !crashedOn(m, 2) || !crashedOn(m, 3) || !crashedOn(m, 4) {
		t.Fatal("partitions taken after an expiry are not Crashed")
	}
	if m, err = ex.Coordinate(ctx, "c", time.Minute, []int{4}, []int{2, 3}, []int{3, 4}); err != nil {
		t.Fatal(err)
	}
	if !crashedOn(m, 2) || crashedOn(m, 3) || crashedOn(m, 4) {
		t.Fatalf("after releasing 2 unsettled and 3 settled, renewing 4 settled: crashed %v %v %v, want true false false", crashedOn(m, 2), crashedOn(m, 3), crashedOn(m, 4))
	}
	if m = coordinate("d", time.Minute, []int{2, 3}, nil); !crashedOn(m, 2) || crashedOn(m, 3) || owned(m, "d") != 2 {
		t.Fatalf("taken after a release: %d owned, crashed %v %v; want 2, true (unsettled) false (settled)", owned(m, "d"), crashedOn(m, 2), crashedOn(m, 3))
	}
	coordinate("d", time.Minute, nil, []int{2, 3})
	coordinate("c", time.Minute, nil, []int{4})

	var rows []postboxdriver.Row
	for range 4 {
		rows = append(rows, row("t", ""))
	}
	if err := ex.Insert(ctx, rows); err != nil {
		t.Fatal(err)
	}
	ls, err := ex.AcquireLeases(ctx, "b", allPartitions(), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	b := fenceOf("b", ls)
	recs, err := ex.Fetch(ctx, postboxdriver.FetchParams{Fence: b, Limit: 100})
	if err != nil || len(recs) != 4 {
		t.Fatalf("fetched %d rows, %v; want 4", len(recs), err)
	}
	var seqs []int64
	for _, rec := range recs {
		seqs = append(seqs, rec.Seq)
	}
	resolve := func(f postboxdriver.Fence) map[int64]int {
		t.Helper()
		got, err := ex.ResolveCrashes(ctx, f, seqs)
		if err != nil {
			t.Fatal(err)
		}
		out := map[int64]int{}
		for _, sp := range got {
			out[sp.Seq] = sp.Crashes
		}
		return out
	}
	if got := resolve(b); len(got) != 0 {
		t.Fatalf("unmarked rows resolved as suspects: %v", got)
	}
	if n, err := ex.MarkInFlight(ctx, b, nil, postboxdriver.NotInFlight, nil); err != nil || n != 0 {
		t.Fatalf("MarkInFlight of nothing = %d, %v", n, err)
	}
	markClear := func(f postboxdriver.Fence, mk postboxdriver.InFlight, want int, seqs, clear []int64) {
		t.Helper()
		if n, err := ex.MarkInFlight(ctx, f, seqs, mk, clear); err != nil || n != want {
			t.Fatalf("MarkInFlight(%v, %d, clear %v) = %d, %v; want %d", seqs, mk, clear, n, err, want)
		}
	}
	mark := func(f postboxdriver.Fence, mk postboxdriver.InFlight, want int, seqs ...int64) {
		t.Helper()
		markClear(f, mk, want, seqs, nil)
	}
	mark(postboxdriver.Fence{Owner: "a", Generations: b.Generations}, postboxdriver.InFlightAlone, 0, seqs...)
	// b is live: its marks are a pause's, not a death's, and are cleared.
	mark(b, postboxdriver.InFlightAlone, 1, seqs[2])
	if got := resolve(b); len(got) != 0 {
		t.Fatalf("marks of a live relay resolved as %v; want them cleared", got)
	}
	if err := ex.Unregister(ctx, "b"); err != nil { // b dies
		t.Fatal(err)
	}
	mark(b, postboxdriver.InFlightWithOthers, 2, seqs[0], seqs[3])
	// One statement marks the next and clears the one before.
	markClear(b, postboxdriver.InFlightWithOthers, 2, []int64{seqs[1]}, []int64{seqs[3]})
	mark(b, postboxdriver.InFlightAlone, 1, seqs[2])
	// A relay dies here; the next owner resolves the marks.
	got := resolve(b)
	if len(got) != 3 || got[seqs[0]] != 0 || got[seqs[1]] != 0 || got[seqs[2]] != 1 {
		t.Fatalf("after a crash: %v; want %d and %d suspects, %d with one crash", got, seqs[0], seqs[1], seqs[2])
	}
	if again := resolve(b); len(again) != 3 || again[seqs[2]] != 1 {
		t.Fatalf("resolved twice: %v; one crash counts once", again)
	}
	mark(b, postboxdriver.InFlightAlone, 1, seqs[2])
	if got := resolve(b); got[seqs[2]] != 2 {
		t.Fatalf("a second crash alone: %v", got)
	}
	// seqs[0] published alone, failed: no longer a suspect. seqs[2] failed
	// too, and keeps its count.
	if _, err := markFailed(ctx, ex, b, []postboxdriver.Failure{{Seq: seqs[0], Error: "x"}, {Seq: seqs[2], Error: "x"}}, 25); err != nil {
		t.Fatal(err)
	}
	if got := resolve(b); len(got) != 2 || got[seqs[1]] != 0 || got[seqs[2]] != 2 {
		t.Fatalf("after failures: %v; want %d suspected, %d with two crashes", got, seqs[1], seqs[2])
	}
}

// A maintenance claim has one holder while it lasts: taken when free,
// expired or the owner's own, freed by its owner only.
func (s *suite[TTx]) execMaintenanceClaims(t *testing.T) {
	e := s.setup(t)
	ctx := context.Background()
	claim := func(owner string, ttl time.Duration, want bool) {
		t.Helper()
		if ok, err := e.store.ClaimMaintenance(ctx, "task", owner, ttl); err != nil || ok != want {
			t.Fatalf("claim by %s = %v, %v; want %v", owner, ok, err, want)
		}
	}
	claim("a", time.Minute, true)
	claim("b", time.Minute, false)
	claim("a", time.Minute, true) // a renewal
	if ok, err := e.store.ClaimMaintenance(ctx, "other-task", "b", time.Minute); err != nil || !ok {
		t.Fatalf("another task = %v, %v", ok, err)
	}
	if err := e.store.ReleaseMaintenance(ctx, "task", "b"); err != nil {
		t.Fatal(err)
	}
	claim("b", time.Minute, false) // b's release did not free a's claim
	if err := e.store.ReleaseMaintenance(ctx, "task", "a"); err != nil {
		t.Fatal(err)
	}
	claim("b", 0, true) // free: taken, and already expired
	claim("a", time.Minute, true)
}

// A read whose transaction began before a key's writer began, and that
// reads once that writer and the key's next one have committed, reads the
// key's rows in order or not at all. The next writer began first and
// waited on the key's lock, as writers that serialize a key do. On
// PostgreSQL now() is when a transaction began: a row's available_at,
// by default its writer's now(), is then earlier for the later row, and a
// read that held fresh rows to available_at <= now() returned the later
// row without the earlier one, which a relay published after it. The
// read spans the writers here by running in a transaction of its own; a
// relay's statement spans them when its start (its now()) and its
// snapshot are far enough apart, as they can be under load: a fleet run
// of the fault harness stored a key's fourth row before its first three.
func (s *suite[TTx]) execReadSpanningWriters(t *testing.T) {
	if !s.h.Features.ConcurrentWriters {
		t.Skip("database serializes writers: no read spans two of them")
	}
	e := s.setup(t)
	ctx := context.Background()
	ls, err := e.store.AcquireLeases(ctx, "r", allPartitions(), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	fence := fenceOf("r", ls)
	// A row published before, for the combined statement to record.
	if err := e.store.Insert(ctx, []postboxdriver.Row{row("t", "other")}); err != nil {
		t.Fatal(err)
	}
	before, err := e.store.Fetch(ctx, postboxdriver.FetchParams{Fence: fence, Limit: 10})
	if err != nil || len(before) != 1 {
		t.Fatalf("fetched %d rows, %v; want 1", len(before), err)
	}
	// The timestamps of the three transactions' starts must differ.
	tick := func() { time.Sleep(20 * time.Millisecond) }
	later, commitLater, _ := s.h.Begin(t, ctx, e.d)
	tick()
	reader, _, rollbackReader := s.h.Begin(t, ctx, e.d)
	defer func() { _ = rollbackReader() }()
	tick()
	earlier, commitEarlier, _ := s.h.Begin(t, ctx, e.d)
	first, second := row("t", "k"), row("t", "k")
	if err := e.store.UnwrapExecutor(earlier).Insert(ctx, []postboxdriver.Row{first}); err != nil {
		t.Fatal(err)
	}
	if err := commitEarlier(); err != nil {
		t.Fatal(err)
	}
	if err := e.store.UnwrapExecutor(later).Insert(ctx, []postboxdriver.Row{second}); err != nil {
		t.Fatal(err)
	}
	if err := commitLater(); err != nil {
		t.Fatal(err)
	}
	check := func(how string, recs []postboxdriver.Record) {
		t.Helper()
		var got []string
		for _, rec := range recs {
			if rec.Key == "k" {
				got = append(got, rec.ID)
			}
		}
		if len(got) > 0 && fmt.Sprint(got) != fmt.Sprint([]string{first.ID, second.ID}) {
			t.Fatalf("%s returned %v of key k, whose rows are %s then %s: the later row without the earlier one", how, got, first.ID, second.ID)
		}
	}
	ex := e.store.UnwrapExecutor(reader)
	params := postboxdriver.FetchParams{Fence: fence, Limit: 10}
	recs, err := ex.Fetch(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	check("Fetch", recs)
	sf, ok := ex.(postboxdriver.SettleFetcher)
	if !ok {
		return
	}
	_, recs, err = sf.SettleFetch(ctx, fence, postboxdriver.Outcome{Read: []int64{before[0].Seq}, Published: []int64{before[0].Seq}}, 25, params)
	if err != nil {
		t.Fatal(err)
	}
	check("SettleFetch", recs)
}

func row(topic, key string) postboxdriver.Row {
	return postboxdriver.Row{ID: postbox.NewID(), Topic: topic, Key: key, Payload: []byte("p"), Headers: []byte(`{}`)}
}

// The executor UnwrapExecutor returns writes in the caller's transaction:
// its rows exist if and only if that transaction commits.
func (s *suite[TTx]) execInsertTx(t *testing.T) {
	e := s.setup(t)
	ctx := context.Background()
	tx, _, rollback := s.h.Begin(t, ctx, e.d)
	if err := e.store.UnwrapExecutor(tx).Insert(ctx, []postboxdriver.Row{row("a", "k"), row("b", "")}); err != nil {
		t.Fatal(err)
	}
	if err := rollback(); err != nil {
		t.Fatal(err)
	}
	if st := e.stats(t); st.Pending != 0 {
		t.Fatalf("%d rows after a rollback, want 0", st.Pending)
	}
	tx, commit, _ := s.h.Begin(t, ctx, e.d)
	if err := e.store.UnwrapExecutor(tx).Insert(ctx, []postboxdriver.Row{row("a", "k"), row("b", "")}); err != nil {
		t.Fatal(err)
	}
	if err := commit(); err != nil {
		t.Fatal(err)
	}
	// The store's own executor writes in a transaction of its own.
	if err := e.store.Insert(ctx, []postboxdriver.Row{row("c", "k")}); err != nil {
		t.Fatal(err)
	}
	if st := e.stats(t); st.Pending != 3 {
		t.Fatalf("%d rows after two commits, want 3", st.Pending)
	}
}

// Coordinate heartbeats, releases, takes and renews in one call, and
// reports the membership after it: who is live, and every lease with its
// owner, generation and whether anyone may take it.
func (s *suite[TTx]) execCoordinate(t *testing.T) {
	e := s.setup(t)
	ctx := context.Background()
	leaseOf := func(m postboxdriver.Membership, p int) postboxdriver.Lease { return leaseIn(t, m, p) }
	// A takes 0-3; every partition is reported, the free ones takeable.
	m, err := e.store.Coordinate(ctx, "a", time.Minute, []int{0, 1, 2, 3}, nil, nil)
	if err != nil || fmt.Sprint(m.Live) != "[a]" || len(m.Leases) != 64 {
		t.Fatalf("first = live %v, %d leases, %v", m.Live, len(m.Leases), err)
	}
	if owned(m, "a") != 4 || leaseOf(m, 4).Owner != "" || !leaseOf(m, 4).Expired {
		t.Fatalf("a holds %d, partition 4 = %+v; want 4 held and the rest free", owned(m, "a"), leaseOf(m, 4))
	}
	// The time a lease has left is read on the database's clock.
	if left := leaseOf(m, 0).ExpiresAt.Sub(m.Now); left <= 50*time.Second || left > time.Minute {
		t.Fatalf("partition 0 has %s left by the membership's clock (ExpiresAt %s, Now %s); want about a minute", left, leaseOf(m, 0).ExpiresAt, m.Now)
	}
	gen := leaseOf(m, 2).Generation
	// B joins and wants 2-5: it gets the free 4 and 5, not A's 2 and 3.
	m, err = e.store.Coordinate(ctx, "b", time.Minute, []int{2, 3, 4, 5}, nil, nil)
	if err != nil || fmt.Sprint(m.Live) != "[a b]" {
		t.Fatalf("b = live %v, %v", m.Live, err)
	}
	if l := leaseOf(m, 2); l.Owner != "a" || l.Expired || l.Generation != gen {
		t.Fatalf("partition 2 after b wanted it = %+v; want a's still", l)
	}
	if owned(m, "b") != 2 || leaseOf(m, 4).Owner != "b" {
		t.Fatalf("b holds %d; want 4 and 5", owned(m, "b"))
	}
	// A renews 0, 1 and 3 and lets 2 go: its generation stays on 0, 1, 3;
	// 2 is free at once, and B takes it at a new generation. A partition
	// both wanted and dropped is dropped.
	m, err = e.store.Coordinate(ctx, "a", time.Minute, []int{0, 1, 2, 3}, []int{2}, nil)
	if err != nil || leaseOf(m, 2).Owner != "" || !leaseOf(m, 2).Expired || leaseOf(m, 3).Generation != leaseOf(m, 0).Generation {
		t.Fatalf("after a dropped 2: partition 2 = %+v, %v", leaseOf(m, 2), err)
	}
	m, err = e.store.Coordinate(ctx, "b", time.Minute, []int{2, 4, 5}, nil, nil)
	if l := leaseOf(m, 2); err != nil || l.Owner != "b" || l.Generation <= gen {
		t.Fatalf("partition 2 taken by b = %+v, %v; want a generation above %d", l, err, gen)
	}
	// Dropping a lease another relay holds changes nothing.
	if m, err = e.store.Coordinate(ctx, "a", time.Minute, []int{0, 1, 3}, []int{4}, nil); err != nil || leaseOf(m, 4).Owner != "b" {
		t.Fatalf("a dropping b's partition 4: %+v, %v", leaseOf(m, 4), err)
	}
	// A relay leaving: no ttl takes it out of the live set as it lets
	// everything go.
	if _, err := e.store.Coordinate(ctx, "d", time.Minute, []int{20, 21}, nil, nil); err != nil {
		t.Fatal(err)
	}
	m, err = e.store.Coordinate(ctx, "d", 0, nil, []int{20, 21}, nil)
	if err != nil || fmt.Sprint(m.Live) != "[a b]" && fmt.Sprint(m.Live) != "[a b d]" || owned(m, "d") != 0 || !leaseOf(m, 20).Expired {
		t.Fatalf("d leaving = live %v, d holds %d, %v", m.Live, owned(m, "d"), err)
	}
	if m, err = e.store.Coordinate(ctx, "a", time.Minute, []int{0, 1, 3}, nil, nil); err != nil || fmt.Sprint(m.Live) != "[a b]" {
		t.Fatalf("after d left, a sees live %v, %v; want [a b]", m.Live, err)
	}
	// A relay whose heartbeat and leases ran out is no longer live, and its
	// leases are takeable.
	if _, err := e.store.Coordinate(ctx, "c", 100*time.Millisecond, []int{10}, nil, nil); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "c's heartbeat and lease to run out", func() bool {
		m, err := e.store.Coordinate(ctx, "a", time.Minute, []int{0, 1, 3}, nil, nil)
		return err == nil && fmt.Sprint(m.Live) == "[a b]" && leaseOf(m, 10).Owner == "c" && leaseOf(m, 10).Expired
	})
}

// ExpireLeases passes every lease to another owner at a new generation,
// already expired: the holder's fenced marks change nothing, and anyone
// takes the partitions next.
func (s *suite[TTx]) execExpireLeases(t *testing.T) {
	e := s.setup(t)
	ctx := context.Background()
	n, err := e.store.Partitions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	held, err := e.store.AcquireLeases(ctx, "a", allPartitions(), time.Minute)
	if err != nil || len(held) != n {
		t.Fatalf("acquire: %d leases, %v", len(held), err)
	}
	if err := e.store.Insert(ctx, []postboxdriver.Row{row("t", "k")}); err != nil {
		t.Fatal(err)
	}
	recs := fetchAll(t, e.store, "a")
	if len(recs) != 1 {
		t.Fatalf("fetched %d rows, want 1", len(recs))
	}
	got, err := e.store.ExpireLeases(ctx, "expired")
	if err != nil || got != n {
		t.Fatalf("ExpireLeases = %d, %v; want %d", got, err, n)
	}
	if moved, err := markPublished(ctx, e.store, fenceOf("a", held), []int64{recs[0].Seq}); err != nil || moved != 0 {
		t.Fatalf("mark under an expired lease moved %d rows (%v), want 0", moved, err)
	}
	taken, err := e.store.AcquireLeases(ctx, "b", allPartitions(), time.Minute)
	if err != nil || len(taken) != n {
		t.Fatalf("takeover: %d leases, %v", len(taken), err)
	}
	for i, l := range taken {
		if l.Generation <= held[i].Generation+1 {
			t.Fatalf("partition %d: generation %d after expiry and takeover, want more than %d", l.Partition, l.Generation, held[i].Generation+1)
		}
	}
	if moved, err := markPublished(ctx, e.store, fenceOf("b", taken), []int64{recs[0].Seq}); err != nil || moved != 1 {
		t.Fatalf("mark by the new owner moved %d rows (%v), want 1", moved, err)
	}
}

// Consumers' dead messages: written (replacing one of the same consumer
// and id, and forgetting its attempts), listed by every filter, read,
// taken in a transaction that can roll back, and deleted.
func (s *suite[TTx]) execConsumerDead(t *testing.T) {
	e := s.setup(t)
	ctx := context.Background()
	ex := e.store
	a, err := ex.RecordFailure(ctx, "billing", "m1", "first")
	if err != nil || a.Attempts != 1 || a.FirstFailureAt.IsZero() {
		t.Fatalf("RecordFailure = %+v, %v", a, err)
	}
	if a, err = ex.RecordFailure(ctx, "billing", "m1", "second"); err != nil || a.Attempts != 2 {
		t.Fatalf("second RecordFailure = %+v, %v", a, err)
	}
	bury := func(consumer, id, topic, key, errText string) {
		t.Helper()
		now := time.Now()
		d := postboxdriver.DeadMessage{Consumer: consumer, ID: id, Topic: topic, Key: key, Payload: []byte(id),
			Headers: []byte(`{"h":"v"}`), Error: errText, Attempts: 2, FirstFailureAt: now.Add(-time.Minute), LastFailureAt: now}
		if err := ex.BuryConsumerDead(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	bury("billing", "m1", "orders.paid", "o-1", "old")
	bury("billing", "m1", "orders.paid", "o-1", "boom") // replaces
	bury("billing", "m2", "orders.created", "o-2", "boom")
	bury("shipping", "m1", "orders.paid", "", "boom")
	// The bury forgot the attempts: the next failure counts from one.
	if a, err = ex.RecordFailure(ctx, "billing", "m1", "again"); err != nil || a.Attempts != 1 {
		t.Fatalf("RecordFailure after the bury = %+v, %v; want 1 attempt", a, err)
	}
	list := func(f postboxdriver.DeadFilter) string {
		t.Helper()
		ds, err := ex.ListConsumerDead(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		out := ""
		for _, d := range ds {
			out += d.Consumer + "/" + d.ID + " "
		}
		return out
	}
	for _, c := range []struct {
		f    postboxdriver.DeadFilter
		want []string // in any order
	}{
		{postboxdriver.DeadFilter{}, []string{"billing/m1", "billing/m2", "shipping/m1"}},
		{postboxdriver.DeadFilter{Consumer: "billing"}, []string{"billing/m1", "billing/m2"}},
		{postboxdriver.DeadFilter{IDs: []string{"m1"}}, []string{"billing/m1", "shipping/m1"}},
		{postboxdriver.DeadFilter{Topic: "orders.created"}, []string{"billing/m2"}},
		{postboxdriver.DeadFilter{Key: "o-1"}, []string{"billing/m1"}},
		{postboxdriver.DeadFilter{Until: time.Now().Add(-time.Hour)}, nil},
		{postboxdriver.DeadFilter{Since: time.Now().Add(-time.Hour), Limit: 1}, []string{"?"}},
	} {
		got := list(c.f)
		if len(c.want) == 1 && c.want[0] == "?" {
			if n := len(splitFields(got)); n != 1 {
				t.Errorf("filter %+v: %q, want one", c.f, got)
			}
			continue
		}
		if !sameSet(splitFields(got), c.want) {
			t.Errorf("filter %+v: %q, want %v", c.f, got, c.want)
		}
	}
	d, err := ex.GetConsumerDead(ctx, "billing", "m1")
	if err != nil || d.Error != "boom" || d.Key != "o-1" || string(d.Payload) != "m1" || headerOf(t, d.Headers, "h") != "v" || d.DeadAt.IsZero() {
		t.Fatalf("GetConsumerDead = %+v, %v", d, err)
	}
	if _, err := ex.GetConsumerDead(ctx, "billing", "nope"); !errors.Is(err, postboxdriver.ErrNotFound) {
		t.Fatalf("missing: %v, want ErrNotFound", err)
	}
	// Take in a transaction that rolls back: the dead message stays.
	tx, _, rollback := s.h.Begin(t, ctx, e.d)
	if d, err := e.store.UnwrapExecutor(tx).TakeConsumerDead(ctx, "billing", "m2"); err != nil || d.ID != "m2" {
		t.Fatalf("TakeConsumerDead = %+v, %v", d, err)
	}
	if err := rollback(); err != nil {
		t.Fatal(err)
	}
	if _, err := ex.GetConsumerDead(ctx, "billing", "m2"); err != nil {
		t.Fatalf("after a rolled-back take: %v", err)
	}
	tx, commit, _ := s.h.Begin(t, ctx, e.d)
	if _, err := e.store.UnwrapExecutor(tx).TakeConsumerDead(ctx, "billing", "nope"); !errors.Is(err, postboxdriver.ErrNotFound) {
		t.Fatalf("take of a missing one: %v, want ErrNotFound", err)
	}
	if _, err := e.store.UnwrapExecutor(tx).TakeConsumerDead(ctx, "billing", "m2"); err != nil {
		t.Fatal(err)
	}
	if err := commit(); err != nil {
		t.Fatal(err)
	}
	if ok, err := ex.DeleteConsumerDead(ctx, "shipping", "m1"); err != nil || !ok {
		t.Fatalf("delete: %v, %v", ok, err)
	}
	if ok, err := ex.DeleteConsumerDead(ctx, "shipping", "m1"); err != nil || ok {
		t.Fatalf("second delete: %v, %v", ok, err)
	}
	if got := list(postboxdriver.DeadFilter{}); !sameSet(splitFields(got), []string{"billing/m1"}) {
		t.Fatalf("left: %q, want billing/m1", got)
	}
}

// An operation of several statements that fails in the caller's
// transaction leaves nothing of itself behind: burying a dead message
// forgets its attempts and writes it; when the write fails (headers that
// are not JSON), the attempts are still counted if the caller commits. (PostgreSQL aborts the transaction instead, and the commit
// fails: nothing of it stays either.)
func (s *suite[TTx]) execFailedOpInTx(t *testing.T) {
	e := s.setup(t)
	ctx := context.Background()
	tx, commit, _ := s.h.Begin(t, ctx, e.d)
	ex := e.store.UnwrapExecutor(tx)
	if _, err := ex.RecordFailure(ctx, "billing", "m1", "first"); err != nil {
		t.Fatal(err)
	}
	bad := postboxdriver.DeadMessage{Consumer: "billing", ID: "m1", Topic: "t", Headers: []byte(`{not json`), Error: "x", Attempts: 1}
	if err := ex.BuryConsumerDead(ctx, bad); err == nil {
		t.Fatal("a dead message with headers that are not JSON was written")
	}
	committed := commit() == nil
	a, err := e.store.RecordFailure(ctx, "billing", "m1", "second")
	if err != nil {
		t.Fatal(err)
	}
	if committed && a.Attempts != 2 {
		t.Fatalf("attempts after the failed bury = %d, want 2: the bury's forgetting of them stayed behind", a.Attempts)
	}
	if _, err := e.store.GetConsumerDead(ctx, "billing", "m1"); !errors.Is(err, postboxdriver.ErrNotFound) {
		t.Fatalf("dead message after the failed bury: %v, want ErrNotFound", err)
	}
}

// The idempotency record: a claim is taken once, stored with its response
// in the handler's transaction under its token only, released for a retry
// of the same body, and pruned once expired but never while held.
func (s *suite[TTx]) execIdempotency(t *testing.T) {
	e := s.setup(t)
	ctx := context.Background()
	ex := e.store
	hash := func(s string) []byte { h := sha256.Sum256([]byte(s)); return h[:] }
	t1, t2, t3, t4 := postbox.NewID(), postbox.NewID(), postbox.NewID(), postbox.NewID()
	key, fp := hash("key 1"), hash("body 1")
	claim := postboxdriver.IdempotencyClaim{KeyHash: key, Fingerprint: fp, Method: "POST", Path: "/orders", Token: t1, TTLMillis: 60_000, ClaimMillis: 60_000}
	if _, found, err := ex.LookupIdempotency(ctx, key); err != nil || found {
		t.Fatalf("lookup before any claim: found=%v err=%v", found, err)
	}
	if took, err := ex.ClaimIdempotency(ctx, claim); err != nil || !took {
		t.Fatalf("first claim: %v, %v", took, err)
	}
	again := claim
	again.Token = t2
	if took, err := ex.ClaimIdempotency(ctx, again); err != nil || took {
		t.Fatalf("claim of a held key: %v, %v; want refused", took, err)
	}
	rec, found, err := ex.LookupIdempotency(ctx, key)
	if err != nil || !found || rec.State != postboxdriver.IdempotencyProcessing || rec.ClaimLeftMillis <= 0 || rec.Expired {
		t.Fatalf("lookup of a held claim: %+v, %v, %v", rec, found, err)
	}
	resp := postboxdriver.IdempotencyResponse{KeyHash: key, Status: 201, Headers: `{"Location":["/orders/1"]}`, Body: []byte("created"), TTLMillis: 60_000}
	resp.Token = t2
	tx, commit, _ := s.h.Begin(t, ctx, e.d)
	if ok, err := e.store.UnwrapExecutor(tx).FinalizeIdempotency(ctx, resp); err != nil || ok {
		t.Fatalf("finalize with another token: %v, %v; want refused", ok, err)
	}
	resp.Token = t1
	if ok, err := e.store.UnwrapExecutor(tx).FinalizeIdempotency(ctx, resp); err != nil || !ok {
		t.Fatalf("finalize: %v, %v", ok, err)
	}
	if err := commit(); err != nil {
		t.Fatal(err)
	}
	rec, found, err = ex.LookupIdempotency(ctx, key)
	if err != nil || !found || rec.State != postboxdriver.IdempotencySucceeded || rec.Status != 201 || string(rec.Body) != "created" || string(rec.Fingerprint) != string(fp) {
		t.Fatalf("lookup of a stored response: %+v, %v, %v", rec, found, err)
	}
	// A release after the commit leaves the stored response alone.
	if err := ex.ReleaseIdempotency(ctx, key, t1, nil); err != nil {
		t.Fatal(err)
	}
	if rec, _, _ = ex.LookupIdempotency(ctx, key); rec.State != postboxdriver.IdempotencySucceeded {
		t.Fatalf("state after a late release: %q", rec.State)
	}
	// A released claim is taken again by the same body, not another.
	key2 := hash("key 2")
	c2 := claim
	c2.KeyHash = key2
	if took, err := ex.ClaimIdempotency(ctx, c2); err != nil || !took {
		t.Fatalf("claim: %v, %v", took, err)
	}
	status := 500
	if err := ex.ReleaseIdempotency(ctx, key2, t1, &status); err != nil {
		t.Fatal(err)
	}
	if rec, _, _ = ex.LookupIdempotency(ctx, key2); rec.State != postboxdriver.IdempotencyFailed || rec.Status != 500 {
		t.Fatalf("released: %+v", rec)
	}
	other := c2
	other.Fingerprint, other.Token = hash("another body"), t3
	if took, err := ex.ClaimIdempotency(ctx, other); err != nil || took {
		t.Fatalf("claim of a released key with another body: %v, %v; want refused", took, err)
	}
	c2.Token = t4
	if took, err := ex.ClaimIdempotency(ctx, c2); err != nil || !took {
		t.Fatalf("claim of a released key with the same body: %v, %v", took, err)
	}
	// Pruning: nothing is expired yet; then everything is, but the claim
	// of key2 is still held (its claim expiry is not backdated) and stays.
	if n, err := ex.PruneIdempotency(ctx, 100); err != nil || n != 0 {
		t.Fatalf("prune before expiry: %d, %v", n, err)
	}
	s.h.Backdate(t, e.d, e.prefix, "idempotency", "expires_at", time.Hour)
	if rec, _, _ = ex.LookupIdempotency(ctx, key); !rec.Expired {
		t.Fatalf("record past its TTL not reported expired: %+v", rec)
	}
	if rec, _, _ = ex.LookupIdempotency(ctx, key2); rec.Expired {
		t.Fatalf("held claim reported expired: %+v", rec)
	}
	if n, err := ex.PruneIdempotency(ctx, 100); err != nil || n != 1 {
		t.Fatalf("prune: %d, %v; want the one expired record", n, err)
	}
	if _, found, _ := ex.LookupIdempotency(ctx, key2); !found {
		t.Fatal("a held claim was pruned")
	}
}

// OldestSnapshot, DurabilityWarnings and CheckConnections answer on every database (the
// PostgreSQL drivers' own tests hold a snapshot and weaken durability).
func (s *suite[TTx]) execSnapshotAndDurability(t *testing.T) {
	e := s.setup(t)
	ctx := context.Background()
	snap, found, err := e.store.OldestSnapshot(ctx)
	if err != nil {
		t.Fatalf("OldestSnapshot: %v", err)
	}
	if found && (snap.Age < 0 || snap.PID == 0) {
		t.Fatalf("OldestSnapshot = %+v", snap)
	}
	if _, err := e.store.DurabilityWarnings(ctx); err != nil {
		t.Fatalf("DurabilityWarnings: %v", err)
	}
	// The suite's connections work, whichever way they reach the
	// database: the check finds nothing to refuse.
	if err := e.store.CheckConnections(ctx); err != nil {
		t.Fatalf("CheckConnections: %v", err)
	}
}

// Every operation on tables that were never migrated fails with
// ErrNotMigrated.
func (s *suite[TTx]) execNotMigrated(t *testing.T) {
	e := s.setup(t)
	ctx := context.Background()
	st, err := e.d.Open(e.prefix + "none_")
	if err != nil {
		t.Fatal(err)
	}
	for name, op := range map[string]func() error{
		"Insert": func() error { return st.Insert(ctx, []postboxdriver.Row{row("t", "")}) },
		"Fetch": func() error {
			_, err := st.Fetch(ctx, postboxdriver.FetchParams{Fence: fenceOf("a", []postboxdriver.Lease{{}}), Limit: 1})
			return err
		},
		"Stats":             func() error { _, err := st.Stats(ctx); return err },
		"Partitions":        func() error { _, err := st.Partitions(ctx); return err },
		"ListDeadMessages":  func() error { _, err := st.ListDeadMessages(ctx, postboxdriver.DeadFilter{}); return err },
		"RecordFailure":     func() error { _, err := st.RecordFailure(ctx, "c", "m", "e"); return err },
		"ListConsumerDead":  func() error { _, err := st.ListConsumerDead(ctx, postboxdriver.DeadFilter{}); return err },
		"LookupIdempotency": func() error { _, _, err := st.LookupIdempotency(ctx, make([]byte, 32)); return err },
	} {
		if err := op(); !errors.Is(err, postboxdriver.ErrNotMigrated) {
			t.Errorf("%s: %v, want ErrNotMigrated", name, err)
		}
	}
	if vs, err := st.AppliedMigrations(ctx); err != nil || len(vs) != 0 {
		t.Errorf("AppliedMigrations = %v, %v; want none", vs, err)
	}
}

func splitFields(s string) []string { return strings.Fields(s) }

// sameSet reports whether a and b hold the same strings, in any order.
func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// leaseIn returns partition p's lease in m.
func leaseIn(t *testing.T, m postboxdriver.Membership, p int) postboxdriver.Lease {
	t.Helper()
	for _, l := range m.Leases {
		if l.Partition == p {
			return l
		}
	}
	t.Fatalf("no lease for partition %d in %d leases", p, len(m.Leases))
	return postboxdriver.Lease{}
}
