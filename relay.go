package postbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/postbox-go/postbox/postboxdriver"
)

// The relay moves committed rows to the broker. Its design, in brief (see
// ARCHITECTURE.md for the whole story):
//
//   - Rows carry partition = hash(key) mod P. Live relays register with a
//     heartbeat and split the partitions between them deterministically;
//     each holds a lease on its share, on the database clock, and the
//     lease's generation changes whenever a partition changes hands.
//   - The owner of a partition reads its pending rows in seq order, without
//     writing anything, publishes them outside any transaction, and then
//     moves the acknowledged ones to the published history with one
//     statement fenced by the generation: a relay that lost a partition
//     while it was publishing changes nothing.
//   - One write per message, instead of a claim and then a mark.

const (
	minPoll = 2 * time.Millisecond
	// deepIdle: a lane that found nothing at PollInterval sleeps this many
	// intervals, waiting for a wake-up from the writer or the idle probe;
	// the long sleep is only a safety net.
	deepIdle      = 10
	minInfraPause = 50 * time.Millisecond
	maxInfraPause = 10 * time.Second
	cleanupBudget = 5 * time.Second
)

type relay struct {
	ex     postboxdriver.Executor
	cfg    *Config
	log    *slog.Logger
	id     string
	wake   <-chan struct{}
	nparts int
	lanes  []*lane
	pub    Publisher // the routes, or the one publisher
	topics []string  // what to fetch; nil for every topic
	// window holds a token per publish awaiting the broker's ack, shared by
	// the lanes: a lane publishing while others read or mark may use all
	// of it.
	window chan struct{}

	// renew asks the coordinator to renew the leases now: a lane's marks
	// were fenced out, so a partition passed to another owner.
	renew chan struct{}

	nextPrune         time.Time // coordinator only
	nextSnapshotCheck time.Time // coordinator only

	mu         sync.Mutex
	held       map[int]int64 // partition -> generation
	validUntil time.Time     // local clock; the held leases end no sooner
	lastBeat   time.Time
}

// A lane runs the fetch, publish, mark cycle over its own share of the
// relay's partitions, so one lane's database round trips overlap another's
// publishing. Lanes never share a partition, and so never a key.
type lane struct {
	r          *relay
	n          int
	wake       chan struct{}
	infraPause time.Duration
	// asleep marks the lane in deep idle: the relay's idle probe reads
	// its partitions for it (see probe).
	asleep atomic.Bool
}

type relayRun struct {
	soft, hard context.CancelFunc
	done       chan struct{}
}

func newRelay(ctx context.Context, ex postboxdriver.Executor, cfg *Config, rs routes, wake <-chan struct{}) (*relay, error) {
	n, err := ex.Partitions(ctx)
	if err != nil {
		return nil, fmt.Errorf("postbox: start relay: %w", err)
	}
	if n < 1 {
		return nil, fmt.Errorf("postbox: start relay: %w: no partitions in the leases table", postboxdriver.ErrNotMigrated)
	}
	id := cfg.RelayID
	if id == "" {
		id = NewID()
	}
	r := &relay{
		ex: ex, cfg: cfg, id: id, wake: wake, nparts: n, pub: rs, topics: rs.patterns(),
		log:  cfg.Logger.With(slog.String("relay", id)),
		held: map[int]int64{}, renew: make(chan struct{}, 1),
	}
	r.window = make(chan struct{}, cfg.PublishWindow)
	for i := range min(cfg.Lanes, n) {
		r.lanes = append(r.lanes, &lane{r: r, n: i, wake: make(chan struct{}, 1)})
	}
	return r, nil
}

func (r *relay) start() *relayRun {
	hard, hardCancel := context.WithCancel(context.Background())
	soft, softCancel := context.WithCancel(hard)
	run := &relayRun{soft: softCancel, hard: hardCancel, done: make(chan struct{})}
	go func() {
		defer close(run.done)
		r.run(soft, hard)
	}()
	return run
}

