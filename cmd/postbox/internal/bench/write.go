package bench

import (
	"cmp"
	"context"
	"encoding/json"
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

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/cmd/postbox/internal/relayd"
	"github.com/postbox-go/postbox/internal/cpuuse"
	"github.com/postbox-go/postbox/internal/pglog"
	"github.com/postbox-go/postbox/postboxpgx"
)

// WriteOptions configure the write-overhead benchmark: domain transactions
// with and without a postbox message in them.
type WriteOptions struct {
	// DatabaseURL is PostgreSQL's (postgres://) or MySQL's or MariaDB's
	// (mysql://).
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
	// PostgreSQL only: MySQL's innodb_flush_log_at_trx_commit is the
	// server's, for every session.
	SynchronousCommit string
	// Warmup is run once, uncounted, before the first measured phase, so
	// connections and prepared statements exist; default 1s, negative
	// skips it.
	Warmup time.Duration
	// Pipeline makes the postbox phase's transactions postboxpgx.Tx, whose
	// messages go with the COMMIT in one round trip. PostgreSQL only.
	Pipeline bool
	// NoBare skips the third phase of each case, the bare row: the domain
	// rows and as many rows of the outbox's columns inserted with plain
	// SQL into a table with its primary key alone, no postbox rule, no
	// other index. It is the database's raw insert rate for the same data.
	NoBare bool
	// NoSignals sets Config.NoSignals on the writing client: no change
	// signals after its writes.
	NoSignals bool
	// Emit adds a fourth phase: the domain rows and, in place of each
	// message's row, a transactional pg_logical_emit_message carrying the
	// message (its id, topic, key, stored headers and payload), the write
	// of an outbox kept in the WAL and read by logical decoding. With
	// Pipeline it goes with the COMMIT, in one round trip. PostgreSQL
	// with wal_level = logical only.
	Emit bool
	// Storage is where the postbox phase's messages go: "table" (the
	// default, the outbox) or "log" (PostgreSQL: the log read by snapshot
	// bands, design §3; internal/pglog), its insert a statement of its own.
	Storage string
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
	case o.Storage != "" && o.Storage != "table" && o.Storage != "log":
		return fmt.Errorf("--storage is table or log, not %q", o.Storage)
	}
	if relayd.URLKind(o.DatabaseURL) == relayd.KindMySQL {
		switch {
		case o.SynchronousCommit != "":
			return fmt.Errorf("--synchronous-commit is PostgreSQL's: on MySQL and MariaDB the commit's flush is the server's innodb_flush_log_at_trx_commit")
		case o.Pipeline:
			return fmt.Errorf("--pipeline is PostgreSQL's (postboxpgx.Begin)")
		case o.Emit:
			return fmt.Errorf("--emit is PostgreSQL's (pg_logical_emit_message)")
		case o.Storage == "log":
			return fmt.Errorf("--storage log needs PostgreSQL: MySQL has no snapshot a statement can test ids against")
		}
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

// WriteCase is one shape of transaction, measured without and with postbox
// (and with a bare row instead, unless WriteOptions.NoBare).
type WriteCase struct {
	Writers int
	Rows    int // domain rows, and messages, per transaction
	Runs    []WriteRun
	// Medians over the runs; Ratio and RatioToBare are the medians of the
	// runs' ratios.
	Without, With, Ratio float64
	Bare, RatioToBare    float64
	// Emitted is the rate with an emitted message in place of each row,
	// and RatioEmitted Emitted / Without; zero without WriteOptions.Emit.
	Emitted, RatioEmitted float64
	// The medians of the runs' CPU per transaction, figure by figure.
	WithoutCPU, WithCPU, BareCPU, EmittedCPU CPUUse
}

// WriteRun is one run of a case: its phases, back to back.
type WriteRun struct {
	Without, With float64 // committed transactions per second
	Ratio         float64 // With / Without
	// Bare is the rate with a bare row in place of each message, and
	// RatioToBare With / Bare; zero with WriteOptions.NoBare.
	Bare, RatioToBare float64
	// Emitted is the rate with an emitted message in place of each row,
	// and RatioEmitted Emitted / Without; zero without WriteOptions.Emit.
	Emitted, RatioEmitted float64
	// The CPU per committed transaction of each phase: Self is the
	// writers' (this process), Database the server's; CPUKnown is false
	// where /proc could not be read.
	WithoutCPU, WithCPU, BareCPU, EmittedCPU CPUUse
	CPUKnown                                 bool
}

// WriteResult is the benchmark's outcome.
type WriteResult struct {
	Database string // PostgreSQL, MariaDB or MySQL
	Cases    []WriteCase
	// Rows found in the tables at the end; they match the commits counted.
	// The Outbox figures here and below are the log's with --storage log.
	DomainRows, OutboxRows, BareRows int64
	// EmittedMessages is the messages the emitted phases committed.
	EmittedMessages int64
	// Average stored row sizes and the tables' total sizes with their
	// indexes, in bytes: how much more each message writes than a domain
	// row. PostgreSQL's row size is pg_column_size of the row; InnoDB's
	// is its estimate after ANALYZE TABLE (avg_row_length).
	DomainRowBytes, OutboxRowBytes, BareRowBytes       float64
	DomainTableBytes, OutboxTableBytes, BareTableBytes int64
}

// writeMode is what a transaction of the write benchmark holds besides its
// domain rows.
type writeMode int

const (
	withoutPostbox writeMode = iota // the domain rows alone
	withPostbox                     // and Client.WriteTx of as many messages
	bareRow                         // and as many bare rows, with plain SQL
	emitted                         // and as many pg_logical_emit_message
)

func (m writeMode) String() string {
	return [...]string{"without postbox", "with postbox   ", "bare row       ", "emitted        "}[m]
}

// writeTables are the tables of a write benchmark's run.
type writeTables struct{ orders, bare string }

// writeRows are the rows of one transaction: the domain rows' columns, the
// messages, and for the bare rows, their ids and stored headers.
type writeRows struct {
	customers    []string
	amounts      []int64
	msgs         []postbox.Message
	ids, headers []string
}

// emitted is what an emitted message of each row carries, the bytes of a
// bare row: id, topic, key, stored headers and payload, NUL-separated.
func (r *writeRows) emitted() [][]byte {
	out := make([][]byte, len(r.msgs))
	for i, m := range r.msgs {
		b := make([]byte, 0, len(r.ids[i])+len(m.Topic)+len(m.Key)+len(r.headers[i])+len(m.Payload)+4)
		for _, f := range []string{r.ids[i], m.Topic, m.Key, r.headers[i]} {
			b = append(append(b, f...), 0)
		}
		out[i] = append(b, m.Payload...)
	}
	return out
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
	db, err := openDatabase(ctx, opts.DatabaseURL, maxWriters, opts.SynchronousCommit)
	if err != nil {
		return res, err
	}
	defer db.close()
	if pg, ok := db.(*pgDatabase); ok {
		pg.pipeline = opts.Pipeline
		if opts.Emit {
			if err := pg.checkLogical(ctx); err != nil {
				return res, err
			}
		}
	}
	res.Database = db.name()
	prefix := "bench_" + randTag() + "_"
	drop, err := db.migrate(ctx, prefix)
	if err != nil {
		return res, err
	}
	defer drop()
	tables := writeTables{orders: prefix + "orders", bare: prefix + "bare"}
	if err := db.createWriteTables(ctx, tables.orders, tables.bare); err != nil {
		return res, err
	}
	// A client that only writes: no publisher, no relay. The rows it
	// writes stay pending; the benchmark measures the write alone.
	cfg := &postbox.Config{Prefix: prefix, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), NoSignals: opts.NoSignals}
	var client benchClient
	messages := prefix + "outbox"
	if pg, ok := db.(*pgDatabase); ok && opts.Storage == "log" {
		messages = prefix + "log"
		if err = pglog.UseLog(ctx, pg.pool, prefix); err == nil {
			client, err = postbox.NewClient(postboxpgx.New(pg.pool, postboxpgx.WithLog()), cfg)
		}
	} else {
		client, err = db.newClient(cfg)
	}
	if err != nil {
		return res, err
	}
	w := &writeBench{db: db, client: client, tables: tables, payload: makePayload(opts.PayloadBytes), opts: opts}
	modes := []writeMode{withoutPostbox, bareRow, withPostbox}
	if opts.NoBare {
		modes = []writeMode{withoutPostbox, withPostbox}
	}
	if opts.Emit {
		modes = append(modes, emitted)
	}

	type shape struct{ writers, rows int }
	var shapes []shape
	for _, n := range opts.Writers {
		shapes = append(shapes, shape{n, 1})
	}
	if opts.Batch > 0 {
		shapes = append(shapes, shape{opts.BatchWriters, opts.Batch})
	}
	var wantDomain, wantOutbox, wantBare int64
	count := func(mode writeMode, n int64) {
		wantDomain += n
		switch mode {
		case withPostbox:
			wantOutbox += n
		case bareRow:
			wantBare += n
		case emitted:
			res.EmittedMessages += n
		}
	}
	fmt.Fprintf(out, "%s: writing to %sorders, and to %s (or a bare row's table)\n", db.name(), prefix, messages)
	if opts.Warmup > 0 {
		fmt.Fprintf(out, "warm-up: %s at %d writers, every phase\n", opts.Warmup, maxWriters)
		for _, mode := range modes {
			n, _, _, _, err := w.phase(ctx, maxWriters, 1, mode, opts.Warmup/time.Duration(len(modes)))
			if err != nil {
				return res, err
			}
			count(mode, n)
		}
	}
	res.Cases = make([]WriteCase, len(shapes))
	for i, s := range shapes {
		res.Cases[i] = WriteCase{Writers: s.writers, Rows: s.rows}
	}
	for run := range opts.Runs {
		for i, s := range shapes {
			// Alternate the order of the phases, run by run.
			order := slices.Clone(modes)
			if run%2 == 1 {
				slices.Reverse(order)
			}
			r := WriteRun{CPUKnown: true}
			for _, mode := range order {
				n, rate, cpu, known, err := w.phase(ctx, s.writers, s.rows, mode, opts.Duration)
				if err != nil {
					return res, err
				}
				count(mode, n*int64(s.rows))
				r.CPUKnown = r.CPUKnown && known
				switch mode {
				case withoutPostbox:
					r.Without, r.WithoutCPU = rate, cpu
				case withPostbox:
					r.With, r.WithCPU = rate, cpu
				case bareRow:
					r.Bare, r.BareCPU = rate, cpu
				case emitted:
					r.Emitted, r.EmittedCPU = rate, cpu
				}
				fmt.Fprintf(out, "run %d/%d  %2d writers  %3d row(s)/tx  %s  %8.0f tx/s\n", run+1, opts.Runs, s.writers, s.rows, mode, rate)
			}
			r.Ratio = r.With / r.Without
			if r.Bare > 0 {
				r.RatioToBare = r.With / r.Bare
			}
			r.RatioEmitted = r.Emitted / r.Without
			res.Cases[i].Runs = append(res.Cases[i].Runs, r)
		}
	}
	for i := range res.Cases {
		c := &res.Cases[i]
		c.Without = medianOf(c.Runs, func(r WriteRun) float64 { return r.Without })
		c.With = medianOf(c.Runs, func(r WriteRun) float64 { return r.With })
		c.Ratio = medianOf(c.Runs, func(r WriteRun) float64 { return r.Ratio })
		c.Bare = medianOf(c.Runs, func(r WriteRun) float64 { return r.Bare })
		c.RatioToBare = medianOf(c.Runs, func(r WriteRun) float64 { return r.RatioToBare })
		c.Emitted = medianOf(c.Runs, func(r WriteRun) float64 { return r.Emitted })
		c.RatioEmitted = medianOf(c.Runs, func(r WriteRun) float64 { return r.RatioEmitted })
		cpu := func(f func(WriteRun) CPUUse) CPUUse {
			uses := make([]CPUUse, len(c.Runs))
			for i, r := range c.Runs {
				uses[i] = f(r)
			}
			return medianUse(uses)
		}
		c.WithoutCPU = cpu(func(r WriteRun) CPUUse { return r.WithoutCPU })
		c.WithCPU = cpu(func(r WriteRun) CPUUse { return r.WithCPU })
		c.BareCPU = cpu(func(r WriteRun) CPUUse { return r.BareCPU })
		c.EmittedCPU = cpu(func(r WriteRun) CPUUse { return r.EmittedCPU })
	}
	for _, t := range []struct {
		table string
		n     *int64
	}{{tables.orders, &res.DomainRows}, {messages, &res.OutboxRows}, {tables.bare, &res.BareRows}} {
		if *t.n, err = db.count(ctx, t.table); err != nil {
			return res, err
		}
	}
	rowBytes, total, err := db.sizes(ctx, tables.orders, messages, tables.bare)
	if err != nil {
		return res, err
	}
	res.DomainRowBytes, res.OutboxRowBytes, res.BareRowBytes = rowBytes[0], rowBytes[1], rowBytes[2]
	res.DomainTableBytes, res.OutboxTableBytes, res.BareTableBytes = total[0], total[1], total[2]
	if res.DomainRows != wantDomain || res.OutboxRows != wantOutbox || res.BareRows != wantBare {
		return res, fmt.Errorf("the tables hold %d domain rows, %d outbox rows and %d bare rows, but %d, %d and %d were committed",
			res.DomainRows, res.OutboxRows, res.BareRows, wantDomain, wantOutbox, wantBare)
	}
	return res, nil
}

