package pglog

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/postboxdriver"
)

// A chunk stays while a writer of its rows runs, and while its row is
// pending after it commits; a relay's read finds that row, committed late
// with an id older than its partition's position, though the chunk was
// sealed since; once it is published and past retention, the chunk goes.
func TestLogChunksWaitForTheirWriters(t *testing.T) {
	ctx := context.Background()
	pool, open := logStoreChunked(t, chunking{width: 10, ahead: 2})
	st := open().(*logStore[pgx.Tx])
	prune := func() int {
		t.Helper()
		n, err := st.PrunePublished(ctx, 0, 1000)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	attached := func(lo int64) bool {
		t.Helper()
		var ok bool
		if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, st.chunkTable(lo)).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	droppable := func() []int64 {
		t.Helper()
		rs, err := st.db.Query(ctx, st.droppable, 0)
		if err != nil {
			t.Fatal(err)
		}
		los, err := pgx.CollectRows(rs, pgx.RowTo[int64])
		if err != nil {
			t.Fatal(err)
		}
		return los
	}
	insert := func(ex postboxdriver.Executor, n int) []string {
		t.Helper()
		var rows []postboxdriver.Row
		var ids []string
		for i := range n {
			id := postbox.NewID()
			ids = append(ids, id)
			rows = append(rows, postboxdriver.Row{ID: id, Topic: "t", Key: fmt.Sprint("k", i%5), Payload: []byte("p"), Headers: []byte("{}")})
		}
		if err := ex.Insert(ctx, rows); err != nil {
			t.Fatal(err)
		}
		return ids
	}
	fence := fenceAll(t, st)
	drain := func() map[string]bool {
		t.Helper()
		got := map[string]bool{}
		for {
			recs, err := st.Fetch(ctx, postboxdriver.FetchParams{Fence: fence, Limit: 7})
			if err != nil {
				t.Fatal(err)
			}
			if len(recs) == 0 {
				return got
			}
			var seqs []int64
			for _, r := range recs {
				seqs = append(seqs, r.Seq)
				got[r.ID] = true
			}
			if _, err := st.Settle(ctx, fence, postboxdriver.Outcome{Read: seqs, Published: seqs}, 5); err != nil {
				t.Fatal(err)
			}
		}
	}

	prune() // attaches [1, 11) and [11, 21) above the fresh sequence
	if !attached(1) || !attached(11) || attached(21) {
		t.Fatal("the chunks ahead of the sequence were not attached")
	}
	insert(st, 9) // seqs 1–9
	late, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = late.Rollback(ctx) }()
	lateID := insert(st.UnwrapExecutor(late), 1)[0] // seq 10, running
	insert(st, 15)                                  // seqs 11–25
	if got := drain(); len(got) != 24 || got[lateID] {
		t.Fatalf("first drain published %d rows (the running writer's: %v)", len(got), got[lateID])
	}

	// Sealed while its writer runs (the sequence is past 10), and every
	// committed row of it published, noted (an idle read pays the notes
	// owed) and pruned row by row: still kept, though no committed row of
	// any partition is left in it.
	time.Sleep(noteEvery)
	if got := drain(); len(got) != 0 {
		t.Fatalf("an idle read published %d rows", len(got))
	}
	prune()
	prune()
	var left int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+st.chunkTable(1)).Scan(&left); err != nil || left != 0 {
		t.Fatalf("%d committed rows left in chunk [1, 11), %v", left, err)
	}
	if !attached(1) || slices.Contains(droppable(), 1) {
		t.Fatal("a chunk whose writer still runs was offered for dropping")
	}
	var sealed bool
	if err := pool.QueryRow(ctx, `SELECT sealed_xid IS NOT NULL FROM `+st.prefix+`log_chunks WHERE lo = 1`).Scan(&sealed); err != nil || !sealed {
		t.Fatalf("chunk [1, 11) sealed = %v, %v", sealed, err)
	}

	// Committed, its row is pending: kept.
	if err := late.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	prune()
	if !attached(1) || slices.Contains(droppable(), 1) {
		t.Fatal("a chunk holding a pending row was offered for dropping")
	}

	// The read finds it: its writer is in the position's snapshot as
	// running, and the chunk's seal is above that snapshot's xmin.
	if got := drain(); len(got) != 1 || !got[lateID] {
		t.Fatalf("the late writer's row was not read from its sealed chunk: %v", got)
	}

	// Published and past retention: the chunk goes, once the positions
	// that passed its rows are noted and every writer that was running at
	// its seal has ended (another test's among them).
	deadline := time.Now().Add(30 * time.Second)
	for attached(1) {
		if time.Now().After(deadline) {
			t.Fatal("the published chunk was never dropped")
		}
		// An idle relay's read notes the positions its records owe.
		if got := drain(); len(got) != 0 {
			t.Fatalf("an idle read published %d rows", len(got))
		}
		prune()
		time.Sleep(50 * time.Millisecond)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+st.prefix+`log WHERE seq >= 1 AND seq < 11`).Scan(&left); err != nil || left != 0 {
		t.Fatalf("%d rows of the dropped chunk left, %v", left, err)
	}
}

