package postboxredis

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/keyorder"
)

// The entries a Run holds.
//
// An entry read or claimed by a Run stays pending, in the group's
// pending list under the Run's consumer, until it is acknowledged. While
// the Run holds it (processing it, waiting out a Retry's delay, or, with
// PerKey, queued behind an earlier entry of its key) the Run keeps its
// idle time low (touch), so that no other subscriber of the group claims
// it. Redis has no delayed redelivery: the Run keeps the entry, with its
// fields, in memory and delivers it again itself when the delay is over,
// raising its delivery count in the group as a redelivery would.
//
// Per-key order (PerKey): each key has a queue of its entries by stream
// id, and only one entry of a key is active (being processed, or waiting
// for its retry) at a time; the next starts once the active one is
// settled. New entries of a key arrive in stream order, which for a
// relay's messages is their write order (the relay publishes a key's
// next message only after the previous one was acknowledged). An entry
// claimed from a dead subscriber is older than the entries of its key
// read since; it runs next, after the active one.
//
// Entries queued behind their key hold places of the MaxInFlight window,
// so a key whose head waits out a long retry could fill the window and
// stop the Run from reading anything else. So at most half the window
// holds queued entries; past that, a queued entry becomes a marker: its
// fields are dropped from memory and its place is freed, but it stays
// pending under the Run's consumer and is touched like the others, so it
// keeps its place in its key's queue and no other subscriber takes it.
// When a marker's turn comes it is fetched back (XCLAIM, its delivery
// count left as it is) on the place the entry before it frees. Markers
// are bounded too (64 per place); past that, queued entries keep their
// places and reading waits.

// entryState is what the Run does with an entry. A keyed entry's place
// in its key's line (queued with its fields, a marker, or its key's
// active entry) is the keyorder.Entry's.
type entryState int

const (
	idle     entryState = iota // waiting behind its key, or taken as ctx ended
	fetching                   // PerKey: a marker being fetched back
	running                    // handed to the processor
	waiting                    // waiting out a Retry's delay
)

// markersPerPlace bounds the markers a Run keeps per place of its
// MaxInFlight window.
const markersPerPlace = 64

// entry is one pending entry the Run holds.
type entry struct {
	keyorder.Entry        // PerKey, for an entry with a key: its place in the key's line
	id             string // the stream entry id
	d              *postbox.Delivery
	state          entryState
	hasToken       bool        // holds a place of the MaxInFlight window
	touched        time.Time   // last time its idle time was reset
	due            time.Time   // waiting: when the retry is due
	timer          *time.Timer // waiting, or fetching again: the timer
	lost           bool        // another subscriber claimed it while it ran
}

// entryPos is an entry id's place in the stream.
func entryPos(id string) keyorder.Pos {
	a, b, _ := strings.Cut(id, "-")
	ms, _ := strconv.ParseUint(a, 10, 64)
	seq, _ := strconv.ParseUint(b, 10, 64)
	return keyorder.Pos{Hi: ms, Lo: seq}
}

// admit takes in an entry read or claimed, which holds a token: it keeps
// the token while the Run holds the entry's fields, and gives it back
// otherwise.
func (r *run) admit(id string, fields map[string]string, delivered int) {
	d := r.s.delivery(id, fields, delivered)
	if d.ID == "" {
		r.s.log.Error("postboxredis subscriber: entry without an id field or ce-id header acknowledged; it cannot pass through an inbox",
			slog.String("stream", r.s.cfg.Stream), slog.String("group", r.s.cfg.Group), slog.String("entry_id", id))
		if err := r.ack(id); err != nil {
			r.s.log.Warn("postboxredis subscriber: ack failed", slog.String("entry_id", id), slog.Any("error", err))
		}
		r.release(1)
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if x := r.held[id]; x != nil {
		if x.State() == keyorder.Marker {
			// A marker claimed back (touches failed for a while): it has
			// its fields again.
			if x.hasToken {
				r.release(1)
			}
			x.d, x.hasToken, x.touched = d, true, time.Now()
			r.keys.Fill(x)
			r.next(x.Key())
			return
		}
		// Claimed back while this Run holds it: it goes on with the copy
		// it has.
		r.release(1)
		return
	}
	e := &entry{id: id, d: d, hasToken: true, touched: time.Now()}
	r.held[id] = e
	if !r.s.cfg.PerKey || d.Key == "" {
		if r.ctx.Err() != nil {
			return // taken as ctx ended: handed back by shutdown
		}
		r.start(e)
		return
	}
	// A keyed entry joins its key's line even when ctx has ended (next
	// then starts nothing), so that shutdown hands it back behind the
	// key's head.
	r.keys.Add(d.Key, entryPos(id), e)
	r.next(d.Key)
	if e.State() == keyorder.Held && r.keys.Crowded() {
		e.d, e.hasToken = nil, false
		r.keys.ToMarker(e, time.Now(), 0, 0)
		r.release(1)
	}
}

// next makes the oldest entry of key active when none of its key is: it
// starts a queued entry, and fetches a marker back on a free place (the
// one the entry before it left, see forget). r.mu is held.
func (r *run) next(key string) {
	if r.ctx.Err() != nil {
		return
	}
	e, ok := r.keys.Head(key)
	if !ok {
		return
	}
	if e.State() == keyorder.Marker {
		if !e.hasToken {
			select {
			case r.sem <- struct{}{}:
				e.hasToken = true
			default:
				return // the maintenance tick tries again
			}
		}
		r.keys.Activate(e)
		e.state = fetching
		r.work.Add(1)
		go func() {
			defer r.work.Done()
			r.fetch(e)
		}()
		return
	}
	r.keys.Activate(e)
	r.start(e)
}

// start processes e on a goroutine of its own; r.mu is held.
func (r *run) start(e *entry) {
	e.state = running
	r.work.Add(1)
	go func() {
		defer r.work.Done()
		r.process(e)
	}()
}

// settled removes an entry that was acknowledged (or lost to another
// subscriber) and starts the next entry of its key.
func (r *run) settled(e *entry) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.forget(e)
}

