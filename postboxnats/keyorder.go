package postboxnats

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/keyorder"
)

// Per-key order (SubscriberConfig.PerKey).
//
// JetStream delivers a consumer's new messages in stream order, but a
// message nak'd with a delay comes back when the delay is up, after
// later messages of its key may have been delivered. So the order is kept
// here: each key has a queue of its deliveries by stream sequence, and
// only its head is processed, one at a time. A head that is to be retried
// becomes a marker, without a message, and is then nak'd (in that order:
// the redelivery may come at once); it stays in the queue until its
// redelivery fills it; the later messages of its key wait behind it,
// unacknowledged, in memory.
//
// Held messages take tokens of the MaxInFlight window. If they could take
// every token, the puller could never fetch the redelivery they wait for.
// So at most half the window holds messages; a message that would exceed
// that is handed back to the server and becomes a marker too, which costs
// a delivery of that message and nothing else. The other half is always
// free for the heads, so the puller always gets a token back. The delay
// it is nak'd with is its turn (keyOrder.turn): the deliveries ahead of
// it in its key's line each take a run's time (pace), a retried or handed
// back one not before the server sends it again, and the pace adds at
// most maxTurn beyond the retries ahead. A flat delay would bring
// a deep line back whole every time: after an outage, a backlog of a
// thousand messages went round at ten deliveries a second each, the
// client's buffer for the pull overflowed (lost deliveries, whose keys
// then wait AckWait) and the backlog drained at a key's message per
// round.
//
// A held message's AckWait is kept from running out with InProgress, so
// the server does not redeliver it meanwhile (to this subscriber, or to
// another one of the consumer). A marker whose redelivery does not come
// within its delay plus twice AckWait is looked up on the server: if the
// consumer's ack floor has passed it (another subscriber acknowledged it,
// or it was deleted from the stream), it is given up and its key moves
// on; if not, the server still holds it pending and will deliver it
// again, so the key waits on (under MaxDeliver, which drops a message
// without acknowledging it, the marker is given up all the same). The
// markers are not looked at while the puller is short of tokens: then a
// redelivery may simply not have been fetched yet.

// minBounce is the shortest delay a message handed back for lack of room
// is nak'd with: long enough not to spin, short enough that a key blocked
// by a running delivery moves on soon after.
const minBounce = 100 * time.Millisecond

// minPace and maxPace bound a run's time as the turns reckon it (pace).
// maxTurn bounds what the pace adds to a turn beyond the retries ahead:
// an estimate too long would leave the key idle, one too short costs a
// delivery more.
const (
	minPace = 10 * time.Millisecond
	maxPace = time.Second
	maxTurn = 2 * time.Second
)

// markerKind is how a marker came to be.
type markerKind int

const (
	lostMarker       markerKind = iota // its delivery was lost on the way: it may come any time
	retryMarker                        // its run asked for a retry after a delay
	handedBackMarker                   // handed back for lack of room, nak'd with its turn
)

// entry is one message of a key: held (msg set), being processed (the
// key's active entry), or a marker awaiting its redelivery (msg nil).
type entry struct {
	keyorder.Entry
	msg     jetstream.Msg
	d       *postbox.Delivery
	touched time.Time // last delivery or InProgress of a held message
	// touching: an InProgress of msg is being sent (sweep). The entry
	// does not start until it is sent: sent after the run's delayed nak,
	// it would restart the message's AckWait on the server, and the
	// redelivery would come AckWait later instead of after the delay.
	touching bool
	kind     markerKind // a marker's
}

// notBefore is when the server sends a marker again at the earliest: a
// retried or handed back one when its nak's delay, its due, is up; a lost
// delivery's any time (zero).
func (e *entry) notBefore() time.Time {
	if e.kind == lostMarker {
		return time.Time{}
	}
	return e.Due()
}

