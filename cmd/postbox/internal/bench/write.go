package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/postboxpgx"
)

// WriteOptions configure the write-overhead benchmark: domain transactions
// with and without a postbox message in them.
type WriteOptions struct {
	DatabaseURL  string
	Duration     time.Duration // of each measured phase; default 5s
	Runs         int           // default 5
	Writers      []int         // concurrent writers of the single-row cases; default 1 and 8
	PayloadBytes int           // default 256
	// Batch is the rows (and messages) per transaction of the batched
	// case; 0 means 100, negative skips the case.
	Batch int
	// BatchWriters is the concurrency of the batched case; default 8.
	BatchWriters int
	// SynchronousCommit, when set, is the writers' synchronous_commit
	// ("off" takes the WAL flush out of each commit, which leaves the CPU
	// cost of the statements to compare); default the server's.
	SynchronousCommit string
	// Warmup is run once, uncounted, before the first measured phase, so
	// connections and prepared statements exist; default 1s, negative
	// skips it.
	Warmup time.Duration
	// Pipeline makes the postbox phase's transactions postboxpgx.Tx, whose
	// messages go with the COMMIT in one round trip.
	Pipeline bool
	// NoSignals sets Config.NoSignals on the writing client: no change
	// signals after its writes.
	NoSignals bool
}

// Validate reports the first bad option, naming its command-line flag.
func (o *WriteOptions) Validate() error {
	switch {
	case o.Duration < 0:
		return fmt.Errorf("--duration must be positive, got %s", o.Duration)
	case o.Duration > 0 && o.Duration < 100*time.Millisecond:
		return fmt.Errorf("--duration must be at least 100ms, got %s", o.Duration)
	case o.Runs < 0 || o.Runs > 1000:
		return fmt.Errorf("--runs must be between 1 and 1000, got %d", o.Runs)
	case o.PayloadBytes < 0 || o.PayloadBytes > postbox.DefaultMaxPayloadBytes:
		return fmt.Errorf("--payload must be between 1 and %d bytes, got %d", postbox.DefaultMaxPayloadBytes, o.PayloadBytes)
	case o.Batch > 10_000:
		return fmt.Errorf("--batch must be at most 10000 (negative skips the batched case), got %d", o.Batch)
	case o.SynchronousCommit != "" && !slices.Contains([]string{"on", "off", "local", "remote_write", "remote_apply"}, o.SynchronousCommit):
		return fmt.Errorf("--synchronous-commit must be one of on, off, local, remote_write, remote_apply, got %q", o.SynchronousCommit)
	case o.BatchWriters < 0 || o.BatchWriters > 64:
		return fmt.Errorf("--batch-writers must be between 1 and 64, got %d", o.BatchWriters)
	}
	for _, w := range o.Writers {
		if w < 1 || w > 64 {
			return fmt.Errorf("--writers: each count must be between 1 and 64, got %d", w)
		}
	}
	return nil
}

func (o *WriteOptions) defaults() {
	defaultURLs(&o.DatabaseURL, defaultDatabaseURL, nil)
	o.Duration = cmp.Or(o.Duration, 5*time.Second)
	o.Runs = cmp.Or(o.Runs, 5)
	if len(o.Writers) == 0 {
		o.Writers = []int{1, 8}
	}
	o.PayloadBytes = cmp.Or(o.PayloadBytes, 256)
	o.Batch = cmp.Or(o.Batch, 100)
	o.BatchWriters = cmp.Or(o.BatchWriters, 8)
	o.Warmup = cmp.Or(o.Warmup, time.Second)
}

// WriteCase is one shape of transaction, measured without and with postbox.
type WriteCase struct {
	Writers int
	Rows    int // domain rows, and messages, per transaction
	Runs    []WriteRun
	// Medians over the runs; Ratio is the median of the runs' ratios.
	Without, With, Ratio float64
}

// WriteRun is one run of a case: both phases, back to back.
type WriteRun struct {
	Without, With float64 // committed transactions per second
	Ratio         float64 // With / Without
}

// WriteResult is the benchmark's outcome.
type WriteResult struct {
	Cases []WriteCase
	// Rows found in the tables at the end; they match the commits counted.
	DomainRows, OutboxRows int64
	// Average stored row sizes (pg_column_size of the row) and the tables'
	// total sizes with their indexes, in bytes: how much more each message
	// writes than a domain row.
	DomainRowBytes, OutboxRowBytes     float64
	DomainTableBytes, OutboxTableBytes int64
}

