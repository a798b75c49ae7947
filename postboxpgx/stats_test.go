package postboxpgx_test

import (
	"context"
	"testing"

	"github.com/postbox-go/postbox/internal/testdb"
	"github.com/postbox-go/postbox/postboxdriver"
	"github.com/postbox-go/postbox/postboxpgx"
)

// Stats counts the pending and published rows exactly up to
// postboxdriver.StatsExactUpTo, and past it reports the planner's
// estimate, scaled to the tables' size now, flagged as one; a table with
// no statistics yet is counted whole. Autovacuum is off on the two tables
// so that their statistics are only those the test takes.
func TestStatsEstimatesPastTheExactCount(t *testing.T) {
	ctx := context.Background()
	pool, prefix := testdb.Migrated(t)
	st, err := postboxpgx.New(pool).Open(prefix)
	if err != nil {
		t.Fatal(err)
	}
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql, args...); err != nil {
			t.Fatal(err)
		}
	}
	exec(`ALTER TABLE ` + prefix + `outbox SET (autovacuum_enabled = false)`)
	exec(`ALTER TABLE ` + prefix + `published SET (autovacuum_enabled = false)`)
	total := 0
	add := func(n int) {
		t.Helper()
		// The outbox's rows as a writer in another language inserts them;
		// the history's as the relay moves them there.
		exec(`INSERT INTO `+prefix+`outbox (id, topic, key, payload, headers)
SELECT gen_random_uuid(), 't', 'k' || g, convert_to(repeat('x', 256), 'UTF8'), '{}' FROM generate_series(1, $1::int) g`, n)
		exec(`INSERT INTO `+prefix+`published (seq, id, topic, key, payload, headers, partition, created_at, attempts)
SELECT -($2::int + g), gen_random_uuid(), 't', 'k' || g, convert_to(repeat('x', 256), 'UTF8'), '{}', g % 64, now(), 1
FROM generate_series(1, $1::int) g`, n, total)
		total += n
	}
	stats := func() postboxdriver.Stats {
		t.Helper()
		s, err := st.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	exact := func(what string) {
		t.Helper()
		s := stats()
		if s.Pending != int64(total) || s.Published != int64(total) || s.PendingEstimated || s.PublishedEstimated {
			t.Fatalf("%s: pending %d (estimated %v), published %d (estimated %v); want %d each, counted",
				what, s.Pending, s.PendingEstimated, s.Published, s.PublishedEstimated, total)
		}
	}

	add(postboxdriver.StatsExactUpTo)
	exact("at the exact count's limit")
	add(1)
	exact("past the limit, with no statistics")

	exec(`ANALYZE ` + prefix + `outbox, ` + prefix + `published`)
	add(2 * postboxdriver.StatsExactUpTo)
	s := stats()
	near := func(n int64) bool { return n > int64(total)*9/10 && n < int64(total)*11/10 }
	if !s.PendingEstimated || !s.PublishedEstimated || !near(s.Pending) || !near(s.Published) {
		t.Fatalf("past the limit, analyzed at a third of the rows: pending %d (estimated %v), published %d (estimated %v); want estimates within 10%% of %d",
			s.Pending, s.PendingEstimated, s.Published, s.PublishedEstimated, total)
	}
}
