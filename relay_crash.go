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
//   - Marked, the batch's rows are published together, each marked in
//     flight with others (one statement for them all). A relay dying then
//     leaves them marked, and the next owner makes each a suspect.
//   - A suspect is published alone: marked in flight alone, with no other
//     publish in flight in the relay (every batch publishes under solo's
//     read lock; this takes the write lock). A relay dying then counts a
//     crash against that one row, and at MaxCrashes the next owner buries
//     it as a dead message instead of publishing it.
//
// A relay killed for a reason of its own (a deploy's SIGKILL) therefore
// counts a crash against an innocent row only when it dies during that
// row's lone publish, MaxCrashes times in a row; and lone publishes are
// only tried while the lane's broker answers (calm), so that a broker
// outage, which stretches every publish to the batch deadline, does not
// widen that window.

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
// pending on them was read.
func (r *relay) settle(fence postboxdriver.Fence, sus map[int]bool, recs []postboxdriver.Record) {
	read := map[int]bool{}
	for i := range recs {
		read[recs[i].Partition] = true
	}
	full := len(recs) >= r.cfg.BatchSize
	r.mu.Lock()
	defer r.mu.Unlock()
	for p := range sus {
		if read[p] || !full {
			r.settled[p] = fence.Generations[p]
		}
	}
}

// marked is what publishMarked leaves for the caller: the rows whose mark
// could not be cleared when their publish ended, to be cleared once the
// batch is recorded, and whether every suspect of the batch was published
// alone.
type marked struct {
	left      []int64 // published with others
	leftAlone []int64 // published alone
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
	sctx, cancel := context.WithDeadline(ctx, deadline)
	found, err := r.ex.ResolveCrashes(sctx, fence, seqs)
	cancel()
	if err != nil {
		return batchResult{infra: fmt.Errorf("read crash marks: %w", err)}, m
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
	// marked before it is published and cleared once it settled: a relay
	// dying makes suspects of one chunk's rows at most. A key whose row
	// was not acknowledged stops there for this batch.
	waiting := map[string]bool{}
	acked := map[int64]bool{}
	// No chunk starts past half the deadline: what is left waits for the
	// next batch, rather than the batch ending in a deadline that pauses
	// the lane.
	half := time.Now().Add(time.Until(deadline) / 2)
	for start := 0; start < len(group) && res.infra == nil; start += markedChunk {
		if start > 0 && time.Now().After(half) {
			left = true
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
		if err := r.mark(ctx, deadline, fence, marks, postboxdriver.InFlightWithOthers); err != nil {
			res.infra = err
			break
		}
		r.solo.RLock()
		out := r.publish(ctx, deadline, send)
		r.solo.RUnlock()
		res.add(out)
		for _, s := range out.published {
			acked[s] = true
		}
		for i := range send {
			if send[i].Key != "" && !acked[send[i].Seq] {
				waiting[send[i].Key] = true
			}
		}
		if err := r.clear(ctx, fence, marks, postboxdriver.NotInFlight); err != nil {
			m.left = append(m.left, marks...)
			if res.infra == nil {
				res.infra = err
			}
		}
	}
	if len(alone) == 0 {
		m.complete = res.infra == nil && !left
		return res, m
	}
	if res.infra != nil || !calm {
		return res, m
	}

	// A suspect goes only after its key's rows published together were
	// acknowledged.
	out, done, stuck := r.publishAlone(ctx, until, fence, alone, waiting)
	res.add(out)
	m.leftAlone = stuck
	m.complete = done && out.infra == nil && !left
	return res, m
}

// publishAlone publishes each of recs (suspects and the rows of their keys
// after them, in seq order) as the only publish in flight in the relay,
// marked in flight alone from just before the publish until its outcome,
// so that the relay dying in between counts a crash against that row and
// no other. A row whose key is in waiting (an earlier row of the key was
// not acknowledged) is left for the next batch. It publishes within a
// batch deadline of its own, never past until, and reports whether it
// tried every row, and the rows whose mark it could not clear.
func (r *relay) publishAlone(ctx context.Context, until time.Time, fence postboxdriver.Fence, recs []postboxdriver.Record, waiting map[string]bool) (res batchResult, all bool, stuck []int64) {
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
			return res, false, nil
		}
		time.Sleep(minPoll)
	}
	all = true
	half := time.Now().Add(time.Until(end) / 2)
	for i := range recs {
		rec := recs[i]
		if i > 0 && time.Now().After(half) {
			return res, false, nil // the rest waits for the next batch
		}
		if rec.Key != "" && waiting[rec.Key] {
			all = false
			continue
		}
		if err := r.mark(ctx, end, fence, []int64{rec.Seq}, postboxdriver.InFlightAlone); err != nil {
			// Perhaps committed: the caller clears it after the record.
			res.infra = err
			return res, false, []int64{rec.Seq}
		}
		out := r.publish(ctx, end, []postboxdriver.Record{rec})
		// The publish ended without killing the relay: clear the mark
		// before the next row's, so that a crash during that one counts
		// against it alone. A row left pending stays a suspect.
		after := postboxdriver.NotInFlight
		if out.infra != nil {
			after = postboxdriver.Suspected
		}
		err := r.clear(ctx, fence, []int64{rec.Seq}, after)
		res.add(out)
		switch {
		case err != nil:
			if res.infra == nil {
				res.infra = err
			}
			return res, false, []int64{rec.Seq}
		case out.infra != nil:
			return res, false, nil
		case len(out.published) == 0 && rec.Key != "":
			waiting[rec.Key] = true // failed: the key's later rows wait
		}
	}
	return res, all, nil
}

