package postbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/postbox-go/postbox/postboxdriver"
)

// The relay moves committed rows to the broker. Its design, in brief (the
// whole story is in docs/design.md §4 and ARCHITECTURE.md):
//
//   - Rows carry partition = hash(key) mod P. Live relays register with a
//     heartbeat and split the partitions between them, sticky and
//     balanced (relay_assign.go); each holds a lease on its share, on the
//     database clock, renewed every eighth of a lease in one round trip,
//     and the lease's generation changes whenever a partition changes
//     hands (relay_leases.go).
//   - The owner of a partition reads its pending rows in seq order, without
//     writing anything, publishes them outside any transaction, and then
//     moves the acknowledged ones to the published history with one
//     statement fenced by the generation: a relay that lost a partition
//     while it was publishing changes nothing. That cycle is step
//     (relay_batch.go), run by the lanes and by Drain alike.
//   - Lanes work on disjoint shares of the relay's partitions, so one
//     lane's database round trips overlap another's publishing; a relay
//     runs as many as its share of the partitions calls for, so that
//     relays sharing a table bring no more lanes to it together than one
//     relay alone (relay_lane.go).
//   - A relay that takes a partition after its owner's lease ran out
//     publishes its first batch with crash marks, so that a message whose
//     publish kills relays is counted and dies after MaxCrashes
//     (relay_crash.go).
//   - The relay holding partition 0 also runs the maintenance: retention
//     of the history and the held-snapshot warning (maintenance.go).

const (
	minPoll = 2 * time.Millisecond
	// deepIdle: a lane that found nothing at PollInterval sleeps this many
	// intervals, waiting for a wake-up from the writer or the idle probe;
	// the long sleep is only a safety net.
	deepIdle      = 10
	minInfraPause = 50 * time.Millisecond
	maxInfraPause = 10 * time.Second
	// fullLinger is how long every lane the share calls for keeps reading
	// after a lane's batch last came back full; past it, the next renewal
	// leaves one lane reading (relay_lane.go).
	fullLinger    = 2 * time.Second
	cleanupBudget = 5 * time.Second
)

type relay struct {
	ex     postboxdriver.Executor
	cfg    *Config
	log    *slog.Logger
	id     string
	wake   *wakeup
	nparts int
	lanes  []*lane
	pub    Publisher // the routes, or the one publisher
	topics []string  // what to fetch; nil for every topic
	// horizon is HeaderReplayHorizon's value, from cfg.Retention.
	horizon string
	// window holds a token per publish awaiting the broker's ack, shared by
	// the lanes: a lane publishing while others read or mark may use all
	// of it.
	window chan struct{}

	// renew asks the coordinator to renew the leases now: a lane's marks
	// were fenced out, so a partition passed to another owner.
	renew chan struct{}

	// maintTick wakes the maintenance goroutine after a renewal.
	maintTick chan struct{}
	maint     maintenance // the maintenance goroutine's only

	// listening: the relay hears change signals (signal.go); signals
	// counts those heard.
	listening atomic.Bool
	signals   atomic.Int64

	mu     sync.Mutex
	target []int // this relay's share, as last worked out
	// want is how many lanes the share calls for (laneCount); active is
	// how many of them read, the first active ones: all of them while
	// batches come back full, one once none has for fullLinger (fullAt
	// is the last). The others wait for a wake-up that makes them read.
	want, active int
	fullAt       time.Time

	held       map[int]int64 // partitions the lanes read: partition -> generation
	leaving    map[int]int64 // partitions out of the share, held until no batch is in flight on them
	busy       map[int]int   // batches in flight per partition
	stale      bool          // marks were fenced out: read nothing until the next renewal
	validUntil time.Time     // local clock; the held leases end no sooner
	lastBeat   time.Time
	// nextExpiry is when, by the local clock, the first lease another
	// relay holds runs out unless renewed: the coordinator looks again
	// then, so that a crashed relay's partitions wait no longer than its
	// lease.
	nextExpiry time.Time
	// dueNow: the next renewal is due at once, because the share has
	// partitions free for the taking, or partitions leaving it have no
	// batch in flight and can be let go.
	dueNow bool
	// crashed holds the held partitions taken after their previous
	// owner's lease ran out, at the generation taken; settled, those of
	// them whose first batch was published with crash marks
	// (relay_crash.go).
	crashed map[int]int64
	settled map[int]int64

	// failing holds the relay's failures to reach its database that it
	// still retries (Client.RelayState).
	failing failing

	// solo: a batch publishes under its read lock; a publish that must be
	// the only one in flight in the relay (relay_crash.go) takes the write
	// lock.
	solo sync.RWMutex
}

