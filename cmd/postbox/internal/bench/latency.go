package bench

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/cpuuse"
	"github.com/postbox-go/postbox/internal/pglog"
	"github.com/postbox-go/postbox/postboxdriver"
	"github.com/postbox-go/postbox/postboxpgx"
)

// LatencyOptions configure the commit-to-ack latency benchmark.
type LatencyOptions struct {
	DatabaseURL string
	NatsURL     string
	// Rate is the messages committed per second, one per transaction;
	// default 1,000.
	Rate int
	// Duration of the paced writing; default 30s.
	Duration time.Duration
	// Warmup is the first part of the writing whose messages are left out
	// of the percentiles; default 2s (never more than a fifth of Duration).
	Warmup time.Duration
	// Writers are the goroutines that take the paced slots, each with a
	// connection of its own; default 16.
	Writers      int
	PayloadBytes int // default 256
	Keys         int // distinct ordering keys; 0 means keyless; default 1,000
	// SeparateWriter writes through a Client of its own, as another
	// process would: the relay learns of the rows by the change signals
	// (LISTEN/NOTIFY), or, with NoSignals, only by polling. By default the
	// writers use the relay's Client, whose WriteTx wakes it.
	SeparateWriter bool
	// NoSignals sets Config.NoSignals on the relay and the writers.
	NoSignals bool
	// Pipeline makes the writers' transactions postboxpgx.Tx: the message
	// goes with the COMMIT, and the writer's Client wakes its relay once
	// the transaction has committed rather than when WriteTx returns.
	Pipeline bool
	// Idle is how long the idle relay's statements are counted before
	// the writing starts; default 10s, negative skips it.
	Idle time.Duration
	// PollInterval and Lanes set the relay's; zero keeps the library's
	// defaults.
	PollInterval time.Duration
	Lanes        int
	// AckTimeout bounds the wait for the last acks after the writing;
	// default 30s.
	AckTimeout time.Duration
	// IdleOnly stops after the idle count: no writing, no latency.
	IdleOnly bool
	// Storage is where the messages go: "table" (the outbox the drivers
	// keep, the default) or "log" (PostgreSQL: the log read by snapshot
	// bands, design §3, through this package's Store).
	Storage string
	// Baseline is how long the same-run floor is measured before the
	// postbox phase, at the same rate: each writer commits a domain row and
	// then publishes the message to JetStream itself, waiting for the ack
	// (the dual write the outbox replaces). Default 10s, negative skips it.
	Baseline time.Duration
}

// Validate reports the first bad option, naming its command-line flag.
func (o *LatencyOptions) Validate() error {
	switch {
	case o.Rate < 0 || o.Rate > 1_000_000:
		return fmt.Errorf("--rate must be between 1 and 1000000 messages per second, got %d", o.Rate)
	case o.Duration < 0:
		return fmt.Errorf("--duration must be positive, got %s", o.Duration)
	case o.Warmup < 0:
		return fmt.Errorf("--warmup must not be negative, got %s", o.Warmup)
	case o.Writers < 0 || o.Writers > 256:
		return fmt.Errorf("--writers must be between 1 and 256, got %d", o.Writers)
	case o.PayloadBytes < 0 || o.PayloadBytes > postbox.DefaultMaxPayloadBytes:
		return fmt.Errorf("--payload must be between 1 and %d bytes, got %d", postbox.DefaultMaxPayloadBytes, o.PayloadBytes)
	case o.Keys < 0:
		return fmt.Errorf("--keys must not be negative, got %d", o.Keys)
	case o.PollInterval < 0 || (o.PollInterval > 0 && o.PollInterval < time.Millisecond):
		return fmt.Errorf("--poll-interval must be at least 1ms, got %s", o.PollInterval)
	case o.Lanes < 0 || o.Lanes > 64:
		return fmt.Errorf("--lanes must be between 1 and 64, got %d", o.Lanes)
	case o.IdleOnly && o.Idle < 0:
		return fmt.Errorf("--idle-only needs a positive --idle")
	case o.AckTimeout < 0:
		return fmt.Errorf("--ack-timeout must be positive, got %s", o.AckTimeout)
	case o.Storage != "" && o.Storage != "table" && o.Storage != "log":
		return fmt.Errorf("--storage is table or log, not %q", o.Storage)
	}
	return nil
}

