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
	Dead      int // rows moved to the dead messages
	Waiting   int // rows left pending, waiting for a retry (Stats.Pending: on PostgreSQL, an estimate past 10,000)
}

// Drain runs the relay synchronously, in the calling goroutine, until no
// row is available to publish: everything written and committed before the
// call is published, failed (and waiting for its backoff) or dead when it
// returns. It is meant for tests; a relay started with Start must not be
// running on the same tables.
//
// It runs the relay's own cycle, one lane over every partition, under
// leases it takes on all of them and lets go when it returns. A ctx that
// ends while the leases are being granted waits for the grant's answer
// (at most 5 s) and lets go of what it granted.
func (c *Client[TTx]) Drain(ctx context.Context) (DrainResult, error) {
	var res DrainResult
	if len(c.routes) == 0 {
		return res, ErrNoPublisher
	}
	cfg := *c.cfg
	cfg.RelayID = "drain-" + NewID()
	cfg.Lanes = 1
	r, err := newRelay(ctx, c.store, &cfg, c.routes, nil)
	if err != nil {
		return res, err
	}
	if err := r.takeAll(ctx); err != nil {
		return res, err
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupBudget)
		defer cancel()
		r.releaseAll(ctx)
	}()
	for {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		fence, until := r.fence(time.Now(), -1)
		if len(fence.Generations) == 0 {
			return res, errors.New("postbox: drain: the leases ran out; raise LeaseDuration")
		}
		step, _, err := r.step(ctx, ctx, fence, until, true, nil)
		if err != nil {
			if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
				// The read ran into the leases' end, not the caller's.
				return res, fmt.Errorf("postbox: drain: the leases ran out during a read; raise LeaseDuration: %w", err)
			}
			return res, err
		}
		if step.read == 0 {
			st, err := c.store.Stats(ctx)
			if err != nil {
				return res, err
			}
			res.Waiting = int(st.Pending)
			return res, nil
		}
		res.Published += step.published
		res.Failed += step.failed
		res.Dead += step.dead
		switch {
		case step.markErr != nil:
			return res, step.markErr
		case step.infra != nil:
			return res, fmt.Errorf("postbox: drain: %w", step.infra)
		case step.fencedOut > 0:
			return res, fmt.Errorf("%w: %d acknowledged rows left pending", ErrLeaseLost, step.fencedOut)
		}
	}
}
