package bench

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"sort"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/cpuuse"
	"github.com/postbox-go/postbox/internal/procfunc"
	"github.com/postbox-go/postbox/postboxnats"
)

// InboxOptions configure the consumer benchmark.
type InboxOptions struct {
	DatabaseURL  string
	NatsURL      string
	Messages     int // default 20,000
	PayloadBytes int // default 256
	Keys         int // distinct ordering keys, one counter row each; default 1,000
	// MaxInFlight is the subscriber's; 0 means the library's default.
	MaxInFlight int
	// PoolSize is the pgx pool's MaxConns; 0 means pgxpool's default.
	PoolSize int
	// PerKey turns on the subscriber's per-key order.
	PerKey bool
	// Batch is the MaxBatch of the batched phase (Inbox.BatchProcessor);
	// 0 skips that phase.
	Batch            int
	BatchWait        time.Duration
	BatchConcurrency int
	// NoSingle skips the phase with one transaction per message.
	NoSingle bool
	// NoCall skips the phase that applies each batch in one handler call
	// (Inbox.BatchHandlerProcessor).
	NoCall bool
	// FailEvery, when above 0, fails the first delivery of one message in
	// FailEvery (chosen by its id) in the inbox phases: its handler writes
	// and then returns an error, so that its run is rolled back, counted
	// and retried after the inbox's backoff. The phase's time then
	// includes the last retry's delay; its CPU a message is the figure to
	// compare.
	FailEvery int
	// CPUProfile, when set, names a file that receives a CPU profile of
	// the last inbox phase.
	CPUProfile string
	// Progress is the interval of progress lines; default 1s.
	Progress time.Duration
}

// InboxResult is one run's figures, each in messages per second.
type InboxResult struct {
	Messages int
	// RawRate: the subscriber with a processor that only acks.
	RawRate float64
	// PlainRate: the same subscriber and domain write, one transaction per
	// message, no inbox.
	PlainRate float64
	// SingleRate: the domain write through the inbox, a transaction per
	// message (Inbox.Processor).
	SingleRate float64
	// BatchRate: the same through Inbox.BatchProcessor.
	BatchRate float64
	// BatchCommits counts the batched phase's transactions.
	BatchCommits int
	// CallRate: the same batches through Inbox.BatchHandlerProcessor, one
	// upsert statement a batch.
	CallRate float64
	// CallCommits counts that phase's transactions.
	CallCommits int
	// CPU is each phase's CPU per message by process, by the phase's
	// name ("raw", "plain", "single", "batch", "call"), where /proc is
	// readable.
	CPU map[string]CPUUse
}

// Best is the rate of the last inbox phase that ran: batched, else one
// transaction per message.
func (r InboxResult) Best() float64 {
	if r.BatchRate > 0 {
		return r.BatchRate
	}
	return r.SingleRate
}

func (o *InboxOptions) defaults() {
	defaultURLs(&o.DatabaseURL, defaultDatabaseURL, &o.NatsURL)
	if o.Messages <= 0 {
		o.Messages = 20_000
	}
	if o.PayloadBytes <= 0 {
		o.PayloadBytes = 256
	}
	if o.Keys <= 0 {
		o.Keys = 1000
	}
	if o.Progress <= 0 {
		o.Progress = time.Second
	}
}

