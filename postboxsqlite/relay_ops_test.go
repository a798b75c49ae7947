package postboxsqlite_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/postbox-go/postbox/postboxdriver"
)

func TestFetch(t *testing.T) {
	f := migrated(t)
	ctx := context.Background()
	seqs := f.insert(t,
		row("t.a", "k1", "0"),
		row("t.b", "", "free"),
		row("t.a", "k2", "0"),
		row("t.a", "k1", "1"),
	)
	fence := f.lease(t, "o")

	if recs, err := f.store.Fetch(ctx, postboxdriver.FetchParams{Fence: postboxdriver.Fence{Owner: "o"}, Limit: 10}); err != nil || recs != nil {
		t.Fatalf("empty fence: %v, %v", recs, err)
	}
	if recs, err := f.store.Fetch(ctx, postboxdriver.FetchParams{Fence: fence, Limit: 0}); err != nil || recs != nil {
		t.Fatalf("limit 0: %v, %v", recs, err)
	}

	recs := f.fetch(t, postboxdriver.FetchParams{Fence: fence})
	if !slices.Equal(seqsOf(recs), seqs) {
		t.Fatalf("fetched %v, want %v in seq order", seqsOf(recs), seqs)
	}
	r := recs[0]
	if r.Topic != "t.a" || r.Key != "k1" || string(r.Payload) != "0" || string(r.Headers) != `{"ce-source":"test"}` ||
		r.Attempts != 0 || r.Partition != postboxdriver.PartitionOf("k1", r.ID, 64) {
		t.Fatalf("record = %+v", r)
	}
	if age := time.Since(r.CreatedAt); age < -time.Second || age > time.Minute {
		t.Fatalf("created_at %v is not about now", r.CreatedAt)
	}
	if recs[1].Key != "" {
		t.Fatalf("keyless row read with key %q", recs[1].Key)
	}

	// Limit keeps the oldest.
	if got := seqsOf(f.fetch(t, postboxdriver.FetchParams{Fence: fence, Limit: 2})); !slices.Equal(got, seqs[:2]) {
		t.Fatalf("limit 2 = %v", got)
	}

	// Only the fence's partitions are read.
	one := postboxdriver.Fence{Owner: "o", Generations: map[int]int64{recs[2].Partition: fence.Generations[recs[2].Partition]}}
	for _, rec := range f.fetch(t, postboxdriver.FetchParams{Fence: one}) {
		if rec.Partition != recs[2].Partition {
			t.Fatalf("read partition %d with a fence on %d only", rec.Partition, recs[2].Partition)
		}
	}
}

// A failed row waiting for its backoff is not read, and holds back the
// later rows of its key only: not earlier ones, not other keys, not
// keyless rows. Once its backoff passes, it is read again, first.
func TestFetchHoldBack(t *testing.T) {
	f := migrated(t)
	ctx := context.Background()
	seqs := f.insert(t,
		row("t", "k", "0"),
		row("t", "k", "1"),
		row("t", "k", "2"),
		row("t", "other", "0"),
		row("t", "", "free"),
	)
	fence := f.lease(t, "o")
	// The middle row of k fails: k:0 is older, so it still goes; k:2 waits.
	if _, err := f.markFailed(ctx, fence, []postboxdriver.Failure{{Seq: seqs[1], Error: "x", Backoff: time.Hour}}, 10); err != nil {
		t.Fatal(err)
	}
	if got := seqsOf(f.fetch(t, postboxdriver.FetchParams{Fence: fence})); !slices.Equal(got, []int64{seqs[0], seqs[3], seqs[4]}) {
		t.Fatalf("fetch = %v, want %v", got, []int64{seqs[0], seqs[3], seqs[4]})
	}
	// A failed row whose backoff is over holds nothing back and is read
	// again in its place.
	if _, err := f.markFailed(ctx, fence, []postboxdriver.Failure{{Seq: seqs[3], Error: "x", Backoff: 0}}, 10); err != nil {
		t.Fatal(err)
	}
	if _, err := f.db.Exec(`UPDATE `+prefix+`outbox SET available_at = available_at - 7200000 WHERE seq = ?`, seqs[1]); err != nil {
		t.Fatal(err)
	}
	if got := seqsOf(f.fetch(t, postboxdriver.FetchParams{Fence: fence})); !slices.Equal(got, seqs) {
		t.Fatalf("after the backoff = %v, want all %v", got, seqs)
	}
}

