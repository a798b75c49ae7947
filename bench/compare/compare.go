// Package compare measures postbox's backlog drain next to Watermill's
// forwarder, with the raw JetStream publish rate of the same run as the
// baseline for both: the machine is shared and noisy, so only ratios taken
// within one run mean something.
//
// One run has three phases, each against the same PostgreSQL and NATS
// server and with the same payloads:
//
//  1. raw: messages published straight to a JetStream stream, asynchronously
//     with a window (the baseline of docs/design.md §6), then a smaller sample
//     published synchronously, one ack at a time (what Watermill's JetStream
//     publisher does);
//  2. postbox: a backlog written to the outbox with Client.Write, then drained
//     by a relay with default settings until the outbox is empty and the
//     stream holds every message;
//  3. Watermill: an equal backlog written to watermill-sql's table through
//     the forwarder's publisher inside transactions, then forwarded to
//     JetStream by Watermill's forwarder until the stream holds every message
//     or the phase's cap is reached.
//
// Every table and stream a run makes is named after a random tag and dropped
// when the run ends.
package compare

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sort"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/postbox-go/postbox/postboxnats"
)

// Options configure one run. The zero value of every field means its
// default.
type Options struct {
	DatabaseURL  string // default postgres://postgres@127.0.0.1:5432/test
	NatsURL      string // default nats://127.0.0.1:4222
	Messages     int    // backlog size; default 100,000
	PayloadBytes int    // default 256
	// Keys is the number of distinct postbox ordering keys; 0 writes
	// keyless messages. Watermill's SQL subscriber keeps one total order
	// whatever the keys.
	Keys int
	// Window is the raw baseline's async publish window; default 256, the
	// relay's default window.
	Window int
	// SyncSample is the number of messages of the synchronous raw
	// baseline; default min(Messages, 20,000).
	SyncSample int
	// WatermillMax caps the messages the forwarder is timed on; 0 means
	// all of them. The whole backlog is written either way, so that the
	// forwarder reads the same table size as the relay.
	WatermillMax int
	// WatermillTimeout caps the forwarder phase; the rate is then taken
	// over the messages it reached. Default 3 minutes.
	WatermillTimeout time.Duration
	// WatermillBatch is the SQL subscriber's SubscribeBatchSize; 0 keeps
	// Watermill's default (100).
	WatermillBatch int
	// WatermillSchema picks watermill-sql's PostgreSQL adapters:
	// SchemaDefault (DefaultPostgreSQLSchema and
	// DefaultPostgreSQLOffsetsAdapter, the pair its docs give for
	// PostgreSQL) or SchemaQueue (PostgreSQLQueueSchema and
	// PostgreSQLQueueOffsetsAdapter with DeleteOnAck). Default
	// SchemaDefault.
	WatermillSchema string
	// PhaseTimeout bounds every other phase; default 10 minutes.
	PhaseTimeout time.Duration
}

// Values of Options.WatermillSchema.
const (
	SchemaDefault = "default"
	SchemaQueue   = "queue"
)

