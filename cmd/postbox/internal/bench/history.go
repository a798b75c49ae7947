package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/pgsql"
	"github.com/postbox-go/postbox/internal/testdb"
	"github.com/postbox-go/postbox/postboxdriver"
	"github.com/postbox-go/postbox/postboxpgx"
)

// HistoryOptions configure the history benchmark: claim latency on a fixed
// pending backlog while the published history grows.
type HistoryOptions struct {
	DatabaseURL string
	// Max is the history size of the last step; the steps are 0, Max/10,
	// 3·Max/10 and Max (0, 1M, 3M, 10M by default).
	Max int
	// Pending is the fixed backlog the fetch reads from; default 10,000.
	Pending int
	// Reps is the number of timed fetches per step; default 1,000.
	Reps int
	// Keys is the number of distinct ordering keys, in the backlog and
	// the history; default 1,000.
	Keys int
	// FillChunk is the rows per INSERT … SELECT of the fill; default
	// 500,000.
	FillChunk int
	// Explain, when set, captures EXPLAIN (ANALYZE, BUFFERS) of the fetch
	// at the first and the last step.
	Explain bool
}

// HistoryStep is one step's figures.
type HistoryStep struct {
	Published   int64         // rows in the history
	HistoryMB   float64       // the history table with its indexes
	FillRate    float64       // history rows inserted per second to reach this step
	FetchP50    time.Duration // one lane's fetch of BatchSize rows
	FetchP99    time.Duration
	MarkP50     time.Duration // one batch moved to the history
	MarkP99     time.Duration
	FetchRatio  float64 // FetchP50 / the first step's FetchP50
	FetchRatio9 float64 // FetchP99 / the first step's FetchP99
	MarkRatio   float64 // MarkP50 / the first step's MarkP50
	// The control (same backlog, empty history), timed in alternation
	// with the measured tables, and the ratios to it.
	CtlFetchP50, CtlFetchP99, CtlMarkP50 time.Duration
	FetchVsCtl, FetchVsCtl9, MarkVsCtl   float64
}

// HistoryResult holds every step, and the EXPLAIN output when asked.
type HistoryResult struct {
	Steps        []HistoryStep
	ExplainFirst string
	ExplainLast  string
}

// Validate checks the options, naming the flag of each bad value.
func (o *HistoryOptions) Validate() error {
	var errs []error
	if o.Max < 10 || o.Max > 100_000_000 {
		errs = append(errs, fmt.Errorf("--max %d: want 10 to 100000000 rows", o.Max))
	}
	if o.Pending < 1 || o.Pending > 10_000_000 {
		errs = append(errs, fmt.Errorf("--pending %d: want 1 to 10000000 rows", o.Pending))
	}
	if o.Reps < 1 || o.Reps > 1_000_000 {
		errs = append(errs, fmt.Errorf("--reps %d: want 1 to 1000000", o.Reps))
	}
	if o.Keys < 1 {
		errs = append(errs, fmt.Errorf("--keys %d: want at least 1", o.Keys))
	}
	if o.FillChunk < 1 {
		errs = append(errs, fmt.Errorf("--fill-chunk %d: want at least 1", o.FillChunk))
	}
	return errors.Join(errs...)
}

func (o *HistoryOptions) defaults() {
	defaultURLs(&o.DatabaseURL, testdb.PostgresURL(), nil)
	o.Max = cmp.Or(o.Max, 10_000_000)
	o.Pending = cmp.Or(o.Pending, 10_000)
	o.Reps = cmp.Or(o.Reps, 1000)
	o.Keys = cmp.Or(o.Keys, 1000)
	o.FillChunk = cmp.Or(o.FillChunk, 500_000)
}

// uuidv7SQL makes a UUIDv7-shaped id from a timestamp expression ts and a
// row number n, as postbox makes them: time-ordered, so the history's id
// index grows at its right edge as it does in production.
func uuidv7SQL(ts, n string) string {
	return `(lpad(to_hex((extract(epoch FROM ` + ts + `) * 1000)::bigint), 12, '0') || '7' ||
  substr(md5(` + n + `::text), 1, 3) || '8' || substr(md5(` + n + `::text), 4, 15))::uuid`
}

