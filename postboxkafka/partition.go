package postboxkafka

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/postbox-go/postbox"
)

// part is one assigned partition: its queue of fetched records and the
// goroutine that processes them in order.
type part struct {
	r    *run
	tp   tp
	stop chan struct{} // closed by detach: finish the record in hand, then return
	done chan struct{} // closed when the worker returned
	wake chan struct{} // a token when records were queued

	// Guarded by r.mu.
	queue   []*kgo.Record // fetched, not settled; the head is in hand
	paused  bool          // fetching is paused
	stopped bool          // stop is closed
	next    int64         // the offset after the last settled record; -1: none yet
	epoch   int32         // the leader epoch of the last settled record
	// committed is the offset last committed; -1: none by this worker.
	committed int64
}

func (pt *part) signal() {
	select {
	case pt.wake <- struct{}{}:
	default:
	}
}

// work processes the partition's records in offset order until stopped.
func (pt *part) work() {
	defer pt.r.workers.Done()
	defer close(pt.done)
	for {
		rec := pt.head()
		if rec == nil || !pt.handle(rec) {
			return
		}
	}
}

// head returns the oldest unsettled record, waiting for one; nil once
// stopped.
func (pt *part) head() *kgo.Record {
	r := pt.r
	for {
		r.mu.Lock()
		switch {
		case pt.stopped:
			r.mu.Unlock()
			return nil
		case len(pt.queue) > 0:
			rec := pt.queue[0]
			r.mu.Unlock()
			return rec
		}
		r.mu.Unlock()
		select {
		case <-pt.wake:
		case <-pt.stop:
			return nil
		}
	}
}

// handle processes rec until it is settled, holding the partition for
// each Retry's delay. It returns false when stopped first.
func (pt *part) handle(rec *kgo.Record) bool {
	r := pt.r
	for attempt := 1; ; attempt++ {
		select {
		case <-pt.stop:
			return false
		default:
		}
		select {
		case r.sem <- struct{}{}:
		case <-pt.stop:
			return false
		}
		v := r.p.Process(r.ctx, delivery(rec, attempt))
		<-r.sem
		switch v.Action {
		case postbox.Ack, postbox.DeadLettered:
			pt.settle(rec)
			return true
		}
		// Retry, and any action this version does not know. Kafka has no
		// redelivery: the record stays at the head and the partition waits;
		// then the record is processed again. Fetching goes on meanwhile
		// until PartitionBuffer records wait, then pauses (pausing at once
		// would cost every short retry up to FetchMaxWait after it). A
		// revocation or shutdown cuts the wait short, and the record, not
		// committed, goes to whoever owns the partition next.
		t := time.NewTimer(min(max(v.Delay, 0), r.cfg.MaxRetryHold))
		select {
		case <-t.C:
		case <-pt.stop:
			t.Stop()
			return false
		}
	}
}

// settle records rec, the head, as settled: its offset becomes
// committable.
func (pt *part) settle(rec *kgo.Record) {
	r := pt.r
	r.mu.Lock()
	pt.queue[0] = nil
	pt.queue = pt.queue[1:]
	if len(pt.queue) == 0 {
		pt.queue = nil // let the backing array go
	}
	pt.next, pt.epoch = rec.Offset+1, rec.LeaderEpoch
	r.mu.Unlock()
	r.syncPause(pt)
	select {
	case r.dirty <- struct{}{}:
	default:
	}
}

// committer commits the settled offsets of every partition, at most once
// per CommitInterval, until shutdown.
func (r *run) committer() {
	defer r.commits.Done()
	last := time.Now()
	for {
		select {
		case <-r.dirty:
		case <-r.quit:
			return
		}
		if wait := r.cfg.CommitInterval - time.Since(last); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-r.quit:
				t.Stop()
				return
			}
		}
		last = time.Now()
		r.commitMu.Lock()
		r.mu.Lock()
		parts := make([]*part, 0, len(r.parts))
		for _, pt := range r.parts {
			parts = append(parts, pt)
		}
		r.mu.Unlock()
		err := r.commit(parts)
		r.commitMu.Unlock()
		if err != nil {
			// Try again after CommitInterval.
			select {
			case r.dirty <- struct{}{}:
			default:
			}
		}
	}
}

// commit commits, synchronously, the settled offsets of parts not yet
// committed. The caller holds commitMu.
func (r *run) commit(parts []*part) error {
	type mark struct {
		pt   *part
		next int64
	}
	var marks []mark
	offsets := map[string]map[int32]kgo.EpochOffset{}
	r.mu.Lock()
	for _, pt := range parts {
		if pt.next > pt.committed {
			if offsets[pt.tp.topic] == nil {
				offsets[pt.tp.topic] = map[int32]kgo.EpochOffset{}
			}
			offsets[pt.tp.topic][pt.tp.partition] = kgo.EpochOffset{Epoch: pt.epoch, Offset: pt.next}
			marks = append(marks, mark{pt, pt.next})
		}
	}
	r.mu.Unlock()
	if len(marks) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.CommitTimeout)
	defer cancel()
	var reqErr error
	failed := map[tp]error{}
	r.cl.CommitOffsetsSync(ctx, offsets, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			reqErr = err
			return
		}
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
					failed[tp{t.Topic, p.Partition}] = err
				}
			}
		}
	})
	r.mu.Lock()
	for _, m := range marks {
		if reqErr == nil && failed[m.pt.tp] == nil {
			m.pt.committed = max(m.pt.committed, m.next)
		}
	}
	r.mu.Unlock()
	if reqErr == nil && len(failed) == 0 {
		r.commitFailing = false
		return nil
	}
	err := reqErr
	if err == nil {
		for k, e := range failed {
			err = fmt.Errorf("%s[%d]: %w", k.topic, k.partition, e)
			break
		}
	}
	level := slog.LevelWarn
	if r.commitFailing {
		level = slog.LevelDebug // said once until a commit succeeds
	}
	r.commitFailing = true
	r.log.Log(context.Background(), level, "postboxkafka: offset commit failed; settled records are delivered again if their partition moves before a commit succeeds",
		slog.Int("partitions", len(marks)), slog.Any("error", err))
	return err
}