// Inbox fills a JetStream stream with messages and consumes it up to five
// times with the postboxnats Subscriber, each time through a durable
// consumer of its own: acking only (raw); applying a domain write (a
// counter per key) in a transaction of its own per message (plain); the
// same write through the inbox on PostgreSQL, a transaction per message
// (single); through the batching processor, a handler a message (batch);
// and through the batching processor with one handler call a batch, its
// counts merged by key into one upsert (call). It then checks that every
// phase applied every message exactly once.
func Inbox(ctx context.Context, opts InboxOptions, out io.Writer) (InboxResult, error) {
	opts.defaults()
	res := InboxResult{Messages: opts.Messages, CPU: map[string]CPUUse{}}
	tag := randTag()
	subject := "bench.inbox." + tag
	stream, err := openStream(ctx, opts.NatsURL, "BENCH_INBOX_"+tag, subject+".", 0, jetstream.WithPublishAsyncMaxPending(256))
	if err != nil {
		return res, err
	}
	defer stream.close(ctx)
	js, streamName := stream.js, stream.name

	payload := makePayload(opts.PayloadBytes)
	fmt.Fprintf(out, "filling stream %s: %d messages of %d bytes over %d keys\n", streamName, opts.Messages, opts.PayloadBytes, opts.Keys)
	want := make(map[string]int64, opts.Keys)
	for i := range opts.Messages {
		key := fmt.Sprintf("key-%d", i%opts.Keys)
		want[key]++
		m := nats.NewMsg(subject + ".m")
		m.Data = payload
		m.Header.Set(postbox.HeaderPartitionKey, key)
		for {
			_, err := js.PublishMsgAsync(m, jetstream.WithMsgID(postbox.NewID()))
			if err == nil {
				break
			}
			if !errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
				return res, fmt.Errorf("fill: %w", err)
			}
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		return res, ctx.Err()
	}

	cfg, err := pgxpool.ParseConfig(opts.DatabaseURL)
	if err != nil {
		return res, err
	}
	if opts.PoolSize > 0 {
		cfg.MaxConns = int32(opts.PoolSize)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return res, err
	}
	defer pool.Close()
	prefix := "bench_" + tag + "_"
	driver, drop, err := migrated(ctx, pool, prefix)
	if err != nil {
		return res, err
	}
	defer drop()
	tables := []string{"counts_plain", "counts_single", "counts_batch", "counts_call"}
	for _, t := range tables {
		if _, err := pool.Exec(ctx, "CREATE TABLE "+prefix+t+" (key text PRIMARY KEY, n bigint NOT NULL)"); err != nil {
			return res, err
		}
	}
	upsert := func(table string) string {
		return "INSERT INTO " + prefix + table + " (key, n) VALUES ($1, 1) ON CONFLICT (key) DO UPDATE SET n = " + prefix + table + ".n + 1"
	}
	upsertPlain := upsert("counts_plain")
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))

	phase := func(name string, p postbox.Processor, profile string) (float64, error) {
		cons, err := postboxnats.EnsureConsumer(ctx, js, streamName, jetstream.ConsumerConfig{
			Durable: name, AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: -1, MaxAckPending: 20_000,
		})
		if err != nil {
			return 0, err
		}
		sub, err := postboxnats.NewSubscriber(cons, &postboxnats.SubscriberConfig{
			MaxInFlight: opts.MaxInFlight, PerKey: opts.PerKey, SubjectPrefix: subject + ".", Logger: quiet,
		})
		if err != nil {
			return 0, err
		}
		var done atomic.Int64
		all := make(chan struct{})
		counted := procfunc.Wrapping(p, procfunc.Func(func(ctx context.Context, d *postbox.Delivery) postbox.Verdict {
			v := p.Process(ctx, d)
			if v.Action == postbox.Ack && !v.Duplicate && done.Add(1) == int64(opts.Messages) {
				close(all)
			}
			return v
		}))
		stopProfile, err := startCPUProfile(profile)
		if err != nil {
			return 0, err
		}
		defer stopProfile()
		cpu := cpuuse.Phase()
		runCtx, stop := context.WithCancel(ctx)
		ran := make(chan error, 1)
		start := time.Now()
		go func() { ran <- sub.Run(runCtx, counted) }()
		tick := time.NewTicker(opts.Progress)
		defer tick.Stop()
		last, lastAt := int64(0), start
		var runErr error
	wait:
		for {
			select {
			case <-all:
				break wait
			case now := <-tick.C:
				n := done.Load()
				fmt.Fprintf(out, "  %s: %d/%d, %.0f msg/s\n", name, n, opts.Messages, float64(n-last)/now.Sub(lastAt).Seconds())
				last, lastAt = n, now
			case runErr = <-ran:
				break wait
			case <-ctx.Done():
				runErr = ctx.Err()
				break wait
			}
		}
		elapsed := time.Since(start)
		stop()
		if runErr == nil {
			runErr = <-ran
		}
		if runErr != nil {
			return 0, fmt.Errorf("%s: subscriber: %w", name, runErr)
		}
		if n := done.Load(); n != int64(opts.Messages) {
			return 0, fmt.Errorf("%s: %d of %d messages applied", name, n, opts.Messages)
		}
		rate := float64(opts.Messages) / elapsed.Seconds()
		fmt.Fprintf(out, "  %s: %d messages in %s: %.0f msg/s\n", name, opts.Messages, elapsed.Round(time.Millisecond), rate)
		if use, ok := cpu(opts.Messages); ok {
			res.CPU[name] = use
			fmt.Fprintf(out, "  %s: CPU per message: this process %s, postgres %s, nats-server %s\n", name, us(use.Self), us(use.Database), us(use.Broker))
		}
		return rate, nil
	}

	fmt.Fprintf(out, "raw: subscriber acks only (max in flight %d)\n", orDefault(opts.MaxInFlight, postboxnats.DefaultMaxInFlight))
	raw := procfunc.Func(func(context.Context, *postbox.Delivery) postbox.Verdict { return postbox.Verdict{Action: postbox.Ack} })
	if res.RawRate, err = phase("raw", raw, ""); err != nil {
		return res, err
	}

	fmt.Fprintf(out, "plain: counter upsert in a transaction per message, no inbox (pool %d)\n", cfg.MaxConns)
	plain := procfunc.Func(func(ctx context.Context, d *postbox.Delivery) postbox.Verdict {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, upsertPlain, d.Key)
			return err
		})
		if err != nil {
			return postbox.Verdict{Action: postbox.Retry, Delay: time.Second, Err: err}
		}
		return postbox.Verdict{Action: postbox.Ack}
	})
	if res.PlainRate, err = phase("plain", plain, ""); err != nil {
		return res, err
	}

	inClient, err := postbox.NewClient(driver, &postbox.Config{Prefix: prefix, Logger: quiet})
	if err != nil {
		return res, err
	}
	in := inClient.Inbox()
	var failures atomic.Int64
	handler := func(table string) postbox.Handler[pgx.Tx] {
		q := upsert(table)
		return func(ctx context.Context, tx pgx.Tx, d *postbox.Delivery) error {
			if _, err := tx.Exec(ctx, q, d.Key); err != nil {
				return err
			}
			if d.Delivered == 1 && failsFirst(d.ID, opts.FailEvery) {
				failures.Add(1)
				return errInjected
			}
			return nil
		}
	}
	failed := func(name string) {
		if opts.FailEvery > 0 {
			fmt.Fprintf(out, "  %s: %d handler runs failed on purpose (--fail-every %d)\n", name, failures.Swap(0), opts.FailEvery)
		}
	}
	profileSingle, profileBatch, profileCall := opts.CPUProfile, "", ""
	switch {
	case opts.Batch > 0 && !opts.NoCall:
		profileSingle, profileCall = "", opts.CPUProfile
	case opts.Batch > 0:
		profileSingle, profileBatch = "", opts.CPUProfile
	}
	if !opts.NoSingle {
		fmt.Fprintf(out, "single: counter upsert through the inbox, a transaction per message (pool %d)\n", cfg.MaxConns)
		if res.SingleRate, err = phase("single", in.Processor("single", handler("counts_single")), profileSingle); err != nil {
			return res, err
		}
		if err := checkInbox(ctx, pool, prefix, "single", want, opts.Messages, nil); err != nil {
			return res, err
		}
		fmt.Fprintf(out, "  single: checked: every counter equals its key's message count, one inbox record per message\n")
		failed("single")
	}
	// batched runs a phase of a batching processor and checks it.
	batched := func(name string, p postbox.Processor, profile string, commits *int) (float64, error) {
		rate, err := phase(name, p, profile)
		if err != nil {
			return 0, err
		}
		if err := checkInbox(ctx, pool, prefix, name, want, opts.Messages, commits); err != nil {
			return 0, err
		}
		fmt.Fprintf(out, "  %s: checked: every counter equals its key's message count, one inbox record per message; %d commits (%.1f messages each)\n",
			name, *commits, float64(opts.Messages)/float64(max(*commits, 1)))
		failed(name)
		return rate, nil
	}
	bc := &postbox.BatchConfig{MaxBatch: opts.Batch, MaxWait: opts.BatchWait, Concurrency: opts.BatchConcurrency}
	if opts.Batch > 0 {
		p, err := in.BatchProcessor("batch", handler("counts_batch"), bc)
		if err != nil {
			return res, err
		}
		// The subscriber's default window yields to the processor's hint,
		// up to postboxnats's ceiling of 4096.
		window := orDefault(opts.MaxInFlight, postbox.InFlight(p, postboxnats.DefaultMaxInFlight, 4096))
		fmt.Fprintf(out, "batch: counter upsert through the inbox, batches of up to %d (wait %s, %d at once; pool %d; max in flight %d)\n",
			opts.Batch, opts.BatchWait, orDefault(opts.BatchConcurrency, postbox.DefaultBatchConcurrency), cfg.MaxConns, window)
		if res.BatchRate, err = batched("batch", p, profileBatch, &res.BatchCommits); err != nil {
			return res, err
		}
	}
	if opts.Batch > 0 && !opts.NoCall {
		p, err := in.BatchHandlerProcessor("call", callHandler(prefix+"counts_call", opts.FailEvery, &failures), bc)
		if err != nil {
			return res, err
		}
		fmt.Fprintf(out, "call: the same batches, each applied in one handler call: its counts merged by key into one upsert\n")
		if res.CallRate, err = batched("call", p, profileCall, &res.CallCommits); err != nil {
			return res, err
		}
	}
	if err := checkCounts(ctx, pool, prefix+"counts_plain", want); err != nil {
		return res, err
	}
	fmt.Fprintf(out, "  plain: checked: every counter equals its key's message count\n")
	return res, nil
}

