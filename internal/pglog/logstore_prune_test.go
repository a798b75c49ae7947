package pglog

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/postbox-go/postbox/internal/cpuuse"
	"github.com/postbox-go/postbox/internal/pgxdriver"
	"github.com/postbox-go/postbox/internal/testdb"
	"github.com/postbox-go/postbox/postboxdriver"
)

// BenchmarkPrunePublished deletes history older than the retention by
// batches of 1,000 rows, one batch an op: from the published table, where
// the drivers move every published row (table), from the log, whose rows
// stay where they were written until retention deletes them, row by row
// (log), and from the log split into chunks of LOG_CHUNK_WIDTH rows
// (default 10,000), which retention drops whole (log-chunks: the first
// call drops every chunk). The history is b.N batches of rows of 256-byte
// payloads, a day past a week's retention. pg-µs/row is PostgreSQL's CPU
// per deleted row:
//
//	go test -run '^$' -bench PrunePublished -benchtime 200x ./internal/pglog/
//	LOG_CHUNK_WIDTH=100000 go test -run '^$' -bench PrunePublished -benchtime 1000x ./internal/pglog/
func BenchmarkPrunePublished(b *testing.B) {
	const batch, retention = 1000, 7 * 24 * time.Hour
	for _, storage := range []string{"table", "log", "log-chunks"} {
		b.Run(storage, func(b *testing.B) {
			ctx := context.Background()
			width := envInt(b, "LOG_CHUNK_WIDTH", 10_000)
			n := b.N * batch
			chunks := chunking{}
			if storage == "log-chunks" {
				n = (n + width - 1) / width * width
				chunks = chunking{width: int64(width), ahead: n / width}
			}
			pool, open := logStoreChunked(b, chunks)
			st := open().(*logStore[pgx.Tx])
			p := st.prefix
			prune := st.PrunePublished
			if storage == "table" {
				inner, err := pgxdriver.New(pool, nil).Open(p)
				if err != nil {
					b.Fatal(err)
				}
				prune = inner.PrunePublished
				if _, err := pool.Exec(ctx, `INSERT INTO `+p+`published (seq, id, topic, key, payload, headers, partition, created_at, attempts, published_at)
SELECT g, gen_random_uuid(), 't', 'k' || g % 1000, convert_to(repeat('x', 256), 'UTF8'), '{}', g % 64,
  now() - interval '8 days', 1, now() - interval '8 days'
FROM generate_series(1, $1::int) g`, n); err != nil {
					b.Fatal(err)
				}
			} else {
				// The chunks first (none with the log whole), the rows, and
				// the chunks sealed; then every position past them, noted
				// as a relay's record notes it, eight days ago.
				if storage == "log-chunks" {
					if err := st.attachChunks(ctx); err != nil {
						b.Fatal(err)
					}
				}
				if _, err := pool.Exec(ctx, `INSERT INTO `+p+`log (id, topic, key, payload, headers, partition)
SELECT gen_random_uuid(), 't', 'k' || g % 1000, convert_to(repeat('x', 256), 'UTF8'), '{}', g % 64
FROM generate_series(1, $1::int) g`, n); err != nil {
					b.Fatal(err)
				}
				if storage == "log-chunks" {
					if err := st.sealChunks(ctx); err != nil {
						b.Fatal(err)
					}
				}
				if _, err := pool.Exec(ctx, `UPDATE `+p+`positions SET lo = pg_current_snapshot(), lo_next = pg_current_xact_id(),
  lo_seq = (SELECT max(seq) FROM `+p+`log)`); err != nil {
					b.Fatal(err)
				}
				if _, err := pool.Exec(ctx, `INSERT INTO `+p+`log_passes (at, parts, lo, lo_seq, hi, cursors, topics, counts, oldest)
SELECT now() - interval '8 days', array_agg(partition), array_agg(lo::text), array_agg(lo_seq), array_agg(hi::text),
  array_agg(band_cursor), '{}', '{}', '{}'
FROM `+p+`positions`); err != nil {
					b.Fatal(err)
				}
			}
			if _, err := pool.Exec(ctx, `VACUUM ANALYZE `+p+`published, `+p+`log`); err != nil {
				b.Fatal(err)
			}
			cpu := cpuuse.Phase()
			b.ResetTimer()
			deleted := 0
			for i := 0; i < b.N && deleted < n; i++ {
				m, err := prune(ctx, retention, batch)
				if err != nil {
					b.Fatal(err)
				}
				deleted += m
			}
			b.StopTimer()
			if deleted != n {
				b.Fatalf("pruned %d of %d rows", deleted, n)
			}
			if use, ok := cpu(n); ok {
				b.ReportMetric(float64(use.Database)/float64(time.Microsecond), "pg-µs/row")
			}
			b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "rows/s")
		})
	}
}

