package postbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/postbox-go/postbox/postboxdriver"
)

// BatchConfig configures Inbox.BatchProcessor. Zero fields take the
// documented defaults.
type BatchConfig struct {
	// MaxBatch bounds the deliveries one transaction commits. Default 64,
	// which is also the most: after a handler failed, the batch runs again with every
	// handler in a savepoint of its own, that is a subtransaction, and a
	// PostgreSQL transaction with more than 64 of them that wrote
	// overflows its backend's cache of subtransaction ids, which slows
	// down the snapshots of every other session while it runs. Batches
	// only grow this large under load (they form from the deliveries
	// waiting); set it lower to bound what a failing handler makes run
	// twice, or what a batch's locks hold up.
	MaxBatch int
	// MaxWait is how long a batch that could start waits for more
	// deliveries to join it, unless MaxBatch of them are already there.
	// Default 0: a batch starts at once with whatever is waiting. Batches
	// still grow with the load: while Concurrency batches run, new
	// deliveries queue up and form the next one. At most 1s.
	MaxWait time.Duration
	// Concurrency bounds the batches in flight at once, each holding one
	// database connection for its transaction. Default 2. Keep it below
	// the pool's size: counting a failed attempt and writing a dead message
	// take a connection of their own while the batch's is held.
	Concurrency int
}

// Batch processing defaults and bounds.
const (
	DefaultBatchMax         = 64
	DefaultBatchConcurrency = 2
	maxBatchMax             = 64
	maxBatchConcurrency     = 256
	maxBatchWait            = time.Second

	// batchSavepoint names the savepoint each handler runs in when a
	// batch runs again after a handler failed.
	// Savepoints are opened one inside the other and never released:
	// ROLLBACK TO names the latest of the name, which is the one just
	// before the failing handler, and the commit keeps them all.
	batchSavepoint = "postbox_handler"
)

func (c *BatchConfig) withDefaults() BatchConfig {
	var out BatchConfig
	if c != nil {
		out = *c
	}
	if out.MaxBatch == 0 {
		out.MaxBatch = DefaultBatchMax
	}
	if out.Concurrency == 0 {
		out.Concurrency = DefaultBatchConcurrency
	}
	return out
}

func (c *BatchConfig) validate() error {
	var ps []*ValidationError
	if c.MaxBatch < 1 || c.MaxBatch > maxBatchMax {
		ps = append(ps, invalid("MaxBatch", c.MaxBatch, "must be between 1 and %d: each handler is a subtransaction, and PostgreSQL slows every session down when a transaction holds more than 64", maxBatchMax))
	}
	if c.MaxWait < 0 || c.MaxWait > maxBatchWait {
		ps = append(ps, invalid("MaxWait", c.MaxWait, "must be between 0 and %s", maxBatchWait))
	}
	if c.Concurrency < 1 || c.Concurrency > maxBatchConcurrency {
		ps = append(ps, invalid("Concurrency", c.Concurrency, "must be between 1 and %d", maxBatchConcurrency))
	}
	if len(ps) > 0 {
		return &ConfigError{Problems: ps}
	}
	return nil
}

