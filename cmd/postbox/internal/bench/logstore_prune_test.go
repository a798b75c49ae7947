package bench

import (
	"context"
	"testing"
	"time"

	"github.com/postbox-go/postbox/postboxpgx"
)

// BenchmarkPrunePublished deletes history older than the retention by
// batches of 1,000 rows, one batch an op: from the published table, where
// the drivers move every published row (table), and from the log, whose
// rows stay where they were written until retention deletes them (log).
// The history is b.N batches of rows of 256-byte payloads, a day past a
// week's retention. pg-µs/row is PostgreSQL's CPU per deleted row:
//
//	go test -run '^$' -bench PrunePublished -benchtime 200x ./cmd/postbox/internal/bench/
func BenchmarkPrunePublished(b *testing.B) {
	const batch, retention = 1000, 7 * 24 * time.Hour
	for _, storage := range []string{"table", "log"} {
		b.Run(storage, func(b *testing.B) {
			ctx := context.Background()
			pool, open := logStoreSchema(b)
			st := open().(*logStore)
			p, n := st.prefix, b.N*batch
			prune := st.PrunePublished
			if storage == "table" {
				inner, err := postboxpgx.New(pool).Open(p)
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
				// The rows, then every position past them, noted as a
				// relay's record notes it, eight days ago.
				if _, err := pool.Exec(ctx, `INSERT INTO `+p+`log (id, topic, key, payload, headers, partition)
SELECT gen_random_uuid(), 't', 'k' || g % 1000, convert_to(repeat('x', 256), 'UTF8'), '{}', g % 64
FROM generate_series(1, $1::int) g`, n); err != nil {
					b.Fatal(err)
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
			cpu := cpuPhase()
			b.ResetTimer()
			deleted := 0
			for range b.N {
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
