package pglog

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/pgxdriver"
	"github.com/postbox-go/postbox/internal/testdb"
	"github.com/postbox-go/postbox/postboxdriver"
)

// The real relay drains the log while writers commit into it: late, with
// an older transaction id than the rows around them, rolled back, beside
// one transaction open for the whole run, and while a third of the
// messages fail their first publish, so that their keys' later rows are
// held and copied to the outbox, and one in sixteen meet a broker failure
// once, so that their batches' rows are copied there unsent. The log is
// split into chunks of 64 seqs, which retention drops as soon as the
// positions have passed them, pruning every 10 ms with no retention at
// all. Every committed message must be published once, none rolled back,
// and each key's in the order its writers committed.
func TestLogStoreUnderConcurrentWriters(t *testing.T) { concurrentWriters(t, true) }

// The same, with every publish succeeding: the relay's small batches are
// then recorded in the statement of the lane's next read (SettleFetch),
// which must keep every guarantee while writers commit late beside it.
func TestLogStoreRecordsWithTheNextRead(t *testing.T) { concurrentWriters(t, false) }

// concurrentWriters runs the relay over the log under concurrent writers,
// with publishes failing when failing is set.
func concurrentWriters(t *testing.T, failing bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pool, prefix := migratedLog(t)
	if _, err := pool.Exec(ctx, ChunkLog(prefix)+`
CREATE TABLE `+prefix+`domain (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, note text)`); err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	published := map[string][]int{} // key → message numbers, in publish order
	delivered := map[string]int{}   // id → successful publishes
	failedOnce := 0
	cut := map[string]bool{} // ids whose publish met a broker failure
	pub := postbox.PublisherFunc(func(_ context.Context, env *postbox.Envelope) error {
		key, num, _ := strings.Cut(string(env.Payload), ":")
		n, _ := strconv.Atoi(num)
		mu.Lock()
		defer mu.Unlock()
		if failing && n%3 == 0 && env.Attempt == 1 {
			failedOnce++
			return postbox.NewMessageError(errors.New("the first publish of every third message fails"))
		}
		if failing && strings.HasSuffix(env.ID, "0") && !cut[env.ID] {
			cut[env.ID] = true
			return errors.New("the broker is cut off at one message in sixteen, once")
		}
		delivered[env.ID]++
		if delivered[env.ID] == 1 {
			published[key] = append(published[key], n)
		}
		return nil
	})
	drv := &Driver[pgx.Tx]{pool: pool, chunks: chunking{width: 64, ahead: 3}}
	client, err := postbox.NewClient(drv, &postbox.Config{
		Prefix: prefix, Publisher: pub, BatchSize: 7, Lanes: 2, PollInterval: 5 * time.Millisecond,
		BackoffBase: 20 * time.Millisecond, BackoffMax: 50 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := client.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = client.Stop(context.WithoutCancel(ctx)) }()

	// A transaction with an id open for the first half of the run: it
	// stays in every position's snapshot as running, and no chunk sealed
	// meanwhile can go before it ends.
	long, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = long.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := long.Exec(ctx, `INSERT INTO `+prefix+`domain (note) VALUES ('long')`); err != nil {
		t.Fatal(err)
	}

	// Each key's writers take turns (the key's lock is held from the
	// number's choice to the commit), so a key's committed numbers rise in
	// commit order; keys do not wait for each other. There are four times
	// as many keys as partitions, so that a partition's rows commit out of
	// their seq order.
	const keys, writers = 256, 6
	var keyMu [keys]sync.Mutex
	next := make([]int, keys)
	committed := map[string]string{} // id → "key:n"
	var rolledBack []string
	var cmu sync.Mutex
	stop := time.Now().Add(3 * time.Second)
	pruneCtx, stopPrune := context.WithCancel(ctx)
	defer stopPrune()
	pruned := make(chan error, 1)
	var chunkMu sync.Mutex
	chunks := map[int64]bool{} // every chunk seen attached
	go func() {
		st := drv.store.Load()
		for pruneCtx.Err() == nil {
			_, err := st.PrunePublished(pruneCtx, 0, 500)
			if err == nil {
				var rs pgx.Rows
				if rs, err = pool.Query(pruneCtx, `SELECT lo FROM `+prefix+`log_chunks`); err == nil {
					var los []int64
					los, err = pgx.CollectRows(rs, pgx.RowTo[int64])
					chunkMu.Lock()
					for _, lo := range los {
						chunks[lo] = true
					}
					chunkMu.Unlock()
				}
			}
			if err != nil && pruneCtx.Err() == nil {
				pruned <- err
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		pruned <- nil
	}()
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for time.Now().Before(stop) {
				if err := writeLogged(ctx, pool, client, prefix, rng, &keyMu, next, committed, &rolledBack, &cmu); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	time.Sleep(time.Until(stop) / 2)
	if err := long.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	// Every committed message is published.
	deadline := time.Now().Add(20 * time.Second)
	for {
		mu.Lock()
		n := len(delivered)
		mu.Unlock()
		if n >= len(committed) || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	// A chunk goes once every partition's noted position passed its seal,
	// and a partition's position is noted at most once a noteEvery: the
	// last notes may come after the last publish, from the idle relay's
	// reads. Retention runs on until a chunk is dropped.
	dropped, waited := 0, time.Now()
	for deadline := time.Now().Add(4*noteEvery + 10*time.Second); ; {
		chunkMu.Lock()
		los := slices.Collect(maps.Keys(chunks))
		chunkMu.Unlock()
		dropped = 0
		for _, lo := range los {
			var gone bool
			if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NULL`, drv.store.Load().chunkTable(lo)).Scan(&gone); err != nil {
				t.Fatal(err)
			}
			if gone {
				dropped++
			}
		}
		if dropped > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	waitedFor := time.Since(waited)
	stopPrune()
	if err := <-pruned; err != nil {
		t.Fatalf("retention: %v", err)
	}
	if dropped == 0 {
		t.Errorf("none of %d chunks was dropped: retention by chunks was not exercised", len(chunks))
	}
	if err := client.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	var lost, copies int
	for id, payload := range committed {
		if delivered[id] == 0 {
			lost++
			if lost <= 5 {
				t.Errorf("committed message %s (%s) was never published", id, payload)
			}
		}
	}
	if lost > 5 {
		t.Errorf("... %d committed messages in all were never published", lost)
	}
	for id, n := range delivered {
		if _, ok := committed[id]; !ok {
			t.Errorf("message %s was published but not committed", id)
		}
		copies += n - 1
	}
	for _, id := range rolledBack {
		if delivered[id] > 0 {
			t.Errorf("rolled-back message %s was published", id)
		}
	}
	if copies > 0 {
		t.Errorf("%d messages published more than once", copies)
	}
	for key, nums := range published {
		for i := 1; i < len(nums); i++ {
			if nums[i] <= nums[i-1] {
				t.Errorf("key %s: published %v, out of its commit order at %d", key, nums, i)
				break
			}
		}
	}
	if failing && (failedOnce == 0 || len(cut) == 0) {
		t.Errorf("%d publishes failed, %d met a broker failure: the copies to the outbox were not exercised", failedOnce, len(cut))
	}
	if !failing && drv.store.Load().rode.Load() == 0 {
		t.Error("no record went with the next read: SettleFetch was not exercised")
	}
	var passed int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+prefix+`outbox`).Scan(&passed); err != nil {
		t.Fatal(err)
	}
	if passed != 0 {
		t.Errorf("%d exceptions left in the outbox", passed)
	}
	t.Logf("%d committed, %d rolled back, %d first publishes failed, %d of %d chunks dropped (%v after the last publish), %d records with the next read",
		len(committed), len(rolledBack), failedOnce, dropped, len(chunks), waitedFor.Round(time.Millisecond), drv.store.Load().rode.Load())
}

// writeLogged writes one message of a random key in a transaction of its
// own: some take their id first with a domain row and commit late, some
// roll back.
func writeLogged(ctx context.Context, pool interface {
	Begin(context.Context) (pgx.Tx, error)
}, client *postbox.Client[pgx.Tx], prefix string, rng *rand.Rand, keyMu *[256]sync.Mutex, next []int,
	committed map[string]string, rolledBack *[]string, cmu *sync.Mutex) error {
	k := rng.IntN(len(next))
	keyMu[k].Lock()
	defer keyMu[k].Unlock()
	n := next[k] + 1
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if rng.IntN(2) == 0 {
		// The transaction takes its id before the message draws its seq.
		if _, err := tx.Exec(ctx, `INSERT INTO `+prefix+`domain (note) VALUES ('w')`); err != nil {
			return err
		}
		time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond)
	}
	id := postbox.NewID()
	key := fmt.Sprintf("k%d", k)
	msg := postbox.Message{ID: id, Topic: "t", Key: key, Payload: fmt.Appendf(nil, "%s:%d", key, n)}
	if rng.IntN(4) == 0 {
		// A writer in another language: the outbox's rules trigger moves
		// its row into the log (migration 14), often as the transaction's
		// first write.
		if _, err := tx.Exec(ctx, `INSERT INTO `+prefix+`outbox (id, topic, key, payload) VALUES ($1, $2, $3, $4)`,
			msg.ID, msg.Topic, msg.Key, msg.Payload); err != nil {
			return err
		}
	} else if err := client.WriteTx(ctx, tx, msg); err != nil {
		return err
	}
	if rng.IntN(5) == 0 {
		time.Sleep(time.Duration(5+rng.IntN(20)) * time.Millisecond) // a late commit
	}
	if rng.IntN(10) == 0 {
		cmu.Lock()
		*rolledBack = append(*rolledBack, id)
		cmu.Unlock()
		return tx.Rollback(ctx)
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	next[k] = n
	cmu.Lock()
	committed[id] = fmt.Sprintf("%s:%d", key, n)
	cmu.Unlock()
	return nil
}

// Rows recorded one by one, by a process that did not read them, join the
// history as the rows a position passes do: the topic status counts them
// as published in the last minute, and a replay under their own ids takes
// them out of the log with their marks.
func TestLogStoreHistoryOfRowsRecordedOneByOne(t *testing.T) {
	ctx := context.Background()
	pool, open := logStoreSchema(t)
	reader, recorder := open(), open()
	var rows []postboxdriver.Row
	for i, topic := range []string{"t.a", "t.a", "t.b"} {
		rows = append(rows, postboxdriver.Row{ID: postbox.NewID(), Topic: topic, Key: fmt.Sprint("k", i), Payload: []byte("p"), Headers: []byte("{}")})
	}
	if err := reader.Insert(ctx, rows); err != nil {
		t.Fatal(err)
	}
	fence := fenceAll(t, reader)
	recs, err := reader.Fetch(ctx, postboxdriver.FetchParams{Fence: fence, Limit: 10})
	if err != nil || len(recs) != 3 {
		t.Fatalf("fetch = %d rows, %v", len(recs), err)
	}
	var seqs []int64
	for _, r := range recs {
		seqs = append(seqs, r.Seq)
	}
	if st, err := recorder.Settle(ctx, fence, postboxdriver.Outcome{Published: seqs}, 5); err != nil || st.Published != 3 {
		t.Fatalf("settle = %+v, %v", st, err)
	}
	topics, err := recorder.TopicStats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, ts := range topics {
		got[ts.Topic] = ts.PublishedLastMinute
	}
	if fmt.Sprint(got) != "map[t.a:2 t.b:1]" {
		t.Fatalf("published in the last minute by topic: %v", got)
	}
	n, err := recorder.Replay(ctx, postboxdriver.ReplayParams{Since: time.Now().Add(-time.Hour), Until: time.Now().Add(time.Hour), Actor: "ops"})
	if err != nil || n != 3 {
		t.Fatalf("replay = %d, %v", n, err)
	}
	var marks int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+reader.(*logStore[pgx.Tx]).prefix+`log_done`).Scan(&marks); err != nil || marks != 0 {
		t.Fatalf("%d marks left after the replay, %v", marks, err)
	}
}

// A replay under the messages' own ids leaves out a published message
// whose id is pending again in the log, written anew after it was sent:
// the one found above the position; the one a late commit left below it,
// which only the xid arm of the pending search finds; and one whose first
// publish failed, so that its history is the published table's row, not
// the log's. Moved to the outbox, each would be sent beside the pending
// message of its id. The count, the preview's and the replay itself
// agree.
func TestLogStoreReplayLeavesOutIDsPendingInTheLog(t *testing.T) {
	ctx := context.Background()
	pool, open := logStoreSchema(t)
	st := open()
	fence := fenceAll(t, st)
	// y and w share a key, so that the read of w moves y's partition past
	// the seq of y's late row.
	row := func(id, topic, key string) []postboxdriver.Row {
		return []postboxdriver.Row{{ID: id, Topic: topic, Key: key, Payload: []byte("p"), Headers: []byte("{}")}}
	}
	// publish reads n rows and records them published, but for the one
	// of id fail, whose publish failed.
	publish := func(n int, fail string) {
		t.Helper()
		recs, err := st.Fetch(ctx, postboxdriver.FetchParams{Fence: fence, Limit: 10})
		if err != nil || len(recs) != n {
			t.Fatalf("fetch = %d rows, %v; want %d", len(recs), err, n)
		}
		o := postboxdriver.Outcome{}
		for _, r := range recs {
			o.Read = append(o.Read, r.Seq)
			if r.ID == fail {
				o.Failed = append(o.Failed, postboxdriver.Failure{Seq: r.Seq, Error: "refused once"})
			} else {
				o.Published = append(o.Published, r.Seq)
			}
		}
		if s, err := st.Settle(ctx, fence, o, 5); err != nil || s.Published != len(o.Published) || len(s.Failed) != len(o.Failed) {
			t.Fatalf("settle = %+v, %v", s, err)
		}
	}
	x, y, v, w := postbox.NewID(), postbox.NewID(), postbox.NewID(), postbox.NewID()
	for _, id := range []string{x, y, v} {
		if err := st.Insert(ctx, row(id, "t.a", "k-"+id)); err != nil {
			t.Fatal(err)
		}
	}
	publish(3, v)
	publish(1, "") // v, from the outbox, into the published table
	// y again, in a transaction running while w is read and recorded.
	late, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = late.Rollback(ctx) }()
	if err := st.UnwrapExecutor(late).Insert(ctx, row(y, "t.a", "k-"+y)); err != nil {
		t.Fatal(err)
	}
	if err := st.Insert(ctx, row(w, "t.b", "k-"+y)); err != nil {
		t.Fatal(err)
	}
	publish(1, "")
	if err := late.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{x, v} {
		if err := st.Insert(ctx, row(id, "t.a", "k-"+id)); err != nil {
			t.Fatal(err)
		}
	}
	p := st.(*logStore[pgx.Tx]).prefix
	var below bool
	if err := pool.QueryRow(ctx, `SELECT bool_and(g.seq <= x.lo_seq) FROM `+p+`log g JOIN `+p+`positions x USING (partition)
WHERE g.id = $1 AND NOT pg_visible_in_snapshot(g.xid, x.lo)`, y).Scan(&below); err != nil || !below {
		t.Fatalf("y's pending row is below lo_seq: %v, %v", below, err)
	}
	var published string
	if err := pool.QueryRow(ctx, `SELECT id::text FROM `+p+`published`).Scan(&published); err != nil || published != v {
		t.Fatalf("the published table holds %s, %v; want v", published, err)
	}

	window := postboxdriver.ReplayParams{Since: time.Now().Add(-time.Hour), Until: time.Now().Add(time.Hour), Actor: "ops"}
	counts, err := st.ReplayCounts(ctx, window, time.Hour)
	if err != nil || fmt.Sprintf("%+v", counts) != "[{Topic:t.b Count:1 Recent:1}]" {
		t.Fatalf("preview = %+v, %v; want w alone", counts, err)
	}
	dry := window
	dry.DryRun = true
	if n, err := st.Replay(ctx, dry); err != nil || n != 1 {
		t.Fatalf("dry run = %d, %v; want w alone", n, err)
	}
	if n, err := st.Replay(ctx, window); err != nil || n != 1 {
		t.Fatalf("replay = %d, %v; want w alone", n, err)
	}
	var outbox []string
	rs, err := pool.Query(ctx, `SELECT id::text FROM `+p+`outbox`)
	if err == nil {
		outbox, err = pgx.CollectRows(rs, pgx.RowTo[string])
	}
	if err != nil || len(outbox) != 1 || outbox[0] != w {
		t.Fatalf("the outbox holds %v, %v; want w alone", outbox, err)
	}
	if s, err := st.Stats(ctx); err != nil || s.Pending != 4 || s.Published != 3 {
		t.Fatalf("stats = %+v, %v; want x, y and v pending in the log, w in the outbox, x, y and v published", s, err)
	}
}

// A record within noteEvery of its partition's last note notes what it
// published but owes the partition's position a note, and the first read
// that finds nothing pays it: retention then reaches the rows of the
// relay's last batch before it fell idle.
func TestLogStoreNotesOwedPositions(t *testing.T) {
	ctx := context.Background()
	_, open := logStoreSchema(t)
	st := open()
	fence := fenceAll(t, st)
	publish := func() {
		t.Helper()
		row := postboxdriver.Row{ID: postbox.NewID(), Topic: "t", Key: "k", Payload: []byte("p"), Headers: []byte("{}")}
		if err := st.Insert(ctx, []postboxdriver.Row{row}); err != nil {
			t.Fatal(err)
		}
		recs, err := st.Fetch(ctx, postboxdriver.FetchParams{Fence: fence, Limit: 10})
		if err != nil || len(recs) != 1 {
			t.Fatalf("fetch = %d rows, %v", len(recs), err)
		}
		o := postboxdriver.Outcome{Read: []int64{recs[0].Seq}, Published: []int64{recs[0].Seq}}
		if s, err := st.Settle(ctx, fence, o, 5); err != nil || s.Published != 1 {
			t.Fatalf("settle = %+v, %v", s, err)
		}
	}
	prune := func(want int) {
		t.Helper()
		if n, err := st.PrunePublished(ctx, 0, 100); err != nil || n != want {
			t.Fatalf("prune = %d, %v; want %d", n, err, want)
		}
	}
	publish() // noted
	publish() // owed
	// The second record noted what it published, if not its position.
	if ts, err := st.TopicStats(ctx); err != nil || len(ts) != 1 || ts[0].PublishedLastMinute != 2 {
		t.Fatalf("topic status = %+v, %v", ts, err)
	}
	prune(1)
	time.Sleep(noteEvery)
	if recs, err := st.Fetch(ctx, postboxdriver.FetchParams{Fence: fence, Limit: 10}); err != nil || len(recs) != 0 {
		t.Fatalf("idle fetch = %d rows, %v", len(recs), err)
	}
	prune(1)
}

// A partition without its row of positions (deleted by hand; migration 12
// gives every partition one) fails the read with an error naming the
// table, and publishes nothing.
func TestLogStoreReadNamesAMissingPosition(t *testing.T) {
	ctx := context.Background()
	pool, open := logStoreSchema(t)
	st := open()
	fence := fenceAll(t, st)
	prefix := st.(*logStore[pgx.Tx]).prefix
	if _, err := pool.Exec(ctx, `DELETE FROM `+prefix+`positions WHERE partition IN (3, 7)`); err != nil {
		t.Fatal(err)
	}
	recs, err := st.Fetch(ctx, postboxdriver.FetchParams{Fence: fence, Limit: 10})
	if want := "2 of 64 partitions have no row in " + prefix + "positions"; err == nil || !strings.Contains(err.Error(), want) || len(recs) != 0 {
		t.Fatalf("fetch = %d rows, %v; want an error saying %q", len(recs), err, want)
	}
}

// logStoreSchema makes the outbox's and the log's tables under a prefix of
// the test's own, and returns the pool and a function opening a log
// store on them (a process of its own).
func logStoreSchema(t testing.TB) (*pgxpool.Pool, func() postboxdriver.Store[pgx.Tx]) {
	t.Helper()
	return logStoreChunked(t, chunking{})
}

// logStoreChunked is logStoreSchema with the log split by c.
func logStoreChunked(t testing.TB, c chunking) (*pgxpool.Pool, func() postboxdriver.Store[pgx.Tx]) {
	t.Helper()
	ctx := context.Background()
	pool, prefix := migratedLog(t)
	if c.width > 0 {
		if _, err := pool.Exec(ctx, ChunkLog(prefix)); err != nil {
			t.Fatal(err)
		}
	}
	return pool, func() postboxdriver.Store[pgx.Tx] {
		st, err := (&Driver[pgx.Tx]{pool: pool, chunks: c}).Open(prefix)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
}

// migratedLog is a migrated database that says log (UseLog), so that the
// log's Store writes the log.
func migratedLog(t testing.TB) (*pgxpool.Pool, string) {
	t.Helper()
	pool, prefix := testdb.Migrated(t)
	if err := UseLog(context.Background(), pool, prefix); err != nil {
		t.Fatal(err)
	}
	return pool, prefix
}

// fenceAll takes every partition's lease for st and returns its fence.
func fenceAll(t testing.TB, st postboxdriver.Store[pgx.Tx]) postboxdriver.Fence {
	t.Helper()
	parts := make([]int, 64)
	for i := range parts {
		parts[i] = i
	}
	ls, err := st.AcquireLeases(context.Background(), "relay", parts, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	fence := postboxdriver.Fence{Owner: "relay", Generations: map[int]int64{}}
	for _, l := range ls {
		fence.Generations[l.Partition] = l.Generation
	}
	return fence
}

// publishAll reads up to 10 rows of fence's partitions from st and
// records every one published, as a relay whose publishes all succeed.
func publishAll(t *testing.T, st postboxdriver.Store[pgx.Tx], fence postboxdriver.Fence) []postboxdriver.Record {
	t.Helper()
	ctx := context.Background()
	recs, err := st.Fetch(ctx, postboxdriver.FetchParams{Fence: fence, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	var seqs []int64
	for _, r := range recs {
		seqs = append(seqs, r.Seq)
	}
	if len(seqs) > 0 {
		if got, err := st.Settle(ctx, fence, postboxdriver.Outcome{Read: seqs, Published: seqs}, 5); err != nil || got.Published != len(seqs) {
			t.Fatalf("settle = %+v, %v; want %d published", got, err, len(seqs))
		}
	}
	return recs
}

// A requeue leaves dead a message whose id is pending again in the log
// through a late commit: written by a transaction that was running when
// its partition's position was taken, with a seq below the position's
// lo_seq, so that only the xid arm of the pending search finds it.
func TestLogStoreRequeueSeesALateCommit(t *testing.T) {
	ctx := context.Background()
	pool, open := logStoreSchema(t)
	st := open()
	p := st.(*logStore[pgx.Tx]).prefix
	id := postbox.NewID()
	row := func(id string) []postboxdriver.Row {
		return []postboxdriver.Row{{ID: id, Topic: "t", Key: "k", Payload: []byte("p"), Headers: []byte("{}")}}
	}
	late, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = late.Rollback(ctx) }()
	if err := st.UnwrapExecutor(late).Insert(ctx, row(id)); err != nil {
		t.Fatal(err)
	}
	if err := st.Insert(ctx, row(postbox.NewID())); err != nil {
		t.Fatal(err)
	}
	fence := fenceAll(t, st)
	recs, err := st.Fetch(ctx, postboxdriver.FetchParams{Fence: fence, Limit: 10})
	if err != nil || len(recs) != 1 {
		t.Fatalf("fetch = %d rows, %v", len(recs), err)
	}
	o := postboxdriver.Outcome{Read: []int64{recs[0].Seq}, Published: []int64{recs[0].Seq}}
	if _, err := st.Settle(ctx, fence, o, 5); err != nil {
		t.Fatal(err)
	}
	if err := late.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var below bool
	if err := pool.QueryRow(ctx, `SELECT g.seq <= x.lo_seq FROM `+p+`log g JOIN `+p+`positions x USING (partition) WHERE g.id = $1`, id).Scan(&below); err != nil || !below {
		t.Fatalf("the late row's seq is below lo_seq: %v, %v", below, err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO `+p+`dead (seq, id, topic, key, payload, headers, partition, created_at, attempts, last_error)
SELECT seq - 1000000, id, topic, key, payload, headers, partition, created_at, 1, 'x' FROM `+p+`log WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	if n, err := st.RequeueDeadMessages(ctx, postboxdriver.DeadFilter{IDs: []string{id}}); err != nil || n != 0 {
		t.Fatalf("requeue = %d, %v; the id is pending in the log", n, err)
	}
}

// A row written by a transaction that was running when its partition's
// position was taken, with a seq below the position's lo_seq, is read
// once it commits: only the xid arm of the read finds it.
func TestLogStoreReadsALateCommit(t *testing.T) {
	ctx := context.Background()
	pool, open := logStoreSchema(t)
	st := open()
	row := func() []postboxdriver.Row {
		return []postboxdriver.Row{{ID: postbox.NewID(), Topic: "t", Key: "k", Payload: []byte("p"), Headers: []byte("{}")}}
	}
	late, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = late.Rollback(ctx) }()
	lateRow := row()
	if err := st.UnwrapExecutor(late).Insert(ctx, lateRow); err != nil {
		t.Fatal(err)
	}
	if err := st.Insert(ctx, row()); err != nil {
		t.Fatal(err)
	}
	fence := fenceAll(t, st)
	read := func() []postboxdriver.Record { return publishAll(t, st, fence) }
	if recs := read(); len(recs) != 1 {
		t.Fatalf("first read = %d rows", len(recs))
	}
	if err := late.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if recs := read(); len(recs) != 1 || recs[0].ID != lateRow[0].ID {
		t.Fatalf("the late commit's row was not read: %+v", recs)
	}
}

// Late commits in two partitions whose positions were taken by different
// reads, so that one read holds two snapshots: the xid arm looks each
// snapshot's ids up once and gives each partition the rows of its own
// snapshot's transactions. The first late transaction is in both
// snapshots' xip lists; its row is read once, for its own partition.
func TestLogStoreReadsLateCommitsUnderTwoSnapshots(t *testing.T) {
	ctx := context.Background()
	pool, open := logStoreSchema(t)
	st := open()
	all := fenceAll(t, st)
	keys := [2]string{"a", ""}
	part := func(key string) int { return postboxdriver.PartitionOf(key, "", len(all.Generations)) }
	for i := 0; keys[1] == ""; i++ {
		if k := fmt.Sprintf("b%d", i); part(k) != part(keys[0]) {
			keys[1] = k
		}
	}
	only := func(parts ...int) postboxdriver.Fence {
		f := postboxdriver.Fence{Owner: all.Owner, Generations: map[int]int64{}}
		for _, p := range parts {
			f.Generations[p] = all.Generations[p]
		}
		return f
	}
	row := func(key string) []postboxdriver.Row {
		return []postboxdriver.Row{{ID: postbox.NewID(), Topic: "t", Key: key, Payload: []byte("p"), Headers: []byte("{}")}}
	}
	read := func(fence postboxdriver.Fence) []string {
		t.Helper()
		recs, err := st.Fetch(ctx, postboxdriver.FetchParams{Fence: fence, Limit: 10})
		if err != nil {
			t.Fatal(err)
		}
		var seqs []int64
		var ids []string
		for _, r := range recs {
			seqs, ids = append(seqs, r.Seq), append(ids, r.ID)
		}
		if len(seqs) > 0 {
			if _, err := st.Settle(ctx, fence, postboxdriver.Outcome{Read: seqs, Published: seqs}, 5); err != nil {
				t.Fatal(err)
			}
		}
		return ids
	}
	var late [2]pgx.Tx
	var lateRows [2][]postboxdriver.Row
	for i, key := range keys {
		// A transaction left running, then a committed row of the same
		// partition above it, read alone: the partition's position takes
		// the read's snapshot, with the running transactions in its xip.
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		late[i], lateRows[i] = tx, row(key)
		if err := st.UnwrapExecutor(tx).Insert(ctx, lateRows[i]); err != nil {
			t.Fatal(err)
		}
		committed := row(key)
		if err := st.Insert(ctx, committed); err != nil {
			t.Fatal(err)
		}
		if ids := read(only(part(key))); len(ids) != 1 || ids[0] != committed[0].ID {
			t.Fatalf("partition %d's first read = %v, want the committed row alone", part(key), ids)
		}
	}
	for _, tx := range late {
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	ids := read(only(part(keys[0]), part(keys[1])))
	if want := []string{lateRows[0][0].ID, lateRows[1][0].ID}; !slices.Equal(ids, want) {
		t.Fatalf("the late commits' read = %v, want %v", ids, want)
	}
	if ids := read(all); len(ids) != 0 {
		t.Fatalf("a read after them = %v, want nothing", ids)
	}
}

// A batch that published every log row it read is recorded in the
// statement that reads the next batch: the position moves past it, a row
// written since is read, and so is a late commit below the new position's
// lo_seq, by the xid arm; under a fence that moved on, nothing is recorded
// and nothing read, though a row waits.
func TestLogStoreSettleFetch(t *testing.T) {
	ctx := context.Background()
	pool, open := logStoreSchema(t)
	st := open().(*logStore[pgx.Tx])
	// Every row has the same key, so that all are in one partition and
	// the late row's seq is below that partition's lo_seq once a is read.
	row := func(name string) []postboxdriver.Row {
		return []postboxdriver.Row{{ID: postbox.NewID(), Topic: "t", Key: "k", Payload: []byte(name), Headers: []byte("{}")}}
	}
	late, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = late.Rollback(ctx) }()
	if err := st.UnwrapExecutor(late).Insert(ctx, row("late")); err != nil {
		t.Fatal(err)
	}
	if err := st.Insert(ctx, row("a")); err != nil {
		t.Fatal(err)
	}
	fence := fenceAll(t, st)
	params := postboxdriver.FetchParams{Fence: fence, Limit: 10}
	recs, err := st.Fetch(ctx, params)
	if err != nil || len(recs) != 1 || string(recs[0].Payload) != "a" {
		t.Fatalf("fetch = %+v, %v; want a", recs, err)
	}
	if err := st.Insert(ctx, row("b")); err != nil {
		t.Fatal(err)
	}
	// step records recs, read alone, under f with the next read, and
	// returns what it read, which must be the row named want (or nothing)
	// after published rows recorded.
	step := func(f postboxdriver.Fence, recs []postboxdriver.Record, published int, want string) []postboxdriver.Record {
		t.Helper()
		rode := st.rode.Load()
		o := postboxdriver.Outcome{Read: []int64{recs[0].Seq}, Published: []int64{recs[0].Seq}}
		got, next, err := st.SettleFetch(ctx, f, o, 5, params)
		var names string
		for _, r := range next {
			names += string(r.Payload)
		}
		if err != nil || names != want || got.Published != published {
			t.Fatalf("SettleFetch of %s = %+v, read %q, %v; want %d recorded and %q read", recs[0].Payload, got, names, err, published, want)
		}
		if st.rode.Load() != rode+1 {
			t.Fatalf("SettleFetch of %s was not one statement", recs[0].Payload)
		}
		return next
	}
	recs = step(fence, recs, 1, "b")
	if err := late.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	recs = step(fence, recs, 1, "late")
	stale := postboxdriver.Fence{Owner: fence.Owner, Generations: map[int]int64{}}
	for p, g := range fence.Generations {
		stale.Generations[p] = g - 1
	}
	if err := st.Insert(ctx, row("c")); err != nil {
		t.Fatal(err)
	}
	step(stale, recs, 0, "")
	if s, err := st.Stats(ctx); err != nil || s.Pending != 2 || s.Published != 2 {
		t.Fatalf("stats = %+v, %v; want the late row and c pending, a and b published", s, err)
	}
}

// The small statement (one range arm over every partition) and the one of
// an arm a partition return the same rows in the same order, for a batch
// that takes every row and for one that stops short of them, over a whole
// log and one split into chunks, with a late transaction's row among
// them. A lane's read takes the small one after a short read (short), and
// the other after a full one.
// TestLogReadShapeAfterNoneOrAFailure: the first read of a set of
// partitions, and the read after one that failed, take the small
// statement; only the read after a full one takes the statement of one
// arm a partition, whose plan costs the more the more partitions it
// reads. Tried again as it was, a read of the whole share that ran out of
// its lease's time on a slow database ran out again, for as long as the
// database was that slow.
func TestLogReadShapeAfterNoneOrAFailure(t *testing.T) {
	_, open := logStoreChunked(t, chunking{})
	st := open().(*logStore[pgx.Tx])
	parts := []int{3, 5, 8}
	small := func() bool {
		return st.plan(postboxdriver.FetchParams{Limit: 2}, parts, map[int]position{}).shape.small
	}
	if !small() {
		t.Fatal("the first read takes the statement of one arm a partition")
	}
	pl := readPlan{p: postboxdriver.FetchParams{Limit: 2}, parts: parts}
	st.noteRead(pl, scanned{rows: make([]logRow, 2)})
	if small() {
		t.Fatal("the read after a full one takes the small statement")
	}
	st.noteFailed(pl)
	if !small() {
		t.Fatal("the read after a failed one takes the statement of one arm a partition")
	}
	st.noteRead(pl, scanned{rows: make([]logRow, 1)})
	if !small() {
		t.Fatal("the read after a short one takes the statement of one arm a partition")
	}
}

func TestLogReadShapesAgree(t *testing.T) {
	for _, c := range []chunking{{}, {width: 8, ahead: 2}} {
		t.Run(fmt.Sprintf("chunks of %d", c.width), func(t *testing.T) {
			ctx := context.Background()
			pool, open := logStoreChunked(t, c)
			st := open().(*logStore[pgx.Tx])
			late, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = late.Rollback(ctx) }()
			row := func(key string) []postboxdriver.Row {
				return []postboxdriver.Row{{ID: postbox.NewID(), Topic: "t", Key: key, Payload: []byte(key), Headers: []byte("{}")}}
			}
			if err := st.UnwrapExecutor(late).Insert(ctx, row("late")); err != nil {
				t.Fatal(err)
			}
			fence := fenceAll(t, st)
			// A first read that stops short and its record, so that the
			// band stays open (its snapshot and cursor bound the next
			// reads), and the late row lies below its partition's
			// position, for the xid arm to read.
			for i := range 40 {
				if err := st.Insert(ctx, row(fmt.Sprintf("k%d", i%13))); err != nil {
					t.Fatal(err)
				}
			}
			recs, err := st.Fetch(ctx, postboxdriver.FetchParams{Fence: fence, Limit: 10})
			if err != nil || len(recs) != 10 {
				t.Fatalf("first read: %d rows, %v; want 10", len(recs), err)
			}
			var seqs []int64
			for _, r := range recs {
				seqs = append(seqs, r.Seq)
			}
			if _, err := st.Settle(ctx, fence, postboxdriver.Outcome{Read: seqs, Published: seqs}, 5); err != nil {
				t.Fatal(err)
			}
			for i := range 30 {
				if err := st.Insert(ctx, row(fmt.Sprintf("k%d", i%7))); err != nil {
					t.Fatal(err)
				}
			}
			if err := late.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			parts := fenced(fence)
			base, err := st.positions(ctx, fence, parts)
			if err != nil {
				t.Fatal(err)
			}
			// Above every row: a read cut by its upper bound (design §3, "An
			// upper bound on the read") is read again, not compared.
			st.top.Store(1000)
			read := func(limit int, small bool) []int64 {
				t.Helper()
				pl := st.plan(postboxdriver.FetchParams{Fence: fence, Limit: limit}, parts, base)
				pl.shape.small = small
				rs, err := pool.Query(ctx, st.statement(st.reads, pl.shape, readSQL), pl.args...)
				if err != nil {
					t.Fatal(err)
				}
				got, err := scanRead(rs, pl)
				if err != nil {
					t.Fatal(err)
				}
				var out []int64
				for _, r := range got.rows {
					out = append(out, r.rec.Seq)
				}
				return out
			}
			for _, limit := range []int{5, 100} {
				arms, small := read(limit, false), read(limit, true)
				if len(arms) < min(limit, 5) || fmt.Sprint(arms) != fmt.Sprint(small) {
					t.Fatalf("limit %d: an arm a partition read %v, the small statement %v; want the same rows", limit, arms, small)
				}
			}
		})
	}
}

// ReadWhole names the partitions a read took whole. A full read takes
// none: its band, open on every partition it read, stays open at its
// snapshot. The read that ends that band short of its limit takes none
// either: a row committed after the band's snapshot waits for the next
// read, which opens a band at its own snapshot and, short, takes every
// partition whole. The relay ends a taken partition's crash marks on that
// answer, so a row the dead relay had in flight in the next band is still
// published marked.
func TestLogStoreReadWhole(t *testing.T) {
	ctx := context.Background()
	_, open := logStoreSchema(t)
	st := open()
	pr, ok := st.(postboxdriver.PartialReader)
	if !ok {
		t.Fatal("the log's Store is no PartialReader")
	}
	write := func(n int) {
		t.Helper()
		for range n {
			row := []postboxdriver.Row{{ID: postbox.NewID(), Topic: "t", Key: "k", Payload: []byte("p"), Headers: []byte("{}")}}
			if err := st.Insert(ctx, row); err != nil {
				t.Fatal(err)
			}
		}
	}
	fence := fenceAll(t, st)
	read := func(limit int) ([]postboxdriver.Record, map[int]bool) {
		t.Helper()
		recs, err := st.Fetch(ctx, postboxdriver.FetchParams{Fence: fence, Limit: limit})
		if err != nil {
			t.Fatal(err)
		}
		whole := map[int]bool{}
		for _, p := range pr.ReadWhole(recs) {
			whole[p] = true
		}
		var seqs []int64
		for _, r := range recs {
			seqs = append(seqs, r.Seq)
		}
		if _, err := st.Settle(ctx, fence, postboxdriver.Outcome{Read: seqs, Published: seqs}, 5); err != nil {
			t.Fatal(err)
		}
		if got := pr.ReadWhole(recs); got != nil {
			t.Fatalf("ReadWhole of a settled read = %v, want nil", got)
		}
		return recs, whole
	}
	write(3)
	recs, whole := read(2)
	if len(recs) != 2 || len(whole) != 0 {
		t.Fatalf("full read: %d rows, whole %v; want 2 rows, none whole", len(recs), whole)
	}
	part := recs[0].Partition
	write(1) // after the band's snapshot
	recs, whole = read(10)
	if len(recs) != 1 || whole[part] {
		t.Fatalf("the read ending the band: %d rows, whole %v; want 1 row, partition %d not whole", len(recs), whole, part)
	}
	if len(whole) != 0 {
		t.Fatalf("the read ending the band took %d partitions whole; the full read opened a band on every one", len(whole))
	}
	recs, whole = read(10)
	if len(recs) != 1 || !whole[part] || len(whole) != 64 {
		t.Fatalf("the next read: %d rows, %d partitions whole (%d: %v); want the row written after the band, every partition whole", len(recs), len(whole), part, whole[part])
	}
}

// The log's Store signals and listens as postboxpgx's does: a write
// through a Client over the log, on another pool, reaches a listener over
// the log as a change signal naming the partition written, so that a
// relay in another process wakes instead of waiting for its poll.
func TestLogStoreSignals(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, open := logStoreSchema(t)
	l, ok := open().(postboxdriver.Listener)
	if !ok {
		t.Fatal("the log's Store is not a postboxdriver.Listener")
	}
	other := testdb.PoolAt(t, testdb.PostgresURL())
	prefix := open().(*logStore[pgx.Tx]).prefix
	writer, err := postbox.NewClient(&Driver[pgx.Tx]{pool: other}, &postbox.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	testdb.HearsWrite(t, ctx, l, func() {
		if err := writer.Write(ctx, postbox.Message{Topic: "orders.paid", Key: "k", Payload: []byte("p")}); err != nil {
			t.Fatal(err)
		}
	})
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+prefix+`log`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("the log holds %d rows (%v), want the write's", n, err)
	}
}

// A record writes the positions of the partitions it passed rows of, and
// of the others only once this process has held them unwritten for
// storeEvery; a process that takes the partitions over from the positions
// left behind reads every row this one has not published, a late commit
// among them, and none it has.
func TestLogStoreWritesThePositionsItPassedRowsOf(t *testing.T) {
	ctx := context.Background()
	pool, open := logStoreSchema(t)
	st := open().(*logStore[pgx.Tx])
	fence := fenceAll(t, st)
	n := len(fence.Generations)
	keyIn := map[int]string{}
	for i := 0; len(keyIn) < 3; i++ {
		k := strconv.Itoa(i)
		if p := postboxdriver.PartitionOf(k, "", n); keyIn[p] == "" {
			keyIn[p] = k
		}
	}
	var parts []int
	for p := range keyIn {
		parts = append(parts, p)
	}
	slices.Sort(parts)
	busy, quiet, lateIn := parts[0], parts[1], parts[2]
	row := func(p int) []postboxdriver.Row {
		return []postboxdriver.Row{{ID: postbox.NewID(), Topic: "t", Key: keyIn[p], Payload: []byte("p"), Headers: []byte("{}")}}
	}
	// versions are the positions' row versions by partition: an update
	// makes a new one.
	versions := func() map[int]string {
		t.Helper()
		rs, err := pool.Query(ctx, `SELECT partition, xmin::text FROM `+st.prefix+`positions`)
		if err != nil {
			t.Fatal(err)
		}
		out := map[int]string{}
		for rs.Next() {
			var p int
			var v string
			if err := rs.Scan(&p, &v); err != nil {
				t.Fatal(err)
			}
			out[p] = v
		}
		if err := rs.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	written := func(before, after map[int]string) (out []int) {
		for p, v := range after {
			if before[p] != v {
				out = append(out, p)
			}
		}
		slices.Sort(out)
		return out
	}
	publish := func(st *logStore[pgx.Tx]) []postboxdriver.Record { return publishAll(t, st, fence) }
	late, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = late.Rollback(ctx) }()
	lateRow := row(lateIn)
	if err := st.UnwrapExecutor(late).Insert(ctx, lateRow); err != nil {
		t.Fatal(err)
	}
	if err := st.Insert(ctx, row(quiet)); err != nil {
		t.Fatal(err)
	}
	if recs := publish(st); len(recs) != 1 {
		t.Fatalf("first read = %d rows; want the quiet partition's", len(recs))
	}
	// Loaded (every position is as stored) and recorded once, the busy
	// partition's rows are recorded alone, read after read.
	for range 3 {
		if err := st.Insert(ctx, row(busy)); err != nil {
			t.Fatal(err)
		}
		before := versions()
		if recs := publish(st); len(recs) != 1 {
			t.Fatalf("read = %d rows; want the busy partition's", len(recs))
		}
		if got := written(before, versions()); !slices.Equal(got, []int{busy}) {
			t.Fatalf("the record wrote the positions of %v; want only %d's", got, busy)
		}
	}
	// Held unwritten for storeEvery, the others are written with the
	// next record.
	st.mu.Lock()
	for p := range st.stored {
		if p != busy {
			st.stored[p] = st.stored[p].Add(-storeEvery)
		}
	}
	st.mu.Unlock()
	if err := st.Insert(ctx, row(busy)); err != nil {
		t.Fatal(err)
	}
	before := versions()
	publish(st)
	if got := written(before, versions()); len(got) != n {
		t.Fatalf("the record after storeEvery wrote %d positions; want all %d", len(got), n)
	}
	// Then alone again, while the late transaction is still open.
	if err := st.Insert(ctx, row(busy)); err != nil {
		t.Fatal(err)
	}
	publish(st)
	if err := late.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	// Another process from the positions stored: the late row, and the
	// quiet partition's new row; not a row st published.
	if err := st.Insert(ctx, row(quiet)); err != nil {
		t.Fatal(err)
	}
	other := open().(*logStore[pgx.Tx])
	recs := publish(other)
	if len(recs) != 2 || recs[0].ID != lateRow[0].ID || recs[1].Partition != quiet {
		t.Fatalf("the other process read %+v; want the late row, then the quiet partition's new one", recs)
	}
	if s, err := other.Stats(ctx); err != nil || s.Pending != 0 || s.Published != 8 {
		t.Fatalf("stats = %+v, %v; want none pending and 8 published", s, err)
	}
}

// The read looks the transactions of its snapshot's xip list up by the
// xid index, in the plan PostgreSQL keeps for the statement, however small
// the log was when it made it. Probed as one list, the generic plan of a
// log of 1 to 400 rows, never analyzed, scanned the whole log for it, and
// PostgreSQL kept that plan at every read as the log grew, until the log
// was next analyzed.
func TestLogReadProbesTheXipListByIndex(t *testing.T) {
	ctx := context.Background()
	pool, st, fence, parts, base := readFixture(t, 100)
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SET plan_cache_mode = force_generic_plan`); err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = conn.Exec(ctx, `RESET plan_cache_mode`) }()
	for _, small := range []bool{true, false} {
		pl := st.plan(postboxdriver.FetchParams{Fence: fence, Limit: 10}, parts, base)
		pl.shape.small = small
		plan := explainRead(t, conn, st, pl, fmt.Sprintf("read_%t", small))
		if strings.Contains(plan, "Seq Scan on "+st.prefix+"log ") {
			t.Fatalf("the read (small %t) scans the log whole:\n%s", small, plan)
		}
	}
}

// A read takes each partition's rows by the log's index in their order,
// and stops at the batch's limit, however many rows a partition holds
// past its position. The planner, guessing fewer than the limit, had the
// small statement (the first read of a backlog) collect a partition's
// rows through a bitmap scan and sort them all, which PostgreSQL does
// only with bitmap scans on (ReadSettings turns them off for a read):
// the whole backlog of every partition for a batch of 500.
func TestLogReadTakesEachPartitionInIndexOrder(t *testing.T) {
	ctx := context.Background()
	// A backlog of 1,000 rows a partition, analyzed. The read's filters
	// on the snapshots are opaque to the planner, which guesses that
	// fewer rows than the limit pass them; with bitmap scans on,
	// PostgreSQL 15 collects them through one and sorts them, in both
	// of the read's shapes (checked: this test fails with JITOff alone).
	// A log this size is large enough that a whole scan is not the
	// cheaper way either.
	pool, st, fence, parts, base := readFixture(t, 64000)
	if _, err := pool.Exec(ctx, `ANALYZE `+st.prefix+`log`); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
		for _, small := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/small=%t", mode, small), func(t *testing.T) {
				tx, err := pool.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer func() { _ = tx.Rollback(ctx) }()
				if _, err := tx.Exec(ctx, ReadSettings); err != nil {
					t.Fatal(err)
				}
				if _, err := tx.Exec(ctx, `SELECT set_config('plan_cache_mode', $1, true)`, mode); err != nil {
					t.Fatal(err)
				}
				pl := st.plan(postboxdriver.FetchParams{Fence: fence, Limit: 500}, parts, base)
				pl.shape.small = small
				plan := explainRead(t, tx, st, pl, fmt.Sprintf("read_%s_%t", mode, small))
				if strings.Contains(plan, "Bitmap Heap Scan on "+st.prefix+"log ") {
					t.Fatalf("the read collects a partition's rows through a bitmap scan:\n%s", plan)
				}
				if !strings.Contains(plan, "Index Scan using "+st.prefix+"log_pkey on "+st.prefix+"log ") {
					t.Fatalf("the read takes no partition's rows by the log's index:\n%s", plan)
				}
			})
		}
	}
}

// readFixture is a log's Store holding n rows of distinct keys, fenced for
// every partition, and the positions its read of them starts from.
func readFixture(t *testing.T, n int) (*pgxpool.Pool, *logStore[pgx.Tx], postboxdriver.Fence, []int, map[int]position) {
	t.Helper()
	ctx := context.Background()
	pool, open := logStoreSchema(t)
	st := open().(*logStore[pgx.Tx])
	rows := make([]postboxdriver.Row, n)
	for i := range rows {
		rows[i] = postboxdriver.Row{ID: postbox.NewID(), Topic: "t", Key: strconv.Itoa(i), Payload: []byte("p"), Headers: []byte("{}")}
	}
	if err := st.Insert(ctx, rows); err != nil {
		t.Fatal(err)
	}
	fence := fenceAll(t, st)
	parts := fenced(fence)
	base, err := st.positions(ctx, fence, parts)
	if err != nil {
		t.Fatal(err)
	}
	return pool, st, fence, parts, base
}

// explainRead is the plan PostgreSQL makes on q for the read pl, prepared
// there as name.
func explainRead(t *testing.T, q interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, st *logStore[pgx.Tx], pl readPlan, name string) string {
	t.Helper()
	ctx := context.Background()
	if _, err := q.Exec(ctx, `PREPARE `+name+` AS `+st.statement(st.reads, pl.shape, readSQL)); err != nil {
		t.Fatal(err)
	}
	args := make([]string, len(pl.args))
	for i, a := range pl.args {
		args[i] = sqlLiteral(t, a)
	}
	rs, err := q.Query(ctx, `EXPLAIN EXECUTE `+name+`(`+strings.Join(args, ", ")+`)`)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rs, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(lines, "\n")
}

// sqlLiteral is v, one of a read's arguments, as an SQL literal.
func sqlLiteral(t *testing.T, v any) string {
	t.Helper()
	quote := func(s *string) string {
		if s == nil {
			return "NULL"
		}
		return "'" + strings.ReplaceAll(*s, "'", "''") + "'"
	}
	var items []string
	var typ string
	switch v := v.(type) {
	case int:
		return strconv.Itoa(v)
	case []int32:
		for _, x := range v {
			items = append(items, strconv.Itoa(int(x)))
		}
		typ = "int"
	case []int64:
		for _, x := range v {
			items = append(items, strconv.FormatInt(x, 10))
		}
		typ = "bigint"
	case []string:
		for i := range v {
			items = append(items, quote(&v[i]))
		}
		typ = "text"
	case []*string:
		for _, x := range v {
			items = append(items, quote(x))
		}
		typ = "text"
	default:
		t.Fatalf("no literal for a %T", v)
	}
	return "ARRAY[" + strings.Join(items, ", ") + "]::" + typ + "[]"
}

// Over one pool (postboxpgx's WithLog), the log's Store checks the pool's
// connections once, as the outbox's Store does, and compares no
// databases; over an outbox on another pool (postboxsql's WithLog), it
// checks its pool and asks it for its database besides.
func TestLogStoreChecksOnePoolOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, prefix := migratedLog(t)
	pool, tally := tracedPool(t)
	check := func(name string, d postboxdriver.Driver[pgx.Tx]) int {
		t.Helper()
		st, err := d.Open(prefix)
		if err != nil {
			t.Fatal(err)
		}
		before := tally.count()
		if err := st.CheckConnections(ctx); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return tally.count() - before
	}
	outbox := check("the outbox's Store", pgxdriver.New(pool, nil))
	if outbox == 0 {
		t.Fatal("the outbox's Store sent no statement to check its connections")
	}
	if got := check("the log's Store on one pool", New[pgx.Tx](pgxdriver.New(pool, nil), pool, 0)); got != outbox {
		t.Errorf("the log's Store on the outbox's pool sent it %d statements, want the outbox Store's %d", got, outbox)
	}
	other := testdb.Pool(t)
	if got := check("the log's Store beside an outbox on another pool", New[pgx.Tx](pgxdriver.New(other, nil), pool, 0)); got <= outbox {
		t.Errorf("the log's Store beside an outbox on another pool sent its own pool %d statements, want more than the %d of its connections' check (its database too)", got, outbox)
	}
}

