package pubkit

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/postbox-go/postbox"
)

var errClosed = errors.New("closed")

func TestAcquire(t *testing.T) {
	closing := make(chan struct{})
	w := NewWindow(1, closing, errClosed)
	if err := w.Acquire(context.Background(), 1); err != nil {
		t.Fatalf("free slot: got %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := w.Acquire(ctx, 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("full window, ended context: got %v, want context.Canceled", err)
	}
	close(closing)
	if err := w.Acquire(context.Background(), 1); !errors.Is(err, errClosed) {
		t.Fatalf("full window, closing: got %v, want the closed error", err)
	}
	w.Release(1)
	if err := w.Acquire(ctx, 1); err != nil {
		t.Fatalf("free slot, ended context and closing: got %v, want the slot taken", err)
	}
}

// TestAcquireWeighted: an acquire of the whole window waits for every
// slot, holds none when it gives up, and is not starved by single
// acquires that come after it.
func TestAcquireWeighted(t *testing.T) {
	w := NewWindow(3, make(chan struct{}), errClosed)
	if err := w.Acquire(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := w.Acquire(ctx, 3); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("whole window while one slot is held: got %v", err)
	}
	if n := w.Pending(); n != 1 {
		t.Fatalf("after a weighted acquire gave up: %d slots held, want 1", n)
	}

	whole := make(chan error, 1)
	go func() { whole <- w.Acquire(context.Background(), 3) }()
	// Wait until the weighted acquire holds excl and the two free slots.
	for w.Pending() != 3 {
		runtime.Gosched()
	}
	single := make(chan error, 1)
	go func() { single <- w.Acquire(context.Background(), 1) }()
	w.Release(1) // the weighted acquire, not the single one, takes it
	if err := <-whole; err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-single:
		t.Fatalf("a single acquire got a slot of a full window: %v", err)
	default:
	}
	w.Release(3)
	if err := <-single; err != nil {
		t.Fatal(err)
	}
	if n := w.Pending(); n != 1 {
		t.Fatalf("%d slots held, want 1", n)
	}
}

func TestDrain(t *testing.T) {
	w := NewWindow(2, make(chan struct{}), errClosed)
	if err := w.Drain(context.Background()); err != nil {
		t.Fatalf("empty window: %v", err)
	}
	_ = w.Acquire(context.Background(), 1)
	_ = w.Acquire(context.Background(), 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if err := w.Drain(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("held slots: got %v, want the context's end", err)
	}
	drained := make(chan error, 1)
	go func() { drained <- w.Drain(context.Background()) }()
	w.Release(1)
	w.Release(1)
	if err := <-drained; err != nil {
		t.Fatal(err)
	}
}

// TestFlightDoneOnce races the broker's answer with the end of the
// publish's context, many times: done must run exactly once, and the
// slot must be freed exactly once, whichever wins.
func TestFlightDoneOnce(t *testing.T) {
	k := New(8, errClosed)
	const rounds = 2000
	calls := make([]atomic.Int32, rounds)
	for i := range rounds {
		ctx, cancel := context.WithCancel(context.Background())
		got := make(chan error, 2)
		f := &Flight{}
		if !k.Enter(ctx, f, func(err error) { calls[i].Add(1); got <- err }) {
			t.Fatal("Enter refused an open Kit")
		}
		k.Leave()
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); cancel() }()
		go func() { defer wg.Done(); f.Settle(nil) }()
		wg.Wait()
		// The winner may be the context's watch, on a goroutine of its
		// own: wait for its done.
		if err := <-got; err != nil && !errors.Is(err, context.Canceled) {
			t.Fatalf("round %d: got %v", i, err)
		}
		if n := k.Window().Pending(); n != 0 {
			t.Fatalf("round %d: %d slots held after the settle", i, n)
		}
	}
	// A second call would come from the loser of a round; by now every
	// watch has run or been stopped long ago.
	for i := range calls {
		if n := calls[i].Load(); n != 1 {
			t.Fatalf("round %d: done called %d times", i, n)
		}
	}
}