func (o *LatencyOptions) defaults() {
	defaultURLs(&o.DatabaseURL, defaultDatabaseURL, &o.NatsURL)
	o.Rate = cmp.Or(o.Rate, 1000)
	o.Duration = cmp.Or(o.Duration, 30*time.Second)
	o.Warmup = cmp.Or(o.Warmup, 2*time.Second)
	o.Warmup = min(o.Warmup, o.Duration/5)
	o.Writers = cmp.Or(o.Writers, 16)
	o.PayloadBytes = cmp.Or(o.PayloadBytes, 256)
	o.Idle = cmp.Or(o.Idle, 10*time.Second)
	o.AckTimeout = cmp.Or(o.AckTimeout, 30*time.Second)
	o.Baseline = cmp.Or(o.Baseline, 10*time.Second)
	o.Storage = cmp.Or(o.Storage, "table")
}

// Percentiles of a latency distribution, in milliseconds.
type Percentiles struct {
	Min, P50, P90, P99, P999, Max, Mean float64
}

// CDFPoint is one point of a latency distribution: the fraction of
// messages acknowledged within Millis of their commit.
type CDFPoint struct {
	Fraction float64 `json:"fraction"`
	Millis   float64 `json:"ms"`
}

// DuplicateAck is a message acknowledged again: its number in the order
// of writing, its id, and how long after its first ack it came.
type DuplicateAck struct {
	Message    int     `json:"message"`
	ID         string  `json:"id"`
	LateMillis float64 `json:"late_ms"`
}

// LatencyResult is the benchmark's outcome.
type LatencyResult struct {
	Rate       int     `json:"rate"`       // the paced rate asked for, msg/s
	Achieved   float64 `json:"achieved"`   // messages committed per second
	Written    int     `json:"written"`    // messages committed
	Measured   int     `json:"measured"`   // of them, after the warm-up
	Acked      int     `json:"acked"`      // distinct ids acknowledged
	Duplicates int     `json:"duplicates"` // acks beyond the first per id
	// DuplicateAcks are the first of those acks: which message, and how
	// long after its first ack.
	DuplicateAcks []DuplicateAck `json:"duplicate_acks,omitempty"`
	// RelayWarnings counts what the relay logged at WARN and above while
	// it ran (a pause, marks lost to fencing, a failed renewal): a stall
	// or a fault, after which these figures are not a clean run's.
	// RelayWarningLines are the first of them.
	RelayWarnings     int      `json:"relay_warnings"`
	RelayWarningLines []string `json:"relay_warning_lines,omitempty"`
	// MaxBehind is how late a writer started its slot at worst: the pacing
	// holds when it is small against the interval between slots.
	MaxBehindMillis float64 `json:"max_behind_ms"`
	// Latency is commit return to broker ack; CommitLatency is the same
	// taken from just before the COMMIT was sent (an upper bound that
	// includes the commit's own round trip).
	Latency       Percentiles `json:"latency_ms"`
	CommitLatency Percentiles `json:"from_commit_start_ms"`
	CDF           []CDFPoint  `json:"cdf"`
	// The same-run floor: commit return to ack when the writer publishes
	// straight to JetStream after its commit.
	Baseline         Percentiles `json:"baseline_ms"`
	BaselineCDF      []CDFPoint  `json:"baseline_cdf"`
	BaselineAchieved float64     `json:"baseline_achieved"`
	BaselineMeasured int         `json:"baseline_measured"`
	// Statements the relay sent per second while idle and while relaying
	// the paced load, and what they were.
	IdleSeconds       float64          `json:"idle_seconds"`
	IdleQueriesPerSec float64          `json:"idle_queries_per_s"`
	IdleStatements    map[string]int64 `json:"idle_statements"`
	BusySeconds       float64          `json:"busy_seconds"`
	BusyQueriesPerSec float64          `json:"busy_queries_per_s"`
	BusyStatements    map[string]int64 `json:"busy_statements"`
	BusyPerMessage    float64          `json:"busy_per_message"`
	// BusyPerMessageExceptJIT leaves out the setting that goes before
	// each of the log's statements, in the same round trip (Storage log).
	BusyPerMessageExceptJIT float64 `json:"busy_per_message_except_jit"`
	// CPU per message by process during the postbox phase (this process
	// holds the writers and, unless SeparateWriter, the relay) and during
	// the baseline; CPUKnown is false where /proc cannot be read.
	CPU              CPUUse `json:"cpu_per_message"`
	CPUKnown         bool   `json:"cpu_known"`
	BaselineCPU      CPUUse `json:"baseline_cpu_per_message"`
	BaselineCPUKnown bool   `json:"baseline_cpu_known"`
	SeparateWriter   bool   `json:"separate_writer"`
	// Storage is LatencyOptions.Storage: table or log.
	Storage      string        `json:"storage"`
	NoSignals    bool          `json:"no_signals"`
	PollInterval time.Duration `json:"poll_interval_ns"`
	Lanes        int           `json:"lanes"`
}