// History fills a published history step by step and, at each step,
// times the relay's own fetch statement on a fixed pending backlog, then
// the mark that moves the backlog into the history batch by batch.
//
// A control set of tables, with the same backlog and an empty history, is
// timed in alternation with the measured one, so each step also has a
// baseline taken at the same moments: on a shared machine the load
// changes between steps, and the ratio to the control separates the
// history's effect from it.
func History(ctx context.Context, opts HistoryOptions, out io.Writer) (HistoryResult, error) {
	opts.defaults()
	var res HistoryResult
	if err := opts.Validate(); err != nil {
		return res, err
	}
	pool, err := pgxpool.New(ctx, opts.DatabaseURL)
	if err != nil {
		return res, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	defer pool.Close()
	tag := randTag()
	prefix := "bench_hist_" + tag + "_"
	ctlPrefix := "bench_histctl_" + tag + "_"
	driver := postboxpgx.New(pool)
	var stores [2]postboxdriver.Executor
	for i, p := range []string{prefix, ctlPrefix} {
		_, drop, err := migrated(ctx, pool, p)
		if err != nil {
			return res, err
		}
		defer drop()
		if stores[i], err = driver.Open(p); err != nil {
			return res, err
		}
		// Outbox seqs come after the history's, as they would in production.
		if _, err := pool.Exec(ctx, fmt.Sprintf("ALTER TABLE %soutbox ALTER COLUMN seq RESTART WITH %d", p, opts.Max+1)); err != nil {
			return res, err
		}
	}
	// One lane's share at default settings: every 4th of 64 partitions.
	parts := map[int]int64{}
	for p := 0; p < 64; p += postbox.DefaultLanes {
		parts[p] = 0
	}
	steps := []int{0, opts.Max / 10, 3 * opts.Max / 10, opts.Max}
	filled := 0
	for i, target := range steps {
		st := HistoryStep{}
		prev := 0
		if i > 0 {
			prev = steps[i-1] //nolint:gosec // i > 0
		}
		if target > filled {
			fmt.Fprintf(out, "history: filling %s to %d rows\n", prefix+"published", target)
			began := time.Now()
			for filled < target {
				n := min(opts.FillChunk, target-filled)
				if err := fillHistory(ctx, pool, prefix, filled, n, opts.Max, opts.Keys); err != nil {
					return res, err
				}
				filled += n
				fmt.Fprintf(out, "  %d rows (%.0f rows/s)\n", filled, float64(filled-prev)/time.Since(began).Seconds())
			}
			st.FillRate = float64(target-prev) / time.Since(began).Seconds()
		}
		for _, p := range []string{prefix, ctlPrefix} {
			if err := fillPending(ctx, pool, p, opts.Pending, opts.Keys); err != nil {
				return res, err
			}
			if _, err := pool.Exec(ctx, "VACUUM ANALYZE "+p+"outbox"); err != nil {
				return res, err
			}
			if _, err := pool.Exec(ctx, "ANALYZE "+p+"published"); err != nil {
				return res, err
			}
		}
		var bytes int64
		if err := pool.QueryRow(ctx, "SELECT count(*), pg_total_relation_size($1::regclass) FROM "+prefix+"published", prefix+"published").Scan(&st.Published, &bytes); err != nil {
			return res, err
		}
		st.HistoryMB = float64(bytes) / (1 << 20)
		fmt.Fprintf(out, "step %d: %d published rows (%.0f MB), %d pending: timing %d fetches, alternating with the control\n", i, st.Published, st.HistoryMB, opts.Pending, opts.Reps)
		fence := postboxdriver.Fence{Owner: "bench", Generations: parts}
		params := postboxdriver.FetchParams{Fence: fence, Limit: postbox.DefaultBatchSize}
		// Warm up, as a running relay would be.
		for range 10 {
			for _, s := range stores {
				if _, err := s.Fetch(ctx, params); err != nil {
					return res, err
				}
			}
		}
		var lat [2][]time.Duration
		for range opts.Reps {
			for j, s := range stores {
				began := time.Now()
				recs, err := s.Fetch(ctx, params)
				if err != nil {
					return res, err
				}
				lat[j] = append(lat[j], time.Since(began))
				if len(recs) == 0 {
					return res, fmt.Errorf("fetch returned no row of a %d-row backlog", opts.Pending)
				}
			}
		}
		st.FetchP50, st.FetchP99 = durQuantile(lat[0], 0.50), durQuantile(lat[0], 0.99)
		st.CtlFetchP50, st.CtlFetchP99 = durQuantile(lat[1], 0.50), durQuantile(lat[1], 0.99)
		if opts.Explain && (i == 0 || i == len(steps)-1) {
			plan, err := explainFetch(ctx, pool, prefix, parts)
			if err != nil {
				return res, err
			}
			if i == 0 {
				res.ExplainFirst = plan
			} else {
				res.ExplainLast = plan
			}
		}
		// The mark: drain both backlogs in batches, alternating, moving
		// each into its history with the relay's fenced statement.
		marks, err := timeMarks(ctx, stores, opts.Pending)
		if err != nil {
			return res, err
		}
		st.MarkP50, st.MarkP99 = durQuantile(marks[0], 0.50), durQuantile(marks[0], 0.99)
		st.CtlMarkP50 = durQuantile(marks[1], 0.50)
		// The control's history stays empty.
		if _, err := pool.Exec(ctx, "TRUNCATE "+ctlPrefix+"published"); err != nil {
			return res, err
		}
		res.Steps = append(res.Steps, st)
		first := &res.Steps[0]
		last := &res.Steps[len(res.Steps)-1]
		last.FetchRatio = durRatio(last.FetchP50, first.FetchP50)
		last.FetchRatio9 = durRatio(last.FetchP99, first.FetchP99)
		last.MarkRatio = durRatio(last.MarkP50, first.MarkP50)
		last.FetchVsCtl = durRatio(last.FetchP50, last.CtlFetchP50)
		last.FetchVsCtl9 = durRatio(last.FetchP99, last.CtlFetchP99)
		last.MarkVsCtl = durRatio(last.MarkP50, last.CtlMarkP50)
		fmt.Fprintf(out, "  fetch p50 %s p99 %s (control %s, %s: ×%.2f, ×%.2f); mark p50 %s p99 %s (control %s: ×%.2f)\n",
			last.FetchP50.Round(time.Microsecond), last.FetchP99.Round(time.Microsecond),
			last.CtlFetchP50.Round(time.Microsecond), last.CtlFetchP99.Round(time.Microsecond), last.FetchVsCtl, last.FetchVsCtl9,
			last.MarkP50.Round(time.Microsecond), last.MarkP99.Round(time.Microsecond), last.CtlMarkP50.Round(time.Microsecond), last.MarkVsCtl)
	}
	return res, nil
}

func durRatio(a, b time.Duration) float64 {
	if b <= 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// fillHistory inserts n history rows numbered from..from+n-1 with one
// statement: ids, topics, keys, 256-byte payloads, CloudEvents headers,
// and published_at spread over the six days before now (inside the
// default 7-day retention), in seq order.
func fillHistory(ctx context.Context, pool *pgxpool.Pool, prefix string, from, n, total, keys int) error {
	ts := `now() - interval '6 days' + (i::float8 / $3) * interval '6 days'`
	// One md5 per row feeds the id's random bits, the payload and the
	// trace id.
	q := `INSERT INTO ` + prefix + `published (seq, id, topic, key, payload, headers, partition, created_at, attempts, published_at)
SELECT i, (lpad(to_hex((extract(epoch FROM ts) * 1000)::bigint), 12, '0') || '7' || substr(h, 1, 3) || '8' || substr(h, 4, 15))::uuid,
  'orders.' || (ARRAY['created','paid','shipped','cancelled'])[1 + i % 4],
  'key-' || (i % $4),
  decode(repeat(h, 8), 'hex'),
  jsonb_build_object('ce-source', 'bench', 'traceparent', '00-' || h || substr(h, 9, 16) || '-01'),
  (i % $4) % 64,
  ts - interval '20 milliseconds',
  0,
  ts
FROM generate_series($1::bigint, $2::bigint) AS i,
  LATERAL (SELECT md5(i::text) AS h, ` + ts + ` AS ts) AS x`
	_, err := pool.Exec(ctx, q, from+1, from+n, total, keys)
	return err
}

// fillPending writes n pending rows of the same shape.
func fillPending(ctx context.Context, pool *pgxpool.Pool, prefix string, n, keys int) error {
	q := `INSERT INTO ` + prefix + `outbox (id, topic, key, payload, headers)
SELECT ` + uuidv7SQL("clock_timestamp()", "i") + `,
  'orders.' || (ARRAY['created','paid','shipped','cancelled'])[1 + i % 4],
  'key-' || (i % $2),
  decode(repeat(md5(i::text), 8), 'hex'),
  jsonb_build_object('ce-source', 'bench')
FROM generate_series(1, $1::bigint) AS i`
	_, err := pool.Exec(ctx, q, n, keys)
	return err
}

// timeMarks leases every partition of each store and moves each backlog
// to its history a batch at a time, the stores in alternation, timing
// each mark.
func timeMarks(ctx context.Context, stores [2]postboxdriver.Executor, pending int) ([2][]time.Duration, error) {
	var lat [2][]time.Duration
	all := make([]int, 64)
	for i := range all {
		all[i] = i
	}
	owner := postbox.NewID()
	var fences [2]postboxdriver.Fence
	for j, s := range stores {
		leases, err := s.AcquireLeases(ctx, owner, all, time.Minute)
		if err != nil {
			return lat, err
		}
		defer func() { _ = s.ReleaseLeases(context.WithoutCancel(ctx), owner, all) }()
		fences[j] = postboxdriver.Fence{Owner: owner, Generations: map[int]int64{}}
		for _, l := range leases {
			fences[j].Generations[l.Partition] = l.Generation
		}
	}
	var moved [2]int
	for moved[0] < pending || moved[1] < pending {
		for j, s := range stores {
			if moved[j] >= pending {
				continue
			}
			recs, err := s.Fetch(ctx, postboxdriver.FetchParams{Fence: fences[j], Limit: postbox.DefaultBatchSize})
			if err != nil {
				return lat, err
			}
			if len(recs) == 0 {
				return lat, fmt.Errorf("backlog empty after %d of %d rows moved", moved[j], pending)
			}
			seqs := make([]int64, len(recs))
			for i := range recs {
				seqs[i] = recs[i].Seq
			}
			began := time.Now()
			settled, err := s.Settle(ctx, fences[j], postboxdriver.Outcome{Read: seqs, Published: seqs}, 25)
			n := settled.Published
			if err != nil {
				return lat, err
			}
			lat[j] = append(lat[j], time.Since(began))
			if n != len(seqs) {
				return lat, fmt.Errorf("mark moved %d of %d rows", n, len(seqs))
			}
			moved[j] += n
		}
	}
	return lat, nil
}

func explainFetch(ctx context.Context, pool *pgxpool.Pool, prefix string, parts map[int]int64) (string, error) {
	ps := make([]int32, 0, len(parts))
	for p := range parts {
		ps = append(ps, int32(p))
	}
	rows, err := pool.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS) "+pgsql.FetchStatement(prefix), ps, postbox.DefaultBatchSize)
	if err != nil {
		return "", fmt.Errorf("explain the fetch: %w", err)
	}
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			return "", err
		}
		b.WriteString(line)
		b.WriteByte('\n')
	}
	return b.String(), rows.Err()
}

// durQuantile returns the q-quantile (0..1) of ds by the nearest-rank
// method; ds is sorted in place.
func durQuantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	i := int(q*float64(len(ds))+0.999999) - 1
	return ds[max(0, min(i, len(ds)-1))]
}