// BatchProcessor returns a Processor that runs h for consumer with group
// commit: the deliveries that arrive while earlier batches are being
// committed are gathered, up to cfg.MaxBatch, into one transaction. It
// records all of them in the inbox with one statement, runs the handler
// of each first copy, and commits once. A failing handler rolls back only
// its own message: the transaction rolls back at the first failure, and
// the batch runs again without that delivery, each handler in a savepoint
// of its own, so that the handlers before the failed one run twice, the
// first run rolled back, and the failed one once. Then every delivery
// gets its verdict, and the subscriber acks; exactly as with Processor, a
// delivery is acknowledged only after its transaction committed, a copy
// runs no handler, and a failed run is counted, retried with backoff and
// dead-lettered after its budget.
//
// Use it when one commit per message is the bottleneck: many small
// deliveries from a subscriber that processes several at once (its
// in-flight window, MaxInFlight for NATS, well above Concurrency). One
// commit then serves many messages; on PostgreSQL this multiplies the
// consumer's throughput. The Processor asks for an in-flight window of
// 2 × MaxBatch × Concurrency (256 at the defaults; see InFlightHinter):
// a subscriber whose window was left at its default takes that, so that
// the next batches fill up while the running ones commit and ack. A
// window set in the subscriber's config is kept. The price: a batch
// holds its locks, and its deliveries wait for their acks, until its
// slowest handler is done, and a handler that waits on another
// transaction holds up the whole batch.
// Handlers run one after the other in a batch, in the order of their
// keys (deliveries of one key in arrival order), so that handlers that
// lock a row per key take the locks of two batches in the same order. If
// the batch's transaction itself fails (a deadlock, a lost connection),
// nothing of it committed, and each of its deliveries is processed again
// on its own. A delivery alone in its batch is processed as Processor
// would.
//
// Process may be called concurrently, and must be for batches to form. A
// batch runs until the contexts of all its deliveries have ended. cfg may
// be nil for the defaults; an invalid one returns a *ConfigError.
func (in *Inbox[TTx]) BatchProcessor(consumer string, h Handler[TTx], cfg *BatchConfig) (Processor, error) {
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	if err := validateConsumer(consumer, "-"); err != nil {
		return nil, err
	}
	if h == nil {
		return nil, invalid("handler", nil, "must not be nil")
	}
	in.register(consumer, h)
	return &batchProcessor[TTx]{in: in, consumer: consumer, h: h, cfg: c}, nil
}

// BatchHandler applies a batch's deliveries inside the consumer's
// transaction tx, together: one statement for all of them, where a
// Handler would run one a message. ds holds the first copies of the
// batch's messages, ordered by key, a key's deliveries in arrival order
// (so that the last of a key is its latest); it is the handler's to read
// during the call only. Every delivery of ds counts as applied if h
// returns nil; an error, or a panic, rolls the whole call back. ctx is the
// batch's, which ends once every delivery's context has ended; with a
// Config.Tracer each delivery's span records its verdict, and with one
// that implements BatchTracer (postboxotel's does) ctx holds the batch's
// span, linked to them, of which h's own spans are children.
type BatchHandler[TTx any] func(ctx context.Context, tx TTx, ds []*Delivery) error

// BatchHandlerProcessor is BatchProcessor with a handler that applies a
// batch's deliveries in one call: a batch of upserts becomes one
// statement, one round trip, instead of one a message
// (BENCHMARKS.md, "A batch applied in one call").
//
// A batch commits exactly as with BatchProcessor: one transaction records
// all its deliveries in the inbox, runs h once with the first copies, and
// commits. If h fails, the transaction rolls back, and the batch runs again
// with h called once for each delivery, ds holding that one alone, each
// call in a savepoint of its own: the deliveries h can apply commit, and
// only those it fails on are counted, retried and dead-lettered. So h must
// accept any subset of the deliveries it is given, a single one included;
// a delivery processed on its own (a redelivery, a copy, one alone in its
// batch, a requeue of a dead message) gets a call of its own too. A
// failure that h cannot pin on a delivery, such as two deliveries of a
// key that one statement cannot update twice, costs the batch that second
// pass: merge them in h instead.
//
// The Inbox keeps h, called with one delivery, as consumer's handler for
// the requeues an operator asks for (RequestRequeue).
func (in *Inbox[TTx]) BatchHandlerProcessor(consumer string, h BatchHandler[TTx], cfg *BatchConfig) (Processor, error) {
	if h == nil {
		return nil, invalid("handler", nil, "must not be nil")
	}
	p, err := in.BatchProcessor(consumer, func(ctx context.Context, tx TTx, d *Delivery) error {
		return h(ctx, tx, []*Delivery{d})
	}, cfg)
	if err != nil {
		return nil, err
	}
	bp := p.(*batchProcessor[TTx])
	bp.many = h
	return bp, nil
}

type batchProcessor[TTx any] struct {
	in       *Inbox[TTx]
	consumer string
	h        Handler[TTx]      // one delivery; wraps many when set
	many     BatchHandler[TTx] // BatchHandlerProcessor's handler, or nil
	cfg      BatchConfig

	mu      sync.Mutex
	queue   []*batchItem // waiting for a batch, in arrival order
	running int          // batches in flight
	fill    chan struct{}
}