// keyOrder schedules the deliveries of one Run that carry a key.
type keyOrder struct {
	r          *run
	giveUp     time.Duration // a marker's wait beyond its delay
	touchEvery time.Duration
	interval   time.Duration

	mu   sync.Mutex
	keys *keyorder.Order[*entry] // by stream sequence
	pace time.Duration           // a run's time, averaged

	asking atomic.Bool // the server is being asked about overdue markers

	// gaps are lost deliveries whose keys are still to be read from the
	// stream (lost.go): while there are any, no key starts a message.
	gaps    []*gap
	reading atomic.Bool // the sweep reads the gaps again
}

// newKeyOrder: ackMin and ackMax are the shortest and longest time the
// server waits for an ack before it redelivers. Held messages are kept
// alive well within the first. A marker is waited for its delay plus
// twice the second: a lost nak makes the redelivery come AckWait after
// the delivery, and a server restarted meanwhile starts that wait again
// when it is back. A failed ack (acks wait for the server's answer) and a
// nak or keep-alive the client refuses say the server is, or was, out of
// reach; each pushes the markers' ends out to a whole wait from then
// (disrupted). Naks and keep-alives are not confirmed, so while the
// client reconnects they are buffered and fail only once it gives up.
func newKeyOrder(r *run, maxInFlight int, ackMin, ackMax time.Duration) *keyOrder {
	return &keyOrder{
		r:          r,
		giveUp:     2*ackMax + time.Second,
		touchEvery: ackMin / 3,
		interval:   min(max(ackMin/4, 10*time.Millisecond), time.Second),
		keys:       keyorder.New[*entry](maxInFlight, 0),
		pace:       minPace,
	}
}

// arrive takes in a delivery of key at stream sequence seq, which holds a
// token.
func (k *keyOrder) arrive(key string, seq uint64, e *entry) {
	now := time.Now()
	in := e.msg // the delivery just taken in, whichever entry files it
	var start, bounce *entry
	var bounceDelay time.Duration
	release := false

	k.mu.Lock()
	added := e
	if x := k.keys.Add(key, keyorder.Pos{Hi: seq}, e); x != e {
		switch x.State() {
		case keyorder.Active:
			// A copy of the delivery being processed, sent because the
			// run outlived AckWait. Its outcome settles the message by
			// stream sequence, whichever delivery it came with.
			added, release = nil, true
		case keyorder.Marker:
			// The redelivery a marker waited for.
			x.msg, x.d, x.touched = e.msg, e.d, now
			k.keys.Fill(x)
			added = x
		default:
			// A held message the server sent again: keep the newer
			// delivery, drop the older one's token.
			x.msg, x.d, x.touched = e.msg, e.d, now
			added, release = nil, true
		}
	}
	start = k.next(key)
	if added != nil && added != start && k.keys.Crowded() {
		bounce, bounceDelay = added, k.turn(added, now)
		k.toMarker(bounce, now, bounceDelay, handedBackMarker)
	}
	k.mu.Unlock()

	if release {
		k.r.release()
	}
	if bounce != nil {
		if err := in.NakWithDelay(bounceDelay); err != nil {
			k.disrupted(time.Now())
			k.r.s.log.Warn("postboxnats subscriber: could not hand a held message back; it comes back after AckWait",
				slog.String("consumer", k.r.s.name), slog.String("key", bounce.Key()), slog.Uint64("stream_seq", bounce.Pos().Hi), slog.Any("error", err))
		}
		k.r.release()
	}
	if start != nil {
		k.start(start)
	}
}

// disrupted pushes every marker's end to at least a whole wait from now:
// the server could not be reached, so a nak may be lost, or the server
// restarted and its redelivery timers begin again.
func (k *keyOrder) disrupted(now time.Time) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.keys.PushOut(now.Add(k.giveUp))
}

// toMarker turns e into a marker of kind expected after delay, which a
// retried or handed back one was nak'd with; k.mu is held.
func (k *keyOrder) toMarker(e *entry, now time.Time, delay time.Duration, kind markerKind) {
	e.msg, e.kind = nil, kind
	k.keys.ToMarker(e, now, delay, k.giveUp)
}