// forget removes e and gives back its token, unless the next entry of its
// key is a marker, which takes it over; r.mu is held.
func (r *run) forget(e *entry) {
	if r.held[e.id] != e {
		return
	}
	delete(r.held, e.id)
	if e.timer != nil && e.timer.Stop() {
		r.work.Done()
	}
	e.timer = nil
	key := e.Key()
	active, _ := r.keys.Active(key)
	r.keys.Remove(e)
	if e.hasToken {
		if h, ok := r.keys.Head(key); active == e && ok && h.State() == keyorder.Marker && !h.hasToken {
			h.hasToken = true
		} else {
			r.release(1)
		}
	}
	r.next(key)
}

// fetch takes a marker's fields back and processes it.
func (r *run) fetch(e *entry) {
	if r.ctx.Err() != nil {
		return // handed back by shutdown
	}
	ctx, cancel := context.WithTimeout(r.ctx, ackTimeout)
	res, err := fetchScript.Run(ctx, r.s.client, []string{r.s.cfg.Stream}, r.s.cfg.Group, r.consumer, e.id).Slice()
	cancel()
	if errors.Is(err, redis.Nil) {
		r.drop(e) // claimed by another subscriber, or deleted
		return
	}
	if err == nil && len(res) != 2 {
		err = errors.New("unexpected fetch reply")
	}
	if err != nil {
		r.s.log.Debug("postboxredis subscriber: could not fetch a queued entry back; trying again",
			slog.String("stream", r.s.cfg.Stream), slog.String("entry_id", e.id), slog.Any("error", err))
		r.again(e, redeliverRetry, r.fetch)
		return
	}
	count, _ := res[0].(int64)
	flat, _ := res[1].([]any)
	d := r.s.delivery(e.id, flatFields(flat), int(count))
	r.mu.Lock()
	e.d, e.state, e.touched = d, running, time.Now()
	r.mu.Unlock()
	r.process(e)
}

// flatFields reads a script's list of fields and values.
func flatFields(flat []any) map[string]string {
	fields := make(map[string]string, len(flat)/2)
	for i := 0; i+1 < len(flat); i += 2 {
		k, _ := flat[i].(string)
		v, _ := flat[i+1].(string)
		fields[k] = v
	}
	return fields
}

// hold keeps e for a Retry's delay; later entries of its key wait.
func (r *run) hold(e *entry, delay time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e.lost {
		r.forget(e)
		return
	}
	e.state = waiting
	e.due = time.Now().Add(delay)
	r.arm(e, delay, r.redeliver)
}

// again arms e's timer to run fn after a failed call to Redis.
func (r *run) again(e *entry, after time.Duration, fn func(*entry)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.arm(e, after, fn)
}

// arm sets e's timer; r.mu is held. Once ctx has ended nothing is armed:
// shutdown hands the entry back.
func (r *run) arm(e *entry, after time.Duration, fn func(*entry)) {
	e.timer = nil
	if r.ctx.Err() != nil || r.held[e.id] != e {
		return
	}
	r.work.Add(1)
	e.timer = time.AfterFunc(after, func() {
		defer r.work.Done()
		fn(e)
	})
}