func (run *relayRun) stop(ctx context.Context) error {
	run.soft()
	select {
	case <-run.done:
		run.hard()
		return nil
	case <-ctx.Done():
		run.hard()
		<-run.done
		return ctx.Err()
	}
}

// run is the coordinator: it keeps the leases, fans wake-ups out to the
// lanes, and on stop waits for them before letting the partitions go.
func (r *relay) run(soft, hard context.Context) {
	defer r.shutdown(hard)
	r.log.Info("postbox relay started", slog.Int("partitions", r.nparts), slog.Int("lanes", len(r.lanes)), slog.String("config", r.cfg.String()))
	if dc, ok := r.ex.(postboxdriver.DurabilityChecker); ok {
		dctx, cancel := context.WithTimeout(soft, r.cfg.LeaseDuration/2)
		warnings, err := dc.DurabilityWarnings(dctx)
		cancel()
		if err != nil {
			r.log.Warn("postbox relay could not read the database's durability settings", slog.Any("error", err))
		}
		for _, w := range warnings {
			r.log.Warn("postbox relay: " + w)
		}
	}
	var wg sync.WaitGroup
	for _, l := range r.lanes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l.run(soft, hard)
		}()
	}
	if len(r.lanes) > 1 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.probe(soft)
		}()
	}
	defer wg.Wait()
	retry := time.Duration(0)
	for soft.Err() == nil {
		r.mu.Lock()
		due := r.lastBeat.Add(r.cfg.LeaseDuration / 3)
		r.mu.Unlock()
		if retry > 0 {
			due = time.Now().Add(retry)
		}
		if wait := time.Until(due); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-r.wake:
				t.Stop()
				for _, l := range r.lanes {
					l.notify()
				}
				continue
			case <-r.renew:
				t.Stop()
			case <-t.C:
			case <-soft.Done():
				t.Stop()
				return
			}
		}
		// Bounded: a renewal stuck on a stalled connection (a network
		// partition the socket does not report) would otherwise hang the
		// coordinator silently while the leases run out. Past half the
		// lease the renewal is too late to help; the failure is logged,
		// the connection dropped by the driver, and the renewal retried.
		rctx, cancel := context.WithTimeout(soft, r.cfg.LeaseDuration/2)
		err := r.rebalance(rctx)
		cancel()
		if err != nil {
			if soft.Err() != nil {
				return
			}
			retry = min(max(retry*2, minInfraPause), r.cfg.LeaseDuration/10)
			r.log.Warn("postbox relay could not renew its leases", slog.Duration("retry", retry), slog.Any("error", err))
			continue
		}
		retry = 0
		for _, l := range r.lanes {
			l.notify()
		}
		r.maintain(soft)
	}
}

// maxPruneBatches bounds one retention pass, so the coordinator gets back
// to renewing leases; what is left waits for the next pass.
const maxPruneBatches = 20

// maintain prunes the published history when this relay holds partition
// 0: whichever relay that is, only one at a time does it.
func (r *relay) maintain(soft context.Context) {
	// Bounded by the next renewal: a pass stuck on a stalled connection
	// must not keep the coordinator from renewing the leases, and a
	// prune cut short is only rolled back.
	ctx, cancel := context.WithTimeout(soft, r.cfg.LeaseDuration/3)
	defer cancel()
	r.checkSnapshots(ctx)
	ad, ok := r.ex.(postboxdriver.Admin)
	if !ok || r.cfg.Retention < 0 || time.Now().Before(r.nextPrune) {
		return
	}
	r.mu.Lock()
	_, owner := r.held[0]
	r.mu.Unlock()
	if !owner {
		return
	}
	r.nextPrune = time.Now().Add(r.cfg.PruneInterval)
	total := 0
	for range maxPruneBatches {
		n, err := ad.PrunePublished(ctx, r.cfg.Retention, r.cfg.PruneBatch)
		total += n
		if err != nil {
			if soft.Err() == nil {
				r.log.Warn("postbox relay: retention pass failed; the next pass takes up the rest", slog.Int("deleted", total), slog.Any("error", err))
			}
			return
		}
		if n < r.cfg.PruneBatch {
			break
		}
	}
	if total > 0 {
		r.log.Info("postbox relay: retention pass", slog.Int("deleted", total), slog.Duration("retention", r.cfg.Retention))
	}
}