func (o *Options) defaults() {
	if o.DatabaseURL == "" {
		o.DatabaseURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	if o.NatsURL == "" {
		o.NatsURL = "nats://127.0.0.1:4222"
	}
	if o.Messages <= 0 {
		o.Messages = 100_000
	}
	if o.PayloadBytes <= 0 {
		o.PayloadBytes = 256
	}
	if o.Window <= 0 {
		o.Window = 256
	}
	if o.SyncSample <= 0 {
		o.SyncSample = min(o.Messages, 20_000)
	}
	if o.WatermillMax <= 0 || o.WatermillMax > o.Messages {
		o.WatermillMax = o.Messages
	}
	if o.WatermillTimeout <= 0 {
		o.WatermillTimeout = 3 * time.Minute
	}
	if o.PhaseTimeout <= 0 {
		o.PhaseTimeout = 10 * time.Minute
	}
	if o.WatermillSchema == "" {
		o.WatermillSchema = SchemaDefault
	}
}

// Result is one run's figures; rates are messages per second.
type Result struct {
	Messages     int
	PayloadBytes int

	RawRate     float64 // raw JetStream async publishes acknowledged per second
	RawSyncRate float64 // raw JetStream synchronous publishes per second

	PostboxWriteRate float64 // backlog rows written per second
	PostboxRate      float64 // backlog drained and acknowledged per second
	PostboxElapsed   time.Duration

	WatermillWriteRate float64 // backlog rows written per second
	WatermillRate      float64 // messages forwarded and acknowledged per second
	WatermillElapsed   time.Duration
	WatermillTarget    int  // messages the forwarder was timed on
	WatermillReached   int  // messages the stream held when the clock stopped
	WatermillCapped    bool // the phase hit WatermillTimeout before the target
}

// PostboxRatio is the postbox drain rate over the raw async rate.
func (r Result) PostboxRatio() float64 { return ratio(r.PostboxRate, r.RawRate) }

// WatermillRatio is the forwarder's rate over the raw async rate.
func (r Result) WatermillRatio() float64 { return ratio(r.WatermillRate, r.RawRate) }

// Speedup is the postbox drain rate over the forwarder's rate.
func (r Result) Speedup() float64 { return ratio(r.PostboxRate, r.WatermillRate) }

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// run holds what the phases of one run share.
type run struct {
	opts    Options
	out     io.Writer
	tag     string
	payload []byte
	nc      *nats.Conn
	js      jetstream.JetStream
	pool    *pgxpool.Pool
}

// Run makes one measurement of the three phases and cleans up after
// itself, whether it succeeds or not.
func Run(ctx context.Context, opts Options, out io.Writer) (Result, error) {
	opts.defaults()
	if opts.WatermillSchema != SchemaDefault && opts.WatermillSchema != SchemaQueue {
		return Result{}, fmt.Errorf("unknown Watermill schema %q: want %q or %q", opts.WatermillSchema, SchemaDefault, SchemaQueue)
	}
	res := Result{Messages: opts.Messages, PayloadBytes: opts.PayloadBytes}
	nc, err := nats.Connect(opts.NatsURL)
	if err != nil {
		return res, fmt.Errorf("connect to NATS at %s: %w", opts.NatsURL, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return res, err
	}
	pool, err := pgxpool.New(ctx, opts.DatabaseURL)
	if err != nil {
		return res, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		return res, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	r := &run{
		opts: opts, out: out, nc: nc, js: js, pool: pool,
		tag:     fmt.Sprintf("%d", rand.Uint32()), //nolint:gosec // a name, not a secret
		payload: make([]byte, opts.PayloadBytes),
	}
	for i := range r.payload {
		r.payload[i] = 'a' + byte(i%26)
	}
	phases := []struct {
		name    string
		timeout time.Duration
		fn      func(context.Context, *Result) error
	}{
		{"raw", opts.PhaseTimeout, r.raw},
		{"postbox", opts.PhaseTimeout, r.postbox},
		// The forwarder's own cap is enforced inside the phase; the
		// phase timeout covers writing its backlog and shutting it down.
		{"watermill", opts.PhaseTimeout + opts.WatermillTimeout, r.watermill},
	}
	for _, p := range phases {
		pctx, cancel := context.WithTimeout(ctx, p.timeout)
		err := p.fn(pctx, &res)
		cancel()
		if err != nil {
			return res, fmt.Errorf("%s phase: %w", p.name, err)
		}
	}
	return res, nil
}

// stream makes a stream for one phase and returns a function that deletes
// it.
func (r *run) stream(ctx context.Context, name, subjects string) (func(), error) {
	if _, err := postboxnats.EnsureStream(ctx, r.js, jetstream.StreamConfig{Name: name, Subjects: []string{subjects}}); err != nil {
		return nil, err
	}
	return func() {
		dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = r.js.DeleteStream(dctx, name)
	}, nil
}

// streamMsgs is the number of messages a stream holds.
func (r *run) streamMsgs(ctx context.Context, name string) (int, error) {
	s, err := r.js.Stream(ctx, name)
	if err != nil {
		return 0, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0, err
	}
	return int(info.State.Msgs), nil
}

// exec runs a statement with a context of its own, for clean-ups that must
// run after the phase's context has ended.
func (r *run) exec(sql string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, _ = r.pool.Exec(ctx, sql)
}

// poll calls done every 20ms until it reports true, fails, or ctx ends.
func poll(ctx context.Context, done func() (bool, error)) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, err := done()
		if err != nil || ok {
			return err
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

var errTooMany = errors.New("the stream holds more messages than were written")

// Median returns the median of each figure over runs, taken figure by
// figure (the median of a ratio is not the ratio of the medians), with the
// ratios in Ratios.
func Median(runs []Result) (Result, Ratios) {
	if len(runs) == 0 {
		return Result{}, Ratios{}
	}
	pick := func(f func(Result) float64) float64 {
		xs := make([]float64, len(runs))
		for i, r := range runs {
			xs[i] = f(r)
		}
		sort.Float64s(xs)
		if len(xs)%2 == 1 {
			return xs[len(xs)/2]
		}
		return (xs[len(xs)/2-1] + xs[len(xs)/2]) / 2
	}
	med := Result{
		Messages:           runs[0].Messages,
		PayloadBytes:       runs[0].PayloadBytes,
		RawRate:            pick(func(r Result) float64 { return r.RawRate }),
		RawSyncRate:        pick(func(r Result) float64 { return r.RawSyncRate }),
		PostboxWriteRate:   pick(func(r Result) float64 { return r.PostboxWriteRate }),
		PostboxRate:        pick(func(r Result) float64 { return r.PostboxRate }),
		WatermillWriteRate: pick(func(r Result) float64 { return r.WatermillWriteRate }),
		WatermillRate:      pick(func(r Result) float64 { return r.WatermillRate }),
	}
	return med, Ratios{
		Postbox:   pick(Result.PostboxRatio),
		Watermill: pick(Result.WatermillRatio),
		Speedup:   pick(Result.Speedup),
	}
}

// Ratios are the medians of the per-run ratios.
type Ratios struct {
	Postbox   float64 // postbox drain / raw async
	Watermill float64 // forwarder / raw async
	Speedup   float64 // postbox drain / forwarder
}
