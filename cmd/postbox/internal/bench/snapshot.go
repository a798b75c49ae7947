package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/testdb"
	"github.com/postbox-go/postbox/postboxdriver"
)

// SnapshotOptions configure the held-snapshot study.
type SnapshotOptions struct {
	DatabaseURL string
	NatsURL     string
	// Before, Hold and After are the phases: steady load alone, then a
	// transaction elsewhere holding its snapshot (and so the xmin
	// horizon), then released. Defaults 10s, 60s, 60s.
	Before, Hold, After time.Duration
	// Rate is the steady write load in messages per second; default 2,000.
	Rate int
	// Keys is the number of distinct ordering keys; default 1,000.
	Keys int
	// Logger receives the relay's logs; default none.
	Logger *slog.Logger
}

// SnapshotSample is one second of the study.
type SnapshotSample struct {
	T            float64 `json:"t"`     // seconds since the load started
	Phase        string  `json:"phase"` // before, hold or after
	Written      int     `json:"written"`
	Batches      int     `json:"batches"`       // relay batches ended in this second
	BatchRows    int     `json:"batch_rows"`    // rows they read
	BatchP50Ms   float64 `json:"batch_p50_ms"`  // time per batch: read, publish, mark
	BatchMaxMs   float64 `json:"batch_max_ms"`  //
	FetchMs      float64 `json:"fetch_ms"`      // one lane's fetch statement, probed in this second (median)
	Pending      int64   `json:"pending"`       // rows in the outbox
	DeadTuples   int64   `json:"dead_tuples"`   // n_dead_tup of the outbox (pg_stat_user_tables)
	OldestXactS  float64 `json:"oldest_xact_s"` // age of the oldest transaction holding a snapshot
	ProbeRows    int     `json:"probe_rows"`    // rows the probe fetch returned
	WriterBehind int     `json:"writer_behind"` // messages the writer is behind its schedule
}

// SnapshotPhase sums up one phase.
type SnapshotPhase struct {
	Phase       string  `json:"phase"`
	FetchP50Ms  float64 `json:"fetch_p50_ms"`
	FetchMaxMs  float64 `json:"fetch_max_ms"`
	BatchP50Ms  float64 `json:"batch_p50_ms"`
	PendingMax  int64   `json:"pending_max"`
	DeadMax     int64   `json:"dead_tuples_max"`
	FetchVsPre  float64 `json:"fetch_vs_before"` // FetchP50Ms / the before phase's
	LastFetchMs float64 `json:"last_fetch_ms"`   // the phase's last second
}

// SnapshotResult is the whole study.
type SnapshotResult struct {
	Options  SnapshotOptions  `json:"-"`
	Written  int              `json:"written"`
	Streamed uint64           `json:"streamed"`
	Samples  []SnapshotSample `json:"samples"`
	Phases   []SnapshotPhase  `json:"phases"`
}

// Validate checks the options, naming the flag of each bad value.
func (o *SnapshotOptions) Validate() error {
	var errs []error
	for _, d := range []struct {
		flag string
		v    time.Duration
		low  time.Duration
	}{{"--before", o.Before, time.Second}, {"--hold", o.Hold, time.Second}, {"--after", o.After, time.Second}} {
		if d.v < d.low || d.v > 24*time.Hour {
			errs = append(errs, fmt.Errorf("%s %s: want 1s to 24h", d.flag, d.v))
		}
	}
	if o.Rate < 1 || o.Rate > 1_000_000 {
		errs = append(errs, fmt.Errorf("--rate %d: want 1 to 1000000 messages per second", o.Rate))
	}
	if o.Keys < 0 {
		errs = append(errs, fmt.Errorf("--keys %d: want 0 (keyless) or more", o.Keys))
	}
	return errors.Join(errs...)
}

func (o *SnapshotOptions) defaults() {
	defaultURLs(&o.DatabaseURL, testdb.PostgresURL(), &o.NatsURL)
	o.Before = cmp.Or(o.Before, 10*time.Second)
	o.Hold = cmp.Or(o.Hold, 60*time.Second)
	o.After = cmp.Or(o.After, 60*time.Second)
	o.Rate = cmp.Or(o.Rate, 2000)
	o.Keys = cmp.Or(o.Keys, 1000)
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
}

// batchLog collects the relay's batch reports through Config.Metrics.
type batchLog struct {
	mu   sync.Mutex
	durs []time.Duration
	rows int
}

func (b *batchLog) RelayBatch(r *postbox.BatchReport) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.durs = append(b.durs, r.Duration)
	b.rows += r.Size
}

func (b *batchLog) InboxHandled(string, postbox.Verdict, time.Duration) {}

