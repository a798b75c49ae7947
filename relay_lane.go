package postbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/postbox-go/postbox/postboxdriver"
)

// A lane runs the relay's cycle (step) over its own share of the relay's
// partitions, so one lane's database round trips overlap another's
// publishing. Lanes never share a partition, and so never a key.
//
// A relay has min(Lanes, P) lanes. Its share of the table's partitions
// calls for the first laneCount of them: relays that share a table then
// bring about Lanes to it together, as one relay holding every partition
// does; more concurrent cycles on one database and one machine cost more
// than they give. That count follows the share at each renewal
// (coordinate).
//
// They read only while the load needs them: one lane reads the whole
// share until a batch comes back full, then all of them (full), until
// none has come back full for fullLinger, when a renewal leaves one
// reading again. At a trickle, one lane's batch carries what several
// lanes would read in as many statements, most of them finding one row
// or none: one lane sends a third of the statements and costs the
// database less a message, with a lower latency (BENCHMARKS.md, "One
// reading lane at a trickle"). A backlog or a burst fills the first
// batch, so a drain loses one batch's time to the start of the others.
//
// A partition that passes from one lane to another when the count
// changes is handed over as when the held set changes: claim leaves it
// out of the new lane's batch while the old lane's batch on it is in
// flight, and the new lane reads it from the start, after that batch's
// marks.
type lane struct {
	r          *relay
	n          int
	wake       *wakeup
	infraPause time.Duration
	// asleep marks the lane in deep idle: the relay's idle probe reads
	// its partitions for it (see probe).
	asleep atomic.Bool
	// unsure: the lane's last batch met an infrastructure failure of the
	// broker's; suspects wait for a batch without one (relay_crash.go).
	unsure bool
	// prior is the lane's last batch while its record waits for the
	// lane's next read (relay_batch.go), nil otherwise.
	prior *prior
	// recent is what the lane's last reads returned.
	recent recentRead
}

// notify wakes the lane for a wake-up of kind. A lane reads all of its
// partitions whatever was written, so its wake-ups name none: only the
// relay's own wakeup, which picks the lanes, collects partitions.
func (l *lane) notify(kind wakeKind) { l.wake.send(kind, 0, nil) }

// wakeKind says what a woken lane may expect to find.
type wakeKind uint8

const (
	// wakeOther: a renewal that changed the lane's partitions, the idle
	// probe's find, a grown share. The lane reads, at its pace.
	wakeOther wakeKind = iota
	// wakeCommitted: rows written and committed in this process (Write,
	// a WriteTx through a postboxdriver.AfterCommitter). The lane reads
	// once: a write committed after that read wakes it again, so after a
	// batch that was not full it waits for that wake-up (or its poll)
	// instead of reading again at once.
	wakeCommitted
	// wakeHeard: a change signal from another process whose writes had
	// committed. Signals come at most one every signalSpacing, so rows
	// committed since the last one may not have theirs yet: the lane
	// polls fast after it, but only for as long as a signal can be late,
	// and then waits for the next one.
	wakeHeard
	// wakeEarly: rows written that may not be committed yet (a WriteTx
	// in a transaction postbox cannot see commit, a change signal, which
	// may arrive before its writer's commit). The lane reads again on
	// its fast poll (2, 4, 8 … ms) until they are there.
	wakeEarly
)

// wakeup is a wake-up channel that remembers which kinds of wake-up were
// sent since it was last taken. The relay's own, a Client's, also says
// which partitions were written, so that only the lanes reading them are
// woken, and which committed rows: a lane whose recent reads already
// returned every one of them is not woken for nothing.
type wakeup struct {
	ch chan struct{}
	mu sync.Mutex
	// What the wake-ups sent since the last take were, under mu. ids,
	// once one was sent, is nil unless every one of them was for
	// committed rows it named.
	sent, early, heard, committed bool
	ids                           []written
	parts                         uint64 // a mask of the partitions written; allParts: unknown
	// alone: the relay woken holds every partition and no other relay is
	// live, so no relay elsewhere has a use for a change signal (the
	// relay's last renewal says so; a relay that joins is heard at once).
	alone atomic.Bool
}

// written is a committed row a wake-up is for: its id, and its
// partition, by which the relay's wakeup passes it to the lane reading it.
type written struct {
	id   string
	part int
}

// maxNamed bounds the rows a wakeup names between two takes; past it the
// wake-ups name none, and the lane woken reads.
const maxNamed = 64

// allParts is the partition mask of a write whose partitions are unknown.
const allParts = ^uint64(0)

