// Package bench holds the benchmarks `postbox bench` runs against real
// servers: each measures postbox next to a baseline taken in the same run,
// so that the ratio means something on a shared, noisy machine.
package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/cpuuse"
	"github.com/postbox-go/postbox/internal/pglog"
	"github.com/postbox-go/postbox/postboxpgx"
)

// DrainOptions configure the backlog drain benchmark.
type DrainOptions struct {
	DatabaseURL string
	// NatsURL may list several servers (a cluster), comma-separated.
	NatsURL string
	// Replicas of both phases' streams (0: one); 3 on a three-node
	// cluster.
	Replicas     int
	Messages     int // default 100,000
	PayloadBytes int // default 256
	Keys         int // distinct ordering keys; 0 means keyless messages
	Window       int // publish window, for postbox and the raw baseline; default 256
	BatchSize    int // relay batch; default 500
	Lanes        int // relay lanes; default the library's
	// CPUProfile, when set, names a file that receives a CPU profile of
	// the drain phase.
	CPUProfile string
	// MemProfile, when set, names a file that receives the allocations
	// of the drain phase, as a profile to read against the one written
	// beside it at the phase's start (MemProfile+".base").
	MemProfile string
	// Storage is "table" (the default: the outbox the drivers keep) or
	// "log" (PostgreSQL only: the log read by snapshot bands, design §3,
	// on the relay's path; internal/pglog). A log's drain samples no
	// timeline of remaining rows.
	Storage string
	// LogChunk, with the log, splits it into chunks of that many seqs,
	// which retention drops whole (pglog.ChunkLog); 0 keeps it whole.
	LogChunk int64
	// SampleEvery, when positive, counts the outbox's remaining rows at
	// this interval during the drain (a count(*) each time, on a
	// connection of its own) and keeps them in DrainResult.Timeline.
	SampleEvery time.Duration
}

// DrainSample is the outbox's remaining rows at a moment of the drain.
type DrainSample struct {
	Seconds   float64 `json:"s"` // since the relay started
	Remaining int64   `json:"remaining"`
}

// DrainResult is one run's figures.
type DrainResult struct {
	// Database names the server the backlog was in: PostgreSQL, MariaDB
	// or MySQL.
	Database string
	// Storage is DrainOptions.Storage: table or log.
	Storage      string
	Messages     int
	RawRate      float64 // raw JetStream async publishes with Nats-Msg-Id acknowledged per second
	RawPlainRate float64 // the same without Nats-Msg-Id
	WriteRate    float64 // rows written per second while filling the backlog
	DrainRate    float64 // backlog rows published and acknowledged per second
	DrainElapsed time.Duration
	Ratio        float64 // DrainRate / RawRate
	RatioPlain   float64 // DrainRate / RawPlainRate
	// RawCPU and DrainCPU are the CPU time per message of this process
	// (the raw publisher, then the relay), of the database server and of
	// nats-server during each phase, read from /proc; CPUKnown is false
	// where it could not be read. Both phases move the same messages to
	// the same server, so the difference is what the outbox costs.
	RawCPU, DrainCPU CPUUse
	// RawPlainCPU is RawCPU's figure for the publishes without
	// Nats-Msg-Id.
	RawPlainCPU CPUUse
	CPUKnown    bool
	// Timeline holds the remaining rows sampled during the drain, when
	// DrainOptions.SampleEvery asked for it: from the backlog at 0 s to
	// 0 at the end.
	Timeline []DrainSample
}

func (o *DrainOptions) defaults() {
	defaultURLs(&o.DatabaseURL, defaultDatabaseURL, &o.NatsURL)
	if o.Messages <= 0 {
		o.Messages = 100_000
	}
	if o.PayloadBytes <= 0 {
		o.PayloadBytes = 256
	}
	if o.Window <= 0 {
		o.Window = 256
	}
	if o.BatchSize <= 0 {
		o.BatchSize = 500
	}
	if o.Storage == "" {
		o.Storage = "table"
	}
}