// turn is how long e, to be handed back, waits for its turn: each
// delivery ahead of it in its key's line runs first, for about pace, a
// marker nak'd with a delay not before it comes back; at most maxTurn
// after the last retry ahead comes back, at least minBounce. k.mu is
// held.
func (k *keyOrder) turn(e *entry, now time.Time) time.Duration {
	t, retried := now, now
	for x := range k.keys.Ahead(e) {
		if x.State() == keyorder.Marker {
			t = later(t, x.notBefore())
			if x.kind == retryMarker {
				retried = later(retried, x.notBefore())
			}
		}
		t = t.Add(k.pace)
	}
	return max(minBounce, min(t.Sub(now), retried.Add(maxTurn).Sub(now)))
}

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// ran averages a run's time d into the pace. A run is counted at most
// four times the pace: one that waited out an unreachable server (its ack
// is retried for seconds) would otherwise set every turn of the lines
// behind it that many seconds a delivery ahead, and the keys would idle
// long after the server came back. Runs slow for good raise the pace by
// about a third each. k.mu is held.
func (k *keyOrder) ran(d time.Duration) {
	d = min(d, 4*k.pace)
	k.pace = min(max(k.pace+(d-k.pace)/8, minPace), maxPace)
}

// next starts key's head and returns it, when nothing of the key runs
// and its head is a held message; k.mu is held. Once ctx has ended
// nothing new starts: held messages are abandoned to AckWait; nor while a
// gap of lost deliveries is still to be read (lost.go); nor while the
// head's keep-alive is being sent (sweep starts it after).
func (k *keyOrder) next(key string) *entry {
	if k.r.ctx.Err() != nil || len(k.gaps) > 0 {
		return nil
	}
	if h, ok := k.keys.Head(key); ok && h.touching {
		return nil
	}
	e, _ := k.keys.Next(key)
	return e
}

func (k *keyOrder) start(e *entry) {
	k.r.wg.Add(1)
	go func() {
		defer k.r.wg.Done()
		began := time.Now()
		msg, d := e.msg, e.d
		v := k.r.p.Process(k.r.ctx, d)
		again, delay := redelivered(v)
		if again {
			// e waits for its redelivery before the nak is sent: the
			// server may send it again at once (a delay of 0, or a
			// short one that ends before this goroutine runs again),
			// and a delivery that finds its entry still running is
			// taken for a copy sent after AckWait, and dropped; the
			// key would then wait a whole AckWait for the next one.
			k.mu.Lock()
			k.toMarker(e, time.Now(), delay, retryMarker)
			k.mu.Unlock()
		}
		k.r.settle(msg, d, v)
		k.settled(e, again, time.Since(began))
	}()
}

// settled records the outcome of e's run, settled with the server: done,
// or (again) a marker awaiting its redelivery. It took ran, which the
// pace averages. It starts the key's next message.
func (k *keyOrder) settled(e *entry, again bool, ran time.Duration) {
	k.mu.Lock()
	k.ran(ran)
	if !again {
		k.keys.Remove(e)
	}
	start := k.next(e.Key())
	k.mu.Unlock()
	k.r.release()
	if start != nil {
		k.start(start)
	}
}

// tick keeps held messages alive and gives up markers that waited too
// long, until ctx ends.
func (k *keyOrder) tick(ctx context.Context, wg *sync.WaitGroup, saturated *atomic.Bool) {
	defer wg.Done()
	t := time.NewTicker(k.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			k.sweep(now, saturated.Load())
		}
	}
}