// markedChunk is the most rows published together with crash marks: a
// relay dying makes suspects of them, each then published alone.
const markedChunk = 32

// add merges the outcome of o, a part of the batch, into b.
func (b *batchResult) add(o batchResult) {
	b.published = append(b.published, o.published...)
	b.ackedAt = append(b.ackedAt, o.ackedAt...)
	b.failed = append(b.failed, o.failed...)
	if b.infra == nil {
		b.infra = o.infra
	}
}

// mark sets the crash mark of seqs, bounded by end (a mark left behind by
// a failure is cleared after the batch is recorded, or read as a crash by
// the next owner of a relay that died).
func (r *relay) mark(ctx context.Context, end time.Time, fence postboxdriver.Fence, seqs []int64, mark postboxdriver.InFlight) error {
	mctx, cancel := context.WithDeadline(ctx, end)
	defer cancel()
	if len(seqs) == 0 {
		return nil
	}
	if _, err := r.ex.MarkInFlight(mctx, fence, seqs, mark); err != nil {
		return fmt.Errorf("mark %d rows in flight: %w", len(seqs), err)
	}
	return nil
}

// clear sets the crash mark of seqs after their publish ended, with a
// budget of its own: a mark left behind would count a crash that did not
// happen.
func (r *relay) clear(ctx context.Context, fence postboxdriver.Fence, seqs []int64, mark postboxdriver.InFlight) error {
	if len(seqs) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupBudget)
	defer cancel()
	if _, err := r.ex.MarkInFlight(ctx, fence, seqs, mark); err != nil {
		return fmt.Errorf("clear the crash marks of %d rows: %w", len(seqs), err)
	}
	return nil
}

// unmark clears, once the batch is recorded, the marks that could not be
// cleared when their publish ended: rows published with others are not
// suspects; a row published alone stays one.
func (r *relay) unmark(ctx context.Context, fence postboxdriver.Fence, m marked) error {
	return errors.Join(r.clear(ctx, fence, m.left, postboxdriver.NotInFlight), r.clear(ctx, fence, m.leftAlone, postboxdriver.Suspected))
}