// Latency measures the time from a message's commit to the broker's ack
// at a steady paced rate, with a relay at default settings publishing to
// JetStream, and first counts the statements that relay sends while idle.
func Latency(ctx context.Context, opts LatencyOptions, out io.Writer) (LatencyResult, error) {
	var res LatencyResult
	if err := opts.Validate(); err != nil {
		return res, err
	}
	opts.defaults()
	res.Rate = opts.Rate
	res.SeparateWriter, res.NoSignals, res.Storage = opts.SeparateWriter, opts.NoSignals, opts.Storage
	tag := randTag()
	bs, err := openStream(ctx, opts.NatsURL, "BENCH_LATENCY_"+tag, "bench.latency."+tag+".", 0)
	if err != nil {
		return res, err
	}
	defer bs.close(ctx)
	js, stream, subjects := bs.js, bs.name, bs.prefix

	// Two pools: the writers' own, and the relay's, whose every statement
	// is counted.
	wpool, err := writersPool(ctx, opts.DatabaseURL, opts.Writers, nil)
	if err != nil {
		return res, err
	}
	defer wpool.Close()
	prefix := "bench_" + tag + "_"
	_, drop, err := migrated(ctx, wpool, prefix)
	if err != nil {
		return res, err
	}
	defer drop()
	// The relay's and the writers' drivers: postboxpgx's over the outbox,
	// or the log's.
	driver := func(pool *pgxpool.Pool) postboxdriver.Driver[pgx.Tx] { return postboxpgx.New(pool) }
	if opts.Storage == "log" {
		driver = func(pool *pgxpool.Pool) postboxdriver.Driver[pgx.Tx] {
			return postboxpgx.New(pool, postboxpgx.WithLog())
		}
		if err := pglog.UseLog(ctx, wpool, prefix); err != nil {
			return res, fmt.Errorf("switch the database to the log: %w", err)
		}
	}
	counter := &statementCounter{prefix: prefix}
	rcfg, err := pgxpool.ParseConfig(opts.DatabaseURL)
	if err != nil {
		return res, err
	}
	rcfg.ConnConfig.Tracer = counter
	rpool, err := pgxpool.NewWithConfig(ctx, rcfg)
	if err != nil {
		return res, err
	}
	defer rpool.Close()

	inner, err := bs.publisher()
	if err != nil {
		return res, err
	}
	defer func() { _ = inner.Close(context.WithoutCancel(ctx)) }()
	acks := newAckRecorder(inner)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	var warned warnings
	relay, err := postbox.NewClient(driver(rpool), &postbox.Config{
		Prefix: prefix, Publisher: acks, Logger: warned.logger(), PollInterval: opts.PollInterval, Lanes: opts.Lanes, NoSignals: opts.NoSignals,
	})
	if err != nil {
		return res, err
	}
	cfg := relay.Config()
	res.PollInterval, res.Lanes = cfg.PollInterval, cfg.Lanes
	writer := relay
	if opts.SeparateWriter {
		writer, err = postbox.NewClient(driver(wpool), &postbox.Config{Prefix: prefix, Logger: quiet, NoSignals: opts.NoSignals})
		if err != nil {
			return res, err
		}
	}
	if err := relay.Start(ctx); err != nil {
		return res, err
	}
	defer func() { _ = relay.Stop(context.WithoutCancel(ctx)) }()

	if opts.Idle > 0 {
		// Let the start-up statements (partitions, durability settings,
		// the first heartbeat and leases) pass, then count.
		fmt.Fprintf(out, "idle relay (poll interval %s, %d lanes): counting its statements for %s\n", cfg.PollInterval, cfg.Lanes, opts.Idle)
		if err := sleepCtx(ctx, time.Second); err != nil {
			return res, err
		}
		before := counter.snapshot()
		start := time.Now()
		if err := sleepCtx(ctx, opts.Idle); err != nil {
			return res, err
		}
		res.IdleSeconds = time.Since(start).Seconds()
		res.IdleStatements = counter.snapshot().minus(before)
		var total int64
		for _, n := range res.IdleStatements {
			total += n
		}
		res.IdleQueriesPerSec = float64(total) / res.IdleSeconds
		fmt.Fprintf(out, "idle relay: %.1f statements/s\n", res.IdleQueriesPerSec)
	}
	if opts.IdleOnly {
		return res, nil
	}

	total := int(float64(opts.Rate) * opts.Duration.Seconds())
	warm := int(float64(opts.Rate) * opts.Warmup.Seconds())
	payload := makePayload(opts.PayloadBytes)
	key := func(i int) string {
		if opts.Keys == 0 {
			return ""
		}
		return fmt.Sprintf("key-%d", i%opts.Keys)
	}

	baselineN := 0
	if opts.Baseline > 0 {
		// The floor: the dual write the outbox replaces. Each writer
		// commits a domain row, then publishes the message to JetStream
		// itself and waits for the PubAck.
		n := max(int(float64(opts.Rate)*opts.Baseline.Seconds()), 1)
		baselineN = n
		baselineCPU := cpuuse.Phase()
		bwarm := min(warm, n/5)
		fmt.Fprintf(out, "baseline, direct publish after commit: %d messages at %d msg/s (%d writers)\n", n, opts.Rate, opts.Writers)
		domain := prefix + "orders"
		if _, err := wpool.Exec(ctx, "CREATE TABLE "+domain+" (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, key text NOT NULL, payload bytea NOT NULL)"); err != nil {
			return res, err
		}
		times := make([]commitTimes, n)
		acked := make([]time.Time, n)
		bids := make([]string, n)
		for i := range bids {
			bids[i] = postbox.NewID()
		}
		p, err := pace(ctx, n, opts.Rate, opts.Writers, out, func() string { return "" }, func(i int) error {
			tx, err := wpool.Begin(ctx)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
			if _, err := tx.Exec(ctx, "INSERT INTO "+domain+" (key, payload) VALUES ($1, $2)", key(i), payload); err != nil {
				return err
			}
			times[i].start = time.Now()
			if err := tx.Commit(ctx); err != nil {
				return err
			}
			times[i].end = time.Now()
			msg := nats.NewMsg(subjects + "direct")
			msg.Data = payload
			if _, err := js.PublishMsg(ctx, msg, jetstream.WithMsgID(bids[i])); err != nil {
				return fmt.Errorf("direct publish: %w", err)
			}
			acked[i] = time.Now()
			return nil
		})
		if err != nil {
			return res, err
		}
		var lat []float64
		for i := bwarm; i < n; i++ {
			lat = append(lat, float64(acked[i].Sub(times[i].end))/1e6)
		}
		res.Baseline = percentiles(lat)
		res.BaselineCDF = cdf(lat)
		res.BaselineCPU, res.BaselineCPUKnown = baselineCPU(n)
		res.BaselineAchieved = p.achieved
		res.BaselineMeasured = len(lat)
	}

	fmt.Fprintf(out, "postbox: writing %d messages at %d msg/s (%d writers, %d keys, %s), one per transaction\n",
		total, opts.Rate, opts.Writers, opts.Keys, wakeUp(opts))
	commits := make([]commitTimes, total)
	ids := make([]string, total)
	for i := range ids {
		ids[i] = postbox.NewID()
	}
	busyBefore := counter.snapshot()
	busyStart := time.Now()
	busyCPU := cpuuse.Phase()
	p, err := pace(ctx, total, opts.Rate, opts.Writers, out, func() string { return fmt.Sprintf(", %d acknowledged", acks.count()) }, func(i int) error {
		ct, err := writeOne(ctx, wpool, opts.Pipeline, writer, postbox.Message{ID: ids[i], Topic: "m", Key: key(i), Payload: payload})
		commits[i] = ct
		return err
	})
	if err != nil {
		return res, err
	}
	res.Written = total
	res.Achieved = p.achieved
	res.MaxBehindMillis = p.maxBehind.Seconds() * 1000

	deadline := time.Now().Add(opts.AckTimeout)
	for acks.count() < total {
		if time.Now().After(deadline) {
			return res, fmt.Errorf("%d of %d messages acknowledged %s after the writing ended", acks.count(), total, opts.AckTimeout)
		}
		if err := sleepCtx(ctx, 10*time.Millisecond); err != nil {
			return res, err
		}
	}
	res.CPU, res.CPUKnown = busyCPU(total)
	busy := counter.snapshot().minus(busyBefore)
	var busyN int64
	for _, n := range busy {
		busyN += n
	}
	res.BusySeconds = time.Since(busyStart).Seconds()
	res.BusyQueriesPerSec = float64(busyN) / res.BusySeconds
	res.BusyStatements = busy
	res.BusyPerMessage = float64(busyN) / float64(len(ids))
	res.BusyPerMessageExceptJIT = float64(busyN-busy[batchKind+jitKind]) / float64(len(ids))

	ackAt, dups := acks.result()
	res.Acked, res.Duplicates = len(ackAt), len(dups)
	res.RelayWarnings, res.RelayWarningLines = warned.result()
	if len(dups) > 0 {
		number := make(map[string]int, len(ids))
		for i, id := range ids {
			number[id] = i
		}
		for _, d := range dups[:min(len(dups), maxListed)] {
			res.DuplicateAcks = append(res.DuplicateAcks, DuplicateAck{Message: number[d.id], ID: d.id, LateMillis: float64(d.at.Sub(ackAt[d.id])) / 1e6})
		}
	}
	var lat, fromStart []float64
	for i, id := range ids {
		at, ok := ackAt[id]
		if !ok {
			return res, fmt.Errorf("message %s was never acknowledged", id)
		}
		if i < warm {
			continue
		}
		lat = append(lat, float64(at.Sub(commits[i].end))/1e6)
		fromStart = append(fromStart, float64(at.Sub(commits[i].start))/1e6)
	}
	if len(ackAt) != total {
		return res, fmt.Errorf("%d distinct ids acknowledged, %d written", len(ackAt), total)
	}
	res.Measured = len(lat)
	res.Latency = percentiles(lat) // sorts lat, which cdf needs
	res.CommitLatency = percentiles(fromStart)
	res.CDF = cdf(lat)
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return res, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return res, err
	}
	if want := uint64(total + baselineN); info.State.Msgs != want {
		return res, fmt.Errorf("stream holds %d messages, want %d (%d from postbox, %d from the baseline)", info.State.Msgs, want, total, baselineN)
	}
	return res, nil
}

