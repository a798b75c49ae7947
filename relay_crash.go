package postbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/postbox-go/postbox/postboxdriver"
)

// A message whose publish kills the relay (a publisher that panics or exits
// on it, the broker client running out of memory) is taken up by the next
// relay after the lease runs out, and would kill it too, for ever. The relay
// bounds that without paying for it in normal operation (design §4, "A
// message that kills the relay"):
//
//   - A partition taken after its previous owner's lease ran out, rather
//     than released, may hold such a message: the database says so
//     (Lease.Crashed). Only its first batch is published with crash marks;
//     every other batch writes nothing more than before.
//   - Marked, the batch's rows are published together, in chunks of
//     markedChunk, each chunk's rows marked in flight with others by one
//     statement (which also clears the chunk before). A relay dying then
//     leaves them marked, and the next owner makes each a suspect.
//   - A suspect is published alone: marked in flight alone (one statement,
//     which also clears the mark before), with no other publish in flight
//     in the relay (every batch publishes under solo's read lock; this
//     takes the write lock). A relay dying then counts a crash against
//     that one row, and at MaxCrashes the next owner buries it as a dead
//     message instead of publishing it.
//
// A relay killed for a reason of its own (a deploy's SIGKILL) therefore
// counts a crash against an innocent row only when it dies during that
// row's lone publish, MaxCrashes times in a row; lone publishes are only
// tried while the lane's broker answers (calm), so that a broker outage,
// which stretches every publish to the batch deadline, does not widen that
// window. A relay that did not die leaves nothing counted: it clears its
// own marks once each publish ends, unfenced, and the next owner clears
// rather than counts a mark whose relay heartbeats again. Marks never hold
// a batch back: one the database does not take within a quarter of the
// batch deadline is given up, and the batch published without marks.

// settledMarks returns the partitions whose crash marks the relay settled
// at the generation it holds them under, so that Coordinate clears their
// leases' mark: released unsettled, a partition passes its mark on to the
// next owner. r.mu is held.
func (r *relay) settledMarks() []int {
	var out []int
	for p, g := range r.settled {
		if r.crashed[p] == g {
			out = append(out, p)
		}
	}
	return out
}

// suspects returns the partitions of fence whose batch is to be published
// with crash marks: taken after an expiry, at the generation fenced, and
// not settled yet.
func (r *relay) suspects(fence postboxdriver.Fence) map[int]bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out map[int]bool
	for p, g := range fence.Generations {
		if cg, ok := r.crashed[p]; ok && cg == g && r.settled[p] != g {
			if out == nil {
				out = map[int]bool{}
			}
			out[p] = true
		}
	}
	return out
}

// settle ends the crash marks on the partitions of sus that recs, a batch
// published with them whose every suspect was published alone, read rows
// of; on all of them when the batch was not full, so that every row
// pending on them was read. The rows of a partition are read oldest
// first, so the rows the dead relay had in flight are among the first
// read.
//
// A store whose read can end short of its limit with rows left
// (postboxdriver.PartialReader: the log, read by snapshot bands) says
// which partitions the read took whole (whole, not nil), and only those
// are settled: a band read short of its limit, closing a band the dead
// relay read past, leaves its in-flight rows in the next band, and ending
// the marks there had them published unmarked, a crash on them counted
// against nothing. Over a backlog the marks then last until the relay
// catches up with the partition.
func (r *relay) settle(fence postboxdriver.Fence, sus map[int]bool, recs []postboxdriver.Record, whole map[int]bool) {
	read := map[int]bool{}
	for i := range recs {
		read[recs[i].Partition] = true
	}
	full := len(recs) >= r.cfg.BatchSize
	r.mu.Lock()
	defer r.mu.Unlock()
	for p := range sus {
		if whole != nil && whole[p] || whole == nil && (read[p] || !full) {
			r.settled[p] = fence.Generations[p]
		}
	}
}

// readWhole asks a PartialReader which partitions the read that returned
// recs took whole; nil for another store, whose reads are whole up to
// their limit.
func (r *relay) readWhole(recs []postboxdriver.Record) map[int]bool {
	pr, ok := r.ex.(postboxdriver.PartialReader)
	if !ok {
		return nil
	}
	whole := map[int]bool{}
	for _, p := range pr.ReadWhole(recs) {
		whole[p] = true
	}
	return whole
}