// snapshotWarnAge is the age past which a transaction holding a snapshot
// gets a warning: the relay's reads and the outbox's vacuum suffer while it
// lasts (see lane.fetch).
const snapshotWarnAge = time.Minute

// snapshotChecker is implemented by executors that can see other
// sessions' snapshots (PostgreSQL).
type snapshotChecker interface {
	OldestSnapshot(ctx context.Context) (age time.Duration, pid int, state string, ok bool, err error)
}

// checkSnapshots warns, at most every snapshotWarnAge, while another
// session holds a snapshot older than snapshotWarnAge. Only the holder of
// partition 0 looks, so replicas do not repeat each other.
func (r *relay) checkSnapshots(ctx context.Context) {
	sc, ok := r.ex.(snapshotChecker)
	if !ok || time.Now().Before(r.nextSnapshotCheck) {
		return
	}
	r.mu.Lock()
	_, owner := r.held[0]
	r.mu.Unlock()
	if !owner {
		return
	}
	r.nextSnapshotCheck = time.Now().Add(snapshotWarnAge / 4)
	age, pid, state, found, err := sc.OldestSnapshot(ctx)
	if err != nil || !found || age < snapshotWarnAge {
		return
	}
	r.nextSnapshotCheck = time.Now().Add(snapshotWarnAge)
	r.log.Warn("postbox relay: a transaction has held a snapshot for long; dead rows pile up in the outbox until it ends (vacuum cannot remove them)",
		slog.Duration("age", age.Round(time.Second)), slog.Int("pid", pid), slog.String("state", state))
}

func (l *lane) notify() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

func (l *lane) run(soft, hard context.Context) {
	r := l.r
	poll := minPoll
	for soft.Err() == nil {
		fence, until := r.fence(time.Now(), l.n)
		if len(fence.Generations) == 0 {
			// Nothing to read.
			l.idle(soft, r.cfg.PollInterval)
			continue
		}
		// A read that outlives the lease is of no use (nothing read under
		// it may be published after it), so it is bounded by it.
		fctx, cancel := context.WithDeadline(soft, until)
		recs, err := l.fetch(fctx, fence)
		cancel()
		if err != nil {
			if soft.Err() == nil {
				l.pause(soft, "fetch", err)
			}
			continue
		}
		if len(recs) == 0 {
			if l.sleep(soft, poll) {
				poll = minPoll
			} else {
				poll = min(poll*2, r.cfg.PollInterval)
			}
			continue
		}
		poll = minPoll
		began := time.Now()
		deadline := began.Add(r.cfg.BatchDeadline)
		if until.Before(deadline) {
			deadline = until
		}
		res := r.publish(hard, deadline, recs)
		rep, markErr := r.record(hard, fence, recs, res)
		if m := r.cfg.Metrics; m != nil {
			rep.Duration = time.Since(began)
			m.RelayBatch(rep)
		}
		if rep.FencedOut > 0 {
			// The lease of some partition passed on: stop reading under
			// the old generations, which would send the same rows again
			// and again, until the coordinator has renewed.
			r.forget()
			select {
			case r.renew <- struct{}{}:
			default:
			}
		}
		switch {
		case res.infra != nil:
			l.pause(soft, "publish", res.infra)
		case markErr != nil:
			l.pause(soft, "mark", markErr)
		default:
			l.infraPause = 0
		}
	}
}