// TestEnterSharesWatch: the flights Entered with one context share one
// watch. Its end finishes those still in flight, with the context's
// error, and none settled before; a watch is dropped once its last flight
// settles or its context ends, and a context that ended gets a watch of
// its own that fires at once.
func TestEnterSharesWatch(t *testing.T) {
	k := New(0, errClosed)
	enter := func(ctx context.Context, got chan<- error) *Flight {
		t.Helper()
		f := &Flight{}
		if !k.Enter(ctx, f, func(err error) { got <- err }) {
			t.Fatal("Enter refused an open Kit")
		}
		k.Leave()
		return f
	}
	watches := func() int {
		k.wmu.Lock()
		defer k.wmu.Unlock()
		return len(k.watches)
	}
	a, cancelA := context.WithCancel(context.Background())
	b, cancelB := context.WithCancel(context.Background())
	defer cancelB()
	gotA, gotB := make(chan error, 10), make(chan error, 10)
	var fa, fb []*Flight
	for range 5 {
		fa = append(fa, enter(a, gotA))
		fb = append(fb, enter(b, gotB))
	}
	if n := watches(); n != 2 {
		t.Fatalf("%d watches for two contexts, want 2", n)
	}
	// Settle the first, a middle and the last of a's list.
	for _, i := range []int{0, 2, 4} {
		fa[i].Settle(nil)
		if err := <-gotA; err != nil {
			t.Fatalf("settled flight: got %v", err)
		}
	}
	cancelA()
	for range 2 {
		if err := <-gotA; !errors.Is(err, context.Canceled) {
			t.Fatalf("flight of an ended context: got %v", err)
		}
	}
	for _, f := range fa {
		f.Settle(nil) // the loser's outcome is ignored
	}
	if n := watches(); n != 1 {
		t.Fatalf("%d watches once a's ended, want 1", n)
	}
	for _, f := range fb {
		f.Settle(nil)
	}
	for range fb {
		if err := <-gotB; err != nil {
			t.Fatalf("settled flight of b: got %v", err)
		}
	}
	if n := watches(); n != 0 {
		t.Fatalf("%d watches once every flight settled, want 0", n)
	}
	select {
	case err := <-gotA:
		t.Fatalf("a done called twice: %v", err)
	case err := <-gotB:
		t.Fatalf("b done called twice: %v", err)
	default:
	}
	// A context that ended after Start's check, before the watch.
	f := enter(a, gotA)
	if err := <-gotA; !errors.Is(err, context.Canceled) {
		t.Fatalf("flight of a context already ended: got %v", err)
	}
	f.Settle(nil)
	// Background never ends: no watch.
	f = enter(context.Background(), gotB)
	if n := watches(); n != 0 {
		t.Fatalf("%d watches for context.Background, want 0", n)
	}
	f.Settle(nil)
	<-gotB
}

// TestEnterSharedWatchRace races flights of one context settling with
// the context's end and with flights entering: every done runs exactly
// once, and no watch is left behind.
func TestEnterSharedWatchRace(t *testing.T) {
	k := New(0, errClosed)
	for round := range 200 {
		ctx, cancel := context.WithCancel(context.Background())
		const n = 16
		calls := make([]atomic.Int32, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				f := &Flight{}
				if !k.Enter(ctx, f, func(error) { calls[i].Add(1) }) {
					t.Error("Enter refused an open Kit")
					return
				}
				k.Leave()
				if i%2 == 0 {
					runtime.Gosched()
				}
				f.Settle(nil)
			}()
		}
		wg.Add(1)
		go func() { defer wg.Done(); cancel() }()
		wg.Wait()
		// A watch that fired may still be finishing its flights.
		deadline := time.Now().Add(10 * time.Second)
		for i := range calls {
			for calls[i].Load() == 0 && time.Now().Before(deadline) {
				runtime.Gosched()
			}
		}
		for i := range calls {
			if c := calls[i].Load(); c != 1 {
				t.Fatalf("round %d, flight %d: done called %d times", round, i, c)
			}
		}
		k.wmu.Lock()
		left := len(k.watches)
		k.wmu.Unlock()
		if left != 0 {
			t.Fatalf("round %d: %d watches left", round, left)
		}
	}
}

// TestFlightContextEndKeepsSlot: a publish whose context ended has its
// done called, but holds its slot until the broker settles it.
func TestFlightContextEndKeepsSlot(t *testing.T) {
	k := New(2, errClosed)
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan error, 1)
	f := &Flight{}
	if !k.Enter(ctx, f, func(err error) { got <- err }) {
		t.Fatal("Enter refused an open Kit")
	}
	k.Leave()
	if n := k.Window().Pending(); n != 1 {
		t.Fatalf("Pending = %d after Enter, want 1", n)
	}
	cancel()
	if err := <-got; !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
	if n := k.Window().Pending(); n != 1 {
		t.Fatalf("Pending = %d once the context ended, want 1: the broker has not settled it", n)
	}
	f.Settle(nil)
	f.Release() // a second release frees nothing
	if n := k.Window().Pending(); n != 0 {
		t.Fatalf("Pending = %d after the settle, want 0", n)
	}
}