// marked is what publishMarked leaves for the caller: the rows still
// marked when it returned, cleared once the batch is recorded (rows
// published are gone by then, failed ones cleared), and whether every
// suspect of the batch was published alone.
type marked struct {
	left      []int64 // published with others: ended, or never began
	leftAlone []int64 // published alone, outcome unknown
	complete  bool
}

// publishMarked publishes recs, the batch of a fence in which the
// partitions sus are published with crash marks: the rows of the other
// partitions, and the rows of sus that are not suspects, together (those
// of sus marked in flight with others); then, when calm, each suspect
// alone, and after it each later row of its key; a row that reached
// MaxCrashes becomes a dead message unpublished, and its key's later rows
// wait for the next batch. until bounds the publishing of the rows alone as
// deadline does the others'. The partitions leave the marks (complete)
// once no suspect of theirs waits.
func (r *relay) publishMarked(ctx context.Context, deadline, until time.Time, fence postboxdriver.Fence, recs []postboxdriver.Record, sus map[int]bool, calm bool) (batchResult, marked) {
	var m marked
	var seqs []int64
	for i := range recs {
		if sus[recs[i].Partition] {
			seqs = append(seqs, recs[i].Seq)
		}
	}
	// The marks are bounded by a quarter of the batch deadline each: a
	// database too busy to write them in that time gets the batch
	// published without them (unmarked), as if the partition had not
	// been taken after an expiry, rather than waiting or pausing.
	sctx, cancel := context.WithDeadline(ctx, r.markBound(deadline))
	found, err := r.ex.ResolveCrashes(sctx, fence, seqs)
	cancel()
	if err != nil {
		// A database this busy gets no more marks from this takeover.
		m.complete = true
		return r.unmarked(ctx, deadline, until, recs, fmt.Errorf("read: %w", err)), m
	}
	crashes := make(map[int64]int, len(found))
	for _, s := range found {
		crashes[s.Seq] = s.Crashes
	}

	var res batchResult
	var group, alone []postboxdriver.Record
	buried := map[string]bool{} // keys whose later rows wait for the next batch
	solo := map[string]bool{}   // keys whose later rows go alone, after their suspect
	left := false               // a suspect waits for the next batch
	for i := range recs {
		rec := &recs[i]
		n, suspect := crashes[rec.Seq]
		switch {
		case rec.Key != "" && buried[rec.Key]:
			left = left || suspect
		case suspect && n >= r.cfg.MaxCrashes:
			res.failed = append(res.failed, postboxdriver.Failure{Seq: rec.Seq, Dead: true,
				Error: fmt.Sprintf("crash-looping: %d relays died while publishing this message alone (MaxCrashes %d)", n, r.cfg.MaxCrashes)})
			r.log.Warn("postbox relay buries a crash-looping message: relays died publishing it",
				slog.String("id", rec.ID), slog.String("topic", rec.Topic), slog.Int("crashes", n))
			if rec.Key != "" {
				buried[rec.Key] = true
			}
		case suspect || (rec.Key != "" && solo[rec.Key]):
			alone = append(alone, *rec)
			if rec.Key != "" {
				solo[rec.Key] = true
			}
		default:
			group = append(group, *rec)
		}
	}

	// Together, in chunks of at most markedChunk rows in seq order, each
	// marked before it is published, by the statement that clears the
	// chunk before: a relay dying makes suspects of one chunk's rows at
	// most. A key whose row was not acknowledged stops there for this
	// batch. No chunk starts past half the deadline: the rest waits for the
	// next batch, rather than the batch ending in a deadline that pauses
	// the lane.
	waiting := map[string]bool{}
	var prev []int64 // marked rows whose publish ended
	half := time.Now().Add(time.Until(deadline) / 2)
	for start := 0; start < len(group); start += markedChunk {
		if start > 0 && time.Now().After(half) {
			left = true
			for _, rec := range group[start:] {
				if rec.Key != "" {
					waiting[rec.Key] = true // not sent: its key's suspect waits too
				}
			}
			break
		}
		var send []postboxdriver.Record
		var marks []int64
		for _, rec := range group[start:min(start+markedChunk, len(group))] {
			if rec.Key != "" && waiting[rec.Key] {
				continue
			}
			send = append(send, rec)
			if sus[rec.Partition] {
				marks = append(marks, rec.Seq)
			}
		}
		if err := r.mark(ctx, r.markBound(deadline), fence, marks, postboxdriver.InFlightWithOthers, prev); err != nil {
			m.left = append(append([]int64(nil), prev...), marks...) // perhaps committed
			var rest []postboxdriver.Record
			for _, rec := range group[start:] {
				if rec.Key == "" || !waiting[rec.Key] {
					rest = append(rest, rec)
				}
			}
			res.add(r.unmarked(ctx, deadline, until, rest, err))
			m.complete = true // a database this busy gets no more marks from this takeover
			return res, m
		}
		if len(marks) > 0 {
			prev = marks
		}
		r.solo.RLock()
		out := r.publish(ctx, deadline, until, send)
		r.solo.RUnlock()
		res.add(out)
		acked := make(map[int64]bool, len(out.published))
		for _, s := range out.published {
			acked[s] = true
		}
		for i := range send {
			if send[i].Key != "" && !acked[send[i].Seq] {
				waiting[send[i].Key] = true
			}
		}
		if out.infra != nil {
			m.left = prev
			return res, m
		}
	}
	if len(alone) == 0 || !calm {
		m.left = prev
		m.complete = len(alone) == 0 && !left
		return res, m
	}
	var done bool
	var out batchResult
	out, done, m.left, m.leftAlone = r.publishAlone(ctx, until, fence, alone, waiting, prev)
	res.add(out)
	m.complete = done && out.infra == nil && !left
	return res, m
}