// tracedPool is a pool on the test database whose statements tally
// counts and keeps, closed when t ends.
func tracedPool(t *testing.T) (*pgxpool.Pool, *queryTally) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testdb.PostgresURL())
	if err != nil {
		t.Fatal(err)
	}
	tally := &queryTally{}
	cfg.ConnConfig.Tracer = tally
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, tally
}

// queryTally keeps the text of the statements a pool sends.
type queryTally struct {
	mu  sync.Mutex
	sql []string
}

// count is how many statements the pool has sent.
func (q *queryTally) count() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.sql)
}

// since is the text of the statements sent after the first n.
func (q *queryTally) since(n int) []string {
	q.mu.Lock()
	defer q.mu.Unlock()
	return slices.Clone(q.sql[n:])
}

func (q *queryTally) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	q.mu.Lock()
	q.sql = append(q.sql, data.SQL)
	q.mu.Unlock()
	return ctx
}

func (*queryTally) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// A write of one message binds its values, one of several binds arrays
// (insertOneSQL, insertSQL), and both land in the log while the database
// says log.
func TestLogWriterBindsOneRowsValues(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, prefix := migratedLog(t)
	pool, tally := tracedPool(t)
	c, err := postbox.NewClient(&Driver[pgx.Tx]{pool: pool}, &postbox.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	m := postbox.Message{Topic: "orders.paid", Key: "k", Payload: []byte("p")}
	for _, w := range []struct {
		msgs   []postbox.Message
		arrays bool
	}{{[]postbox.Message{m}, false}, {[]postbox.Message{m, m, m}, true}} {
		before := tally.count()
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return c.WriteTx(ctx, tx, w.msgs...) }); err != nil {
			t.Fatal(err)
		}
		var inserts []string
		for _, s := range tally.since(before) {
			if strings.Contains(s, "INSERT INTO "+prefix+"log") {
				inserts = append(inserts, s)
			}
		}
		if len(inserts) != 1 || strings.Contains(inserts[0], "unnest") != w.arrays {
			t.Fatalf("a write of %d messages sent %d inserts into the log (%q), want one that binds arrays: %v", len(w.msgs), len(inserts), inserts, w.arrays)
		}
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+prefix+`log`).Scan(&n); err != nil || n != 4 {
		t.Fatalf("the log holds %d rows (%v), want the 4 written", n, err)
	}
}