func (b *batchLog) take() ([]time.Duration, int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	d, n := b.durs, b.rows
	b.durs, b.rows = nil, 0
	return d, n
}

// Snapshot runs a relay at default settings under a steady write load,
// holds a snapshot open on another connection for a while, releases it,
// and samples every second how the relay copes: time per batch, the
// relay's fetch statement probed on one lane's partitions, pending rows
// and the outbox's dead tuples.
func Snapshot(ctx context.Context, opts SnapshotOptions, out io.Writer) (SnapshotResult, error) {
	opts.defaults()
	res := SnapshotResult{Options: opts}
	if err := opts.Validate(); err != nil {
		return res, err
	}
	tag := randTag()
	bs, err := openStream(ctx, opts.NatsURL, "BENCH_SNAP_"+tag, "bench.snap."+tag+".", 0)
	if err != nil {
		return res, err
	}
	defer bs.close(ctx)
	js, stream := bs.js, bs.name
	pub, err := bs.publisher()
	if err != nil {
		return res, err
	}
	defer func() { _ = pub.Close(context.WithoutCancel(ctx)) }()

	pool, err := pgxpool.New(ctx, opts.DatabaseURL)
	if err != nil {
		return res, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	defer pool.Close()
	prefix := "bench_snap_" + tag + "_"
	driver, drop, err := migrated(ctx, pool, prefix)
	if err != nil {
		return res, err
	}
	defer drop()
	store, err := driver.Open(prefix)
	if err != nil {
		return res, err
	}
	batches := &batchLog{}
	client, err := postbox.NewClient(driver, &postbox.Config{Prefix: prefix, Publisher: pub, Metrics: batches, Logger: opts.Logger})
	if err != nil {
		return res, err
	}
	if err := client.Start(ctx); err != nil {
		return res, err
	}
	defer func() { _ = client.Stop(context.WithoutCancel(ctx)) }()

	// The holder: its own connection, a snapshot taken and kept.
	holder, err := pgx.Connect(ctx, opts.DatabaseURL)
	if err != nil {
		return res, err
	}
	defer func() { _ = holder.Close(context.WithoutCancel(ctx)) }()

	total := opts.Before + opts.Hold + opts.After
	began := time.Now()
	wctx, stopWriter := context.WithCancel(ctx)
	defer stopWriter()
	var written, behind int
	var wmu sync.Mutex
	werr := make(chan error, 1)
	go func() { werr <- steadyWriter(wctx, client, opts, began, &wmu, &written, &behind) }()

	// The probe: one lane's share, the relay's own fetch statement.
	parts := map[int]int64{}
	for p := 0; p < 64; p += postbox.DefaultLanes {
		parts[p] = 0
	}
	probe := postboxdriver.FetchParams{Fence: postboxdriver.Fence{Owner: "probe", Generations: parts}, Limit: postbox.DefaultBatchSize}

	fmt.Fprintf(out, "snapshot: %d msg/s for %s, a snapshot held from %s to %s\n", opts.Rate, total, opts.Before, opts.Before+opts.Hold)
	var tx pgx.Tx
	held, released := false, false
	lastWritten := 0
	for sec := 1; time.Duration(sec)*time.Second <= total; sec++ {
		var probes []time.Duration
		probeRows := 0
		for time.Since(began) < time.Duration(sec)*time.Second {
			now := time.Since(began)
			if !held && now >= opts.Before {
				held = true
				if tx, err = holder.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead}); err != nil {
					return res, err
				}
				if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
					return res, err
				}
				fmt.Fprintf(out, "  %4.0fs: snapshot taken\n", now.Seconds())
			}
			if held && !released && now >= opts.Before+opts.Hold {
				released = true
				if err := tx.Rollback(ctx); err != nil {
					return res, err
				}
				fmt.Fprintf(out, "  %4.0fs: snapshot released\n", now.Seconds())
			}
			t0 := time.Now()
			recs, err := store.Fetch(ctx, probe)
			if err != nil {
				return res, err
			}
			probes = append(probes, time.Since(t0))
			probeRows = len(recs)
			select {
			case <-time.After(200 * time.Millisecond):
			case <-ctx.Done():
				return res, ctx.Err()
			case err := <-werr:
				return res, fmt.Errorf("writer: %w", err)
			}
		}
		s := SnapshotSample{T: time.Since(began).Seconds(), Phase: phaseAt(time.Duration(sec)*time.Second, opts), ProbeRows: probeRows}
		durs, rows := batches.take()
		s.Batches, s.BatchRows = len(durs), rows
		if len(durs) > 0 {
			s.BatchP50Ms = msf(durQuantile(durs, 0.5))
			s.BatchMaxMs = msf(durQuantile(durs, 1))
		}
		s.FetchMs = msf(durQuantile(probes, 0.5))
		wmu.Lock()
		s.Written, s.WriterBehind = written-lastWritten, behind
		lastWritten = written
		wmu.Unlock()
		var oldest *float64
		err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+prefix+`outbox),
  coalesce((SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = $1::regclass), 0),
  (SELECT extract(epoch FROM now() - min(xact_start))::float8 FROM pg_stat_activity WHERE backend_xmin IS NOT NULL AND pid <> pg_backend_pid())`,
			prefix+"outbox").Scan(&s.Pending, &s.DeadTuples, &oldest)
		if err != nil {
			return res, err
		}
		if oldest != nil {
			s.OldestXactS = *oldest
		}
		res.Samples = append(res.Samples, s)
		if sec%5 == 0 || sec == 1 {
			fmt.Fprintf(out, "  %4.0fs %-6s fetch %7.2f ms  batch p50 %7.2f ms (%3d batches)  pending %6d  dead tuples %7d  oldest xact %5.0fs\n",
				s.T, s.Phase, s.FetchMs, s.BatchP50Ms, s.Batches, s.Pending, s.DeadTuples, s.OldestXactS)
		}
	}
	stopWriter()
	if err := <-werr; err != nil && !errors.Is(err, context.Canceled) {
		return res, fmt.Errorf("writer: %w", err)
	}
	res.Written = written
	// Everything written reaches the stream, and its marks empty the
	// outbox (a mark follows its ack).
	deadline := time.Now().Add(2 * time.Minute)
	var pending int64
	for {
		n, err := streamMsgs(ctx, js, stream)
		if err != nil {
			return res, err
		}
		res.Streamed = n
		if pending, err = outboxPending(ctx, pool, prefix); err != nil {
			return res, err
		}
		if (pending == 0 && n >= uint64(written)) || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if pending != 0 || res.Streamed < uint64(written) {
		return res, fmt.Errorf("after the run: %d pending, %d of %d written messages in the stream", pending, res.Streamed, written)
	}
	res.Phases = summarize(res.Samples)
	return res, nil
}