// Write measures committed domain transactions per second at each writer
// count, without postbox (the domain insert alone) and with it (the same
// insert plus Client.WriteTx of one message in the same transaction), the
// two phases alternating so that drift on a shared machine favours
// neither. A batched case writes Batch domain rows per transaction, and
// Batch messages with them in the postbox phase.
func Write(ctx context.Context, opts WriteOptions, out io.Writer) (WriteResult, error) {
	var res WriteResult
	if err := opts.Validate(); err != nil {
		return res, err
	}
	opts.defaults()
	maxWriters := slices.Max(append(slices.Clone(opts.Writers), opts.BatchWriters))
	pool, err := writersPool(ctx, opts.DatabaseURL, maxWriters, func(cfg *pgxpool.Config) {
		if opts.SynchronousCommit != "" {
			cfg.ConnConfig.RuntimeParams["synchronous_commit"] = opts.SynchronousCommit
		}
	})
	if err != nil {
		return res, err
	}
	defer pool.Close()
	prefix := "bench_" + randTag() + "_"
	driver, drop, err := migrated(ctx, pool, prefix)
	if err != nil {
		return res, err
	}
	defer drop()
	orders := prefix + "orders"
	if _, err := pool.Exec(ctx, `CREATE TABLE `+orders+` (
		id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		customer text NOT NULL,
		amount_cents bigint NOT NULL,
		status text NOT NULL,
		created_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return res, err
	}
	// A client that only writes: no publisher, no relay. The rows it
	// writes stay pending; the benchmark measures the write alone.
	client, err := postbox.NewClient(driver, &postbox.Config{Prefix: prefix, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), NoSignals: opts.NoSignals})
	if err != nil {
		return res, err
	}
	w := &writeBench{pool: pool, client: client, orders: orders, payload: makePayload(opts.PayloadBytes), opts: opts}

	type shape struct{ writers, rows int }
	var shapes []shape
	for _, n := range opts.Writers {
		shapes = append(shapes, shape{n, 1})
	}
	if opts.Batch > 0 {
		shapes = append(shapes, shape{opts.BatchWriters, opts.Batch})
	}
	var wantDomain, wantOutbox int64
	if opts.Warmup > 0 {
		fmt.Fprintf(out, "warm-up: %s at %d writers, both phases\n", opts.Warmup, maxWriters)
		for _, with := range []bool{false, true} {
			n, _, err := w.phase(ctx, maxWriters, 1, with, opts.Warmup/2)
			if err != nil {
				return res, err
			}
			wantDomain += n
			if with {
				wantOutbox += n
			}
		}
	}
	res.Cases = make([]WriteCase, len(shapes))
	for i, s := range shapes {
		res.Cases[i] = WriteCase{Writers: s.writers, Rows: s.rows}
	}
	for run := range opts.Runs {
		for i, s := range shapes {
			// Alternate which phase goes first, run by run.
			order := []bool{false, true}
			if run%2 == 1 {
				order = []bool{true, false}
			}
			var r WriteRun
			for _, with := range order {
				n, rate, err := w.phase(ctx, s.writers, s.rows, with, opts.Duration)
				if err != nil {
					return res, err
				}
				wantDomain += n * int64(s.rows)
				label := "without postbox"
				if with {
					wantOutbox += n * int64(s.rows)
					r.With = rate
					label = "with postbox   "
				} else {
					r.Without = rate
				}
				fmt.Fprintf(out, "run %d/%d  %2d writers  %3d row(s)/tx  %s  %8.0f tx/s\n", run+1, opts.Runs, s.writers, s.rows, label, rate)
			}
			r.Ratio = r.With / r.Without
			res.Cases[i].Runs = append(res.Cases[i].Runs, r)
		}
	}
	for i := range res.Cases {
		c := &res.Cases[i]
		c.Without = medianOf(c.Runs, func(r WriteRun) float64 { return r.Without })
		c.With = medianOf(c.Runs, func(r WriteRun) float64 { return r.With })
		c.Ratio = medianOf(c.Runs, func(r WriteRun) float64 { return r.Ratio })
	}
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+orders).Scan(&res.DomainRows); err != nil {
		return res, err
	}
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+prefix+"outbox").Scan(&res.OutboxRows); err != nil {
		return res, err
	}
	if err := pool.QueryRow(ctx, `SELECT
		(SELECT coalesce(avg(pg_column_size(d.*)), 0) FROM `+orders+` d),
		(SELECT coalesce(avg(pg_column_size(o.*)), 0) FROM `+prefix+`outbox o),
		pg_total_relation_size($1), pg_total_relation_size($2)`, orders, prefix+"outbox").Scan(
		&res.DomainRowBytes, &res.OutboxRowBytes, &res.DomainTableBytes, &res.OutboxTableBytes); err != nil {
		return res, err
	}
	if res.DomainRows != wantDomain || res.OutboxRows != wantOutbox {
		return res, fmt.Errorf("the tables hold %d domain rows and %d outbox rows, but %d and %d were committed", res.DomainRows, res.OutboxRows, wantDomain, wantOutbox)
	}
	return res, nil
}

type writeBench struct {
	pool    *pgxpool.Pool
	client  *postbox.Client[pgx.Tx]
	orders  string
	payload []byte
	opts    WriteOptions
}

// phase runs writers for d, each committing transactions of rows domain
// rows (and as many messages when with is set) one after another; it
// returns the transactions committed and their rate over the phase.
func (w *writeBench) phase(ctx context.Context, writers, rows int, with bool, d time.Duration) (int64, float64, error) {
	var stop atomic.Bool
	var committed atomic.Int64
	errs := make(chan error, writers)
	var wg sync.WaitGroup
	start := time.Now()
	for n := range writers {
		wg.Go(func() {
			customers := make([]string, rows)
			amounts := make([]int64, rows)
			msgs := make([]postbox.Message, rows)
			for i := 0; !stop.Load(); i++ {
				for j := range rows {
					customers[j] = fmt.Sprintf("customer-%d", (n*7919+i*rows+j)%1000)
					amounts[j] = int64(1000 + (i+j)%9000)
					msgs[j] = postbox.Message{Topic: "orders.created", Key: customers[j], Payload: w.payload}
				}
				if err := w.tx(ctx, customers, amounts, msgs, with); err != nil {
					errs <- err
					stop.Store(true)
					return
				}
				committed.Add(1)
			}
		})
	}
	t := time.NewTimer(d)
	select {
	case <-t.C:
	case <-ctx.Done():
	}
	t.Stop()
	stop.Store(true)
	wg.Wait()
	elapsed := time.Since(start)
	close(errs)
	if err := errors.Join(collect(errs)...); err != nil {
		return committed.Load(), 0, err
	}
	if err := ctx.Err(); err != nil {
		return committed.Load(), 0, err
	}
	n := committed.Load()
	return n, float64(n) / elapsed.Seconds(), nil
}

func collect(errs <-chan error) []error {
	var out []error
	for err := range errs {
		out = append(out, err)
	}
	return out
}

// tx is one domain transaction: the order rows, with one statement, and
// with set, the messages through WriteTx (one more statement).
// With Pipeline, the messages go with the COMMIT instead.
func (w *writeBench) tx(ctx context.Context, customers []string, amounts []int64, msgs []postbox.Message, with bool) error {
	body := func(tx pgx.Tx) error {
		var err error
		if len(customers) == 1 {
			_, err = tx.Exec(ctx, "INSERT INTO "+w.orders+" (customer, amount_cents, status) VALUES ($1, $2, 'new')", customers[0], amounts[0])
		} else {
			_, err = tx.Exec(ctx, "INSERT INTO "+w.orders+" (customer, amount_cents, status) SELECT unnest($1::text[]), unnest($2::bigint[]), 'new'", customers, amounts)
		}
		if err != nil || !with {
			return err
		}
		return w.client.WriteTx(ctx, tx, msgs...)
	}
	if !with || !w.opts.Pipeline {
		return pgx.BeginFunc(ctx, w.pool, body)
	}
	tx, err := postboxpgx.Begin(ctx, w.pool)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if err := body(tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// medianOf returns the median of f over xs; 0 for none.
func medianOf[T any](xs []T, f func(T) float64) float64 {
	vs := make([]float64, 0, len(xs))
	for _, x := range xs {
		if v := f(x); !math.IsNaN(v) {
			vs = append(vs, v)
		}
	}
	if len(vs) == 0 {
		return 0
	}
	sort.Float64s(vs)
	if len(vs)%2 == 1 {
		return vs[len(vs)/2]
	}
	return (vs[len(vs)/2-1] + vs[len(vs)/2]) / 2
}
