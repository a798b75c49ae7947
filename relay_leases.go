package postbox

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"sort"
	"time"

	"github.com/postbox-go/postbox/postboxdriver"
)

// coordinate is the relay's one round trip per renewal (Coordinate): it
// heartbeats, renews what it holds and takes what its share still lacks,
// lets go of what it has finished with, and works out its next share from
// the membership that comes back (assign).
//
// A partition that leaves the relay's share is not let go at once: it
// stops being read (it moves from held to leaving), and its lease is
// renewed until no lane has a batch in flight on it, then released. The
// batch's marks therefore still hold, and the relay that takes the
// partition over starts after them: a rebalance moves partitions without
// sending anything twice.
//
// Relays agree on shares once their views of the membership agree; until
// then a partition may sit unowned for a renewal or two, but never has two
// owners, because a lease is only taken when free or expired. It reports
// whether the relay still waits for part of its share (held by another
// relay that has not let go of it yet), so that the caller renews again
// soon instead of a whole interval later, and whether the renewal changed
// what the lanes read (the held partitions or their generations, the
// lanes reading), or lanes had found nothing to read for a stale view or
// leases about to pass: then the lanes are to be woken.
func (r *relay) coordinate(ctx context.Context) (pending, moved bool, err error) {
	r.mu.Lock()
	want := make([]int, 0, len(r.target)+len(r.leaving))
	var drop []int
	want = append(want, r.target...)
	for p := range r.leaving {
		if r.busy[p] > 0 {
			want = append(want, p)
		} else {
			drop = append(drop, p)
		}
	}
	settled := r.settledMarks()
	r.mu.Unlock()

	start := time.Now()
	m, err := r.ex.Coordinate(ctx, r.id, r.cfg.LeaseDuration, want, drop, settled)
	if err != nil {
		return false, false, err
	}
	if i := sort.SearchStrings(m.Live, r.id); i == len(m.Live) || m.Live[i] != r.id {
		return false, false, fmt.Errorf("relay %s missing from the live set after its heartbeat", r.id)
	}
	target := assign(m.Live, m.Leases)[r.id]
	inTarget := make(map[int]bool, len(target))
	for _, p := range target {
		inTarget[p] = true
	}

	r.mu.Lock()
	defer r.mu.Unlock()
	before := len(r.held)
	prevHeld, prevActive := r.held, r.active
	// A lane found nothing to read while the view was stale or the
	// leases about to pass: it waits for this renewal's wake-up.
	blocked := r.stale || r.validUntil.Sub(start) < minPoll*5
	r.held, r.leaving, r.crashed = map[int]int64{}, map[int]int64{}, map[int]int64{}
	for _, l := range m.Leases {
		if l.Owner != r.id || l.Expired {
			continue
		}
		if inTarget[l.Partition] {
			r.held[l.Partition] = l.Generation
		} else {
			r.leaving[l.Partition] = l.Generation
		}
		if l.Crashed {
			r.crashed[l.Partition] = l.Generation
		}
	}
	for p, g := range r.settled {
		if r.crashed[p] != g {
			delete(r.settled, p)
		}
	}
	// A partition of the new share that is free already is taken by a
	// renewal right away, not a PollInterval later: a crashed relay's
	// partitions, found expired, wait no longer than they must. So is a
	// partition leaving the share with no batch in flight let go: the
	// relay whose share it joins is waiting for it.
	r.dueNow = false
	for _, l := range m.Leases {
		if inTarget[l.Partition] && l.Expired {
			r.dueNow = true
			break
		}
	}
	for p := range r.leaving {
		if r.busy[p] == 0 {
			r.dueNow = true
			break
		}
	}
	r.target = target
	if r.wake != nil {
		r.wake.alone.Store(len(m.Live) == 1 && len(r.held) == r.nparts)
	}
	if n := laneCount(len(r.lanes), len(target), r.nparts); n != r.want {
		r.log.Info("postbox relay lanes", slog.Int("lanes", n), slog.Int("share", len(target)), slog.Int("partitions", r.nparts))
		r.want = n
	}
	// Every lane of the share while batches come back full, one once
	// none has for fullLinger.
	active := 1
	if start.Sub(r.fullAt) < fullLinger {
		active = r.want
	}
	if active != r.active {
		r.log.Debug("postbox relay lanes reading", slog.Int("lanes", active), slog.Int("share_lanes", r.want))
		r.active = active
	}
	r.stale = false
	// The database set the expiries from its clock after start; ending
	// our use of the leases a tenth early leaves room for clock rate
	// drift.
	r.validUntil = start.Add(r.cfg.LeaseDuration - r.cfg.LeaseDuration/10)
	r.lastBeat = start
	r.nextExpiry = time.Time{}
	for _, l := range m.Leases {
		if l.Owner == "" || l.Owner == r.id || l.Expired {
			continue
		}
		// A little after the database's expiry, by the time left on
		// its clock: the lease is surely free by then.
		at := start.Add(l.ExpiresAt.Sub(m.Now) + 10*time.Millisecond)
		if r.nextExpiry.IsZero() || at.Before(r.nextExpiry) {
			r.nextExpiry = at
		}
	}
	if r.log.Enabled(ctx, slog.LevelDebug) {
		r.log.Debug("postbox relay leases", slog.Any("held", sortedKeys(r.held)), slog.Any("leaving", sortedKeys(r.leaving)),
			slog.Any("share", target), slog.Int("relays", len(m.Live)), slog.Duration("took", time.Since(start)))
	}
	if len(r.held) != before {
		r.log.Info("postbox relay partitions", slog.Int("held", len(r.held)), slog.Int("share", len(target)),
			slog.Int("leaving", len(r.leaving)), slog.Int("relays", len(m.Live)))
	}
	moved = blocked || r.active != prevActive || !maps.Equal(r.held, prevHeld)
	return len(r.held) < len(target) || len(r.leaving) > 0, moved, nil
}