type writeBench struct {
	db      database
	client  benchClient
	tables  writeTables
	payload []byte
	opts    WriteOptions
}

// phase runs writers for d, each committing transactions of rows domain
// rows (and as many messages or bare rows, as mode says) one after
// another; it returns the transactions committed, their rate over the
// phase and the CPU per transaction of the writers (this process) and the
// database server meanwhile (known reports whether /proc could be read).
func (w *writeBench) phase(ctx context.Context, writers, rows int, mode writeMode, d time.Duration) (int64, float64, CPUUse, bool, error) {
	var stop atomic.Bool
	var committed atomic.Int64
	errs := make(chan error, writers)
	var wg sync.WaitGroup
	cpu := cpuuse.Phase(w.db.procs()...)
	start := time.Now()
	for n := range writers {
		wg.Go(func() {
			r := &writeRows{
				customers: make([]string, rows),
				amounts:   make([]int64, rows),
				msgs:      make([]postbox.Message, rows),
				ids:       make([]string, rows),
				headers:   make([]string, rows),
			}
			for i := 0; !stop.Load(); i++ {
				for j := range rows {
					r.customers[j] = fmt.Sprintf("customer-%d", (n*7919+i*rows+j)%1000)
					r.amounts[j] = int64(1000 + (i+j)%9000)
					r.msgs[j] = postbox.Message{Topic: "orders.created", Key: r.customers[j], Payload: w.payload}
					if mode == bareRow || mode == emitted {
						r.ids[j], r.headers[j] = w.bareRow(time.Now())
					}
				}
				if err := w.db.writeTx(ctx, w.client, w.tables, r, mode); err != nil {
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
		return committed.Load(), 0, CPUUse{}, false, err
	}
	if err := ctx.Err(); err != nil {
		return committed.Load(), 0, CPUUse{}, false, err
	}
	n := committed.Load()
	use, known := cpu(int(n))
	return n, float64(n) / elapsed.Seconds(), use, known, nil
}

func collect(errs <-chan error) []error {
	var out []error
	for err := range errs {
		out = append(out, err)
	}
	return out
}

// bareRow is a bare row's id and stored headers, those postbox stores for
// a message without headers of its own: its source and time. An emitted
// message carries the same.
func (w *writeBench) bareRow(now time.Time) (id, headers string) {
	h, _ := json.Marshal(map[string]string{postbox.HeaderSource: w.client.Config().Source, postbox.HeaderTime: now.UTC().Format(time.RFC3339Nano)})
	return postbox.NewID(), string(h)
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