// InFlightHint asks for twice the deliveries of Concurrency full batches:
// while those run, and their deliveries wait for their acks, as many
// again gather into the next batches. A subscriber left at its default
// in-flight bound raises it to this (postbox.InFlight).
func (p *batchProcessor[TTx]) InFlightHint() int {
	return 2 * p.cfg.MaxBatch * p.cfg.Concurrency
}

// batchItem is one delivery on its way through a batch.
type batchItem struct {
	ctx   context.Context
	d     *Delivery
	start time.Time
	lead  chan struct{} // closed when the item is to lead a batch
	done  chan struct{} // closed when v is set
	v     Verdict

	// Set while its batch runs.
	hctx  context.Context
	end   func(Verdict)
	fresh bool // first copy: its handler ran
	herr  error
}

// Process implements Processor.
func (p *batchProcessor[TTx]) Process(ctx context.Context, d *Delivery) Verdict {
	if validateConsumer(p.consumer, d.ID) != nil || p.in.countsCrashes(p.consumer, d) {
		// An id the inbox cannot record: Handle buries it. A redelivery
		// is counted before its run (MaxCrashes) and runs on its own, so
		// that the message that keeps killing the process takes no batch
		// down with it, and a batch's first deliveries write nothing more.
		return p.in.Handle(ctx, p.consumer, d, p.h)
	}
	it := &batchItem{ctx: ctx, d: d, start: time.Now(), lead: make(chan struct{}), done: make(chan struct{})}
	p.mu.Lock()
	p.queue = append(p.queue, it)
	p.promoteLocked()
	if p.fill != nil && len(p.queue) >= p.cfg.MaxBatch-1 {
		close(p.fill)
		p.fill = nil
	}
	p.mu.Unlock()
	select {
	case <-it.done:
	case <-it.lead:
		p.lead(it)
	}
	return it.v
}

// promoteLocked lets the oldest waiting deliveries lead a batch each while
// fewer than Concurrency run; p.mu is held.
func (p *batchProcessor[TTx]) promoteLocked() {
	for p.running < p.cfg.Concurrency && len(p.queue) > 0 {
		it := p.queue[0]
		p.queue[0] = nil
		p.queue = p.queue[1:]
		p.running++
		close(it.lead)
	}
}

// lead runs one batch made of first and the deliveries waiting behind it.
func (p *batchProcessor[TTx]) lead(first *batchItem) {
	if p.cfg.MaxWait > 0 {
		p.waitFill()
	}
	p.mu.Lock()
	n := min(len(p.queue), p.cfg.MaxBatch-1)
	batch := make([]*batchItem, 0, n+1)
	batch = append(batch, first)
	batch = append(batch, p.queue[:n]...)
	rest := copy(p.queue, p.queue[n:])
	clear(p.queue[rest:])
	p.queue = p.queue[:rest]
	p.mu.Unlock()

	p.run(batch)

	p.mu.Lock()
	p.running--
	p.promoteLocked()
	p.mu.Unlock()
}

// waitFill waits up to MaxWait for MaxBatch-1 deliveries to queue up.
func (p *batchProcessor[TTx]) waitFill() {
	p.mu.Lock()
	if len(p.queue) >= p.cfg.MaxBatch-1 {
		p.mu.Unlock()
		return
	}
	if p.fill == nil {
		p.fill = make(chan struct{})
	}
	ch := p.fill
	p.mu.Unlock()
	t := time.NewTimer(p.cfg.MaxWait)
	defer t.Stop()
	select {
	case <-ch:
	case <-t.C:
	}
}