type relayRun struct {
	r          *relay
	soft, hard context.CancelFunc
	done       chan struct{}
}

func newRelay(ctx context.Context, ex postboxdriver.Executor, cfg *Config, rs routes, wake *wakeup) (*relay, error) {
	n, err := ex.Partitions(ctx)
	if err != nil {
		return nil, fmt.Errorf("postbox: start relay: %w", err)
	}
	if n < 1 {
		return nil, fmt.Errorf("postbox: start relay: %w: no partitions in the leases table", postboxdriver.ErrNotMigrated)
	}
	if err := checkConnections(ctx, ex, cfg); err != nil {
		return nil, fmt.Errorf("postbox: start relay: %w", err)
	}
	if g, ok := ex.(postboxdriver.StorageGuard); ok {
		if err := g.CheckStorage(ctx); err != nil {
			return nil, fmt.Errorf("postbox: start relay: %w", err)
		}
	}
	// Every start is a new owner: two processes never share a name in the
	// leases table, even when they were given the same RelayID, since
	// the fence tells owners apart by name.
	id := NewID()
	if cfg.RelayID != "" {
		id = cfg.RelayID + "-" + id[len(id)-12:]
	}
	r := &relay{
		ex: ex, cfg: cfg, id: id, wake: wake, nparts: n, pub: rs, topics: rs.patterns(), horizon: replayHorizon(cfg.Retention),
		log:  cfg.Logger.With(slog.String("relay", id)),
		held: map[int]int64{}, leaving: map[int]int64{}, busy: map[int]int{}, crashed: map[int]int64{}, settled: map[int]int64{}, renew: make(chan struct{}, 1), maintTick: make(chan struct{}, 1),
	}
	r.window = make(chan struct{}, cfg.PublishWindow)
	for i := range min(cfg.Lanes, n) {
		r.lanes = append(r.lanes, &lane{r: r, n: i, wake: newWakeup()})
	}
	// One lane reads until a batch comes back full; the first renewal
	// sets want.
	r.want, r.active = len(r.lanes), 1
	return r, nil
}

// RelayState is what the relay running in a Client's process is doing
// (Client.RelayState).
type RelayState struct {
	// Running: the relay was started and not stopped.
	Running bool
	// Err is the relay's failure to reach its database that it is still
	// retrying: the renewal of its leases, a lane's read or a lane's record
	// of a batch that failed and has not succeeded since. The oldest of
	// them when several fail. Nil while they work. A broker's failures
	// are not the database's and are left out.
	Err error
	// Since is when the failures of Err began; zero with no Err.
	Since time.Time
}

// failing holds a relay's failures to reach its database, by source: the
// coordinator's renewals (coordinatorSource) and each lane's reads and
// records (the lane's number). A source's success clears it.
type failing struct {
	mu sync.Mutex
	by map[int]failure
}

type failure struct {
	err   error
	since time.Time
}

const coordinatorSource = -1

