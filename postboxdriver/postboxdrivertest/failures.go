package postboxdrivertest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/postboxdriver"
)

// runFailures tests the failure classes a publisher can name (docs/design.md
// §4): permanent, retry-after counted or not, and a batch whose failures
// must all be recorded whatever one of them is.
func (s *suite[TTx]) runFailures(t *testing.T) {
	t.Run("PermanentDiesAtOnce", s.permanentDiesAtOnce)
	t.Run("RetryAfterCountedReplacesBackoff", s.retryAfterCounted)
	t.Run("RetryAfterUncountedSpendsNoAttempt", s.retryAfterUncounted)
	t.Run("ReusedDeadIDRecordsTheBatch", s.reusedDeadID)
	t.Run("ReusedDeadIDRequeueLeavesItDead", s.reusedDeadIDRequeue)
	t.Run("UnstorableErrorTextRecorded", s.unstorableErrorText)
	t.Run("SettleDeadNow", s.settleDeadNow)
	t.Run("SettleMixedOutcome", s.settleMixed)
	t.Run("SettleFetch", s.settleFetch)
}

// failing is a publisher that fails the envelopes fail picks, with the
// error it returns, and acknowledges the rest; it records both.
type failing struct {
	mu    sync.Mutex
	fail  func(env *postbox.Envelope) error
	acked []string // payloads
	tries map[string][]int
}

func (f *failing) Publish(_ context.Context, env *postbox.Envelope, done func(error)) {
	f.mu.Lock()
	if f.tries == nil {
		f.tries = map[string][]int{}
	}
	f.tries[string(env.Payload)] = append(f.tries[string(env.Payload)], env.Attempt)
	err := f.fail(env)
	if err == nil {
		f.acked = append(f.acked, string(env.Payload))
	}
	f.mu.Unlock()
	done(err)
}

func (f *failing) attempts(payload string) []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]int(nil), f.tries[payload]...)
}

func (f *failing) published() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.acked...)
}