// BenchmarkLogHistory times a relay's read and the operator's statements
// over a log that holds a history: LOG_HISTORY_ROWS rows (default
// 1,000,000) of 256-byte payloads written over the past six days, every
// one passed by the positions, and 5,000 written in the last minute and
// pending. The history is written by transactions of LOG_HISTORY_TX_ROWS
// rows each (default 2,500), since the planner's estimates for the xid
// index follow how many rows a writer's transaction holds. One op is one
// call, reported with PostgreSQL's and this process's CPU a call; a
// request's window is the last hour:
//
//	go test -run '^$' -bench LogHistory -benchtime 5x -timeout 30m ./internal/pglog/
func BenchmarkLogHistory(b *testing.B) {
	rows, perTx := envInt(b, "LOG_HISTORY_ROWS", 1_000_000), envInt(b, "LOG_HISTORY_TX_ROWS", 2_500)
	ctx := context.Background()
	pool, open := logStoreSchema(b)
	st := open().(*logStore[pgx.Tx])
	p := st.prefix
	// One transaction a loop, committed by the server's own loop without
	// waiting for each flush.
	if _, err := pool.Exec(ctx, fmt.Sprintf(`DO $$ BEGIN
PERFORM set_config('synchronous_commit', 'off', false);
FOR i IN 0..%[2]d / %[3]d - 1 LOOP
  INSERT INTO %[1]slog (id, topic, key, payload, headers, partition, created_at)
  SELECT gen_random_uuid(), 't' || g %% 8, 'k' || g %% 1000, convert_to(repeat('x', 256), 'UTF8'), '{}', g %% 64,
    now() - interval '6 days' + (i * %[3]d + g) * (interval '6 days' / %[2]d)
  FROM generate_series(1, %[3]d) g;
  COMMIT;
END LOOP; END $$`, p, rows, perTx)); err != nil {
		b.Fatal(err)
	}
	for _, q := range []string{
		`UPDATE %[1]spositions SET lo = pg_current_snapshot(), lo_next = pg_current_xact_id(), lo_seq = (SELECT max(seq) FROM %[1]slog)`,
		`INSERT INTO %[1]slog_passes (parts, lo, lo_seq, hi, cursors, topics, counts, oldest)
SELECT array_agg(partition), array_agg(lo::text), array_agg(lo_seq), array_agg(hi::text), array_agg(band_cursor), '{}', '{}', '{}'
FROM %[1]spositions`,
		`INSERT INTO %[1]slog (id, topic, key, payload, headers, partition)
SELECT gen_random_uuid(), 't' || g %% 8, 'k' || g %% 1000, convert_to(repeat('x', 256), 'UTF8'), '{}', g %% 64
FROM generate_series(1, 5000) g`,
		`INSERT INTO %[1]sdead (seq, id, topic, key, payload, headers, partition, created_at, attempts, last_error)
SELECT -g, gen_random_uuid(), 't', 'k', '\x00', '{}', g %% 64, now(), 1, 'x' FROM generate_series(1, 100) g`,
		`VACUUM ANALYZE %[1]slog`,
		// The small tables too, as autovacuum soon does under a relay: a
		// table never analyzed is estimated at hundreds of rows, the
		// positions' 64 among them, which multiplies every per-partition
		// arm's cost.
		`ANALYZE %[1]spositions, %[1]slog_passes, %[1]slog_done, %[1]soutbox, %[1]sdead, %[1]spublished`,
	} {
		if _, err := pool.Exec(ctx, fmt.Sprintf(q, p, rows)); err != nil {
			b.Fatal(err)
		}
	}
	historyCases(b, st, func(fence postboxdriver.Fence) error {
		_, br, err := st.read(ctx, postboxdriver.FetchParams{Fence: fence, Limit: 500})
		if err == nil && br == nil {
			err = errors.New("the read found nothing")
		}
		return err
	})
}