// Drain measures the raw JetStream async publish rate, then fills an outbox
// with a backlog and measures how fast the relay drains it to JetStream.
func Drain(ctx context.Context, opts DrainOptions, out io.Writer) (DrainResult, error) {
	opts.defaults()
	res := DrainResult{Messages: opts.Messages, Storage: opts.Storage}
	tag := randTag()
	payload := makePayload(opts.PayloadBytes)
	db, err := openDatabase(ctx, opts.DatabaseURL, 0, "")
	if err != nil {
		return res, err
	}
	defer db.close()
	res.Database = db.name()
	pg, isPG := db.(*pgDatabase)
	switch {
	case opts.Storage == "log" && !isPG:
		return res, fmt.Errorf("--storage log needs PostgreSQL; %s has no snapshot a statement can test ids against", db.name())
	case opts.Storage != "log" && opts.Storage != "table":
		return res, fmt.Errorf("--storage is table or log, not %q", opts.Storage)
	case opts.LogChunk < 0 || opts.LogChunk > 0 && opts.Storage != "log":
		return res, fmt.Errorf("--log-chunk %d: a positive chunk width applies to --storage log only (0 keeps the log whole)", opts.LogChunk)
	}

	// The baselines: the same messages published straight to JetStream
	// with the same window, first without an id, then with the
	// Nats-Msg-Id that postbox sets (the server then checks each against
	// its duplicate window).
	raw, err := openStream(ctx, opts.NatsURL, "BENCH_RAW_"+tag, "bench.raw."+tag+".", opts.Replicas, jetstream.WithPublishAsyncMaxPending(opts.Window))
	if err != nil {
		return res, err
	}
	defer raw.close(ctx)
	fmt.Fprintf(out, "raw JetStream: publishing %d messages of %d bytes, window %d, without then with Nats-Msg-Id\n", opts.Messages, opts.PayloadBytes, opts.Window)
	// The ids are made before the clock starts: the outbox makes its ids
	// at write time too, not while draining.
	ids := make([]string, opts.Messages)
	for i := range ids {
		ids[i] = postbox.NewID()
	}
	var ok bool
	if res.RawPlainRate, res.RawPlainCPU, ok, err = publishRaw(ctx, raw.js, "bench.raw."+tag+".m", payload, opts.Messages, nil, db.procs()); err != nil {
		return res, err
	}
	if res.RawRate, res.RawCPU, res.CPUKnown, err = publishRaw(ctx, raw.js, "bench.raw."+tag+".m", payload, opts.Messages, ids, db.procs()); err != nil {
		return res, err
	}
	res.CPUKnown = res.CPUKnown && ok
	fmt.Fprintf(out, "raw JetStream: %.0f msg/s without Nats-Msg-Id, %.0f msg/s with it\n", res.RawPlainRate, res.RawRate)

	prefix := "bench_" + tag + "_"
	drop, err := db.migrate(ctx, prefix)
	if err != nil {
		return res, err
	}
	defer drop()
	drain, err := ensureStream(ctx, raw.nc, "BENCH_DRAIN_"+tag, "bench.drain."+tag+".", opts.Replicas)
	if err != nil {
		return res, err
	}
	defer drain.close(ctx)
	pub, err := drain.publisher()
	if err != nil {
		return res, err
	}
	defer func() { _ = pub.Close(context.WithoutCancel(ctx)) }()
	cfg := &postbox.Config{
		Prefix: prefix, Publisher: pub, PublishWindow: opts.Window, BatchSize: opts.BatchSize, Lanes: opts.Lanes,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	var client benchClient
	var logs *pglog.Driver[pgx.Tx]
	table := prefix + "outbox"
	if opts.Storage == "log" {
		if err := pglog.UseLog(ctx, pg.pool, prefix); err != nil {
			return res, fmt.Errorf("switch the database to the log: %w", err)
		}
		if opts.LogChunk > 0 {
			if _, err := pg.pool.Exec(ctx, pglog.ChunkLog(prefix)); err != nil {
				return res, fmt.Errorf("split the log into chunks: %w", err)
			}
		}
		logs, table = pglog.New(postboxpgx.New(pg.pool), pg.pool, opts.LogChunk), prefix+"log"
		if client, err = postbox.NewClient(logs, cfg); err == nil && opts.LogChunk > 0 {
			// The backlog's rows go into chunks, as a relay's
			// retention pass keeps them ahead of the sequence.
			err = logs.AttachChunks(ctx)
		}
	} else {
		client, err = db.newClient(cfg)
	}
	if err != nil {
		return res, err
	}

	fmt.Fprintf(out, "postbox: writing a backlog of %d messages to %s (%d keys)\n", opts.Messages, db.name(), opts.Keys)
	start := time.Now()
	if err := writeBacklog(ctx, client, payload, opts.Messages, opts.Keys); err != nil {
		return res, err
	}
	res.WriteRate = float64(opts.Messages) / time.Since(start).Seconds()
	if err := db.analyze(ctx, table); err != nil {
		return res, err
	}

	fmt.Fprintf(out, "postbox: draining the backlog to JetStream (storage %s, batch %d, window %d)\n", opts.Storage, opts.BatchSize, opts.Window)
	stopProfile, err := startCPUProfile(opts.CPUProfile)
	if err != nil {
		return res, err
	}
	defer stopProfile()
	stopAllocs, err := startAllocProfile(opts.MemProfile)
	if err != nil {
		return res, err
	}
	drainCPU := cpuuse.Phase(db.procs()...)
	start = time.Now()
	if err := client.Start(ctx); err != nil {
		return res, err
	}
	defer func() { _ = client.Stop(context.WithoutCancel(ctx)) }()
	var timeline <-chan []DrainSample
	sctx, stopSampling := context.WithCancel(ctx)
	defer func() {
		stopSampling()
		if timeline != nil {
			<-timeline
		}
	}()
	if opts.SampleEvery > 0 && logs == nil {
		timeline = sampleRemaining(sctx, db, prefix+"outbox", start, opts.SampleEvery, int64(opts.Messages))
	}
	if logs == nil {
		err = waitOutboxEmpty(ctx, db, prefix, 20*time.Millisecond)
	} else {
		err = waitLogDrained(ctx, db, logs, prefix, int64(opts.Messages), 20*time.Millisecond)
	}
	if err != nil {
		return res, err
	}
	res.DrainElapsed = time.Since(start)
	if err := stopAllocs(); err != nil {
		return res, err
	}
	res.DrainRate = float64(opts.Messages) / res.DrainElapsed.Seconds()
	res.Ratio = res.DrainRate / res.RawRate
	res.RatioPlain = res.DrainRate / res.RawPlainRate
	if res.CPUKnown {
		res.DrainCPU, res.CPUKnown = drainCPU(opts.Messages)
	}
	if timeline != nil {
		stopSampling()
		for _, smp := range <-timeline {
			if smp.Seconds < res.DrainElapsed.Seconds() {
				res.Timeline = append(res.Timeline, smp)
			}
		}
		res.Timeline = append(res.Timeline, DrainSample{Seconds: res.DrainElapsed.Seconds()})
		timeline = nil
	}
	s, err := drain.js.Stream(ctx, drain.name)
	if err != nil {
		return res, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return res, err
	}
	if info.State.Msgs != uint64(opts.Messages) {
		return res, fmt.Errorf("stream holds %d messages after the drain, want %d", info.State.Msgs, opts.Messages)
	}
	fmt.Fprintf(out, "postbox: drained %d messages in %s: %.0f msg/s\n", opts.Messages, res.DrainElapsed.Round(time.Millisecond), res.DrainRate)
	if res.CPUKnown {
		fmt.Fprintf(out, "CPU per message, raw without id: publisher %s, nats-server %s; with id: publisher %s, nats-server %s; drain: relay %s, %s %s, nats-server %s\n",
			us(res.RawPlainCPU.Self), us(res.RawPlainCPU.Broker), us(res.RawCPU.Self), us(res.RawCPU.Broker), us(res.DrainCPU.Self), strings.Join(db.procs(), "/"), us(res.DrainCPU.Database), us(res.DrainCPU.Broker))
	}
	return res, nil
}

// publishRaw publishes n messages of payload to subject with
// PublishMsgAsync, each with ids[i] as its Nats-Msg-Id when ids is not nil,
// waits for every acknowledgement, and returns the rate and the CPU per
// message of this process, the database server (the processes named in
// dbProcs) and nats-server meanwhile (known reports whether /proc could be
// read).
func publishRaw(ctx context.Context, js jetstream.JetStream, subject string, payload []byte, n int, ids []string, dbProcs []string) (rate float64, use CPUUse, known bool, err error) {
	cpu := cpuuse.Phase(dbProcs...)
	start := time.Now()
	for i := 0; i < n; i++ {
		msg := nats.NewMsg(subject)
		msg.Data = payload
		var opts []jetstream.PublishOpt
		if ids != nil {
			opts = append(opts, jetstream.WithMsgID(ids[i]))
		}
		for {
			_, err := js.PublishMsgAsync(msg, opts...)
			if err == nil {
				break
			}
			// A window that stays full for a while is back-pressure, not
			// failure: wait for it to drain and go on.
			if !errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
				return 0, CPUUse{}, false, fmt.Errorf("raw publish: %w", err)
			}
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		return 0, CPUUse{}, false, ctx.Err()
	}
	rate = float64(n) / time.Since(start).Seconds()
	use, known = cpu(n)
	return rate, use, known, nil
}

// sampleRemaining counts table's rows every d from start, on a connection
// of its own, until ctx ends or the table is empty, then sends the
// samples, which begin with total at 0 s.
func sampleRemaining(ctx context.Context, db database, table string, start time.Time, d time.Duration, total int64) <-chan []DrainSample {
	out := make(chan []DrainSample, 1)
	go func() {
		samples := []DrainSample{{Seconds: 0, Remaining: total}}
		defer func() { out <- samples }()
		count, release, err := db.counter(ctx)
		if err != nil {
			return
		}
		defer release()
		tick := time.NewTicker(d)
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
			case <-ctx.Done():
				return
			}
			n, err := count(ctx, table)
			if err != nil {
				return
			}
			samples = append(samples, DrainSample{Seconds: time.Since(start).Seconds(), Remaining: n})
			if n == 0 {
				return
			}
		}
	}()
	return out
}

