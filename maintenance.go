package postbox

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"time"
)

// maintenance is the state of the relay's maintenance pass: retention of
// the published history, and the warning about a held snapshot. Only the
// relay that holds partition 0 runs it, so replicas neither repeat nor
// race each other; the coordinator calls it after each renewal.
type maintenance struct {
	nextPrune         time.Time
	nextSnapshotCheck time.Time
}

// maxPruneBatches bounds one retention pass, so that a relay that stops
// soon after holding partition 0 has no long pass to wait for; what is
// left waits for the next pass.
const maxPruneBatches = 20

// snapshotWarnAge is the age past which a transaction holding a snapshot
// gets a warning: the relay's reads and the outbox's vacuum suffer while it
// lasts (see fetchParams).
const snapshotWarnAge = time.Minute

// maintain runs the maintenance pass when this relay holds partition 0.
func (r *relay) maintain(soft context.Context) {
	if !r.holds(0) {
		return
	}
	// Bounded: a pass stuck on a stalled connection ends, and a prune
	// cut short is only rolled back.
	ctx, cancel := context.WithTimeout(soft, r.cfg.LeaseDuration/3)
	defer cancel()
	r.checkSnapshots(ctx)
	if r.cfg.Retention < 0 || time.Now().Before(r.maint.nextPrune) {
		return
	}
	r.maint.nextPrune = time.Now().Add(r.cfg.PruneInterval)
	total, err := prune(ctx, maxPruneBatches, r.cfg.PruneBatch, func(ctx context.Context) (int, error) {
		return r.ex.PrunePublished(ctx, r.cfg.Retention, r.cfg.PruneBatch)
	})
	switch {
	case err != nil:
		if soft.Err() == nil {
			r.log.Warn("postbox relay: retention pass failed; the next pass takes up the rest", slog.Int("deleted", total), slog.Any("error", err))
		}
	case total > 0:
		r.log.Info("postbox relay: retention pass", slog.Int("deleted", total), slog.Duration("retention", r.cfg.Retention))
	}
}

// checkSnapshots warns, at most every snapshotWarnAge, while another
// session holds a snapshot older than snapshotWarnAge.
func (r *relay) checkSnapshots(ctx context.Context) {
	if time.Now().Before(r.maint.nextSnapshotCheck) {
		return
	}
	r.maint.nextSnapshotCheck = time.Now().Add(snapshotWarnAge / 4)
	s, found, err := r.ex.OldestSnapshot(ctx)
	if err != nil || !found || s.Age < snapshotWarnAge {
		return
	}
	r.maint.nextSnapshotCheck = time.Now().Add(snapshotWarnAge)
	r.log.Warn("postbox relay: a transaction has held a snapshot for long; dead rows pile up in the outbox until it ends (vacuum cannot remove them)",
		slog.Duration("age", s.Age.Round(time.Second)), slog.Int("pid", s.PID), slog.String("state", s.State))
}

// prune runs one bounded delete after another until a batch comes back
// short of batch, maxBatches have run (0: no bound), ctx ends or a delete
// fails, and returns the total deleted. Every retention pass of postbox
// (the history, the inbox, dead messages) is made of it.
func prune(ctx context.Context, maxBatches, batch int, del func(ctx context.Context) (int, error)) (int, error) {
	total := 0
	for i := 0; maxBatches == 0 || i < maxBatches; i++ {
		n, err := del(ctx)
		total += n
		if err != nil || n < batch {
			return total, err
		}
		if err := ctx.Err(); err != nil {
			return total, err
		}
	}
	return total, nil
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