// TestFlightTimeout: a watch with a timeout reports why's error, with a
// nil context error; WatchContext also ends the context it returns. The
// end of the context, before the timeout, reports the context's error.
func TestFlightTimeout(t *testing.T) {
	why := func(ctxErr error) error {
		if ctxErr != nil {
			return ctxErr
		}
		return errors.New("timed out")
	}
	watch := map[string]func(*Flight, context.Context, time.Duration) context.Context{
		"Watch": func(f *Flight, ctx context.Context, d time.Duration) context.Context {
			f.Watch(ctx, d, why)
			return nil
		},
		"WatchContext": func(f *Flight, ctx context.Context, d time.Duration) context.Context {
			return f.WatchContext(ctx, d, why)
		},
	}
	for name, watch := range watch {
		t.Run(name, func(t *testing.T) {
			got := make(chan error, 1)
			f := &Flight{}
			f.Start(func(err error) { got <- err })
			wctx := watch(f, context.Background(), time.Millisecond)
			if err := <-got; err == nil || err.Error() != "timed out" {
				t.Fatalf("got %v, want the timeout's error", err)
			}
			if wctx != nil {
				<-wctx.Done()
			}
			f.Stop()
			if !f.Finished() {
				t.Fatal("Finished = false after done ran")
			}

			ctx, cancel := context.WithCancel(context.Background())
			f = &Flight{}
			f.Start(func(err error) { got <- err })
			watch(f, ctx, time.Hour)
			cancel()
			if err := <-got; !errors.Is(err, context.Canceled) {
				t.Fatalf("got %v, want context.Canceled", err)
			}
			f.Stop()
		})
	}
}

var errTimeout = errors.New("timed out")

// TestFlightTimeoutRace races the timeout with the broker's answer, many
// times, the answer coming from another goroutine about when the timer
// fires: done runs exactly once, whichever wins. A timer that fired
// before Stop may still be running its Finish after the settle, so the
// calls are counted once every timer is long past.
func TestFlightTimeoutRace(t *testing.T) {
	const rounds = 500
	calls := make([]atomic.Int32, rounds)
	var answers sync.WaitGroup
	for i := range rounds {
		f := &Flight{}
		f.Start(func(error) { calls[i].Add(1) })
		f.Watch(context.Background(), 20*time.Microsecond, func(error) error { return errTimeout })
		answers.Go(func() {
			// Answer between 0 and 40µs in, spinning rather than
			// sleeping, whose granularity is coarser than that.
			for start := time.Now(); time.Since(start) < time.Duration(i%40)*time.Microsecond; {
			}
			f.Settle(nil)
		})
	}
	answers.Wait()
	// Every timeout was 20µs; their callbacks have run well before.
	time.Sleep(200 * time.Millisecond)
	for i := range calls {
		if n := calls[i].Load(); n != 1 {
			t.Fatalf("round %d: done called %d times", i, n)
		}
	}
}

// TestCloseWakesEnter: a Publish waiting for a slot of a full window
// fails with the closed error when Close is called, and one after Close
// fails at once; neither holds a slot.
func TestCloseWakesEnter(t *testing.T) {
	k := New(1, errClosed)
	first := &Flight{}
	if !k.Enter(context.Background(), first, func(error) {}) {
		t.Fatal("Enter refused an open Kit")
	}
	k.Leave()
	waiting := make(chan error, 1)
	go func() {
		f := &Flight{}
		if k.Enter(context.Background(), f, func(err error) { waiting <- err }) {
			k.Leave()
			waiting <- errors.New("entered a full window")
		}
	}()
	if !k.Close() {
		t.Fatal("the first Close reported the Kit closed already")
	}
	if k.Close() {
		t.Fatal("a second Close reported closing the Kit")
	}
	if err := <-waiting; !errors.Is(err, errClosed) {
		t.Fatalf("waiting Publish: got %v, want the closed error", err)
	}
	first.Settle(nil)
	var after error
	if k.Enter(context.Background(), &Flight{}, func(err error) { after = err }) {
		t.Fatal("Enter let a publish in after Close")
	}
	if !errors.Is(after, errClosed) {
		t.Fatalf("Publish after Close: got %v, want the closed error", after)
	}
	if n := k.Window().Pending(); n != 0 {
		t.Fatalf("Pending = %d, want 0", n)
	}
}

// TestCloseWaitsForGate: Close does not return while a Publish is inside
// the gate, so that whatever Close cleans up includes its message.
func TestCloseWaitsForGate(t *testing.T) {
	k := New(0, errClosed)
	if !k.Open() {
		t.Fatal("Open refused an open Kit")
	}
	closed := make(chan struct{})
	go func() {
		k.Close()
		close(closed)
	}()
	select {
	case <-closed:
		t.Fatal("Close returned while a Publish was inside the gate")
	case <-time.After(20 * time.Millisecond):
	}
	k.Leave()
	<-closed
	if k.Open() {
		t.Fatal("Open let a publish in after Close")
	}
}

