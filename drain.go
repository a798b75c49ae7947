package postbox

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ErrPartitionsHeld is returned by Drain when a running relay holds some
// of the partitions: stop it first, or let it do the work.
var ErrPartitionsHeld = errors.New("postbox: drain: partitions held by a running relay")

// ErrLeaseLost is returned by Drain when another relay took a partition's
// lease while Drain held it: the marks of the batch it had in flight were
// fenced out, so those rows are still pending and will be published again,
// under the same ids, by whoever holds the lease now (a later Drain, too).
var ErrLeaseLost = errors.New("postbox: drain: a partition's lease passed to another owner mid-batch")

// DrainResult counts what Drain did.
type DrainResult struct {
	Published int // rows published and marked
	Failed    int // publishes that failed as message failures (attempts spent)
	Dead      int // rows moved to the dead table
	Waiting   int // rows left pending, waiting for a retry
}

// Drain runs the relay synchronously, in the calling goroutine, until no
// row is available to publish: everything written and committed before the
// call is published, failed (and waiting for its backoff) or dead when it
// returns. It is meant for tests; a relay started with Start must not be
// running on the same tables.
func (c *Client[TTx]) Drain(ctx context.Context) (DrainResult, error) {
	var res DrainResult
	if len(c.routes) == 0 {
		return res, ErrNoPublisher
	}
	cfg := *c.cfg
	cfg.RelayID = "drain-" + NewID()
	r, err := newRelay(ctx, c.store, &cfg, c.routes, nil)
	if err != nil {
		return res, err
	}
	all := make([]int, r.nparts)
	for i := range all {
		all[i] = i
	}
	start := time.Now()
	leases, err := c.store.AcquireLeases(ctx, cfg.RelayID, all, cfg.LeaseDuration)
	if err != nil {
		return res, err
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupBudget)
		defer cancel()
		_ = c.store.ReleaseLeases(ctx, cfg.RelayID, all)
	}()
	if len(leases) != len(all) {
		return res, fmt.Errorf("%w (%d of %d)", ErrPartitionsHeld, len(all)-len(leases), len(all))
	}
	for _, l := range leases {
		r.held[l.Partition] = l.Generation
	}
	r.validUntil = start.Add(cfg.LeaseDuration - cfg.LeaseDuration/10)
	r.lanes = r.lanes[:1]
	for {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		fence, until := r.fence(time.Now(), 0)
		if len(fence.Generations) == 0 {
			return res, errors.New("postbox: drain: the leases ran out; raise LeaseDuration")
		}
		recs, err := c.store.Fetch(ctx, r.fetchParams(fence))
		if err != nil {
			return res, err
		}
		if len(recs) == 0 {
			st, err := c.store.Stats(ctx)
			if err != nil {
				return res, err
			}
			res.Waiting = int(st.Pending)
			return res, nil
		}
		began := time.Now()
		deadline := began.Add(cfg.BatchDeadline)
		if until.Before(deadline) {
			deadline = until
		}
		batch := r.publish(ctx, deadline, recs)
		res.Failed += len(batch.failed)
		rep, err := r.record(ctx, fence, recs, batch)
		res.Published += len(batch.published) - rep.FencedOut
		res.Dead += rep.dead
		if m := cfg.Metrics; m != nil {
			rep.Duration = time.Since(began)
			m.RelayBatch(rep)
		}
		if err != nil {
			return res, err
		}
		if batch.infra != nil {
			return res, fmt.Errorf("postbox: drain: %w", batch.infra)
		}
		if rep.FencedOut > 0 {
			return res, fmt.Errorf("%w: %d acknowledged rows left pending", ErrLeaseLost, rep.FencedOut)
		}
	}
}