// set records src's outcome: a failure keeps the time its run of
// failures began; nil clears it.
func (f *failing) set(src int, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err == nil {
		delete(f.by, src)
		return
	}
	if f.by == nil {
		f.by = map[int]failure{}
	}
	since := time.Now()
	if old, ok := f.by[src]; ok {
		since = old.since
	}
	f.by[src] = failure{err: err, since: since}
}

// oldest is the failure that began first, if any.
func (f *failing) oldest() (failure, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out failure
	found := false
	for _, x := range f.by {
		if !found || x.since.Before(out.since) {
			out, found = x, true
		}
	}
	return out, found
}

func (r *relay) start() *relayRun {
	hard, hardCancel := context.WithCancel(context.Background())
	soft, softCancel := context.WithCancel(hard)
	run := &relayRun{r: r, soft: softCancel, hard: hardCancel, done: make(chan struct{})}
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
// lanes, runs the maintenance, and on stop waits for the lanes before
// letting the partitions go.
func (r *relay) run(soft, hard context.Context) {
	defer r.shutdown(hard)
	r.log.Info("postbox relay started", slog.Int("partitions", r.nparts), slog.Int("lanes", len(r.lanes)), slog.String("config", r.cfg.String()))
	r.warnDurability(soft)
	var wg sync.WaitGroup
	for _, l := range r.lanes {
		wg.Go(func() { l.run(soft, hard) })
	}
	if len(r.lanes) > 1 {
		wg.Go(func() { r.probe(soft) })
	}
	if l, ok := r.ex.(postboxdriver.Listener); ok && !r.cfg.NoSignals {
		wg.Go(func() { r.listen(soft, l) })
	}
	// Maintenance runs beside the coordinator, after each renewal: a
	// retention pass must not hold up the renewal that hands partitions
	// on.
	wg.Go(func() {
		for {
			select {
			case <-soft.Done():
				return
			case <-r.maintTick:
				r.maintain(soft)
			}
		}
	})
	defer wg.Wait()
	r.warm(soft)
	retry := time.Duration(0)
	pending := true
	for soft.Err() == nil {
		r.mu.Lock()
		due := r.lastBeat.Add(r.renewEvery())
		if pending {
			// A share not yet all held, or partitions waiting for
			// their batches to end before they are let go: look
			// again soon, so that a partition changing hands waits
			// no longer than that.
			due = r.lastBeat.Add(min(r.cfg.PollInterval, r.renewEvery()))
		}
		if r.nextExpiry.After(r.lastBeat) && r.nextExpiry.Before(due) {
			due = r.nextExpiry
		}
		if r.dueNow {
			due = r.lastBeat
		}
		r.mu.Unlock()
		if retry > 0 {
			due = time.Now().Add(retry)
		}
		if wait := time.Until(due); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-r.wake.ch:
				t.Stop()
				o := r.wake.take()
				r.wakeFor(o.partitions(), o.kind, o.ids)
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
		//
		// A stop does not cut it short (hard, not soft): a statement the
		// relay gave up on may still run on the database, after the leave
		// that follows the stop, and take the partitions the leave let go
		// back for a whole lease after the relay is gone. So the leave
		// waits for the renewal's answer, which also tells it every
		// partition the renewal took.
		rctx, cancel := context.WithTimeout(hard, r.cfg.LeaseDuration/2)
		var moved bool
		var err error
		pending, moved, err = r.coordinate(rctx)
		cancel()
		if err != nil {
			if soft.Err() != nil {
				return
			}
			r.failing.set(coordinatorSource, fmt.Errorf("renewing its leases: %w", err))
			if r.wake != nil {
				// Its leases may pass to a relay that needs the
				// signals: the writes of this process send them again.
				r.wake.alone.Store(false)
			}
			retry = min(max(retry*2, minInfraPause), r.cfg.LeaseDuration/10)
			r.log.Warn("postbox relay could not renew its leases", slog.Duration("retry", retry), slog.Any("error", err))
			continue
		}
		retry = 0
		r.failing.set(coordinatorSource, nil)
		// The lanes hear of a renewal only when it changed what they
		// read: a wake-up after every renewal (eight a lease) would
		// make each idle lane read and poll fast again each time.
		if moved {
			// Every lane, also one the renewal left without a share:
			// a batch it has yet to record holds its partitions' claim
			// until it does (lane.rest).
			for _, l := range r.lanes {
				l.notify(wakeOther)
			}
		}
		select {
		case r.maintTick <- struct{}{}:
		default:
		}
	}
}

// renewNow asks the coordinator for a renewal at once: another relay
// joined, left or let partitions go (a change signal), or the last batch
// in flight on a partition leaving the share has ended.
func (r *relay) renewNow() {
	select {
	case r.renew <- struct{}{}:
	default:
	}
}

// renewEvery is the interval between renewals in steady state: an eighth
// of the lease, so a relay paused for most of a lease keeps its partitions,
// and a crashed relay's are taken within a lease and an eighth.
func (r *relay) renewEvery() time.Duration { return max(r.cfg.LeaseDuration/8, minPoll) }

// notifyLanes wakes the lanes that read; the others wait for the renewal
// or the full batch that makes them read, which wakes them.
func (r *relay) notifyLanes(kind wakeKind) {
	for _, l := range r.lanes[:r.activeLanes()] {
		l.notify(kind)
	}
}

// warnDurability logs, at start, each way the database may lose a
// committed row after the relay published it. Bounded by half a lease: a
// stalled connection must not hold the start up.
func (r *relay) warnDurability(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.LeaseDuration/2)
	defer cancel()
	warnings, err := r.ex.DurabilityWarnings(ctx)
	if err != nil {
		r.log.Warn("postbox relay could not read the database's durability settings", slog.Any("error", err))
	}
	for _, w := range warnings {
		r.log.Warn("postbox relay: " + w)
	}
}