func (s *suite[TTx]) permanentDiesAtOnce(t *testing.T) {
	e := s.setup(t)
	ctx := context.Background()
	pub := &failing{fail: func(env *postbox.Envelope) error {
		if string(env.Payload) == "too-large" {
			return postbox.Permanent(errors.New("payload above the broker's maximum"))
		}
		return nil
	}}
	c := e.client(t, pub, postbox.Config{MaxAttempts: 25})
	if err := c.Write(ctx,
		postbox.Message{Topic: "t.perm", Key: "k", Payload: []byte("too-large")},
		postbox.Message{Topic: "t.perm", Key: "k", Payload: []byte("after")},
	); err != nil {
		t.Fatal(err)
	}
	res, err := c.Drain(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// One attempt, dead at once; the key is not held back by a backoff, so
	// the next message of the key goes out in the same Drain.
	if res.Failed != 1 || res.Dead != 1 || res.Published != 1 || res.Waiting != 0 {
		t.Fatalf("Drain = %+v, want 1 failed, 1 dead, 1 published, none waiting", res)
	}
	if got := pub.attempts("too-large"); fmt.Sprint(got) != "[1]" {
		t.Fatalf("attempts of the permanent failure = %v, want [1]", got)
	}
	dead, err := c.Admin().ListDead(ctx, postbox.DeadFilter{Topic: "t.perm"})
	if err != nil || len(dead) != 1 {
		t.Fatalf("ListDead = %v, %v", dead, err)
	}
	if dead[0].Attempts != 1 || !strings.Contains(dead[0].Error, "broker's maximum") {
		t.Fatalf("dead message = attempts %d, error %q", dead[0].Attempts, dead[0].Error)
	}
}

func (s *suite[TTx]) retryAfterCounted(t *testing.T) {
	e := s.setup(t)
	ctx := context.Background()
	first := true
	pub := &failing{fail: func(*postbox.Envelope) error {
		if first {
			first = false
			return postbox.RetryAfter(errors.New("throttled"), 0, true)
		}
		return nil
	}}
	// A backoff of an hour: only the retry-after's delay of 0 lets the
	// message go out again within this Drain.
	c := e.client(t, pub, postbox.Config{MaxAttempts: 5, BackoffBase: time.Hour, BackoffMax: time.Hour})
	if err := c.Write(ctx, postbox.Message{Topic: "t.ra", Key: "k", Payload: []byte("m")}); err != nil {
		t.Fatal(err)
	}
	res, err := c.Drain(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.Failed != 1 || res.Published != 1 || res.Dead != 0 {
		t.Fatalf("Drain = %+v, want 1 failed then published", res)
	}
	if got := pub.attempts("m"); fmt.Sprint(got) != "[1 2]" {
		t.Fatalf("attempts = %v, want [1 2]: the retry-after was counted", got)
	}

	// Counted, it spends the budget like any message failure.
	pub2 := &failing{fail: func(*postbox.Envelope) error { return postbox.RetryAfter(errors.New("throttled"), 0, true) }}
	c2 := e.client(t, pub2, postbox.Config{MaxAttempts: 3, BackoffBase: time.Hour, BackoffMax: time.Hour})
	if err := c2.Write(ctx, postbox.Message{Topic: "t.ra", Key: "k2", Payload: []byte("always")}); err != nil {
		t.Fatal(err)
	}
	res, err = c2.Drain(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.Dead != 1 || fmt.Sprint(pub2.attempts("always")) != "[1 2 3]" {
		t.Fatalf("Drain = %+v, attempts %v; want dead after [1 2 3]", res, pub2.attempts("always"))
	}
}

func (s *suite[TTx]) retryAfterUncounted(t *testing.T) {
	e := s.setup(t)
	ctx := context.Background()
	first := true
	pub := &failing{fail: func(*postbox.Envelope) error {
		if first {
			first = false
			return postbox.RetryAfter(errors.New("broker asks to slow down"), time.Minute, false)
		}
		return nil
	}}
	c := e.client(t, pub, postbox.Config{MaxAttempts: 1})
	if err := c.Write(ctx, postbox.Message{Topic: "t.ra", Key: "k", Payload: []byte("m")}); err != nil {
		t.Fatal(err)
	}
	// Uncounted, it is an infrastructure failure: Drain stops on it and
	// nothing is written, even with a budget of one attempt.
	if _, err := c.Drain(ctx); err == nil || !strings.Contains(err.Error(), "slow down") {
		t.Fatalf("Drain = %v, want the infrastructure failure", err)
	}
	if st := e.stats(t); st.Pending != 1 || st.Dead != 0 {
		t.Fatalf("stats = %+v, want the message pending", st)
	}
	res, err := c.Drain(ctx)
	if err != nil || res.Published != 1 {
		t.Fatalf("Drain = %+v, %v", res, err)
	}
	if got := pub.attempts("m"); fmt.Sprint(got) != "[1 1]" {
		t.Fatalf("attempts = %v, want [1 1]: no attempt spent", got)
	}
}

// reusedDeadID writes a message under the id of a dead message, in a batch
// with other failing messages: when it dies too it replaces the older dead
// message, and every other failure of the batch is recorded.
func (s *suite[TTx]) reusedDeadID(t *testing.T) {
	e := s.setup(t)
	ctx := context.Background()
	pub := &failing{fail: func(env *postbox.Envelope) error {
		switch p := string(env.Payload); {
		case strings.HasPrefix(p, "dies"):
			return postbox.Permanent(errors.New("refused: " + p))
		case strings.HasPrefix(p, "fails"):
			return postbox.NewMessageError(errors.New("rejected"))
		}
		return nil
	}}
	c := e.client(t, pub, postbox.Config{MaxAttempts: 25, BackoffBase: time.Hour, BackoffMax: time.Hour})
	id := postbox.NewID()
	if err := c.Write(ctx, postbox.Message{ID: id, Topic: "t.reuse", Key: "a", Payload: []byte("dies-1")}); err != nil {
		t.Fatal(err)
	}
	if res, err := c.Drain(ctx); err != nil || res.Dead != 1 {
		t.Fatalf("first life: Drain = %+v, %v", res, err)
	}
	// The id again, with two more failures in the same batch.
	if err := c.Write(ctx,
		postbox.Message{ID: id, Topic: "t.reuse", Key: "a", Payload: []byte("dies-2")},
		postbox.Message{Topic: "t.reuse", Key: "b", Payload: []byte("fails-b")},
		postbox.Message{Topic: "t.reuse", Payload: []byte("fails-c")},
		postbox.Message{Topic: "t.reuse", Key: "d", Payload: []byte("ok")},
	); err != nil {
		t.Fatal(err)
	}
	res, err := c.Drain(ctx)
	if err != nil {
		t.Fatalf("second life: Drain = %+v, %v", res, err)
	}
	if res.Dead != 1 || res.Failed != 3 || res.Published != 1 || res.Waiting != 2 {
		t.Fatalf("second life: Drain = %+v, want 1 dead, 3 failed, 1 published, 2 waiting", res)
	}
	dm, err := c.Admin().GetDead(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if string(dm.Payload) != "dies-2" || dm.Attempts != 1 || !strings.Contains(dm.Error, "dies-2") {
		t.Fatalf("dead message = %q, attempts %d, error %q; want the second life's", dm.Payload, dm.Attempts, dm.Error)
	}
	if st := e.stats(t); st.Dead != 1 || st.Pending != 2 {
		t.Fatalf("stats = %+v, want 1 dead and the 2 failures waiting", st)
	}
	// The waiting rows spent their attempt: a read now finds none of them.
	if res, err := c.Drain(ctx); err != nil || res.Published+res.Failed != 0 {
		t.Fatalf("third Drain = %+v, %v: the failures were not recorded", res, err)
	}
}

// reusedDeadIDRequeue requeues a dead message whose id is pending again:
// it stays dead, and the requeue of the others goes through.
func (s *suite[TTx]) reusedDeadIDRequeue(t *testing.T) {
	e := s.setup(t)
	ctx := context.Background()
	block := true
	pub := &failing{fail: func(env *postbox.Envelope) error {
		if block {
			return postbox.Permanent(errors.New("refused"))
		}
		return nil
	}}
	c := e.client(t, pub, postbox.Config{})
	id := postbox.NewID()
	if err := c.Write(ctx,
		postbox.Message{ID: id, Topic: "t.requeue", Payload: []byte("first")},
		postbox.Message{Topic: "t.requeue", Payload: []byte("other")},
	); err != nil {
		t.Fatal(err)
	}
	if res, err := c.Drain(ctx); err != nil || res.Dead != 2 {
		t.Fatalf("Drain = %+v, %v", res, err)
	}
	if err := c.Write(ctx, postbox.Message{ID: id, Topic: "t.requeue", Payload: []byte("second")}); err != nil {
		t.Fatal(err)
	}
	n, err := c.Admin().RequeueDead(ctx, postbox.DeadSelection{DeadFilter: postbox.DeadFilter{Topic: "t.requeue"}})
	if err != nil || n != 1 {
		t.Fatalf("RequeueDead = %d, %v; want the other one requeued", n, err)
	}
	dm, err := c.Admin().GetDead(ctx, id)
	if err != nil || string(dm.Payload) != "first" {
		t.Fatalf("GetDead = %q, %v; want the first life still dead", dm.Payload, err)
	}
	block = false
	res, err := c.Drain(ctx)
	if err != nil || res.Published != 2 {
		t.Fatalf("Drain = %+v, %v", res, err)
	}
	if got := fmt.Sprint(pub.published()); got != "[second other]" && got != "[other second]" {
		t.Fatalf("published %s", got)
	}
}

// unstorableErrorText: an error whose text is not valid UTF-8, holds NUL
// or is cut inside a character is still recorded, with the batch's other
// failures.
func (s *suite[TTx]) unstorableErrorText(t *testing.T) {
	e := s.setup(t)
	ctx := context.Background()
	long := strings.Repeat("é", 1500) // 3000 bytes: the 2000-byte cut falls inside none
	texts := map[string]string{"nul": "a\x00b", "latin1": "caf\xe9", "long": "x" + long}
	pub := &failing{fail: func(env *postbox.Envelope) error {
		return postbox.NewMessageError(errors.New(texts[string(env.Payload)]))
	}}
	c := e.client(t, pub, postbox.Config{BackoffBase: time.Hour, BackoffMax: time.Hour})
	if err := c.Write(ctx,
		postbox.Message{Topic: "t.text", Payload: []byte("nul")},
		postbox.Message{Topic: "t.text", Payload: []byte("latin1")},
		postbox.Message{Topic: "t.text", Payload: []byte("long")},
	); err != nil {
		t.Fatal(err)
	}
	res, err := c.Drain(ctx)
	if err != nil || res.Failed != 3 || res.Waiting != 3 {
		t.Fatalf("Drain = %+v, %v; want 3 failures recorded", res, err)
	}
	if res, err := c.Drain(ctx); err != nil || res.Failed != 0 {
		t.Fatalf("second Drain = %+v, %v: the failures were not recorded", res, err)
	}
}

// settleDeadNow is a Failure's Dead flag on the Executor itself: the
// row dies on its first attempt, beside a row that only waits; a seq listed
// twice is recorded once.
func (s *suite[TTx]) settleDeadNow(t *testing.T) {
	e := s.setup(t)
	ctx := context.Background()
	_, fence, recs := leasedBatch(t, e.store, row("t", "a"), row("t", "b"))
	out, err := markFailed(ctx, e.store, fence, []postboxdriver.Failure{
		{Seq: recs[0].Seq, Error: "first", Backoff: time.Hour},
		{Seq: recs[1].Seq, Error: "retry", Backoff: time.Hour},
		{Seq: recs[0].Seq, Error: "permanent", Dead: true},
	}, 25)
	if err != nil {
		t.Fatal(err)
	}
	want := []postboxdriver.FailResult{{Seq: recs[0].Seq, Attempts: 1, Dead: true}, {Seq: recs[1].Seq, Attempts: 1}}
	if fmt.Sprint(out) != fmt.Sprint(want) {
		t.Fatalf("failures recorded = %+v, want %+v", out, want)
	}
	dm, err := e.store.GetDeadMessage(ctx, recs[0].ID)
	if err != nil || dm.Error != "permanent" || dm.Attempts != 1 {
		t.Fatalf("GetDeadMessage = %+v, %v", dm, err)
	}
}

// settleMixed is one batch's whole outcome in one Settle: rows published,
// a row that waits for a retry, a row that dies, and a row not sent, which
// stays pending as it was; under a fence that moved on, none of it.
func (s *suite[TTx]) settleMixed(t *testing.T) {
	e := s.setup(t)
	ctx := context.Background()
	ls, fence, recs := leasedBatch(t, e.store, row("t", "a"), row("t", "b"), row("t", "c"), row("t", "d"), row("t", "e"))
	read := make([]int64, len(recs))
	for i, r := range recs {
		read[i] = r.Seq
	}
	o := postboxdriver.Outcome{
		Read:      read,
		Published: []int64{recs[0].Seq, recs[1].Seq},
		Failed: []postboxdriver.Failure{
			{Seq: recs[2].Seq, Error: "later", Backoff: time.Hour},
			{Seq: recs[3].Seq, Error: "never", Dead: true},
		},
	}
	// A fence whose leases moved on records nothing of it.
	stale := fenceOf("x", ls)
	for p := range stale.Generations {
		stale.Generations[p]--
	}
	if got, err := e.store.Settle(ctx, stale, o, 25); err != nil || got.Published != 0 || len(got.Failed) != 0 {
		t.Fatalf("Settle under a stale fence = %+v, %v; want nothing recorded", got, err)
	}
	if st := e.stats(t); st.Pending != 5 || st.Dead != 0 || st.Published != 0 {
		t.Fatalf("after a stale Settle: %+v, want 5 pending", st)
	}
	got, err := e.store.Settle(ctx, fence, o, 25)
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(got.Failed, func(a, b postboxdriver.FailResult) int { return cmp.Compare(a.Seq, b.Seq) })
	want := []postboxdriver.FailResult{{Seq: recs[2].Seq, Attempts: 1}, {Seq: recs[3].Seq, Attempts: 1, Dead: true}}
	if got.Published != 2 || fmt.Sprint(got.Failed) != fmt.Sprint(want) {
		t.Fatalf("Settle = %+v; want 2 published and failures %+v", got, want)
	}
	if st := e.stats(t); st.Pending != 2 || st.Dead != 1 || st.Published != 2 {
		t.Fatalf("after Settle: %+v; want 2 pending (one waiting, one not sent), 1 dead, 2 published", st)
	}
	// The row not sent is read again at once; the failed one waits.
	recs2, err := e.store.Fetch(ctx, postboxdriver.FetchParams{Fence: fence, Limit: 10})
	if err != nil || len(recs2) != 1 || recs2[0].Seq != recs[4].Seq || recs2[0].Attempts != 0 {
		t.Fatalf("Fetch after Settle = %+v, %v; want the unsent row alone", recs2, err)
	}
}

// settleFetch records a batch's publishes in the statement that reads the
// next batch (postboxdriver.SettleFetcher, for the drivers that have it):
// the published rows go to the history and are not read again, the row
// not sent is, with the rows written since; under a stale fence nothing is
// recorded and nothing read, since the relay renews first; a read that
// finds nothing still records.
func (s *suite[TTx]) settleFetch(t *testing.T) {
	e := s.setup(t)
	sf, ok := e.store.(postboxdriver.SettleFetcher)
	if !ok {
		t.Skip("the driver records and reads in separate calls")
	}
	ctx := context.Background()
	ls, fence, recs := leasedBatch(t, e.store, row("t", "a"), row("t", "b"), row("t", "c"))
	if err := e.store.Insert(ctx, []postboxdriver.Row{row("t", "d")}); err != nil {
		t.Fatal(err)
	}
	o := postboxdriver.Outcome{Read: []int64{recs[0].Seq, recs[1].Seq, recs[2].Seq}, Published: []int64{recs[0].Seq, recs[1].Seq}}
	params := postboxdriver.FetchParams{Fence: fence, Limit: 10}
	if _, _, err := sf.SettleFetch(ctx, fence, postboxdriver.Outcome{Read: o.Read, Failed: []postboxdriver.Failure{{Seq: recs[2].Seq, Error: "x"}}}, 25, params); err == nil {
		t.Fatal("SettleFetch took a failure; want it refused")
	}
	stale := fenceOf("x", ls)
	for p := range stale.Generations {
		stale.Generations[p]--
	}
	got, next, err := sf.SettleFetch(ctx, stale, o, 25, params)
	if err != nil || got.Published != 0 || len(next) != 0 {
		t.Fatalf("SettleFetch under a stale fence = %+v, %+v, %v; want nothing recorded and nothing read", got, next, err)
	}
	if st := e.stats(t); st.Pending != 4 || st.Published != 0 {
		t.Fatalf("after a stale SettleFetch: %+v, want 4 pending", st)
	}
	got, next, err = sf.SettleFetch(ctx, fence, o, 25, params)
	if err != nil || got.Published != 2 || len(next) != 2 || next[0].Seq != recs[2].Seq || next[1].Key != "d" {
		t.Fatalf("SettleFetch = %+v, %+v, %v; want 2 recorded, the unsent and the new row read", got, next, err)
	}
	if st := e.stats(t); st.Pending != 2 || st.Published != 2 {
		t.Fatalf("after SettleFetch: %+v, want 2 pending and 2 published", st)
	}
	o = postboxdriver.Outcome{Read: []int64{next[0].Seq, next[1].Seq}, Published: []int64{next[0].Seq, next[1].Seq}}
	got, next, err = sf.SettleFetch(ctx, fence, o, 25, params)
	if err != nil || got.Published != 2 || len(next) != 0 {
		t.Fatalf("SettleFetch of the last rows = %+v, %+v, %v; want 2 recorded and nothing read", got, next, err)
	}
	if st := e.stats(t); st.Pending != 0 || st.Published != 4 {
		t.Fatalf("after the last SettleFetch: %+v, want 4 published", st)
	}
	// Every kind of read: strict, routed, both.
	for i, p := range []postboxdriver.FetchParams{
		{Fence: fence, Limit: 10, BlockOnDead: true},
		{Fence: fence, Limit: 10, Topics: []string{"t*"}},
		{Fence: fence, Limit: 10, Topics: []string{"t"}, BlockOnDead: true},
	} {
		rows := []postboxdriver.Row{row("t", fmt.Sprint("k", i))}
		if p.Topics != nil {
			rows = append(rows, row("u", fmt.Sprint("u", i)))
		}
		if err := e.store.Insert(ctx, rows); err != nil {
			t.Fatal(err)
		}
		recs, err := e.store.Fetch(ctx, p)
		if err != nil || len(recs) != 1 {
			t.Fatalf("Fetch %+v = %+v, %v; want the row of topic t", p, recs, err)
		}
		got, next, err := sf.SettleFetch(ctx, fence, postboxdriver.Outcome{Read: []int64{recs[0].Seq}, Published: []int64{recs[0].Seq}}, 25, p)
		if err != nil || got.Published != 1 || len(next) != 0 {
			t.Fatalf("SettleFetch %+v = %+v, %+v, %v; want 1 recorded and nothing read (topic u is not routed)", p, got, next, err)
		}
	}
}

// leasedBatch inserts rows, takes every partition's lease for "x", and
// reads the rows back in one batch under that fence.
func leasedBatch[TTx any](t *testing.T, st postboxdriver.Store[TTx], rows ...postboxdriver.Row) ([]postboxdriver.Lease, postboxdriver.Fence, []postboxdriver.Record) {
	t.Helper()
	ctx := context.Background()
	if err := st.Insert(ctx, rows); err != nil {
		t.Fatal(err)
	}
	ls, err := st.AcquireLeases(ctx, "x", allPartitions(), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	fence := fenceOf("x", ls)
	recs, err := st.Fetch(ctx, postboxdriver.FetchParams{Fence: fence, Limit: 10})
	if err != nil || len(recs) != len(rows) {
		t.Fatalf("Fetch = %d rows, %v; want %d", len(recs), err, len(rows))
	}
	return ls, fence, recs
}
