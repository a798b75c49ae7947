package postboxnats

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/keyorder"
)

// floorConsumer answers Info with an ack floor, the last delivery and
// MaxDeliver, or err.
type floorConsumer struct {
	jetstream.Consumer
	floor, delivered uint64
	maxDeliver       int
	err              error
}

func (c *floorConsumer) Info(context.Context) (*jetstream.ConsumerInfo, error) {
	if c.err != nil {
		return nil, c.err
	}
	return &jetstream.ConsumerInfo{
		Config:    jetstream.ConsumerConfig{MaxDeliver: c.maxDeliver},
		AckFloor:  jetstream.SequenceInfo{Stream: c.floor},
		Delivered: jetstream.SequenceInfo{Stream: c.delivered},
	}, nil
}

// TestOverdueMarkerLookedUp: a marker whose redelivery is overdue is given
// up only when the consumer's ack floor has passed it, or under MaxDeliver;
// one the server still holds pending waits another whole wait, holding its
// key; when the consumer cannot be read, every marker waits on.
func TestOverdueMarkerLookedUp(t *testing.T) {
	for _, tc := range []struct {
		name     string
		cons     *floorConsumer
		givenUp  bool
		extended bool
	}{
		{"still pending", &floorConsumer{floor: 4}, false, true},
		{"acknowledged elsewhere or deleted", &floorConsumer{floor: 5}, true, false},
		{"under MaxDeliver", &floorConsumer{floor: 4, maxDeliver: 5}, true, false},
		{"consumer unreadable", &floorConsumer{err: errors.New("no responders")}, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &Subscriber{cons: tc.cons, log: slog.New(slog.NewTextHandler(io.Discard, nil)), name: "s > c"}
			r := &run{s: s, ctx: context.Background()}
			k := newKeyOrder(r, 8, time.Second, time.Second)
			now := time.Now()
			m := &entry{}
			k.keys.Add("k", keyorder.Pos{Hi: 5}, m)
			k.toMarker(m, now, time.Second, retryMarker)
			behind := &entry{}
			k.keys.Add("k", keyorder.Pos{Hi: 6}, behind)

			late := m.Due().Add(k.giveUp).Add(time.Millisecond)
			overdue := k.keys.Overdue(late)
			if len(overdue) != 1 {
				t.Fatalf("%d overdue markers, want 1", len(overdue))
			}
			k.overdue(late, overdue)
			if got := !k.keys.IsMarker(m); got != tc.givenUp {
				t.Fatalf("given up: %v, want %v", got, tc.givenUp)
			}
			if tc.extended && len(k.keys.Overdue(late.Add(time.Second))) != 0 {
				t.Fatal("a marker kept was not given another wait")
			}
			if _, ok := k.keys.Next("k"); ok != tc.givenUp {
				t.Fatalf("the key's next message may start: %v, want %v", ok, tc.givenUp)
			}
		})
	}
}

// keyedStream serves GetMsg: every message on subject "t" with the key
// keys gives its sequence, or err.
type keyedStream struct {
	jetstream.Stream
	keys map[uint64]string
	err  error
}

func (s *keyedStream) GetMsg(_ context.Context, seq uint64, _ ...jetstream.GetMsgOpt) (*jetstream.RawStreamMsg, error) {
	if s.err != nil {
		return nil, s.err
	}
	key, ok := s.keys[seq]
	if !ok {
		return nil, jetstream.ErrMsgNotFound
	}
	return &jetstream.RawStreamMsg{Subject: "t", Sequence: seq, Header: nats.Header{postbox.HeaderPartitionKey: []string{key}}}, nil
}

