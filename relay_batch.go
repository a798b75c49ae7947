package postbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/postbox-go/postbox/postboxdriver"
)

// stepResult is what one relay cycle did.
type stepResult struct {
	read      int                    // rows read; 0 means nothing was available
	published int                    // acknowledged and marked
	failed    int                    // message failures (an attempt spent, or dead)
	dead      int                    // rows moved to the dead messages
	fencedOut int                    // acknowledged rows whose mark changed nothing: the lease moved on
	infra     error                  // the batch's infrastructure failure: nothing of it spent an attempt
	markErr   error                  // recording the outcome failed; those rows stay pending
	recs      []postboxdriver.Record // the rows read, each published, failed or left on an infrastructure failure; nil after a batch with crash marks
}

// step is the relay's one cycle, run by every lane and by Drain: read the
// next batch of fence's partitions, publish it under one deadline, record
// the outcome fenced by the leases' generations, and report it to the
// metrics. until is when the leases stop being usable: nothing read under
// them is published after it.
//
// The read runs on soft: a stop ends it. Publishing and recording run on
// hard, so that a soft stop still finishes the batch in flight and records
// it. The returned error is the read's; publish and record failures are in
// the result.
//
// A batch on partitions taken after their owner's lease ran out is
// published with crash marks (relay_crash.go); calm says the lane's broker
// answered its last batch, which the lone publishes of suspects wait for.
//
// pr is the lane's last batch, whose record waits for this read (nil for
// none): it is recorded in the read's statement, or alone when that
// fails, and its claim ended. The batch step returns instead of recording
// it (nil when it recorded its batch) is the caller's to hand to the next
// step or to flush; its claim on fence holds until then.
func (r *relay) step(soft, hard context.Context, fence postboxdriver.Fence, until time.Time, calm bool, pr *prior) (stepResult, *prior, error) {
	// A read that outlives the lease is of no use, so it is bounded by it.
	fctx, cancel := context.WithDeadline(soft, until)
	var recs []postboxdriver.Record
	var err error
	var before stepResult
	if pr != nil {
		// The statement records as well as reads: a soft stop does not
		// cut it short, or a record PostgreSQL committed would be
		// recorded again by the fallback and reported fenced out.
		rctx, rcancel := context.WithDeadline(hard, until)
		before, recs, err = r.recordWithRead(rctx, hard, pr, r.fetchParams(fence))
		rcancel()
	} else {
		recs, err = r.ex.Fetch(fctx, r.fetchParams(fence))
	}
	cancel()
	if err != nil || len(recs) == 0 {
		return before, nil, err
	}
	began := time.Now()
	deadline := began.Add(r.cfg.BatchDeadline)
	if until.Before(deadline) {
		deadline = until
	}
	sus := r.suspects(fence)
	var out batchResult
	var m marked
	var whole map[int]bool
	if sus == nil {
		r.solo.RLock()
		out = r.publish(hard, deadline, until, recs)
		r.solo.RUnlock()
		if r.deferrable(fence, recs, out) {
			return stepResult{read: len(recs), fencedOut: before.fencedOut, markErr: before.markErr, recs: recs},
				&prior{fence: fence, recs: recs, out: out, took: time.Since(began)}, nil
		}
	} else {
		whole = r.readWhole(recs) // asked before the marks move the read's rows
		out, m = r.publishMarked(hard, deadline, until, fence, recs, sus, calm)
	}
	res, rep := r.record(hard, fence, recs, out)
	res.fencedOut += before.fencedOut
	res.markErr = errors.Join(before.markErr, res.markErr)
	if sus == nil {
		res.recs = recs
	} else {
		// A batch published with crash marks may leave rows for the next
		// batch, sent and failed by no one: it reports no rows read.
		if res.markErr == nil && res.fencedOut == 0 {
			m.recorded(out)
		}
		if err := r.unmark(hard, fence, m); err != nil {
			res.markErr = errors.Join(res.markErr, err)
		}
		if m.complete && res.markErr == nil {
			r.settle(fence, sus, recs, whole)
		}
	}
	r.report(rep, time.Since(began))
	return res, nil, nil
}