func (k *keyOrder) sweep(now time.Time, saturated bool) {
	// Keep-alives first: one the client refuses says the server is out
	// of reach, which must push the markers out before any is given up.
	var touch []*entry
	var msgs []jetstream.Msg
	k.mu.Lock()
	for e := range k.keys.All() {
		if e.State() == keyorder.Held && now.Sub(e.touched) >= k.touchEvery {
			touch, msgs = append(touch, e), append(msgs, e.msg)
			e.touched, e.touching = now, true
		}
	}
	k.mu.Unlock()
	failed := false
	for _, m := range msgs {
		// A lost one costs a redelivery, which arrive absorbs.
		if m.InProgress() != nil {
			failed = true
		}
	}
	k.mu.Lock()
	for _, e := range touch {
		e.touching = false
	}
	k.mu.Unlock()
	if failed {
		k.disrupted(now)
	}

	// The markers are not given up while the puller is short of tokens:
	// then a redelivery may simply not have been fetched yet.
	var overdue, starts []*entry
	k.mu.Lock()
	if !saturated {
		overdue = k.keys.Overdue(now)
	}
	gaps := len(k.gaps) > 0
	k.mu.Unlock()
	if gaps && k.reading.CompareAndSwap(false, true) {
		k.r.wg.Add(1)
		go func() {
			defer k.r.wg.Done()
			defer k.reading.Store(false)
			k.readGaps(now)
		}()
	}
	if len(overdue) > 0 && k.asking.CompareAndSwap(false, true) {
		// Asked on a goroutine of its own, so that a slow answer holds no
		// keep-alive back; the next sweeps start the keys that moved on.
		k.r.wg.Add(1)
		go func() {
			defer k.r.wg.Done()
			defer k.asking.Store(false)
			k.overdue(now, overdue)
		}()
	}
	k.mu.Lock()
	for key := range k.keys.Keys() {
		if s := k.next(key); s != nil {
			starts = append(starts, s)
		}
	}
	k.mu.Unlock()
	for _, e := range starts {
		k.start(e)
	}
}

// overdue settles the markers whose redelivery did not come in time. The
// server says what became of each: one at or below the consumer's ack
// floor was settled without this Subscriber (acknowledged by another
// subscriber of the consumer, or deleted from the stream, which the
// server counts as acknowledged), so it is given up and its key moves on.
// One above the floor is still pending on the server, which will deliver
// it again: a redelivery comes late after the consumer's leader moved, or
// when the ones before were lost on the way. So its key keeps waiting for
// another whole wait, as per-key order asks; only a consumer with
// MaxDeliver, whose server drops a message at its last delivery without
// acknowledging it, gives such a marker up. When the server cannot be
// asked, every marker waits on (disrupted).
func (k *keyOrder) overdue(now time.Time, markers []*entry) {
	s := k.r.s
	ctx, cancel := context.WithTimeout(k.r.ctx, lostScanTimeout)
	info, err := s.cons.Info(ctx)
	cancel()
	if k.r.ctx.Err() != nil {
		return // the Run ends: held messages and markers are abandoned
	}
	if err != nil {
		k.disrupted(now)
		s.log.Warn("postboxnats subscriber: a retried message was not redelivered in time and the consumer could not be read; its key waits on",
			slog.String("consumer", s.name), slog.Int("markers", len(markers)), slog.Any("error", err))
		return
	}
	floor, capped := info.AckFloor.Stream, info.Config.MaxDeliver > 0
	var gone, waiting []*entry
	k.mu.Lock()
	for _, e := range markers {
		switch {
		case !k.keys.IsMarker(e):
			// Its redelivery came meanwhile.
		case e.Pos().Hi <= floor || capped:
			k.keys.Remove(e)
			gone = append(gone, e)
		default:
			k.keys.Extend(e, now.Add(k.giveUp))
			waiting = append(waiting, e)
		}
	}
	k.mu.Unlock()
	for _, e := range gone {
		msg, hint := "postboxnats subscriber: a retried message was settled without this subscriber; its key moves on", "acknowledged by another subscriber of the consumer, or deleted from the stream"
		if e.Pos().Hi > floor {
			msg, hint = "postboxnats subscriber: a retried message was not redelivered in time; its key moves on, so its order may break", "MaxDeliver reached, or delivered to another subscriber of the consumer"
		}
		s.log.Warn(msg, slog.String("consumer", s.name), slog.String("key", e.Key()), slog.Uint64("stream_seq", e.Pos().Hi), slog.String("hint", hint))
	}
	for _, e := range waiting {
		s.log.Warn("postboxnats subscriber: a retried message is still pending on the server but was not redelivered in time; its key waits on",
			slog.String("consumer", s.name), slog.String("key", e.Key()), slog.Uint64("stream_seq", e.Pos().Hi), slog.Uint64("ack_floor_stream_seq", floor))
	}
}
