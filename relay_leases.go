package postbox

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"time"

	"github.com/postbox-go/postbox/postboxdriver"
)

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
	held, err := r.acquire(ctx, target)
	if err != nil {
		return err
	}
	if held != len(target) || len(drop) > 0 {
		r.log.Debug("postbox relay partitions", slog.Int("held", held), slog.Int("target", len(target)), slog.Int("relays", len(live)))
	}
	return nil
}

// acquire takes or renews the leases of parts and makes what it got the
// held set, valid until a tenth before the lease's end: the database set
// the expiry from its clock after the call began, and ending our use of
// the lease early leaves room for clock rate drift. It returns how many it
// holds.
func (r *relay) acquire(ctx context.Context, parts []int) (int, error) {
	lease := r.cfg.LeaseDuration
	start := time.Now()
	leases, err := r.ex.AcquireLeases(ctx, r.id, parts, lease)
	if err != nil {
		return 0, err
	}
	held := make(map[int]int64, len(leases))
	for _, l := range leases {
		held[l.Partition] = l.Generation
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.held = held
	r.validUntil = start.Add(lease - lease/10)
	r.lastBeat = start
	return len(held), nil
}

// takeAll leases every partition, for Drain: it fails with
// ErrPartitionsHeld, holding none, when a running relay holds some.
func (r *relay) takeAll(ctx context.Context) error {
	all := make([]int, r.nparts)
	for i := range all {
		all[i] = i
	}
	n, err := r.acquire(ctx, all)
	if err != nil {
		return err
	}
	if n != len(all) {
		r.releaseAll(ctx)
		return fmt.Errorf("%w (%d of %d)", ErrPartitionsHeld, len(all)-n, len(all))
	}
	return nil
}

// releaseAll lets every held partition go, so another relay takes them at
// once.
func (r *relay) releaseAll(ctx context.Context) {
	r.mu.Lock()
	parts := make([]int, 0, len(r.held))
	for p := range r.held {
		parts = append(parts, p)
	}
	r.held = map[int]int64{}
	r.mu.Unlock()
	if len(parts) == 0 {
		return
	}
	if err := r.ex.ReleaseLeases(ctx, r.id, parts); err != nil {
		r.log.Warn("postbox relay could not release its partitions; they pass on when the lease expires", slog.Any("error", err))
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

// fence returns lane n's share of the held partitions: every len(lanes)-th
// of them in partition order, so the shares stay even whichever partitions
// the relay holds; n < 0 returns all of them. The second result is when
// the leases stop being usable; an empty fence is returned once that is
// too close to start a read.
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

// holds reports whether the relay holds partition p.
func (r *relay) holds(p int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.held[p]
	return ok
}