// takeAll leases every partition, for Drain: it fails with
// ErrPartitionsHeld, holding none, when a running relay holds some.
//
// The grant runs to its answer even when ctx ends meanwhile (bounded by
// cleanupBudget), and a ctx that ended lets go of what it granted.
// Abandoned, the statement could still reach the database and commit
// after the call returned, holding every partition for a whole lease with
// no one to release them: the next Drain failed with ErrPartitionsHeld
// and relays waited the lease out.
func (r *relay) takeAll(ctx context.Context) error {
	all := make([]int, r.nparts)
	for i := range all {
		all[i] = i
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	start := time.Now()
	cleanup, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupBudget)
	defer cancel()
	leases, err := r.ex.AcquireLeases(cleanup, r.id, all, r.cfg.LeaseDuration)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return err
	}
	r.mu.Lock()
	r.held = make(map[int]int64, len(leases))
	for _, l := range leases {
		r.held[l.Partition] = l.Generation
	}
	r.validUntil = start.Add(r.cfg.LeaseDuration - r.cfg.LeaseDuration/10)
	r.mu.Unlock()
	switch {
	case ctx.Err() != nil:
		r.releaseAll(cleanup)
		return ctx.Err()
	case len(leases) != len(all):
		r.releaseAll(cleanup)
		return fmt.Errorf("%w (%d of %d)", ErrPartitionsHeld, len(all)-len(leases), len(all))
	}
	return nil
}

// releaseAll lets every partition the relay holds go, so another relay
// takes them at once. The lanes have stopped: nothing is in flight.
func (r *relay) releaseAll(ctx context.Context) {
	if parts := r.letGo(); len(parts) > 0 {
		if err := r.ex.ReleaseLeases(ctx, r.id, parts); err != nil {
			r.log.Warn("postbox relay could not release its partitions; they pass on when the lease expires", slog.Any("error", err))
		}
	}
}

// leave ends the relay's membership and lets every partition it holds go
// in one round trip (a heartbeat of no duration), so that the others see
// both at once: had they seen the partitions free while the relay still
// counted as live, its share would still be its own, and they would wait
// a renewal more to take them. The lanes have stopped.
func (r *relay) leave(ctx context.Context) {
	r.mu.Lock()
	settled := r.settledMarks()
	r.mu.Unlock()
	if _, err := r.ex.Coordinate(ctx, r.id, 0, nil, r.letGo(), settled); err != nil {
		r.log.Warn("postbox relay could not release its partitions; they pass on when the lease expires", slog.Any("error", err))
	}
}