// redeliver delivers a held entry again once its Retry's delay is over.
func (r *run) redeliver(e *entry) {
	if r.ctx.Err() != nil {
		return // handed back by shutdown
	}
	ctx, cancel := context.WithTimeout(r.ctx, ackTimeout)
	n, err := redeliverScript.Run(ctx, r.s.client, []string{r.s.cfg.Stream}, r.s.cfg.Group, r.consumer, e.id).Int64()
	cancel()
	if err != nil {
		r.s.log.Debug("postboxredis subscriber: could not count a redelivery; trying again",
			slog.String("stream", r.s.cfg.Stream), slog.String("entry_id", e.id), slog.Any("error", err))
		r.again(e, redeliverRetry, r.redeliver)
		return
	}
	if n < 0 {
		r.drop(e) // claimed by another subscriber, or settled: not ours to deliver
		return
	}
	r.mu.Lock()
	d := *e.d
	d.Delivered = int(n)
	d.Headers = make(map[string]string, len(e.d.Headers))
	for k, v := range e.d.Headers {
		d.Headers[k] = v
	}
	e.d, e.state = &d, running
	r.mu.Unlock()
	r.process(e)
}

// drop forgets an entry the Run no longer owns.
func (r *run) drop(e *entry) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.forget(e)
}

// touch resets the idle time of the entries held for touchEvery or
// longer, so that no other subscriber claims them, and forgets those that
// another subscriber claimed meanwhile (a running one is left to finish;
// its copy elsewhere is absorbed by the inbox). It also fetches markers
// that reached the head of their key's queue while no place was free.
func (r *run) touch(touchEvery time.Duration) {
	now := time.Now()
	var ids []string
	r.mu.Lock()
	for id, e := range r.held {
		if now.Sub(e.touched) >= touchEvery {
			ids = append(ids, id)
		}
	}
	for key := range r.keys.Keys() {
		r.next(key)
	}
	r.mu.Unlock()
	for len(ids) > 0 && r.ctx.Err() == nil {
		batch := ids[:min(len(ids), touchBatch)]
		ids = ids[len(batch):]
		args := make([]any, 0, 2+2*len(batch))
		args = append(args, r.s.cfg.Group, r.consumer)
		for _, id := range batch {
			args = append(args, id, 0)
		}
		ctx, cancel := context.WithTimeout(r.ctx, touchEvery)
		lost, err := touchScript.Run(ctx, r.s.client, []string{r.s.cfg.Stream}, args...).StringSlice()
		cancel()
		if err != nil {
			if r.ctx.Err() == nil {
				r.s.log.Warn("postboxredis subscriber: could not keep held entries from being claimed; another subscriber may claim them after MinIdle",
					slog.String("stream", r.s.cfg.Stream), slog.String("group", r.s.cfg.Group), slog.Int("entries", len(batch)), slog.Any("error", err))
			}
			return
		}
		gone := make(map[string]bool, len(lost))
		for _, id := range lost {
			gone[id] = true
		}
		r.mu.Lock()
		for _, id := range batch {
			e := r.held[id]
			switch {
			case e == nil:
			case !gone[id]:
				e.touched = now
			case e.state == running || e.state == fetching:
				e.lost = true
			default:
				r.s.log.Info("postboxredis subscriber: a held entry was claimed by another subscriber; dropping it here",
					slog.String("stream", r.s.cfg.Stream), slog.String("entry_id", id))
				r.forget(e)
			}
		}
		r.mu.Unlock()
	}
}

// handBack hands every entry the Run still holds back to the group, once
// nothing runs: each is given the idle time that makes it claimable by
// the group's next claim pass (MinIdle), or, for a Retry, claimable when
// its delay is over (at once when the delay is longer than MinIdle). The
// entries queued behind a retried entry of their key become claimable
// with it, not before: a claim pass takes entries in stream order, so
// the subscriber that takes them over gets the key's head first.
func (r *run) handBack() {
	now := time.Now()
	minIdle := r.s.cfg.MinIdle
	idleOf := func(e *entry) time.Duration {
		if e.state == waiting {
			return max(0, minIdle-e.due.Sub(now))
		}
		return minIdle
	}
	var args []any
	r.mu.Lock()
	for id, e := range r.held {
		idle := idleOf(e)
		if a, ok := r.keys.Active(e.Key()); ok && a != e {
			idle = min(idle, idleOf(a))
		}
		args = append(args, id, idle.Milliseconds())
		if e.hasToken {
			r.release(1)
		}
	}
	clear(r.held)
	r.keys.Clear()
	r.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.ctx), releaseTimeout)
	defer cancel()
	for len(args) > 0 {
		batch := args[:min(len(args), 2*touchBatch)]
		args = args[len(batch):]
		err := touchScript.Run(ctx, r.s.client, []string{r.s.cfg.Stream}, append([]any{r.s.cfg.Group, r.consumer}, batch...)...).Err()
		if err != nil {
			r.s.log.Warn("postboxredis subscriber: could not hand held entries back; they are claimed after MinIdle",
				slog.String("stream", r.s.cfg.Stream), slog.String("group", r.s.cfg.Group), slog.Int("entries", len(batch)/2), slog.Any("error", err))
			return
		}
	}
}