func newWakeup() *wakeup { return &wakeup{ch: make(chan struct{}, 1)} }

// send sends a wake-up of kind for the partitions in mask. A wake-up for
// committed rows names them in ids, or names none with nil.
func (w *wakeup) send(kind wakeKind, mask uint64, ids []written) {
	w.mu.Lock()
	// Named so far: nothing sent yet, or only named rows (ids not nil).
	named := !w.sent || w.ids != nil
	if named && kind == wakeCommitted && len(ids) > 0 && len(w.ids)+len(ids) <= maxNamed {
		w.ids = append(w.ids, ids...)
	} else {
		w.ids = nil
	}
	w.sent = true
	switch kind {
	case wakeEarly:
		w.early = true
	case wakeHeard:
		w.heard = true
	case wakeCommitted:
		w.committed = true
	}
	w.parts |= mask
	w.mu.Unlock()
	select {
	case w.ch <- struct{}{}:
	default:
	}
}

// woke is what the wake-ups sent since the last take were.
type woke struct {
	// sent: there was one. Each wake-up's channel token follows its
	// record, so a token found with nothing sent is one whose wake-up
	// an earlier take answered.
	sent bool
	// kind is the one that promises least: early if any was, else heard,
	// else committed, else other.
	kind wakeKind
	// ids, when not nil: all were for committed rows, every one of
	// which is in ids.
	ids   []written
	parts uint64
}

// take returns, and forgets, what the wake-ups sent since the last call
// were.
func (w *wakeup) take() woke {
	w.mu.Lock()
	defer w.mu.Unlock()
	k := wakeOther
	switch {
	case w.early:
		k = wakeEarly
	case w.heard:
		k = wakeHeard
	case w.committed:
		k = wakeCommitted
	}
	out := woke{sent: w.sent, kind: k, ids: w.ids, parts: w.parts}
	w.sent, w.early, w.heard, w.committed = false, false, false, false
	w.ids, w.parts = nil, 0
	return out
}

// partitions lists the partitions of a wake-up's mask, nil for every
// partition.
func (o woke) partitions() []int {
	mask := o.parts
	if mask == allParts {
		return nil
	}
	parts := make([]int, 0, bits.OnesCount64(mask))
	for ; mask != 0; mask &= mask - 1 {
		parts = append(parts, bits.TrailingZeros64(mask))
	}
	return parts
}

// pace is what a lane expects of the rows it reads next, from the
// wake-ups that brought it there.
type pace uint8

const (
	// pacePolled: nothing announces them once committed. After a
	// wake-up or a batch the lane reads on its fast poll (2, 4, 8 … ms
	// up to PollInterval).
	pacePolled pace = iota
	// paceHeard: change signals announce them after their commits
	// (wakeHeard), each at most signalSpacing late: the fast poll stops
	// once it has waited that long.
	paceHeard
	// paceAnnounced: wake-ups in this process announce them after their
	// commits (wakeCommitted).
	paceAnnounced
)

// laneCount is how many lanes a relay with lanes lanes reads with when
// its share is share of the table's nparts partitions: lanes for the
// whole table, in proportion for part of it, rounded up, and at least one.
func laneCount(lanes, share, nparts int) int {
	return min(max((lanes*share+nparts-1)/nparts, 1), lanes)
}

// full is a lane's report of a batch that came back full: the lanes
// cannot keep up, so every lane the share calls for reads, from now until
// none has come back full for fullLinger. The lanes that start reading
// are woken.
func (r *relay) full(now time.Time) {
	r.mu.Lock()
	r.fullAt = now
	from, to := r.active, r.want
	if to > from {
		r.active = to
	}
	r.mu.Unlock()
	if to <= from {
		return
	}
	r.log.Debug("postbox relay lanes reading", slog.Int("lanes", to), slog.Int("share_lanes", to))
	for _, l := range r.lanes[from:to] {
		l.notify(wakeOther)
	}
}

// activeLanes is how many lanes read now.
func (r *relay) activeLanes() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.active
}