// Median returns the median of each figure over runs, taken figure by
// figure (the ratio's median is not the ratio of the medians).
func Median(runs []DrainResult) DrainResult {
	pick := func(f func(DrainResult) float64) float64 {
		xs := make([]float64, len(runs))
		for i, r := range runs {
			xs[i] = f(r)
		}
		sort.Float64s(xs)
		if len(xs) == 0 {
			return 0
		}
		if len(xs)%2 == 1 {
			return xs[len(xs)/2]
		}
		return (xs[len(xs)/2-1] + xs[len(xs)/2]) / 2
	}
	cpu := func(f func(DrainResult) CPUUse) CPUUse {
		uses := make([]CPUUse, len(runs))
		for i, r := range runs {
			uses[i] = f(r)
		}
		return medianUse(uses)
	}
	known := true
	for _, r := range runs {
		known = known && r.CPUKnown
	}
	return DrainResult{
		CPUKnown:     known,
		Database:     runs[0].Database,
		RawCPU:       cpu(func(r DrainResult) CPUUse { return r.RawCPU }),
		DrainCPU:     cpu(func(r DrainResult) CPUUse { return r.DrainCPU }),
		Messages:     runs[0].Messages,
		RawPlainCPU:  cpu(func(r DrainResult) CPUUse { return r.RawPlainCPU }),
		RawRate:      pick(func(r DrainResult) float64 { return r.RawRate }),
		RawPlainRate: pick(func(r DrainResult) float64 { return r.RawPlainRate }),
		RatioPlain:   pick(func(r DrainResult) float64 { return r.RatioPlain }),
		DrainRate:    pick(func(r DrainResult) float64 { return r.DrainRate }),
		WriteRate:    pick(func(r DrainResult) float64 { return r.WriteRate }),
		Ratio:        pick(func(r DrainResult) float64 { return r.Ratio }),
	}
}