// callHandler applies a batch's deliveries to table in one statement: the
// deliveries come in key order, so a key's are adjacent and merge into one
// row of the upsert, which could not update a row twice. With failEvery,
// a call that holds the first delivery of a message failsFirst picks fails
// after its write, and is counted in failures.
func callHandler(table string, failEvery int, failures *atomic.Int64) postbox.BatchHandler[pgx.Tx] {
	q := "INSERT INTO " + table + " (key, n) SELECT * FROM unnest($1::text[], $2::bigint[]) ON CONFLICT (key) DO UPDATE SET n = " + table + ".n + EXCLUDED.n"
	return func(ctx context.Context, tx pgx.Tx, ds []*postbox.Delivery) error {
		keys := make([]string, 0, len(ds))
		ns := make([]int64, 0, len(ds))
		for _, d := range ds {
			if len(keys) > 0 && keys[len(keys)-1] == d.Key {
				ns[len(ns)-1]++
				continue
			}
			keys = append(keys, d.Key)
			ns = append(ns, 1)
		}
		if _, err := tx.Exec(ctx, q, keys, ns); err != nil {
			return err
		}
		for _, d := range ds {
			if d.Delivered == 1 && failsFirst(d.ID, failEvery) {
				failures.Add(1)
				return errInjected
			}
		}
		return nil
	}
}