// report hands a batch's report, if any, to the metrics.
func (r *relay) report(rep *BatchReport, took time.Duration) {
	if m := r.cfg.Metrics; m != nil && rep != nil {
		rep.Duration = took
		m.RelayBatch(rep)
	}
}

// prior is a lane's last batch, when it only published and was small:
// its record waits for the lane's next read and goes in the same
// statement (postboxdriver.SettleFetcher), so that a relay kept busy by a
// trickle of writes sends one statement a batch rather than two. The
// lane records it alone when no read comes within priorLinger, and at a
// stop.
type prior struct {
	fence postboxdriver.Fence
	recs  []postboxdriver.Record
	out   batchResult
	took  time.Duration // from the read to the last acknowledgement
}

// Which batches wait for the next read to be recorded: at most
// priorMaxRows published rows, for at most priorLinger, which is the
// default PollInterval: a lane at rest then records its last batch with
// the read of its next poll. A crash of the relay sends them again, as it
// does the publishes in flight: each lane adds at most priorMaxRows to
// what a crash sends twice. A partition leaving the relay's share wakes
// every lane (its renewal moved the held set), whose next read, or whose
// turn to wait for a share, records the batch at once.
const (
	priorMaxRows = 8
	priorLinger  = DefaultPollInterval
)

// deferrable says whether a batch published under fence may wait for the
// lane's next read to be recorded: the store can record it with a read,
// every row was acknowledged, there are few, the read was not full (a
// backlog reads again at once, and records alone), and no partition of
// fence is leaving the relay's share, whose release waits for the record.
func (r *relay) deferrable(fence postboxdriver.Fence, recs []postboxdriver.Record, out batchResult) bool {
	if _, ok := r.ex.(postboxdriver.SettleFetcher); !ok || r.wake == nil {
		return false
	}
	if out.infra != nil || len(out.failed) > 0 || len(out.published) != len(recs) ||
		len(recs) > priorMaxRows || len(recs) >= r.cfg.BatchSize {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for p := range fence.Generations {
		if _, leaving := r.leaving[p]; leaving {
			return false
		}
	}
	return true
}

// recordWithRead records pr in the statement that reads the next batch
// (params), and ends pr's claim. When that statement fails, pr is
// recorded alone. It returns what recording pr found (fenced-out rows, a
// failure to record) and the read.
func (r *relay) recordWithRead(fctx, hard context.Context, pr *prior, params postboxdriver.FetchParams) (stepResult, []postboxdriver.Record, error) {
	defer r.done(pr.fence)
	settled, recs, err := r.ex.(postboxdriver.SettleFetcher).SettleFetch(fctx, pr.fence, pr.outcome(), r.cfg.MaxAttempts, params)
	var res stepResult
	var rep *BatchReport
	if err != nil {
		res, rep = r.record(hard, pr.fence, pr.recs, pr.out)
	} else {
		res, rep = r.recorded(pr.fence, pr.recs, pr.out, settled, nil)
	}
	r.report(rep, pr.took)
	return stepResult{fencedOut: res.fencedOut, markErr: res.markErr}, recs, err
}

// flush records pr alone and ends its claim: no read came for it in time,
// or the lane stops.
func (r *relay) flush(hard context.Context, pr *prior) stepResult {
	defer r.done(pr.fence)
	res, rep := r.record(hard, pr.fence, pr.recs, pr.out)
	r.report(rep, pr.took)
	return res
}

func (pr *prior) outcome() postboxdriver.Outcome {
	read := make([]int64, len(pr.recs))
	for i := range pr.recs {
		read[i] = pr.recs[i].Seq
	}
	return postboxdriver.Outcome{Read: read, Published: pr.out.published}
}

// fetchParams selects the next batch under fence: always from the start of
// its partitions in seq order. A lower bound carried from the previous read would skip a row
// that committed late with a lower seq than rows already read, and
// publish its key's later rows before it (G4); under a held snapshot the
// read therefore walks the index entries of rows already moved out, which
// the relay reports (see checkSnapshots).
func (r *relay) fetchParams(fence postboxdriver.Fence) postboxdriver.FetchParams {
	return postboxdriver.FetchParams{Fence: fence, Limit: r.cfg.BatchSize, BlockOnDead: r.cfg.BlockOnDead, Topics: r.topics}
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

// pubDone is the done of one record's publish: it frees the record's
// window token and reports its outcome, once. A batch makes its records'
// at once.
type pubDone struct {
	once    atomic.Bool
	i       int
	window  chan struct{}
	end     func(error) // the tracer's span, or nil
	results chan<- outcome
}

func (d *pubDone) done(err error) {
	if d.once.CompareAndSwap(false, true) {
		<-d.window // free the slot at once, for every lane
		if d.end != nil {
			d.end(err)
		}
		d.results <- outcome{d.i, err}
	}
}

// publish sends recs with at most PublishWindow outstanding, each keyed
// message only after its predecessor in the batch was acknowledged. A
// message failure ends its key's chain for this batch (the rest stay
// pending and wait behind its backoff); an infrastructure failure stops
// new publishes.
//
// No publish starts after deadline; the rows not sent by then stay pending
// for the next batch. A publish already sent is awaited until the lease
// the batch was read under ends (until): abandoning it at the deadline
// would send it again although the broker has most likely taken it, so a
// broker that is merely slow (a quorum queue's fsync under load) would
// turn every batch deadline into duplicates. What is still outstanding at
// until is abandoned: those rows stay pending and are published again.
func (r *relay) publish(ctx context.Context, deadline, until time.Time, recs []postboxdriver.Record) batchResult {
	if until.Before(deadline) {
		until = deadline
	}
	ctx, cancel := context.WithDeadline(ctx, until)
	defer cancel()
	sctx, scancel := context.WithDeadline(ctx, deadline)
	defer scancel()

	ready, next := chains(recs)
	var res batchResult
	// Buffered for every record, so a publisher that calls done after the
	// batch is abandoned never blocks.
	results := make(chan outcome, len(recs))
	dones := make([]pubDone, len(recs))
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
		for res.infra == nil && head < len(ready) && sctx.Err() == nil {
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
				case <-sctx.Done():
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
			d := &dones[i]
			d.i, d.window, d.results = i, r.window, results
			if r.cfg.Tracer != nil {
				d.end = r.cfg.Tracer.StartPublish(ctx, env)
			}
			r.pub.Publish(ctx, env, d.done)
		}
	wait:
		if inflight == 0 {
			if res.infra == nil && sctx.Err() != nil && head < len(ready) {
				res.infra = fmt.Errorf("batch deadline passed: %w", sctx.Err())
			}
			return res
		}
		select {
		case o := <-results:
			settle(o)
		case <-ctx.Done():
			if res.infra == nil {
				res.infra = fmt.Errorf("lease ended with %d publishes unacknowledged: %w", inflight, ctx.Err())
			}
			// The abandoned publishes keep their tokens until the
			// publisher gives up on them, which it must when ctx ends.
			return res
		}
	}
}

// chains orders a batch for publishing: ready holds what may be sent at
// once (every keyless row, and the first row of each key), and next[i] the
// row of the same key that may be sent once row i is acknowledged (-1 for
// none). ready has room for every row: acknowledged rows append their
// successors to it.
func chains(recs []postboxdriver.Record) (ready, next []int) {
	next = make([]int, len(recs))
	last := make(map[string]int)
	ready = make([]int, 0, len(recs))
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
	return ready, next
}

func (r *relay) envelope(rec *postboxdriver.Record) (*Envelope, error) {
	h, err := DecodeHeaders(rec.Headers)
	if err != nil {
		// No attempt can cure a row whose headers are not an object of
		// strings.
		return nil, Permanent(err)
	}
	return newEnvelope(rec.ID, rec.Topic, rec.Key, rec.Payload, h, r.cfg.Source, r.horizon, rec.CreatedAt, rec.Attempts+1), nil
}

// failure is the record of a message failure: dead at once when it is
// permanent, after the delay it names when it is a counted retry-after,
// else after the backoff.
func (r *relay) failure(rec *postboxdriver.Record, err error) postboxdriver.Failure {
	f := postboxdriver.Failure{Seq: rec.Seq, Error: errorText(err), Backoff: backoff(rec.Attempts, r.cfg.BackoffBase, r.cfg.BackoffMax)}
	if IsPermanent(err) {
		f.Dead = true
	} else if ra, ok := retryAfter(err); ok {
		f.Backoff = ra.Delay
	}
	return f
}

// record writes the batch's outcome back, fenced. It runs on the hard
// context so a soft Stop still records a finished batch; after a hard stop
// it gets a short budget of its own, since every acknowledged row it fails
// to mark is published again. With metrics on it also returns the batch's
// report, counted per topic.
func (r *relay) record(ctx context.Context, fence postboxdriver.Fence, recs []postboxdriver.Record, out batchResult) (stepResult, *BatchReport) {
	if len(out.published) == 0 && len(out.failed) == 0 {
		return r.recorded(fence, recs, out, postboxdriver.Settled{}, nil)
	}
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
	read := make([]int64, len(recs))
	for i := range recs {
		read[i] = recs[i].Seq
	}
	settled, err := r.ex.Settle(ctx, fence, postboxdriver.Outcome{Read: read, Published: out.published, Failed: out.failed}, r.cfg.MaxAttempts)
	return r.recorded(fence, recs, out, settled, err)
}

// recorded is the result and the report of a batch whose outcome Settle
// (or SettleFetch) recorded as settled, or failed to record with err.
func (r *relay) recorded(fence postboxdriver.Fence, recs []postboxdriver.Record, out batchResult, settled postboxdriver.Settled, err error) (stepResult, *BatchReport) {
	res := stepResult{read: len(recs), failed: len(out.failed), infra: out.infra}
	var rep *BatchReport
	var bySeq map[int64]*postboxdriver.Record
	if r.cfg.Metrics != nil {
		rep = &BatchReport{Relay: r.id, Size: len(recs), Infrastructure: out.infra,
			Published: map[string]int{}, Failed: map[string]int{}, Dead: map[string]int{}}
		bySeq = make(map[int64]*postboxdriver.Record, len(recs))
		for i := range recs {
			bySeq[recs[i].Seq] = &recs[i]
		}
	}
	if len(out.published) == 0 && len(out.failed) == 0 {
		return res, rep
	}
	if err != nil {
		res.markErr = fmt.Errorf("record the outcome of %d published and %d failed rows (they will be published again): %w",
			len(out.published), len(out.failed), err)
		return res, rep
	}
	if settled.Published < len(out.published) {
		res.fencedOut = len(out.published) - settled.Published
		r.log.Warn("postbox relay lost marks to fencing: its lease moved on, the new owner publishes these again",
			slog.Int("lost", res.fencedOut))
	}
	res.published = settled.Published
	if rep != nil {
		rep.FencedOut = res.fencedOut
		for i, seq := range out.published {
			rec := bySeq[seq]
			rep.Published[rec.Topic]++
			rep.Lag = append(rep.Lag, out.ackedAt[i].Sub(rec.CreatedAt))
		}
	}
	for _, fr := range settled.Failed {
		if rep != nil {
			rep.Failed[bySeq[fr.Seq].Topic]++
		}
		if fr.Dead {
			res.dead++
			if rep != nil {
				rep.Dead[bySeq[fr.Seq].Topic]++
			}
			r.log.Warn("postbox message dead: its attempt budget is spent or its failure is permanent", slog.Int64("seq", fr.Seq), slog.Int("attempts", fr.Attempts))
		}
	}
	return res, rep
}