// checkConnections refuses a start on connections the relay cannot work
// with (postboxdriver.ErrPooledStatements, ErrOtherDatabase). Bounded by half a lease: any
// other failure of the check (a pool with no second connection free, a
// stalled link) is logged and the start goes on, as the relay's own
// statements will report a database that does not answer.
func checkConnections(ctx context.Context, ex postboxdriver.Executor, cfg *Config) error {
	ctx, cancel := context.WithTimeout(ctx, cfg.LeaseDuration/2)
	defer cancel()
	err := ex.CheckConnections(ctx)
	if errors.Is(err, postboxdriver.ErrPooledStatements) || errors.Is(err, postboxdriver.ErrOtherDatabase) {
		return err
	}
	if err != nil {
		cfg.Logger.Warn("postbox relay could not check how its connections reach the database", slog.Any("error", err))
	}
	return nil
}

// warm readies the relay's connections for its lanes' reads before it
// takes a partition (postboxdriver.Warmer), within half a lease: the first
// batches on the partitions it takes then start without the cost of a new
// connection's first read. A failure is logged; the relay goes on.
func (r *relay) warm(ctx context.Context) {
	w, ok := r.ex.(postboxdriver.Warmer)
	if !ok {
		return
	}
	wctx, cancel := context.WithTimeout(ctx, r.cfg.LeaseDuration/2)
	defer cancel()
	if err := w.Warm(wctx, r.fetchParams(postboxdriver.Fence{Owner: r.id}), len(r.lanes)); err != nil && ctx.Err() == nil {
		r.log.Warn("postbox relay could not ready its connections before taking partitions", slog.Any("error", err))
	}
}

func (r *relay) shutdown(ctx context.Context) {
	if r.wake != nil {
		r.wake.alone.Store(false)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupBudget)
	defer cancel()
	r.leave(ctx)
	if err := r.ex.Unregister(ctx, r.id); err != nil {
		r.log.Warn("postbox relay could not unregister", slog.Any("error", err))
	}
	r.log.Info("postbox relay stopped")
}