// run processes a batch and settles every item in it.
func (p *batchProcessor[TTx]) run(batch []*batchItem) {
	began := time.Now()
	if len(batch) == 1 {
		it := batch[0]
		it.v = p.in.Handle(it.ctx, p.consumer, it.d, p.h)
		close(it.done)
		inboxBatch(p.in.cfg.Metrics, &InboxBatchReport{Consumer: p.consumer, Size: 1, Outcome: BatchAlone, Duration: time.Since(began)})
		return
	}
	ctx, stop := batchContext(batch)
	defer stop()

	// Handlers run in key order, a key's deliveries in arrival order.
	sort.SliceStable(batch, func(i, j int) bool { return batch[i].d.Key < batch[j].d.Key })
	// A second copy of an id in the same batch waits for the batch to
	// commit and then goes through the inbox on its own: it finds the
	// record, or runs if the first copy's handler failed.
	seen := make(map[string]bool, len(batch))
	members := batch[:0:0]
	var copies []*batchItem
	for _, it := range batch {
		if seen[it.d.ID] {
			copies = append(copies, it)
			continue
		}
		seen[it.d.ID] = true
		members = append(members, it)
	}
	ids := make([]string, len(members))
	for i, it := range members {
		ids[i] = it.d.ID
		it.hctx = ctx
		if t := p.in.cfg.Tracer; t != nil {
			it.hctx, it.end = t.StartHandle(ctx, p.consumer, it.d)
		}
	}
	var endSpan func(*InboxBatchReport)
	if t, ok := p.in.cfg.Tracer.(BatchTracer); ok {
		hctxs := make([]context.Context, len(members))
		for i, it := range members {
			hctxs[i] = it.hctx
		}
		ctx, endSpan = t.StartBatch(ctx, p.consumer, hctxs)
	}

	alone.RLock()
	outcome := BatchCommitted
	err := p.in.store.InTx(ctx, func(tx TTx) error { return p.apply(ctx, tx, members, ids, false) })
	if errors.Is(err, errBatchHandlerFailed) {
		outcome = BatchSecondPass
		// The first pass ran no savepoints and stopped at its first
		// failing handler, and nothing of it committed. The batch runs
		// again without that delivery, which keeps its error, each
		// handler in a savepoint of its own. A BatchHandler's failure
		// names no delivery: the batch runs again whole, one call and
		// one savepoint a delivery.
		again := make([]*batchItem, 0, len(members)-1)
		againIDs := make([]string, 0, len(members)-1)
		for _, it := range members {
			if it.herr == nil {
				again = append(again, it)
				againIDs = append(againIDs, it.d.ID)
			}
		}
		err = nil
		if len(again) > 0 {
			err = p.in.store.InTx(ctx, func(tx TTx) error { return p.apply(ctx, tx, again, againIDs, true) })
		}
	}
	alone.RUnlock()

	for _, it := range members {
		switch {
		case err != nil:
			// Nothing of the batch committed (or, after a commit whose
			// outcome was lost, the inbox holds its records): each
			// delivery goes through the inbox again on its own.
			it.v = p.in.handle(it.hctx, p.consumer, it.d, p.h)
		case !it.fresh:
			it.v = Verdict{Action: Ack, Duplicate: true}
		case it.herr == nil:
			it.v = Verdict{Action: Ack}
		default:
			it.v = p.in.failed(it.hctx, p.consumer, it.d, &handlerError{it.herr}, false)
		}
		inboxHandled(p.in.cfg.Metrics, p.consumer, it.d.Topic, it.v, time.Since(it.start))
		if it.end != nil {
			it.end(it.v)
		}
		close(it.done)
	}
	if err != nil {
		outcome = BatchOneByOne
		p.in.log.Warn("postbox inbox: a batch transaction failed; its messages were processed one by one",
			slog.String("consumer", p.consumer), slog.Int("size", len(members)), slog.Any("error", err))
	}
	report := &InboxBatchReport{Consumer: p.consumer, Size: len(members), Copies: len(copies), Outcome: outcome, Duration: time.Since(began)}
	inboxBatch(p.in.cfg.Metrics, report)
	if endSpan != nil {
		endSpan(report)
	}
	for _, it := range copies {
		it.v = p.in.Handle(it.ctx, p.consumer, it.d, p.h)
		close(it.done)
	}
}

// errBatchHandlerFailed ends a batch's first pass, which runs its
// handlers without savepoints, at its first failing handler.
var errBatchHandlerFailed = errors.New("postbox: a handler of the batch failed")