func (l *lane) run(soft, hard context.Context) {
	r := l.r
	// poll is the wait after a read that found nothing. At pacePolled
	// it starts short after a wake-up or a batch and doubles up to
	// PollInterval, so that rows nothing announces (a write not yet
	// committed, a writer elsewhere) are found soon after they are
	// there; at paceHeard it goes from short to PollInterval once it
	// passes signalSpacing; at paceAnnounced it is PollInterval.
	poll, p := minPoll, pacePolled
	// woken takes the wake-ups sent since the last look: after a sleep
	// they ended (slept), or while a batch ran.
	woken := func(kind wakeKind, slept bool) {
		switch kind {
		case wakeCommitted:
			poll, p = r.cfg.PollInterval, paceAnnounced
		case wakeHeard:
			poll, p = minPoll, paceHeard
		case wakeEarly:
			poll, p = minPoll, pacePolled
		default:
			if slept {
				poll, p = minPoll, pacePolled
			}
		}
	}
	defer l.flush(soft, hard)
	reading := false // the lane was among those reading at its last turn
	for soft.Err() == nil {
		if l.n >= r.activeLanes() {
			// Not reading: wait for the renewal or the full batch that
			// makes it read, which wakes it. Its failures to read are no
			// longer the relay's. When it stops reading, the lanes that
			// read its partitions now are woken to read them at once, not
			// at their poll: its batch held their claim until now, and
			// the wake-ups sent to it for them go unanswered.
			l.flush(soft, hard)
			if reading {
				reading = false
				r.notifyLanes(wakeOther)
			}
			r.failing.set(l.n, nil)
			select {
			case <-l.wake.ch:
			case <-soft.Done():
			}
			poll, p = minPoll, pacePolled
			continue
		}
		reading = true
		fence, until := r.claim(time.Now(), l.n, l.prior)
		if len(fence.Generations) == 0 {
			// Nothing to read, and so no failure of the lane's to
			// report once its last batch is recorded.
			if l.flush(soft, hard) {
				r.failing.set(l.n, nil)
			}
			l.idle(soft, r.cfg.PollInterval)
			continue
		}
		res, next, err := r.step(soft, hard, fence, until, !l.unsure, l.prior)
		l.prior = next
		l.recent.add(res.recs)
		if res.read >= r.cfg.BatchSize {
			r.full(time.Now())
		}
		if next == nil {
			r.done(fence)
		}
		if err == nil {
			l.recorded(res.markErr)
		}
		if res.fencedOut > 0 {
			// The lease of some partition passed on: stop reading under
			// the old generations, which would send the same rows again
			// and again, until the coordinator has renewed.
			r.fencedOut()
			r.renewNow()
		}
		switch {
		case err != nil:
			// With it, the record of the batch before, which went alone
			// when the read failed and may have failed too.
			if soft.Err() == nil {
				err = errors.Join(err, res.markErr)
				r.failing.set(l.n, fmt.Errorf("lane %d reading its partitions: %w", l.n, err))
				l.pause(soft, "fetch", err)
			}
			continue
		case res.read == 0:
			if res.markErr == nil {
				// The read and the record worked: a later failure pauses
				// from the shortest pause again, not from where an
				// outage before left it.
				l.infraPause = 0
			}
			if kind, ok := l.sleep(soft, poll); ok {
				woken(kind, true)
			} else {
				switch {
				case p == paceHeard && poll*2 > signalSpacing:
					poll = r.cfg.PollInterval
				case p == paceHeard:
					poll *= 2
				default:
					poll, p = min(poll*2, r.cfg.PollInterval), pacePolled
				}
			}
			continue
		}
		if p != paceAnnounced {
			poll = minPoll
		}
		// The wake-ups sent while the batch ran: those for rows its read
		// returned are answered already.
		kind, owed := l.look()
		woken(kind, false)
		l.unsure = res.infra != nil && !errors.Is(res.infra, errCrashMarks)
		switch {
		case res.infra != nil:
			l.pause(soft, "publish", res.infra)
		case res.markErr != nil:
			l.pause(soft, "mark", errors.Join(res.markErr, l.record(hard)))
		default:
			l.infraPause = 0
			if p == paceAnnounced && res.read < r.cfg.BatchSize && res.fencedOut == 0 && !owed {
				// Whatever was committed since this batch's read has
				// woken the lane again: no read at once to find out.
				if kind, ok := l.rest(soft, hard, poll); ok {
					woken(kind, true)
				} else {
					p = pacePolled
				}
			}
		}
	}
}