// BenchmarkTableHistory is BenchmarkLogHistory over the drivers' own
// storage: TABLE_HISTORY_ROWS rows (default 1,000,000) in the published
// table, written over the past six days, and TABLE_HISTORY_PENDING
// (default 5,000) pending in the outbox, written with SQL as a writer in
// another language writes them.
// The read is the relay's Fetch of 500 rows:
//
//	go test -run '^$' -bench TableHistory -benchtime 5x -timeout 30m ./internal/pglog/
func BenchmarkTableHistory(b *testing.B) {
	rows, pending := envInt(b, "TABLE_HISTORY_ROWS", 1_000_000), envInt(b, "TABLE_HISTORY_PENDING", 5_000)
	ctx := context.Background()
	pool, p := testdb.Migrated(b)
	st, err := pgxdriver.New(pool, nil).Open(p)
	if err != nil {
		b.Fatal(err)
	}
	for _, q := range []string{
		`INSERT INTO %[1]spublished (seq, id, topic, key, payload, headers, partition, created_at, attempts, published_at)
SELECT -g, gen_random_uuid(), 't' || g %% 8, 'k' || g %% 1000, convert_to(repeat('x', 256), 'UTF8'), '{}', g %% 64,
  now() - interval '6 days' + g * (interval '6 days' / %[2]d), 1, now() - interval '6 days' + g * (interval '6 days' / %[2]d)
FROM generate_series(1, %[2]d) g`,
		`INSERT INTO %[1]soutbox (id, topic, key, payload, headers)
SELECT gen_random_uuid(), 't' || g %% 8, 'k' || g %% 1000, convert_to(repeat('x', 256), 'UTF8'), '{}'
FROM generate_series(1, %[3]d) g`,
		`INSERT INTO %[1]sdead (seq, id, topic, key, payload, headers, partition, created_at, attempts, last_error)
SELECT -g, gen_random_uuid(), 't', 'k', '\x00', '{}', g %% 64, now(), 1, 'x' FROM generate_series(1, 100) g`,
		`VACUUM ANALYZE %[1]spublished, %[1]soutbox, %[1]sdead`,
	} {
		if _, err := pool.Exec(ctx, fmt.Sprintf(q, p, rows, pending)); err != nil {
			b.Fatal(err)
		}
	}
	historyCases(b, st, func(fence postboxdriver.Fence) error {
		recs, err := st.Fetch(ctx, postboxdriver.FetchParams{Fence: fence, Limit: 500})
		if err == nil && len(recs) == 0 {
			err = errors.New("the read found nothing")
		}
		return err
	})
}

// historyCases runs the history benchmarks' calls over st, a relay's read
// of 500 rows through read, each as a sub-benchmark reporting
// PostgreSQL's and this process's CPU a call.
func historyCases(b *testing.B, st postboxdriver.Store[pgx.Tx], read func(postboxdriver.Fence) error) {
	ctx := context.Background()
	fence := fenceAll(b, st)
	window := postboxdriver.ReplayParams{Since: time.Now().Add(-time.Hour), Until: time.Now(), Actor: "bench", DryRun: true}
	for _, c := range []struct {
		name string
		run  func() error
	}{
		{"Read500", func() error { return read(fence) }},
		{"Stats", func() error { _, err := st.Stats(ctx); return err }},
		{"TopicStats", func() error { _, err := st.TopicStats(ctx); return err }},
		{"ReplayDryRun", func() error { _, err := st.Replay(ctx, window); return err }},
		{"ReplayCounts", func() error { _, err := st.ReplayCounts(ctx, window, 2*time.Minute); return err }},
		{"PruneNothingOld", func() error { _, err := st.PrunePublished(ctx, 7*24*time.Hour, 1000); return err }},
		{"RequeueDead100", func() error {
			_, err := st.RequeueDeadMessages(ctx, postboxdriver.DeadFilter{Topic: "none"})
			return err
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			cpu := cpuuse.Phase()
			for range b.N {
				if err := c.run(); err != nil {
					b.Fatal(err)
				}
			}
			if use, ok := cpu(b.N); ok {
				b.ReportMetric(float64(use.Database)/float64(time.Millisecond), "pg-ms/op")
				b.ReportMetric(float64(use.Self)/float64(time.Millisecond), "client-ms/op")
			}
		})
	}
}

// envInt is the integer in the environment variable name, or def.
func envInt(b *testing.B, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		b.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}
