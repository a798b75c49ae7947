package postbox

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/postbox-go/postbox/postboxdriver"
)

// A lane runs the relay's cycle (step) over its own share of the relay's
// partitions, so one lane's database round trips overlap another's
// publishing. Lanes never share a partition, and so never a key.
//
// A relay has min(Lanes, P) lanes, of which the first laneCount read: as
// many as its share of the table's partitions calls for. Relays that share
// a table then bring about Lanes to it together, as one relay holding
// every partition does; more concurrent cycles on one database and one
// machine cost more than they give. The count follows the share at each
// renewal (coordinate). A partition that passes from one lane to another
// when it changes is handed over as when the held set changes: claim
// leaves it out of the new lane's batch while the old lane's batch on it
// is in flight, and the new lane reads it from the start, after that
// batch's marks.
type lane struct {
	r          *relay
	n          int
	wake       chan struct{}
	infraPause time.Duration
	// asleep marks the lane in deep idle: the relay's idle probe reads
	// its partitions for it (see probe).
	asleep atomic.Bool
	// unsure: the lane's last batch met an infrastructure failure of the
	// broker's; suspects wait for a batch without one (relay_crash.go).
	unsure bool
}

func (l *lane) notify() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// laneCount is how many lanes a relay with lanes lanes reads with when
// its share is share of the table's nparts partitions: lanes for the
// whole table, in proportion for part of it, rounded up, and at least one.
func laneCount(lanes, share, nparts int) int {
	return min(max((lanes*share+nparts-1)/nparts, 1), lanes)
}

// activeLanes is how many lanes read now.
func (r *relay) activeLanes() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.active
}

func (l *lane) run(soft, hard context.Context) {
	r := l.r
	poll := minPoll
	for soft.Err() == nil {
		if l.n >= r.activeLanes() {
			// Not needed for the relay's share: wait for the renewal
			// that grows it (notifyLanes).
			select {
			case <-l.wake:
			case <-soft.Done():
			}
			poll = minPoll
			continue
		}
		fence, until := r.claim(time.Now(), l.n)
		if len(fence.Generations) == 0 {
			// Nothing to read.
			l.idle(soft, r.cfg.PollInterval)
			continue
		}
		res, err := r.step(soft, hard, fence, until, !l.unsure)
		r.done(fence)
		switch {
		case err != nil:
			if soft.Err() == nil {
				l.pause(soft, "fetch", err)
			}
			continue
		case res.read == 0:
			if l.sleep(soft, poll) {
				poll = minPoll
			} else {
				poll = min(poll*2, r.cfg.PollInterval)
			}
			continue
		}
		poll = minPoll
		l.unsure = res.infra != nil && !errors.Is(res.infra, errCrashMarks)
		if res.fencedOut > 0 {
			// The lease of some partition passed on: stop reading under
			// the old generations, which would send the same rows again
			// and again, until the coordinator has renewed.
			r.fencedOut()
			select {
			case r.renew <- struct{}{}:
			default:
			}
		}
		switch {
		case res.infra != nil:
			l.pause(soft, "publish", res.infra)
		case res.markErr != nil:
			l.pause(soft, "mark", res.markErr)
		default:
			l.infraPause = 0
		}
	}
}

// sleep is a lane's wait after a read that found nothing: d, or, once the
// lane has backed off to PollInterval with several lanes running, a deep
// idle in which the relay's idle probe does the looking. It reports a
// wake-up.
func (l *lane) sleep(ctx context.Context, d time.Duration) bool {
	r := l.r
	if d < r.cfg.PollInterval || r.activeLanes() == 1 {
		return l.idle(ctx, d)
	}
	l.asleep.Store(true)
	defer l.asleep.Store(false)
	return l.idle(ctx, deepIdle*d)
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