// letGo empties the relay's view of its leases and returns the partitions
// it held.
func (r *relay) letGo() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	parts := make([]int, 0, len(r.held)+len(r.leaving))
	for p := range r.held {
		parts = append(parts, p)
	}
	for p := range r.leaving {
		parts = append(parts, p)
	}
	r.held, r.leaving, r.target = map[int]int64{}, map[int]int64{}, nil
	return parts
}

// fencedOut is a lane's report that some of its marks changed nothing:
// the lease of a partition passed on, so the relay's view of what it holds
// is out of date. Until the next renewal, which the caller asks for and
// which rebuilds the view from the database, no lane reads: lanes reading
// stale generations would send rows that another owner sends too. What
// the relay still holds stays held, so that the renewal keeps it and a
// stop releases it.
func (r *relay) fencedOut() {
	r.mu.Lock()
	r.stale = true
	r.mu.Unlock()
}

// fence returns lane n's share of the held partitions: every active-th of
// them in partition order, so the shares stay even whichever partitions
// the relay holds; none for a lane that does not read (n >= active), and
// all of them for n < 0. The second result is when the leases stop being
// usable; an empty fence is returned once that is too close to start a
// read, and while the relay's view is stale.
func (r *relay) fence(now time.Time, n int) (postboxdriver.Fence, time.Time) {
	f := postboxdriver.Fence{Owner: r.id, Generations: map[int]int64{}}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stale || r.validUntil.Sub(now) < minPoll*5 || n >= r.active {
		return f, r.validUntil
	}
	parts := r.heldInOrder()
	start, step := n, r.active
	if n < 0 {
		start, step = 0, 1
	}
	for i := start; i < len(parts); i += step {
		f.Generations[parts[i]] = r.held[parts[i]]
	}
	return f, r.validUntil
}

// heldInOrder lists the held partitions in order, as fence deals them to
// the lanes: the i-th to lane i mod active. r.mu is held.
func (r *relay) heldInOrder() []int {
	parts := make([]int, 0, len(r.held))
	for p := range r.held {
		parts = append(parts, p)
	}
	sort.Ints(parts)
	return parts
}

// claim is fence for a lane that is about to read and publish. It counts a
// batch in flight on each partition of the fence, so that the coordinator,
// which releases a partition leaving the share only once no batch is in
// flight on it, cannot release one under a batch. It leaves out the
// partitions another lane has a batch in flight on: a lane's share is by
// position among the held partitions and by the number of lanes reading,
// which shift when the held set or the share changes, and two lanes
// reading one partition at once would send its rows twice and out of
// order. The lane calls done with the fence when its
// batch is marked.
//
// pr is the lane's own batch whose record waits for this read (nil for
// none): its partitions are claimed again, since that record goes in the
// read's statement, before anything of the new batch is sent.
func (r *relay) claim(now time.Time, n int, pr *prior) (postboxdriver.Fence, time.Time) {
	f, until := r.fence(now, n)
	r.mu.Lock()
	defer r.mu.Unlock()
	for p, g := range f.Generations {
		// The held set may have changed between fence's lock and this
		// one: only what is still held at the same generation counts.
		mine := 0
		if pr != nil {
			if pg, ok := pr.fence.Generations[p]; ok && pg == g {
				mine = 1
			}
		}
		if r.held[p] != g || r.busy[p] > mine {
			delete(f.Generations, p)
			continue
		}
		r.busy[p]++
	}
	return f, until
}

// done ends the batch claim counted. A partition leaving the share whose
// last batch in flight this was is let go by a renewal at once.
func (r *relay) done(f postboxdriver.Fence) {
	r.mu.Lock()
	release := false
	for p := range f.Generations {
		if r.busy[p]--; r.busy[p] == 0 {
			delete(r.busy, p)
			_, leaving := r.leaving[p]
			release = release || leaving
		}
	}
	r.mu.Unlock()
	if release {
		r.renewNow()
	}
}

// holds reports whether the relay holds partition p.
func (r *relay) holds(p int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.held[p]
	return ok
}

func sortedKeys(m map[int]int64) []int {
	out := make([]int, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Ints(out)
	return out
}