type commitTimes struct{ start, end time.Time }

type paced struct {
	achieved  float64       // slots done per second
	maxBehind time.Duration // how late a slot was started at worst
}

// pace runs do(i) for i in [0, total), slot i due at rate slots per second
// from now, on writers goroutines that each take the next slot and wait
// for its time; a writer that is late starts at once. It prints progress
// every 5 s, with what more() adds.
func pace(ctx context.Context, total, rate, writers int, out io.Writer, more func() string, do func(i int) error) (paced, error) {
	var res paced
	period := time.Second / time.Duration(rate)
	var next, behind atomic.Int64
	errc := make(chan error, writers)
	var wg sync.WaitGroup
	start := time.Now().Add(10 * time.Millisecond)
	for range writers {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= total || ctx.Err() != nil {
					return
				}
				due := start.Add(time.Duration(i) * period)
				if d := time.Until(due); d > 0 {
					time.Sleep(d)
				} else {
					for late := int64(-d); ; {
						was := behind.Load()
						if late <= was || behind.CompareAndSwap(was, late) {
							break
						}
					}
				}
				if err := do(i); err != nil {
					errc <- err
					next.Store(int64(total)) // the others stop too
					return
				}
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	progress := time.NewTicker(5 * time.Second)
	defer progress.Stop()
wait:
	for {
		select {
		case <-done:
			break wait
		case <-progress.C:
			fmt.Fprintf(out, "  %s: %d written%s\n", time.Since(start).Round(time.Second), min(int(next.Load()), total), more())
		}
	}
	close(errc)
	if err := <-errc; err != nil {
		return res, fmt.Errorf("writer: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return res, err
	}
	res.achieved = float64(total) / time.Since(start).Seconds()
	res.maxBehind = time.Duration(behind.Load())
	return res, nil
}

// writeOne commits msg alone in a transaction (a postboxpgx.Tx with
// pipeline) and reports when the COMMIT was sent and when it returned.
func writeOne(ctx context.Context, pool *pgxpool.Pool, pipeline bool, client *postbox.Client[pgx.Tx], msg postbox.Message) (commitTimes, error) {
	var ct commitTimes
	var tx pgx.Tx
	var err error
	if pipeline {
		tx, err = postboxpgx.Begin(ctx, pool)
	} else {
		tx, err = pool.Begin(ctx)
	}
	if err != nil {
		return ct, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := client.WriteTx(ctx, tx, msg); err != nil {
		return ct, err
	}
	ct.start = time.Now()
	if err := tx.Commit(ctx); err != nil {
		return ct, err
	}
	ct.end = time.Now()
	return ct, nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ackRecorder is a Publisher that passes each envelope on and records
// when the broker acknowledged it.
type ackRecorder struct {
	next postbox.Publisher
	mu   sync.Mutex
	at   map[string]time.Time // first ack per id
	dups []ack                // the acks after an id's first
}

type ack struct {
	id string
	at time.Time
}

func newAckRecorder(next postbox.Publisher) *ackRecorder {
	return &ackRecorder{next: next, at: map[string]time.Time{}}
}

func (a *ackRecorder) Publish(ctx context.Context, env *postbox.Envelope, done func(error)) {
	id := env.ID
	a.next.Publish(ctx, env, func(err error) {
		if err == nil {
			now := time.Now()
			a.mu.Lock()
			if _, ok := a.at[id]; ok {
				a.dups = append(a.dups, ack{id, now})
			} else {
				a.at[id] = now
			}
			a.mu.Unlock()
		}
		done(err)
	})
}

func (a *ackRecorder) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.at)
}

func (a *ackRecorder) result() (map[string]time.Time, []ack) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.at, a.dups
}

// percentiles takes nearest-rank percentiles of xs (sorted in place).
func percentiles(xs []float64) Percentiles {
	if len(xs) == 0 {
		return Percentiles{}
	}
	sort.Float64s(xs)
	var sum float64
	for _, x := range xs {
		sum += x
	}
	return Percentiles{
		Min: xs[0], P50: rank(xs, 0.50), P90: rank(xs, 0.90), P99: rank(xs, 0.99), P999: rank(xs, 0.999),
		Max: xs[len(xs)-1], Mean: sum / float64(len(xs)),
	}
}

func rank(sorted []float64, q float64) float64 {
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// cdf samples a sorted distribution: every 0.5% up to 99%, then finer
// into the tail, and the maximum.
func cdf(sorted []float64) []CDFPoint {
	if len(sorted) == 0 {
		return nil
	}
	var qs []float64
	for k := 1; k < 198; k++ { // 0.5% … 98.5%
		qs = append(qs, float64(k)*0.005)
	}
	for k := 0; k < 18; k++ { // 99% … 99.85%
		qs = append(qs, 0.99+float64(k)*0.0005)
	}
	for k := 0; k < 10; k++ { // 99.9% … 99.99%
		qs = append(qs, 0.999+float64(k)*0.0001)
	}
	qs = append(qs, 1)
	out := make([]CDFPoint, 0, len(qs))
	for _, q := range qs {
		out = append(out, CDFPoint{Fraction: q, Millis: rank(sorted, q)})
	}
	return out
}

// statementCounter is a pgx tracer counting the statements a pool sends,
// by kind: queries, and the queries of batches and copies.
type statementCounter struct {
	prefix string
	mu     sync.Mutex
	counts map[string]int64
}

type statementCounts map[string]int64

func (s statementCounts) minus(before statementCounts) map[string]int64 {
	out := map[string]int64{}
	for k, v := range s {
		if d := v - before[k]; d > 0 {
			out[k] = d
		}
	}
	return out
}

func (c *statementCounter) add(kind string) {
	c.mu.Lock()
	if c.counts == nil {
		c.counts = map[string]int64{}
	}
	c.counts[kind]++
	c.mu.Unlock()
}

func (c *statementCounter) snapshot() statementCounts {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(statementCounts, len(c.counts))
	for k, v := range c.counts {
		out[k] = v
	}
	return out
}

// jitKind names the settings that go before each of the log's
// statements in the same round trip (pglog's noJIT: JITOff, or
// ReadSettings before a read), which sends both in a batch, so that the
// counter counts them under batchKind+jitKind.
const jitKind = "jit off (before each of the log's statements)"

// batchKind prefixes the kind of a statement sent in a batch.
const batchKind = "batch: "

// kind names a statement of the relay's for the report.
func (c *statementCounter) kind(sql string) string {
	s := strings.Join(strings.Fields(sql), " ")
	switch {
	case s == pglog.JITOff, s == pglog.ReadSettings:
		return jitKind
	case strings.Contains(s, "UPDATE "+c.prefix+"positions") && strings.Contains(s, c.prefix+"log o"):
		return "log: record and read"
	case strings.Contains(s, "UPDATE "+c.prefix+"positions"):
		return "log: record"
	case strings.Contains(s, c.prefix+"log o"):
		return "log: read"
	case strings.Contains(s, "ORDER BY o.seq") && strings.Contains(s, "DELETE FROM "+c.prefix+"outbox"):
		return "mark and fetch"
	case strings.Contains(s, "ORDER BY o.seq"):
		return "fetch pending rows"
	case strings.Contains(s, "INSERT INTO "+c.prefix+"relays"):
		return "heartbeat"
	case strings.HasPrefix(s, "UPDATE "+c.prefix+"leases"):
		return "acquire/renew leases"
	}
	s = strings.ReplaceAll(s, c.prefix, "")
	if len(s) > 48 {
		s = s[:48] + "…"
	}
	return s
}

func (c *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	c.add(c.kind(data.SQL))
	return ctx
}

func (c *statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *statementCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (c *statementCounter) TraceBatchQuery(_ context.Context, _ *pgx.Conn, data pgx.TraceBatchQueryData) {
	c.add(batchKind + c.kind(data.SQL))
}

func (c *statementCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func (c *statementCounter) TraceCopyFromStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceCopyFromStartData) context.Context {
	c.add("copy: " + data.TableName.Sanitize())
	return ctx
}

func (c *statementCounter) TraceCopyFromEnd(context.Context, *pgx.Conn, pgx.TraceCopyFromEndData) {}

// sortedStatements lists counts by kind, the most frequent first.
func sortedStatements(m map[string]int64) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int {
		if m[a] != m[b] {
			if m[a] > m[b] {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	return keys
}

// StatementKinds lists the kinds of r's idle statements, the most
// frequent first.
func (r LatencyResult) StatementKinds() []string { return sortedStatements(r.IdleStatements) }

// BusyStatementKinds lists the kinds of the statements r's relay sent
// under the paced load, the most frequent first.
func (r LatencyResult) BusyStatementKinds() []string { return sortedStatements(r.BusyStatements) }

// wakeUp says how the relay learns of the rows in a run with opts.
func wakeUp(opts LatencyOptions) string {
	switch {
	case !opts.SeparateWriter && opts.NoSignals:
		return "relay's client: in-process wake-up, no change signals"
	case !opts.SeparateWriter:
		return "relay's client: in-process wake-up and change signals"
	case opts.NoSignals:
		return "separate client: polling only"
	}
	return "separate client: change signals"
}