func phaseAt(t time.Duration, o SnapshotOptions) string {
	switch {
	case t <= o.Before:
		return "before"
	case t <= o.Before+o.Hold:
		return "hold"
	default:
		return "after"
	}
}

func msf(d time.Duration) float64 { return d.Seconds() * 1000 }

// steadyWriter writes opts.Rate messages per second in transactions of
// one tick's worth (every 10ms), catching up when it falls behind.
func steadyWriter(ctx context.Context, client *postbox.Client[pgx.Tx], opts SnapshotOptions, began time.Time, mu *sync.Mutex, written, behind *int) error {
	payload := makePayload(256)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	n := 0
	for {
		select {
		case <-tick.C:
		case <-ctx.Done():
			return ctx.Err()
		}
		due := int(time.Since(began).Seconds() * float64(opts.Rate))
		todo := min(due-n, max(opts.Rate/10, 1)) // at most a tenth of a second per transaction
		if todo <= 0 {
			continue
		}
		msgs := make([]postbox.Message, todo)
		for i := range msgs {
			msgs[i] = postbox.Message{Topic: "orders.created", Payload: payload}
			if opts.Keys > 0 {
				msgs[i].Key = fmt.Sprintf("key-%d", (n+i)%opts.Keys)
			}
		}
		if err := client.Write(ctx, msgs...); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		n += todo
		mu.Lock()
		*written, *behind = n, due-n
		mu.Unlock()
	}
}

func summarize(samples []SnapshotSample) []SnapshotPhase {
	var out []SnapshotPhase
	for _, ph := range []string{"before", "hold", "after"} {
		var fetch, batch []time.Duration
		p := SnapshotPhase{Phase: ph}
		for _, s := range samples {
			if s.Phase != ph {
				continue
			}
			fetch = append(fetch, time.Duration(s.FetchMs*float64(time.Millisecond)))
			if s.Batches > 0 {
				batch = append(batch, time.Duration(s.BatchP50Ms*float64(time.Millisecond)))
			}
			p.PendingMax = max(p.PendingMax, s.Pending)
			p.DeadMax = max(p.DeadMax, s.DeadTuples)
			p.LastFetchMs = s.FetchMs
		}
		p.FetchP50Ms = msf(durQuantile(fetch, 0.5))
		p.FetchMaxMs = msf(durQuantile(fetch, 1))
		p.BatchP50Ms = msf(durQuantile(batch, 0.5))
		if len(out) > 0 && out[0].FetchP50Ms > 0 {
			p.FetchVsPre = p.FetchP50Ms / out[0].FetchP50Ms
		} else if ph == "before" {
			p.FetchVsPre = 1
		}
		out = append(out, p)
	}
	return out
}