// publishAlone publishes each of recs (suspects and the rows of their keys
// after them, in seq order) as the only publish in flight in the relay,
// marked in flight alone from just before its publish until the next
// row's mark (or the caller's clear, after the record), so that the relay
// dying in between counts a crash against that row and no other; prev,
// the rows published together before, are cleared by the first mark. A
// row whose key is in waiting (an earlier row of the key was not
// acknowledged) is left for the next batch. It publishes within a batch
// deadline of its own, never past until, and reports whether it tried
// every row, and the rows still marked: those to clear, and the one
// published alone whose outcome is unknown, to keep a suspect.
func (r *relay) publishAlone(ctx context.Context, until time.Time, fence postboxdriver.Fence, recs []postboxdriver.Record, waiting map[string]bool, prev []int64) (res batchResult, all bool, clear, suspect []int64) {
	r.solo.Lock()
	defer r.solo.Unlock()
	// The other lanes' batches have ended: a deadline of its own.
	end := time.Now().Add(r.cfg.BatchDeadline)
	if until.Before(end) {
		end = until
	}
	// Publishes a batch abandoned at its deadline still hold their window
	// tokens until the publisher gives them up: none may be in flight.
	for len(r.window) > 0 {
		if time.Now().After(end) || ctx.Err() != nil {
			res.infra = fmt.Errorf("publishes of an abandoned batch still in flight: %d", len(r.window))
			return res, false, prev, nil
		}
		time.Sleep(minPoll)
	}
	half := time.Now().Add(time.Until(end) / 2)
	for i := range recs {
		rec := recs[i]
		if i > 0 && time.Now().After(half) {
			return res, false, prev, nil // the rest waits for the next batch
		}
		if rec.Key != "" && waiting[rec.Key] {
			continue
		}
		if err := r.mark(ctx, r.markBound(end), fence, []int64{rec.Seq}, postboxdriver.InFlightAlone, prev); err != nil {
			// The rest waits for the next batch.
			r.log.Warn("postbox relay could not mark a suspect in flight; it waits for the next batch", slog.Any("error", err))
			return res, false, prev, []int64{rec.Seq} // perhaps committed
		}
		prev = []int64{rec.Seq}
		out := r.publish(ctx, end, end, []postboxdriver.Record{rec})
		res.add(out)
		switch {
		case out.infra != nil:
			return res, false, nil, prev
		case len(out.published) == 0 && rec.Key != "":
			waiting[rec.Key] = true // failed: the key's later rows wait
		}
	}
	for _, rec := range recs {
		if rec.Key != "" && waiting[rec.Key] {
			return res, false, prev, nil
		}
	}
	return res, true, prev, nil
}