// TestLostGapUnreadHoldsEveryKey: when lost deliveries' keys cannot be read
// from the stream (or their range's end from the consumer), no key starts
// a message until a later read finds them, or until a retried message's
// whole wait has passed.
func TestLostGapUnreadHoldsEveryKey(t *testing.T) {
	ctx := context.Background()
	down := errors.New("no responders")
	setup := func(cons *floorConsumer, st *keyedStream) *keyOrder {
		s := &Subscriber{cons: cons, cfg: &SubscriberConfig{Stream: st}, log: slog.New(slog.NewTextHandler(io.Discard, nil)), name: "s > c"}
		r := &run{s: s, ctx: ctx}
		k := newKeyOrder(r, 8, time.Second, time.Second)
		r.keys = k
		// A later message of another key, arrived after the gap.
		k.keys.Add("b", keyorder.Pos{Hi: 10}, &entry{})
		return k
	}
	starts := func(k *keyOrder, key string) bool {
		k.mu.Lock()
		defer k.mu.Unlock()
		if e := k.next(key); e != nil {
			k.keys.Remove(e)
			k.keys.Add(key, e.Pos(), e) // held again, for the next look
			return true
		}
		return false
	}

	// The stream, or the consumer for the range's end, cannot answer at
	// first; once it can, key a waits for its lost message 5 and key b
	// starts.
	for _, tc := range []struct {
		name     string
		end      uint64 // lost's end: 0 asks the consumer
		wantEnd  uint64
		cons     *floorConsumer
		st       *keyedStream
		answered func(*floorConsumer, *keyedStream)
	}{
		{"stream read later", 6, 6, &floorConsumer{}, &keyedStream{keys: map[uint64]string{5: "a"}, err: down},
			func(_ *floorConsumer, st *keyedStream) { st.err = nil }},
		{"end asked later", 0, 0, &floorConsumer{err: down, delivered: 5}, &keyedStream{keys: map[uint64]string{5: "a"}},
			func(c *floorConsumer, _ *keyedStream) { c.err = nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := setup(tc.cons, tc.st)
			if end := k.lost(ctx, 1, 4, tc.end); end != tc.wantEnd {
				t.Fatalf("end %d, want %d", end, tc.wantEnd)
			}
			if starts(k, "b") {
				t.Fatal("a key started while the lost deliveries' keys were unknown")
			}
			tc.answered(tc.cons, tc.st)
			k.readGaps(time.Now())
			if len(k.gaps) != 0 {
				t.Fatalf("%d gaps left after a read that worked", len(k.gaps))
			}
			if first, ok := k.keys.First("a"); !ok || first.State() != keyorder.Marker || first.Pos().Hi != 5 {
				t.Fatalf("key a: %v %v, want a marker for the lost message 5", first, ok)
			}
			if !starts(k, "b") {
				t.Fatal("the other key still waits once the gap was read")
			}
		})
	}
	t.Run("given up", func(t *testing.T) {
		k := setup(&floorConsumer{}, &keyedStream{err: down})
		k.lost(ctx, 1, 4, 6)
		k.readGaps(time.Now().Add(k.giveUp + time.Second))
		if len(k.gaps) != 0 || !starts(k, "b") {
			t.Fatalf("%d gaps left after a whole wait; the keys must go on", len(k.gaps))
		}
	})
}

// keptAliveMsg is a delivery whose InProgress waits for proceed after
// saying so on sending, and which records what was sent for it.
type keptAliveMsg struct {
	jetstream.Msg
	sending, proceed chan struct{}
	mu               sync.Mutex
	sent             []string
}

func (m *keptAliveMsg) record(s string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.sent = append(m.sent, s)
}

func (m *keptAliveMsg) InProgress() error {
	m.sending <- struct{}{}
	<-m.proceed
	m.record("in progress")
	return nil
}

func (m *keptAliveMsg) NakWithDelay(time.Duration) error {
	m.record("nak with delay")
	return nil
}

// retryAfter is a Processor that asks for every delivery's retry after it.
type retryAfter time.Duration

func (d retryAfter) Process(context.Context, *postbox.Delivery) postbox.Verdict {
	return postbox.Verdict{Action: postbox.Retry, Delay: time.Duration(d)}
}