// errInjected is the failure --fail-every injects.
var errInjected = errors.New("bench: failure injected (--fail-every)")

// failsFirst says whether the first delivery of the message with this id
// fails: one id in every, those whose FNV-1a hash is a multiple of every.
func failsFirst(id string, every int) bool {
	if every <= 0 {
		return false
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	return h.Sum32()%uint32(every) == 0
}

// checkInbox checks exactly once for one inbox phase: every key's counter
// equals its number of messages, and the inbox holds one record per
// message. Each transaction stamps its records with its own start time
// (now()), so the distinct stamps count the phase's commits.
func checkInbox(ctx context.Context, pool *pgxpool.Pool, prefix, consumer string, want map[string]int64, messages int, commits *int) error {
	if err := checkCounts(ctx, pool, prefix+"counts_"+consumer, want); err != nil {
		return err
	}
	var records, txs int
	if err := pool.QueryRow(ctx, "SELECT count(*), count(DISTINCT received_at) FROM "+prefix+"inbox WHERE consumer = $1", consumer).Scan(&records, &txs); err != nil {
		return err
	}
	if records != messages {
		return fmt.Errorf("%s: the inbox holds %d records, want %d", consumer, records, messages)
	}
	if commits != nil {
		*commits = txs
	}
	return nil
}

func checkCounts(ctx context.Context, pool *pgxpool.Pool, table string, want map[string]int64) error {
	rows, err := pool.Query(ctx, "SELECT key, n FROM "+table)
	if err != nil {
		return err
	}
	got := map[string]int64{}
	var key string
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&key, &n}, func() error {
		got[key] = n
		return nil
	})
	if err != nil {
		return err
	}
	if len(got) != len(want) {
		return fmt.Errorf("%s: %d keys, want %d", table, len(got), len(want))
	}
	for k, w := range want {
		if got[k] != w {
			return fmt.Errorf("%s: key %s applied %d times, want %d", table, k, got[k], w)
		}
	}
	return nil
}