// rest is the lane's wait for a wake-up after a batch, for at most d. It
// reports a wake-up and its kind. A batch whose record waits for the next
// read (prior) is recorded by the read that ends the wait: the one a
// wake-up calls for, or the poll at the end of d. When d is longer than
// priorLinger, the record goes alone after priorLinger and the lane sleeps
// on for d.
func (l *lane) rest(soft, hard context.Context, d time.Duration) (wakeKind, bool) {
	if l.prior == nil {
		return l.sleep(soft, d)
	}
	if d <= priorLinger {
		// Not a deep idle: the read at the end of d records the batch.
		return l.idle(soft, d)
	}
	if kind, ok := l.idle(soft, priorLinger); ok {
		return kind, true
	}
	if err := l.record(hard); err != nil {
		l.pause(soft, "mark", err)
		return wakeOther, false
	}
	if soft.Err() != nil {
		return wakeOther, false
	}
	// The whole d after the linger, so that a lane at PollInterval still
	// goes into deep idle.
	return l.sleep(soft, d)
}

// flush records the lane's batch that waits for a read, if any, alone,
// and pauses when that fails. It reports whether nothing failed.
func (l *lane) flush(soft, hard context.Context) bool {
	if err := l.record(hard); err != nil {
		l.pause(soft, "mark", err)
		return false
	}
	return true
}

// record records the lane's batch that waits for a read, if any, alone,
// and returns the failure to record it.
func (l *lane) record(hard context.Context) error {
	if l.prior == nil {
		return nil
	}
	res := l.r.flush(hard, l.prior)
	l.prior = nil
	if res.fencedOut > 0 {
		l.r.fencedOut()
		l.r.renewNow()
	}
	if res.markErr != nil {
		l.recorded(res.markErr)
	}
	return res.markErr
}

// recorded keeps the relay's account of the lane's failures to reach the
// database (RelayState) after a read that worked: err is its batch's
// failure to record, nil when the batch was recorded or waits for the
// next read.
func (l *lane) recorded(err error) {
	if err != nil {
		err = fmt.Errorf("lane %d recording a batch: %w", l.n, err)
	}
	l.r.failing.set(l.n, err)
}

// sleep is a lane's wait after a read that found nothing: d, or, once the
// lane has backed off to PollInterval with several lanes running, a deep
// idle in which the relay's idle probe does the looking. It reports a
// wake-up and its kind.
func (l *lane) sleep(ctx context.Context, d time.Duration) (wakeKind, bool) {
	r := l.r
	if d < r.cfg.PollInterval || r.activeLanes() == 1 {
		return l.idle(ctx, d)
	}
	l.asleep.Store(true)
	defer l.asleep.Store(false)
	return l.idle(ctx, deepIdle*d)
}

// idle waits for d, a wake-up or the end of ctx; it reports a wake-up and
// its kind. A wake-up that only names rows the lane's recent reads
// returned is no reason to read: it waits on.
func (l *lane) idle(ctx context.Context, d time.Duration) (wakeKind, bool) {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case <-l.wake.ch:
			if kind, ok := l.answer(l.wake.take()); ok {
				return kind, true
			}
		case <-t.C:
			return wakeOther, false
		case <-ctx.Done():
			return wakeOther, false
		}
	}
}

// look takes the wake-ups sent to the lane since it last looked, and
// reports whether they call for a read, and of which kind.
func (l *lane) look() (wakeKind, bool) {
	// The token first: a wake-up sent after the take below leaves its
	// own.
	select {
	case <-l.wake.ch:
	default:
	}
	return l.answer(l.wake.take())
}

// answer says whether wake-ups taken call for a read: they do unless none
// was sent since the last take, or each was for committed rows that the
// lane's recent reads returned, which it has therefore published, failed
// (they wait for their retry), or left on an infrastructure failure (the
// lane pauses and reads again). A batch with crash marks, which may leave
// rows for the next, adds none (stepResult.recs).
func (l *lane) answer(o woke) (wakeKind, bool) {
	if !o.sent || o.ids != nil && l.recent.hasAll(o.ids) {
		return wakeOther, false
	}
	return o.kind, true
}

// recentRead is the ids of the rows a lane's last reads returned, the
// latest recentMax, to tell a wake-up for rows already read from one for
// rows still to read. A message written again under an id the lane read
// moments before may therefore wait for the lane's poll.
type recentRead struct {
	ids  [recentMax]string
	next int
}

const recentMax = 64

func (s *recentRead) add(recs []postboxdriver.Record) {
	for i := max(len(recs)-recentMax, 0); i < len(recs); i++ {
		s.ids[s.next] = recs[i].ID
		s.next = (s.next + 1) % recentMax
	}
}

func (s *recentRead) hasAll(ws []written) bool {
	for _, w := range ws {
		found := false
		for _, id := range s.ids {
			if id == w.id {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
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
				l.notify(wakeOther)
				continue
			}
		}
		for _, l := range sleeping {
			l.notify(wakeOther)
		}
	}
}