// apply records a batch's members in the inbox in tx and runs each first
// copy's handler. Each member's fresh and herr tell what happened.
//
// Unguarded (the first pass), the handlers run one after the other in the
// transaction itself, and the first that fails ends the pass with
// errBatchHandlerFailed, its member's herr set: the caller rolls the
// transaction back. A savepoint costs a round trip and a subtransaction a
// message, about a fifth of the consumer's CPU in a batch of upserts
// (BENCHMARKS.md, "The batching inbox without a savepoint a message"),
// and a batch in which no handler fails needs none. A BatchHandler runs
// once for all first copies instead, and its failure sets no herr.
//
// Guarded, each handler runs in a savepoint of its own; a failing handler
// is rolled back to its savepoint and its inbox record deleted, so that
// its next delivery runs again.
func (p *batchProcessor[TTx]) apply(ctx context.Context, tx TTx, members []*batchItem, ids []string, guarded bool) error {
	ex := p.in.store.UnwrapExecutor(tx)
	fresh, err := ex.InboxInsertMany(ctx, p.consumer, ids)
	if err != nil {
		return err
	}
	for i, it := range members {
		it.fresh, it.herr = fresh[i], nil
	}
	if !guarded && p.many != nil {
		return p.applyMany(ctx, ex, tx, members)
	}
	var failed []string
	for _, it := range members {
		if !it.fresh {
			continue
		}
		if guarded {
			if err := ex.Savepoint(ctx, batchSavepoint); err != nil {
				return err
			}
		}
		if herr := callHandler(it.hctx, p.h, tx, it.d); herr != nil {
			it.herr = herr
			if !guarded {
				return errBatchHandlerFailed
			}
			if err := ex.RollbackToSavepoint(ctx, batchSavepoint); err != nil {
				return err
			}
			failed = append(failed, it.d.ID)
		}
	}
	if err := ex.InboxDelete(ctx, p.consumer, failed); err != nil {
		return err
	}
	return p.keep(ctx, ex, members)
}

// applyMany is apply's first pass for a BatchHandler: one call with every
// first copy.
func (p *batchProcessor[TTx]) applyMany(ctx context.Context, ex postboxdriver.Executor, tx TTx, members []*batchItem) error {
	ds := make([]*Delivery, 0, len(members))
	for _, it := range members {
		if it.fresh {
			ds = append(ds, it.d)
		}
	}
	if len(ds) > 0 {
		if err := recovered(func() error { return p.many(ctx, tx, ds) }); err != nil {
			p.in.log.Debug("postbox inbox: a batch handler failed; the batch runs again, a call a delivery",
				slog.String("consumer", p.consumer), slog.Int("size", len(ds)), slog.Any("error", err))
			return errBatchHandlerFailed
		}
	}
	return p.keep(ctx, ex, members)
}

// keep extends the inbox records of a batch's applied members as the
// producers' replay horizon asks.
func (p *batchProcessor[TTx]) keep(ctx context.Context, ex postboxdriver.Executor, members []*batchItem) error {
	// The records kept past InboxRetention for the producers' replay
	// horizon (Inbox.keepFor), in one statement per distinct horizon: in
	// practice one, or none.
	var keeps map[time.Duration][]string
	for _, it := range members {
		if it.herr != nil {
			continue
		}
		if keep, ok := p.in.keepFor(it.d, !it.fresh); ok {
			if keeps == nil {
				keeps = map[time.Duration][]string{}
			}
			keeps[keep] = append(keeps[keep], it.d.ID)
		}
	}
	for keep, ids := range keeps {
		if err := ex.InboxKeep(ctx, p.consumer, ids, keep); err != nil {
			return err
		}
	}
	return nil
}

// batchContext returns the context a batch runs in: the values of its
// first delivery's context, ended once every delivery's context has
// ended, or by the returned stop.
func batchContext(batch []*batchItem) (context.Context, func()) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(batch[0].ctx))
	var live atomic.Int64
	live.Store(int64(len(batch)))
	stops := make([]func() bool, len(batch))
	for i, it := range batch {
		stops[i] = context.AfterFunc(it.ctx, func() {
			if live.Add(-1) == 0 {
				cancel()
			}
		})
	}
	return ctx, func() {
		for _, s := range stops {
			s()
		}
		cancel()
	}
}

// callHandler runs h, turning a panic into an error.
func callHandler[TTx any](ctx context.Context, h Handler[TTx], tx TTx, d *Delivery) error {
	return recovered(func() error { return h(ctx, tx, d) })
}

// recovered runs fn, turning a panic into an error.
func recovered(fn func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("handler panicked: %v", r)
		}
	}()
	return fn()
}