// markBound is when a mark written now must be done: a quarter of the
// batch deadline, and never past deadline.
func (r *relay) markBound(deadline time.Time) time.Time {
	if b := time.Now().Add(r.cfg.BatchDeadline / 4); b.Before(deadline) {
		return b
	}
	return deadline
}

// unmarked publishes recs as a batch without crash marks, after the
// marks could not be read or written (why).
func (r *relay) unmarked(ctx context.Context, deadline, until time.Time, recs []postboxdriver.Record, why error) batchResult {
	r.log.Warn("postbox relay publishes a batch without crash marks: the database did not take them in time", slog.Any("error", why))
	r.solo.RLock()
	defer r.solo.RUnlock()
	return r.publish(ctx, deadline, until, recs)
}

// markedChunk is the most rows published together with crash marks: a
// relay dying makes suspects of them, each then published alone.
const markedChunk = 64

// add merges the outcome of o, a part of the batch, into b.
func (b *batchResult) add(o batchResult) {
	b.published = append(b.published, o.published...)
	b.ackedAt = append(b.ackedAt, o.ackedAt...)
	b.failed = append(b.failed, o.failed...)
	if b.infra == nil {
		b.infra = o.infra
	}
}

// mark sets the crash mark of seqs and clears that of clear, in one
// statement bounded by end.
func (r *relay) mark(ctx context.Context, end time.Time, fence postboxdriver.Fence, seqs []int64, mark postboxdriver.InFlight, clear []int64) error {
	if len(seqs) == 0 && len(clear) == 0 {
		return nil
	}
	mctx, cancel := context.WithDeadline(ctx, end)
	defer cancel()
	if _, err := r.ex.MarkInFlight(mctx, fence, seqs, mark, clear); err != nil {
		return fmt.Errorf("%w: mark %d rows in flight: %w", errCrashMarks, len(seqs), err)
	}
	return nil
}

// errCrashMarks marks a failure to read or write crash marks: the
// database's, not the broker's, so it does not make a lane unsure of its
// broker (calm).
var errCrashMarks = errors.New("crash marks")

// recorded drops from m the rows whose outcome out recorded: published
// rows left the outbox, and failed ones lost their marks.
func (m *marked) recorded(out batchResult) {
	if len(m.left) == 0 && len(m.leftAlone) == 0 {
		return
	}
	done := make(map[int64]bool, len(out.published)+len(out.failed))
	for _, s := range out.published {
		done[s] = true
	}
	for _, f := range out.failed {
		done[f.Seq] = true
	}
	keep := func(seqs []int64) []int64 {
		out := seqs[:0]
		for _, s := range seqs {
			if !done[s] {
				out = append(out, s)
			}
		}
		return out
	}
	m.left, m.leftAlone = keep(m.left), keep(m.leftAlone)
}

// unmark clears, once the batch is recorded, the marks publishMarked
// left: rows published are gone and rows failed cleared by then; the
// others were in flight with no crash, or published alone with no outcome
// (which, cleared, go together with others next time, and become suspects
// again if a relay dies then). Clears are not fenced: a mark's own relay
// clearing it says only that the publish ended without a crash, whoever
// holds the partition now. It has a budget of its own: a mark left behind
// counts a crash that did not happen.
func (r *relay) unmark(ctx context.Context, fence postboxdriver.Fence, m marked) error {
	clear := append(m.left, m.leftAlone...)
	if len(clear) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupBudget)
	defer cancel()
	if _, err := r.ex.MarkInFlight(ctx, fence, nil, postboxdriver.NotInFlight, clear); err != nil {
		return fmt.Errorf("%w: clear %d rows: %w", errCrashMarks, len(clear), err)
	}
	return nil
}