// Migration 12 makes the log with xid first and seq drawn from the
// outbox's sequence (the position's argument rests on both), and a
// position a partition from the log's beginning; chunkLog remakes the
// empty table partitioned with the same columns, defaults and index
// names.
func TestLogMigration(t *testing.T) {
	ctx := context.Background()
	for _, chunked := range []bool{false, true} {
		pool, open := logStoreChunked(t, chunking{width: map[bool]int64{true: 10}[chunked]})
		prefix := open().(*logStore[pgx.Tx]).prefix
		var cols, defaults []string
		var kind string
		if err := pool.QueryRow(ctx, `SELECT array_agg(a.attname::text ORDER BY a.attnum),
    array_agg(coalesce(pg_get_expr(d.adbin, d.adrelid), '') ORDER BY a.attnum), c.relkind::text
  FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
  LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
  WHERE c.oid = $1::regclass GROUP BY c.relkind`, prefix+"log").Scan(&cols, &defaults, &kind); err != nil {
			t.Fatal(err)
		}
		want := []string{"xid", "seq", "id", "topic", "key", "payload", "headers", "partition", "created_at"}
		if !slices.Equal(cols, want) {
			t.Errorf("chunked %v: the log's columns are %v, want %v", chunked, cols, want)
		}
		if defaults[0] != "pg_current_xact_id()" || defaults[1] != fmt.Sprintf("nextval('%soutbox_seq_seq'::regclass)", prefix) {
			t.Errorf("chunked %v: xid and seq default to %q and %q", chunked, defaults[0], defaults[1])
		}
		if want := map[bool]string{false: "r", true: "p"}[chunked]; kind != want {
			t.Errorf("chunked %v: the log's relkind is %s, want %s", chunked, kind, want)
		}
		var indexes []string
		if err := pool.QueryRow(ctx, `SELECT array_agg(indexrelid::regclass::text ORDER BY indexrelid::regclass::text)
  FROM pg_index WHERE indrelid = $1::regclass`, prefix+"log").Scan(&indexes); err != nil {
			t.Fatal(err)
		}
		if want := []string{prefix + "log_created_idx", prefix + "log_pkey", prefix + "log_xid_idx"}; !slices.Equal(indexes, want) {
			t.Errorf("chunked %v: the log's indexes are %v, want %v", chunked, indexes, want)
		}
		var trigger bool
		if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = $1::regclass AND tgname = $2)`,
			prefix+"log", prefix+"log_rules_update").Scan(&trigger); err != nil || !trigger {
			t.Errorf("chunked %v: the log's update trigger: %v, %v", chunked, trigger, err)
		}
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+prefix+`positions
  WHERE lo::text = '1:1:' AND lo_next = '1' AND lo_seq = 0 AND hi IS NULL`).Scan(&n); err != nil || n != 64 {
			t.Errorf("chunked %v: %d positions at the log's beginning (%v), want 64", chunked, n, err)
		}
		// A log row and an outbox row of one transaction: the seqs compare.
		// The outbox's row has its partition, as postbox's writer gives it:
		// without one, the rules trigger would move it into the log.
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		var a, b int64
		if err := tx.QueryRow(ctx, `INSERT INTO `+prefix+`log (id, topic, payload, headers, partition)
  VALUES (gen_random_uuid(), 't', '\x', '{}', 0) RETURNING seq`).Scan(&a); err != nil {
			t.Fatal(err)
		}
		if err := tx.QueryRow(ctx, `INSERT INTO `+prefix+`outbox (id, topic, payload, headers, partition)
  VALUES (gen_random_uuid(), 't', '\x', '{}', 0) RETURNING seq`).Scan(&b); err != nil {
			t.Fatal(err)
		}
		_ = tx.Rollback(ctx)
		if b != a+1 {
			t.Errorf("chunked %v: the log's row drew seq %d and the outbox's next %d; want one sequence", chunked, a, b)
		}
	}
}