// TestGoAndWait: Close waits for the goroutines Go started until its
// context ends, and Go starts none once the Kit is closed.
func TestGoAndWait(t *testing.T) {
	k := New(0, errClosed)
	release := make(chan struct{})
	if !k.Go(func() { <-release }) {
		t.Fatal("Go refused an open Kit")
	}
	k.Close()
	if k.Go(func() {}) {
		t.Fatal("Go started a goroutine after Close")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if err := k.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("goroutine still running: got %v, want the context's end", err)
	}
	close(release)
	if err := k.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	k.Cancel()
	if k.Context().Err() == nil {
		t.Fatal("Context did not end with Cancel")
	}
}

func TestMessageFault(t *testing.T) {
	errMine := errors.New("the message's fault")
	cases := []struct {
		err            error
		message, known bool
	}{
		{postbox.NewMessageError(errors.New("x")), true, true},
		{fmt.Errorf("wrapped: %w", postbox.NewMessageError(context.Canceled)), true, true},
		{context.Canceled, false, true},
		{fmt.Errorf("wrapped: %w", context.DeadlineExceeded), false, true},
		{fmt.Errorf("%w: %w", errMine, context.Canceled), false, true},
		{fmt.Errorf("wrapped: %w", errMine), true, true},
		{errors.New("unknown"), false, false},
	}
	for _, c := range cases {
		message, known := MessageFault(c.err, errMine)
		if message != c.message || known != c.known {
			t.Errorf("MessageFault(%v) = %t, %t; want %t, %t", c.err, message, known, c.message, c.known)
		}
	}
}

type testRecord struct {
	Flight
	id string
}

// TestStart: an ended context fails the publish as it is, an envelope
// that cannot be encoded fails as a message failure, and one that can
// enters the gate holding a slot.
func TestStart(t *testing.T) {
	k := New(1, errClosed)
	encode := func(env *postbox.Envelope) (*testRecord, error) {
		if env.ID == "" {
			return nil, errors.New("no id")
		}
		return &testRecord{id: env.ID}, nil
	}
	var got error
	done := func(err error) { got = err }
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, ok := Start(k, ctx, &postbox.Envelope{ID: "a"}, done, encode); ok || !errors.Is(got, context.Canceled) {
		t.Fatalf("ended context: ok, got %v", got)
	}
	if _, ok := Start(k, context.Background(), &postbox.Envelope{}, done, encode); ok || !postbox.IsMessageError(got) {
		t.Fatalf("bad envelope: got %v, want a message failure", got)
	}
	got = nil
	r, ok := Start(k, context.Background(), &postbox.Envelope{ID: "a"}, done, encode)
	if !ok || r.id != "a" || got != nil {
		t.Fatalf("good envelope: ok %t, record %+v, done %v", ok, r, got)
	}
	k.Leave()
	if n := k.Window().Pending(); n != 1 {
		t.Fatalf("Pending = %d, want 1", n)
	}
	r.Settle(nil)
	if n := k.Window().Pending(); n != 0 {
		t.Fatalf("Pending = %d after the settle, want 0", n)
	}
}

// BenchmarkFlightWatch is a flight's watch of its publish's context and
// timeout, then its settle: what every publish pays.
//
//	go test -run '^$' -bench FlightWatch -benchmem ./internal/pubkit/
func BenchmarkFlightWatch(b *testing.B) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	why := func(error) error { return errTimeout }
	for name, watch := range map[string]func(*Flight){
		"Watch":        func(f *Flight) { f.Watch(ctx, time.Minute, why) },
		"WatchContext": func(f *Flight) { f.WatchContext(ctx, time.Minute, why) },
	} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				f := &Flight{}
				f.Start(func(error) {})
				watch(f)
				f.Settle(nil)
			}
		})
	}
	// Enter's watch, shared by the publishes of one context, with the
	// window of a relay's publisher: its flights settle in the order
	// they entered.
	b.Run("Enter", func(b *testing.B) {
		b.ReportAllocs()
		k := New(256, errClosed)
		ring := make([]*Flight, 0, 128)
		for b.Loop() {
			f := &Flight{}
			k.Enter(ctx, f, func(error) {})
			k.Leave()
			if len(ring) == cap(ring) {
				ring[0].Settle(nil)
				ring = append(ring[:0], ring[1:]...)
			}
			ring = append(ring, f)
		}
		for _, f := range ring {
			f.Settle(nil)
		}
	})
}