// TestHeldMessageNotStartedWhileKeptAlive: a held message does not start
// while its keep-alive is being sent. Started, a run that asks for a retry
// naks it with a delay; an InProgress the server took after that nak
// would restart the message's AckWait, and it would come back AckWait
// later (30 s by default) instead of after the delay, its key held
// meanwhile.
func TestHeldMessageNotStartedWhileKeptAlive(t *testing.T) {
	s := &Subscriber{cons: &floorConsumer{}, log: slog.New(slog.NewTextHandler(io.Discard, nil)), name: "s > c"}
	r := &run{s: s, ctx: context.Background(), p: retryAfter(10 * time.Millisecond), sem: make(chan struct{}, 1)}
	r.sem <- struct{}{} // the held message's token
	k := newKeyOrder(r, 8, time.Second, time.Second)
	r.keys = k
	m := &keptAliveMsg{sending: make(chan struct{}), proceed: make(chan struct{})}
	now := time.Now()
	k.keys.Add("k", keyorder.Pos{Hi: 1}, &entry{msg: m, d: &postbox.Delivery{ID: "1", Key: "k"}, touched: now.Add(-k.touchEvery)})

	swept := make(chan struct{})
	go func() {
		defer close(swept)
		k.sweep(now, false)
	}()
	<-m.sending
	// What a settled run or an arrival of the key does meanwhile.
	k.mu.Lock()
	started := k.next("k")
	k.mu.Unlock()
	if started != nil {
		k.start(started)
	}
	close(m.proceed)
	<-swept
	r.wg.Wait()
	if started != nil {
		t.Error("the held message started while its keep-alive was being sent")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if want := []string{"in progress", "nak with delay"}; fmt.Sprint(m.sent) != fmt.Sprint(want) {
		t.Fatalf("sent %q, want %q: the sweep starts the message once its keep-alive is sent", m.sent, want)
	}
}

// nakMsg records the delay it is nak'd with.
type nakMsg struct {
	jetstream.Msg
	delay time.Duration
}

func (m *nakMsg) NakWithDelay(d time.Duration) error {
	m.delay = d
	return nil
}

// TestHandedBackInTurn: a message handed back for lack of room is nak'd
// with a delay that brings it back when its turn comes: after a retried
// message ahead of it in its key's line is sent again, and a run's time
// for each delivery ahead. A flat delay brought a deep line back whole
// every time, ten deliveries a second a message. A lost delivery's marker
// ahead, which may come any time, does not push it back, and the pace adds
// at most maxTurn to the retries ahead. The times compared are the
// markers' own, so that how long the test takes does not matter.
func TestHandedBackInTurn(t *testing.T) {
	s := &Subscriber{cons: &floorConsumer{}, log: slog.New(slog.NewTextHandler(io.Discard, nil)), name: "s > c"}
	r := &run{s: s, ctx: context.Background(), p: retryAfter(0), sem: make(chan struct{}, 16)}
	k := newKeyOrder(r, 2, time.Minute, time.Minute) // room to hold one message
	r.keys = k
	now := time.Now()
	retry := now.Add(time.Minute) // when k 2 is sent again
	add := func(key string, seq uint64) *entry {
		r.sem <- struct{}{}
		return k.keys.Add(key, keyorder.Pos{Hi: seq}, &entry{d: &postbox.Delivery{Key: key}})
	}
	// Key k runs 1, and 2 is to be retried in a minute.
	add("k", 1)
	k.keys.Next("k")
	k.toMarker(add("k", 2), now, time.Minute, retryMarker)
	// Key m runs 20, and 21's delivery was lost on the way.
	add("m", 20)
	k.keys.Next("m")
	k.toMarker(add("m", 21), now, time.Minute, lostMarker)
	// Key j runs 10, and 11 and 12 are held: the room is taken.
	add("j", 10)
	k.keys.Next("j")
	add("j", 11)
	add("j", 12)
	if !k.keys.Crowded() {
		t.Fatal("the set-up did not take the room for held messages")
	}
	arrive := func(key string, seq uint64) time.Duration {
		r.sem <- struct{}{}
		m := &nakMsg{}
		k.arrive(key, seq, &entry{msg: m, d: &postbox.Delivery{ID: fmt.Sprint(seq), Key: key}, touched: time.Now()})
		if m.delay == 0 {
			t.Fatalf("%s %d was not handed back", key, seq)
		}
		return m.delay
	}
	back := func(key string, seq uint64) time.Time {
		arrive(key, seq)
		k.mu.Lock()
		defer k.mu.Unlock()
		for e := range k.keys.All() {
			if e.Key() == key && e.Pos().Hi == seq && e.State() == keyorder.Marker {
				return e.notBefore()
			}
		}
		t.Fatalf("%s %d is not a marker", key, seq)
		return time.Time{}
	}
	if at := back("k", 3); !at.Equal(retry.Add(minPace)) {
		t.Errorf("k 3 comes back %v after the retry ahead of it, want a run's time, %v", at.Sub(retry), minPace)
	}
	if at := back("k", 4); !at.Equal(retry.Add(2 * minPace)) {
		t.Errorf("k 4 comes back %v after the retry ahead of it, want two runs' time, %v", at.Sub(retry), 2*minPace)
	}
	if d := arrive("m", 22); d != minBounce {
		t.Errorf("m 22 behind a lost delivery handed back for %v, want %v", d, minBounce)
	}
	// However deep the line and slow the runs, the pace adds at most
	// maxTurn beyond the retry ahead.
	k.mu.Lock()
	k.pace = maxPace
	k.mu.Unlock()
	var at time.Time
	for seq := uint64(5); seq < 10; seq++ {
		if at = back("k", seq); at.After(retry.Add(maxTurn)) {
			t.Errorf("k %d comes back %v after the retry ahead of it, want at most %v", seq, at.Sub(retry), maxTurn)
		}
	}
	if !at.Equal(retry.Add(maxTurn)) {
		t.Errorf("k 9, five runs of a second behind, comes back %v after the retry ahead of it, want %v", at.Sub(retry), maxTurn)
	}
	r.wg.Wait()
}

// TestPaceSteadyAgainstAStalledRun: a run that waited out an unreachable
// server moves the pace by little, so that the turns of the lines behind
// it stay near the runs' usual time; runs slow for good raise it.
func TestPaceSteadyAgainstAStalledRun(t *testing.T) {
	k := newKeyOrder(&run{}, 8, time.Second, time.Second)
	for range 20 {
		k.ran(20 * time.Millisecond)
	}
	usual := k.pace
	k.ran(5 * time.Second)
	if k.pace > 2*usual {
		t.Fatalf("one stalled run of 5 s set the pace from %v to %v", usual, k.pace)
	}
	for range 40 {
		k.ran(300 * time.Millisecond)
	}
	if k.pace < 200*time.Millisecond {
		t.Fatalf("after 40 runs of 300 ms the pace is %v", k.pace)
	}
	for range 100 {
		k.ran(time.Minute)
	}
	if k.pace != maxPace {
		t.Fatalf("runs of a minute set the pace to %v, want at most %v", k.pace, maxPace)
	}
}