// With BlockOnDead a dead row holds back the later rows of its key;
// without it they go on. Earlier rows and other keys are never held.
func TestFetchBlockOnDead(t *testing.T) {
	f := migrated(t)
	ctx := context.Background()
	seqs := f.insert(t, row("t", "k", "0"), row("t", "k", "1"), row("t", "k", "2"), row("t", "j", "0"))
	fence := f.lease(t, "o")
	out, err := f.markFailed(ctx, fence, []postboxdriver.Failure{{Seq: seqs[1], Error: "x"}}, 1)
	if err != nil || len(out) != 1 || !out[0].Dead {
		t.Fatalf("failures recorded = %v, %v", out, err)
	}
	if got := seqsOf(f.fetch(t, postboxdriver.FetchParams{Fence: fence})); !slices.Equal(got, []int64{seqs[0], seqs[2], seqs[3]}) {
		t.Fatalf("lenient fetch = %v", got)
	}
	if got := seqsOf(f.fetch(t, postboxdriver.FetchParams{Fence: fence, BlockOnDead: true})); !slices.Equal(got, []int64{seqs[0], seqs[3]}) {
		t.Fatalf("strict fetch = %v, want %v", got, []int64{seqs[0], seqs[3]})
	}
}

// Fetch only reads: it runs while another connection holds the write lock.
func TestFetchTakesNoWriteLock(t *testing.T) {
	f := migrated(t)
	f.insert(t, row("t", "k", "0"))
	fence := f.lease(t, "o")
	release := holdWriteLock(t, f.db)
	defer release()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	recs, err := f.store.Fetch(ctx, postboxdriver.FetchParams{Fence: fence, Limit: 10})
	if err != nil || len(recs) != 1 {
		t.Fatalf("fetch under a held write lock = %d, %v", len(recs), err)
	}
	if _, err := f.store.Stats(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestSettlePublished(t *testing.T) {
	f := migrated(t)
	ctx := context.Background()
	seqs := f.insert(t, row("t", "a", "0"), row("t", "b", "0"), row("t", "", "x"), row("t", "c", "0"))
	fence := f.lease(t, "o")

	if n, err := f.markPublished(ctx, fence, nil); err != nil || n != 0 {
		t.Fatalf("nothing: %d, %v", n, err)
	}
	// Wrong owner, wrong generation, partition missing from the fence:
	// nothing moves.
	wrongOwner := postboxdriver.Fence{Owner: "intruder", Generations: fence.Generations}
	stale := postboxdriver.Fence{Owner: "o", Generations: map[int]int64{}}
	for p, g := range fence.Generations {
		stale.Generations[p] = g - 1
	}
	for name, fc := range map[string]postboxdriver.Fence{"owner": wrongOwner, "generation": stale, "empty": {Owner: "o"}} {
		if n, err := f.markPublished(ctx, fc, seqs); err != nil || n != 0 {
			t.Fatalf("%s: moved %d, %v", name, n, err)
		}
	}
	if st := f.stats(t); st.Pending != 4 || st.Published != 0 {
		t.Fatalf("after fenced-out marks: %+v", st)
	}

	before := f.dbNow(t)
	// Duplicates and unknown seqs count nothing extra.
	n, err := f.markPublished(ctx, fence, []int64{seqs[0], seqs[2], seqs[0], 999999})
	if err != nil || n != 2 {
		t.Fatalf("moved %d, %v; want 2", n, err)
	}
	if st := f.stats(t); st.Pending != 2 || st.Published != 2 {
		t.Fatalf("after marks: %+v", st)
	}
	// The history keeps the row as it was, with the publish time.
	var id, topic, payload, headers string
	var key *string
	var part, attempts int
	var created, published int64
	err = f.db.QueryRow(`SELECT id, topic, key, payload, headers, partition, attempts, created_at, published_at FROM `+prefix+`published WHERE seq = ?`, seqs[2]).
		Scan(&id, &topic, &key, &payload, &headers, &part, &attempts, &created, &published)
	if err != nil {
		t.Fatal(err)
	}
	if key != nil || topic != "t" || payload != "x" || part != postboxdriver.PartitionOf("", id, 64) || attempts != 0 || published < before || published < created {
		t.Fatalf("history row: key=%v topic=%s payload=%s part=%d attempts=%d created=%d published=%d", key, topic, payload, part, attempts, created, published)
	}
	// Marking again changes nothing.
	if n, err := f.markPublished(ctx, fence, seqs[:1]); err != nil || n != 0 {
		t.Fatalf("second mark moved %d, %v", n, err)
	}
	// A fence on one partition moves only that partition's rows.
	recs := f.fetch(t, postboxdriver.FetchParams{Fence: fence})
	onlyFirst := postboxdriver.Fence{Owner: "o", Generations: map[int]int64{recs[0].Partition: fence.Generations[recs[0].Partition]}}
	n, err = f.markPublished(ctx, onlyFirst, []int64{seqs[1], seqs[3]})
	want := 0
	for _, r := range recs {
		if r.Partition == recs[0].Partition {
			want++
		}
	}
	if err != nil || n != want {
		t.Fatalf("partial fence moved %d, %v; want %d", n, err, want)
	}
}

func TestSettleFailed(t *testing.T) {
	f := migrated(t)
	ctx := context.Background()
	seqs := f.insert(t, row("t", "a", "0"), row("t", "b", "0"), row("t", "c", "0"))
	fence := f.lease(t, "o")

	if out, err := f.markFailed(ctx, fence, nil, 3); err != nil || out != nil {
		t.Fatalf("nothing: %v, %v", out, err)
	}
	// Fenced out: nothing changes.
	if out, err := f.markFailed(ctx, postboxdriver.Fence{Owner: "x", Generations: fence.Generations},
		[]postboxdriver.Failure{{Seq: seqs[0], Error: "e"}}, 1); err != nil || len(out) != 0 {
		t.Fatalf("fenced out: %v, %v", out, err)
	}
	if n := f.count(t, "outbox", "attempts > 0"); n != 0 {
		t.Fatalf("%d rows changed by a fenced-out Settle", n)
	}

	before := f.dbNow(t)
	out, err := f.markFailed(ctx, fence, []postboxdriver.Failure{
		{Seq: seqs[0], Error: "first", Backoff: 90 * time.Second},
		{Seq: seqs[1], Error: "boom", Backoff: time.Second},
		{Seq: 424242, Error: "unknown"},
	}, 2)
	after := f.dbNow(t)
	if err != nil || fmt.Sprint(out) != fmt.Sprint([]postboxdriver.FailResult{{Seq: seqs[0], Attempts: 1}, {Seq: seqs[1], Attempts: 1}}) {
		t.Fatalf("first failures = %v, %v", out, err)
	}
	var avail int64
	var lastErr string
	if err := f.db.QueryRow(`SELECT available_at, last_error FROM `+prefix+`outbox WHERE seq = ?`, seqs[0]).Scan(&avail, &lastErr); err != nil {
		t.Fatal(err)
	}
	if avail < before+90_000 || avail > after+90_000 || lastErr != "first" {
		t.Fatalf("available_at %d not in [%d, %d] + 90s, last_error %q", avail, before, after, lastErr)
	}

	// The second failure reaches the budget of 2: dead, out of the outbox,
	// listed before the rows that retry. A seq listed twice counts once,
	// with its last entry.
	deadBefore := f.dbNow(t)
	out, err = f.markFailed(ctx, fence, []postboxdriver.Failure{
		{Seq: seqs[2], Error: "c1", Backoff: time.Second},
		{Seq: seqs[1], Error: "ignored"},
		{Seq: seqs[1], Error: "final"},
	}, 2)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(out) != fmt.Sprint([]postboxdriver.FailResult{{Seq: seqs[1], Attempts: 2, Dead: true}, {Seq: seqs[2], Attempts: 1}}) {
		t.Fatalf("second failures = %v", out)
	}
	if st := f.stats(t); st.Pending != 2 || st.Dead != 1 {
		t.Fatalf("stats = %+v", st)
	}
	var attempts int
	var deadAt int64
	var key string
	if err := f.db.QueryRow(`SELECT key, attempts, last_error, dead_at FROM `+prefix+`dead WHERE seq = ?`, seqs[1]).Scan(&key, &attempts, &lastErr, &deadAt); err != nil {
		t.Fatal(err)
	}
	if key != "b" || attempts != 2 || lastErr != "final" || deadAt < deadBefore {
		t.Fatalf("dead row: key=%s attempts=%d last_error=%q dead_at=%d", key, attempts, lastErr, deadAt)
	}
	// A dead row is no longer pending: failing it again changes nothing.
	if out, err := f.markFailed(ctx, fence, []postboxdriver.Failure{{Seq: seqs[1], Error: "again"}}, 2); err != nil || len(out) != 0 {
		t.Fatalf("failing a dead row = %v, %v", out, err)
	}
	// maxAttempts 1 buries at the first failure.
	s4 := f.insert(t, row("t", "d", "0"))[0]
	if out, err := f.markFailed(ctx, fence, []postboxdriver.Failure{{Seq: s4, Error: "once"}}, 1); err != nil || len(out) != 1 || !out[0].Dead || out[0].Attempts != 1 {
		t.Fatalf("budget of one = %v, %v", out, err)
	}
}

func TestStats(t *testing.T) {
	f := migrated(t)
	ctx := context.Background()
	if st := f.stats(t); st != (postboxdriver.Stats{}) {
		t.Fatalf("empty stats = %+v", st)
	}
	seqs := f.insert(t, row("t", "a", "0"), row("t", "b", "0"), row("t", "c", "0"), row("t", "d", "0"))
	// The oldest pending row, by seq, sets the age.
	if _, err := f.db.Exec(`UPDATE `+prefix+`outbox SET created_at = created_at - 5000 WHERE seq = ?`, seqs[0]); err != nil {
		t.Fatal(err)
	}
	fence := f.lease(t, "o")
	if _, err := f.markPublished(ctx, fence, seqs[1:2]); err != nil {
		t.Fatal(err)
	}
	if _, err := f.markFailed(ctx, fence, []postboxdriver.Failure{{Seq: seqs[2]}}, 1); err != nil {
		t.Fatal(err)
	}
	st := f.stats(t)
	if st.Pending != 2 || st.Dead != 1 || st.Published != 1 {
		t.Fatalf("stats = %+v", st)
	}
	if st.OldestPendingAge < 5*time.Second || st.OldestPendingAge > time.Minute {
		t.Fatalf("oldest pending age %v, want about 5s", st.OldestPendingAge)
	}
}

// A relay write that gives up waiting for the write lock fails with the
// context's error and leaves no transaction behind in the pool.
func TestRelayWriteGivesUpCleanly(t *testing.T) {
	f := migrated(t)
	seqs := f.insert(t, row("t", "k", "0"))
	fence := f.lease(t, "o")
	release := holdWriteLock(t, f.db)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := f.markPublished(ctx, fence, seqs); err == nil {
		t.Fatal("Settle succeeded while another connection held the write lock")
	}
	if _, err := f.store.Coordinate(ctx, "o", time.Minute, nil, nil, nil); err == nil {
		t.Fatal("Coordinate succeeded after its context ended")
	}
	release()
	// Every pooled connection is free of transactions: the write lock can
	// be taken, and the marks go through.
	holdWriteLock(t, f.db)()
	if n, err := f.markPublished(context.Background(), fence, seqs); err != nil || n != 1 {
		t.Fatalf("Settle after release = %d, %v", n, err)
	}
}