// forget empties the held set: which other partitions moved on with the
// fenced one is unknown, and lanes reading stale generations send rows
// that another owner sends too. Every lane idles until the renewal the
// caller asks for, which takes back what is free or expired, at new
// generations, and wakes them.
func (r *relay) forget() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.held = map[int]int64{}
}

// fetch reads the lane's next batch, always from the start of the lane's
// partitions in seq order. A lower bound carried from the previous read
// would skip a row that committed late with a lower seq than rows already
// read, and publish its key's later rows before it (G4); under a held
// snapshot the read therefore walks the index entries of rows already
// moved out, which the relay reports (see checkSnapshots).
func (l *lane) fetch(ctx context.Context, fence postboxdriver.Fence) ([]postboxdriver.Record, error) {
	return l.r.ex.Fetch(ctx, l.r.fetchParams(fence))
}

// rebalance heartbeats, works out this relay's share of the partitions
// from the live set, lets go of partitions outside it and takes or renews
// those inside it. Relays agree on shares once their views of the live set
// agree; until then a partition may sit unowned for a heartbeat, but never
// has two owners, because a lease is only taken when free or expired.
//
// A partition let go while a lane still publishes from it can be taken by
// another relay at once, and both may send the same rows: each sends a
// key's rows in order, so the first copy of every row still arrives in
// order, and only one of them can mark the rows (the fence).
func (r *relay) rebalance(ctx context.Context) error {
	lease := r.cfg.LeaseDuration
	live, err := r.ex.Heartbeat(ctx, r.id, lease)
	if err != nil {
		return err
	}
	idx := sort.SearchStrings(live, r.id)
	if idx == len(live) || live[idx] != r.id {
		return fmt.Errorf("relay %s missing from the live set after its heartbeat", r.id)
	}
	target := make([]int, 0, r.nparts/len(live)+1)
	inTarget := make(map[int]bool, cap(target))
	for p := idx; p < r.nparts; p += len(live) {
		target = append(target, p)
		inTarget[p] = true
	}
	r.mu.Lock()
	var drop []int
	for p := range r.held {
		if !inTarget[p] {
			drop = append(drop, p)
			delete(r.held, p)
		}
	}
	r.mu.Unlock()
	if len(drop) > 0 {
		if err := r.ex.ReleaseLeases(ctx, r.id, drop); err != nil {
			r.log.Warn("postbox relay could not release partitions; they pass on when the lease expires", slog.Any("error", err))
		}
	}
	start := time.Now()
	leases, err := r.ex.AcquireLeases(ctx, r.id, target, lease)
	if err != nil {
		return err
	}
	held := make(map[int]int64, len(leases))
	for _, l := range leases {
		held[l.Partition] = l.Generation
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(held) != len(r.held) || len(drop) > 0 {
		r.log.Debug("postbox relay partitions", slog.Int("held", len(held)), slog.Int("target", len(target)), slog.Int("relays", len(live)))
	}
	r.held = held
	// The database set the expiry from its clock after start; ending our
	// use of the lease a tenth early leaves room for clock rate drift.
	r.validUntil = start.Add(lease - lease/10)
	r.lastBeat = start
	return nil
}

// fence returns lane n's share of the held partitions: every len(lanes)-th
// of them in partition order, so the shares stay even whichever partitions
// the relay holds; n < 0 returns all of them.
func (r *relay) fence(now time.Time, n int) (postboxdriver.Fence, time.Time) {
	f := postboxdriver.Fence{Owner: r.id, Generations: map[int]int64{}}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.validUntil.Sub(now) < minPoll*5 {
		return f, r.validUntil
	}
	parts := make([]int, 0, len(r.held))
	for p := range r.held {
		parts = append(parts, p)
	}
	sort.Ints(parts)
	start, step := n, len(r.lanes)
	if n < 0 {
		start, step = 0, 1
	}
	for i := start; i < len(parts); i += step {
		f.Generations[parts[i]] = r.held[parts[i]]
	}
	return f, r.validUntil
}

// sleep is a lane's wait after a read that found nothing: d, or, once the
// lane has backed off to PollInterval with several lanes running, a deep
// idle in which the relay's idle probe does the looking. It reports a
// wake-up.
func (l *lane) sleep(ctx context.Context, d time.Duration) bool {
	r := l.r
	if d < r.cfg.PollInterval || len(r.lanes) == 1 {
		return l.idle(ctx, d)
	}
	l.asleep.Store(true)
	defer l.asleep.Store(false)
	return l.idle(ctx, deepIdle*d)
}

// probe is the relay's one look per PollInterval at the partitions of the
// lanes in deep idle, instead of one per lane: it reads one row of them
// all and wakes the lane whose partition has one (every sleeping lane on
// an error, so that a lane's own read reports it). A writer in this
// process wakes the lanes sooner; rows written elsewhere are found within
// PollInterval, as by a polling lane, also while other lanes are busy.
func (r *relay) probe(ctx context.Context) {
	t := time.NewTicker(r.cfg.PollInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		fence := postboxdriver.Fence{Owner: r.id, Generations: map[int]int64{}}
		owner := map[int]*lane{}
		var sleeping []*lane
		for _, l := range r.lanes {
			if !l.asleep.Load() {
				continue
			}
			sleeping = append(sleeping, l)
			f, _ := r.fence(now, l.n)
			for p, g := range f.Generations {
				fence.Generations[p], owner[p] = g, l
			}
		}
		if len(fence.Generations) == 0 {
			continue
		}
		params := r.fetchParams(fence)
		params.Limit = 1
		pctx, cancel := context.WithTimeout(ctx, r.cfg.BatchDeadline)
		recs, err := r.ex.Fetch(pctx, params)
		cancel()
		if err == nil && len(recs) == 0 {
			continue
		}
		if err == nil {
			if l := owner[recs[0].Partition]; l != nil {
				l.notify()
				continue
			}
		}
		for _, l := range sleeping {
			l.notify()
		}
	}
}

// idle waits for d, a wake-up or the end of ctx; it reports a wake-up.
func (l *lane) idle(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-l.wake:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	return false
}

func (l *lane) pause(ctx context.Context, what string, err error) {
	l.infraPause = min(max(l.infraPause*2, minInfraPause), maxInfraPause)
	d := l.infraPause/2 + rand.N(l.infraPause/2+1) //nolint:gosec // jitter
	l.r.log.Warn("postbox relay paused", slog.Int("lane", l.n), slog.String("during", what), slog.Duration("pause", d), slog.Any("error", err))
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

type batchResult struct {
	published []int64
	ackedAt   []time.Time // parallel to published; with metrics only
	failed    []postboxdriver.Failure
	infra     error
}

type outcome struct {
	i   int
	err error
}

// publish sends recs with at most PublishWindow outstanding, each keyed
// message only after its predecessor in the batch was acknowledged. A
// message failure ends its key's chain for this batch (the rest stay
// pending and wait behind its backoff); an infrastructure failure stops
// new publishes, and what is outstanding at the deadline is abandoned:
// those rows stay pending and are published again later.
func (r *relay) publish(ctx context.Context, deadline time.Time, recs []postboxdriver.Record) batchResult {
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()

	next := make([]int, len(recs))
	last := make(map[string]int)
	ready := make([]int, 0, len(recs))
	for i := range recs {
		next[i] = -1
		k := recs[i].Key
		if k == "" {
			ready = append(ready, i)
			continue
		}
		if j, ok := last[k]; ok {
			next[j] = i
		} else {
			ready = append(ready, i)
		}
		last[k] = i
	}

	var res batchResult
	// Buffered for every record, so a publisher that calls done after the
	// batch is abandoned never blocks.
	results := make(chan outcome, len(recs))
	inflight, head := 0, 0
	settle := func(o outcome) {
		inflight--
		switch {
		case o.err == nil:
			res.published = append(res.published, recs[o.i].Seq)
			if r.cfg.Metrics != nil {
				res.ackedAt = append(res.ackedAt, time.Now())
			}
			if n := next[o.i]; n >= 0 {
				ready = append(ready, n)
			}
		case IsMessageError(o.err):
			res.failed = append(res.failed, r.failure(&recs[o.i], o.err))
		case res.infra == nil:
			res.infra = o.err
		}
	}
	for {
		for res.infra == nil && head < len(ready) && ctx.Err() == nil {
			// A window token, without waiting while this batch has
			// publishes outstanding: their acks may be what frees one.
			if inflight > 0 {
				select {
				case r.window <- struct{}{}:
				default:
					goto wait
				}
			} else {
				select {
				case r.window <- struct{}{}:
				case <-ctx.Done():
					continue
				}
			}
			i := ready[head]
			head++
			env, err := r.envelope(&recs[i])
			if err != nil {
				<-r.window
				res.failed = append(res.failed, r.failure(&recs[i], err))
				continue
			}
			inflight++
			var once atomic.Bool
			var end func(error)
			if r.cfg.Tracer != nil {
				end = r.cfg.Tracer.StartPublish(ctx, env)
			}
			r.pub.Publish(ctx, env, func(err error) {
				if once.CompareAndSwap(false, true) {
					<-r.window // free the slot at once, for every lane
					if end != nil {
						end(err)
					}
					results <- outcome{i, err}
				}
			})
		}
	wait:
		if inflight == 0 {
			if res.infra == nil && ctx.Err() != nil && head < len(ready) {
				res.infra = fmt.Errorf("batch deadline passed: %w", ctx.Err())
			}
			return res
		}
		select {
		case o := <-results:
			settle(o)
		case <-ctx.Done():
			if res.infra == nil {
				res.infra = fmt.Errorf("batch deadline passed with %d publishes unacknowledged: %w", inflight, ctx.Err())
			}
			// The abandoned publishes keep their tokens until the
			// publisher gives up on them, which it must when ctx ends.
			return res
		}
	}
}

func (r *relay) envelope(rec *postboxdriver.Record) (*Envelope, error) {
	h, err := DecodeHeaders(rec.Headers)
	if err != nil {
		return nil, NewMessageError(err)
	}
	h[HeaderSpecVersion] = "1.0"
	h[HeaderID] = rec.ID
	h[HeaderType] = rec.Topic
	if h[HeaderSource] == "" {
		h[HeaderSource] = r.cfg.Source
	}
	if h[HeaderTime] == "" {
		h[HeaderTime] = rec.CreatedAt.UTC().Format(time.RFC3339Nano)
	}
	if rec.Key != "" {
		h[HeaderPartitionKey] = rec.Key
	}
	return &Envelope{
		ID: rec.ID, Topic: rec.Topic, Key: rec.Key, Payload: rec.Payload, Headers: h,
		CreatedAt: rec.CreatedAt, Attempt: rec.Attempts + 1,
	}, nil
}

func (r *relay) failure(rec *postboxdriver.Record, err error) postboxdriver.Failure {
	msg := err.Error()
	if len(msg) > 2000 {
		msg = msg[:2000]
	}
	return postboxdriver.Failure{Seq: rec.Seq, Error: msg, Backoff: backoff(rec.Attempts, r.cfg.BackoffBase, r.cfg.BackoffMax)}
}

// backoff is base·2^attempts capped at most, with equal jitter: half of
// it fixed, half random, so retries spread out but never come early.
func backoff(attempts int, base, most time.Duration) time.Duration {
	d := most
	if attempts < 40 {
		if b := base << attempts; b > 0 && b < most {
			d = b
		}
	}
	return d/2 + rand.N(d/2+1) //nolint:gosec // jitter
}

// record writes the batch's outcome back, fenced. It runs on the hard
// context so a soft Stop still records a finished batch; after a hard stop
// it gets a short budget of its own, since every acknowledged row it fails
// to mark is published again. It returns the batch's report, with the
// per-topic counts filled in only when metrics are on.
func (r *relay) record(ctx context.Context, fence postboxdriver.Fence, recs []postboxdriver.Record, res batchResult) (*BatchReport, error) {
	var cancel context.CancelFunc
	if ctx.Err() != nil {
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), cleanupBudget)
	} else {
		// A mark stuck on a stalled connection for a whole lease is
		// given up: its rows stay pending, and whoever holds their
		// partitions next sends them again.
		ctx, cancel = context.WithTimeout(ctx, r.cfg.LeaseDuration)
	}
	defer cancel()
	rep := &BatchReport{Relay: r.id, Size: len(recs), Infrastructure: res.infra}
	var bySeq map[int64]*postboxdriver.Record // with metrics only
	if r.cfg.Metrics != nil {
		bySeq = make(map[int64]*postboxdriver.Record, len(recs))
		for i := range recs {
			bySeq[recs[i].Seq] = &recs[i]
		}
		rep.Published, rep.Failed, rep.Dead = map[string]int{}, map[string]int{}, map[string]int{}
	}
	var errs []error
	if len(res.published) > 0 {
		n, err := r.ex.MarkPublished(ctx, fence, res.published)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("mark %d published rows (they will be published again): %w", len(res.published), err))
		case n < len(res.published):
			rep.FencedOut = len(res.published) - n
			r.log.Warn("postbox relay lost marks to fencing: its lease moved on, the new owner publishes these again",
				slog.Int("lost", rep.FencedOut))
		}
		if err == nil && bySeq != nil {
			for i, seq := range res.published {
				rec := bySeq[seq]
				rep.Published[rec.Topic]++
				rep.Lag = append(rep.Lag, res.ackedAt[i].Sub(rec.CreatedAt))
			}
		}
	}
	if len(res.failed) > 0 {
		out, err := r.ex.MarkFailed(ctx, fence, res.failed, r.cfg.MaxAttempts)
		if err != nil {
			errs = append(errs, fmt.Errorf("record %d failed publishes: %w", len(res.failed), err))
		}
		for _, fr := range out {
			if bySeq != nil {
				rep.Failed[bySeq[fr.Seq].Topic]++
			}
			if fr.Dead {
				rep.dead++
				if bySeq != nil {
					rep.Dead[bySeq[fr.Seq].Topic]++
				}
				r.log.Warn("postbox message dead after its attempt budget", slog.Int64("seq", fr.Seq), slog.Int("attempts", fr.Attempts))
			}
		}
	}
	return rep, errors.Join(errs...)
}

func (r *relay) fetchParams(fence postboxdriver.Fence) postboxdriver.FetchParams {
	return postboxdriver.FetchParams{Fence: fence, Limit: r.cfg.BatchSize, BlockOnDead: r.cfg.BlockOnDead, Topics: r.topics}
}

func (r *relay) shutdown(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupBudget)
	defer cancel()
	r.mu.Lock()
	parts := make([]int, 0, len(r.held))
	for p := range r.held {
		parts = append(parts, p)
	}
	r.held = map[int]int64{}
	r.mu.Unlock()
	if len(parts) > 0 {
		if err := r.ex.ReleaseLeases(ctx, r.id, parts); err != nil {
			r.log.Warn("postbox relay could not release its partitions; they pass on when the lease expires", slog.Any("error", err))
		}
	}
	if err := r.ex.Unregister(ctx, r.id); err != nil {
		r.log.Warn("postbox relay could not unregister", slog.Any("error", err))
	}
	r.log.Info("postbox relay stopped")
}