func orDefault(v, def int) int {
	if v == 0 {
		return def
	}
	return v
}

// MedianInbox returns the median of each figure over runs, figure by
// figure.
func MedianInbox(runs []InboxResult) InboxResult {
	pick := func(f func(InboxResult) float64) float64 {
		xs := make([]float64, len(runs))
		for i, r := range runs {
			xs[i] = f(r)
		}
		return median(xs)
	}
	if len(runs) == 0 {
		return InboxResult{}
	}
	return InboxResult{
		Messages:     runs[0].Messages,
		RawRate:      pick(func(r InboxResult) float64 { return r.RawRate }),
		PlainRate:    pick(func(r InboxResult) float64 { return r.PlainRate }),
		SingleRate:   pick(func(r InboxResult) float64 { return r.SingleRate }),
		BatchRate:    pick(func(r InboxResult) float64 { return r.BatchRate }),
		BatchCommits: int(pick(func(r InboxResult) float64 { return float64(r.BatchCommits) })),
		CallRate:     pick(func(r InboxResult) float64 { return r.CallRate }),
		CallCommits:  int(pick(func(r InboxResult) float64 { return float64(r.CallCommits) })),
		CPU:          medianCPU(runs),
	}
}

// InboxPhases names the phases of Inbox, in the order they run.
var InboxPhases = []string{"raw", "plain", "single", "batch", "call"}

// medianCPU is the median of each phase's CPU per message, process by
// process, over the runs that measured the phase.
func medianCPU(runs []InboxResult) map[string]CPUUse {
	out := map[string]CPUUse{}
	for _, phase := range InboxPhases {
		var uses []CPUUse
		for _, r := range runs {
			if u, ok := r.CPU[phase]; ok {
				uses = append(uses, u)
			}
		}
		if len(uses) > 0 {
			out[phase] = medianUse(uses)
		}
	}
	return out
}

// MedianOf returns the median over runs of one figure, such as a ratio
// taken run by run.
func MedianOf(runs []InboxResult, f func(InboxResult) float64) float64 {
	xs := make([]float64, len(runs))
	for i, r := range runs {
		xs[i] = f(r)
	}
	return median(xs)
}

// Ratio returns a / b, or 0 when b is 0 (a phase that did not run).
func Ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

func median(xs []float64) float64 {
	sort.Float64s(xs)
	if len(xs) == 0 {
		return 0
	}
	if len(xs)%2 == 1 {
		return xs[len(xs)/2]
	}
	return (xs[len(xs)/2-1] + xs[len(xs)/2]) / 2
}
