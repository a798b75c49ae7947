// Package pubkit holds what the broker adapters' Publishers share: the
// window of unsettled publishes (Window), the record of one publish whose
// done runs exactly once (Flight), the start of a Publish and the
// draining of Close (Kit); the one rule for what counts as a message
// failure (MessageFault); and the helpers the adapters use to fill in and
// check their configs and to keep quoted text printable.
package pubkit

import (
	"context"
	"sync"

	"github.com/postbox-go/postbox"
)

// Kit is the lifecycle a Publisher shares with its publishes: whether it
// is closed, a gate that keeps Close out while a Publish hands a message
// to the client, the goroutines Close waits for, and a context that ends
// at Close. Its methods are safe for concurrent use.
type Kit struct {
	window  *Window // nil for a Publisher without one
	closed  error
	closing chan struct{}
	ctx     context.Context
	cancel  context.CancelFunc

	// gate is read-held by a Publish from its check of closed until the
	// client has the message, and write-held by Close while it marks the
	// Publisher closed: whatever the client cleans up or drains at Close
	// then includes every message a Publish handed over.
	gate sync.RWMutex

	mu   sync.Mutex // guards shut, and wg.Add with it
	shut bool
	wg   sync.WaitGroup

	// wmu guards watches and every watch's list of flights.
	wmu     sync.Mutex
	watches []*ctxWatch
}

// ctxWatch finishes the flights Entered with its context when the
// context ends: the publishes of one relay batch share a context, and
// so one registration with it, where a registration a publish would cost
// each of them allocations and two turns of the context's own lock.
type ctxWatch struct {
	ctx  context.Context
	stop func() bool // unregisters from ctx
	head *Flight     // nil once no flight is left
}

// New returns a Kit whose publishes fail with closed once it is closed,
// with a Window of window slots (none when window is 0).
func New(window int, closed error) *Kit {
	k := &Kit{closed: closed, closing: make(chan struct{})}
	k.ctx, k.cancel = context.WithCancel(context.Background())
	if window > 0 {
		k.window = NewWindow(window, k.closing, closed)
	}
	return k
}

// Window returns the Kit's window; nil when it has none.
func (k *Kit) Window() *Window { return k.window }

// Closing returns a channel closed by Close, which wakes what waits for
// room or for a connection.
func (k *Kit) Closing() <-chan struct{} { return k.closing }

// Context returns a context that ends with Cancel, for the Publisher's
// own calls to the broker (lookups, pipelines, dials).
func (k *Kit) Context() context.Context { return k.ctx }

// Cancel ends Context.
func (k *Kit) Cancel() { k.cancel() }

// Closed reports whether Close was called.
func (k *Kit) Closed() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.shut
}

// Record is an adapter's record of one publish; embedding Flight gives it
// Base.
type Record interface{ Base() *Flight }

// Start is the start every Publish through k shares: it fails the
// publish with ctx.Err() if ctx has ended, encodes env with encode
// (failing it with a permanent failure wrapping encode's error: an
// envelope the adapter cannot encode never will be), and Enters the
// record's Flight. On true the gate is held, as after Enter.
func Start[R Record](k *Kit, ctx context.Context, env *postbox.Envelope, done func(error), encode func(*postbox.Envelope) (R, error)) (r R, ok bool) {
	if err := ctx.Err(); err != nil {
		done(err)
		return r, false
	}
	r, err := encode(env)
	if err != nil {
		done(postbox.Permanent(err))
		return r, false
	}
	return r, k.Enter(ctx, r.Base(), done)
}

// Enter is the start every publish shares, once env
// is encoded into the record that embeds f: it takes a slot of the
// window (if the Kit has one), watches ctx, and checks that the Kit is not closed. On true the
// gate is held: the caller hands the message to the client and then
// calls Leave, and done is called once the outcome is known (Settle, or
// Finish and Release). On false done was called already, with ctx.Err()
// or the closed error.
//
// done is never called with the gate held: a done that publishes again
// would read-lock it a second time, which a waiting Close turns into a
// deadlock.
func (k *Kit) Enter(ctx context.Context, f *Flight, done func(error)) bool {
	f.Start(done)
	if k.window != nil {
		if err := k.window.Acquire(ctx, 1); err != nil {
			done(err)
			return false
		}
		f.Hold(k.window, 1)
	}
	k.watch(ctx, f)
	if !k.Open() {
		f.Settle(k.closed)
		return false
	}
	return true
}

// watch finishes f with ctx.Err() when ctx ends, through the watch k
// shares among the flights of ctx, until f's Stop. A context that never
// ends needs none.
func (k *Kit) watch(ctx context.Context, f *Flight) {
	if ctx.Done() == nil {
		return
	}
	k.wmu.Lock()
	defer k.wmu.Unlock()
	var w *ctxWatch
	// Few contexts have publishes in flight at once: a relay's lanes
	// each publish one batch at a time.
	for _, c := range k.watches {
		if c.ctx == ctx {
			w = c
			break
		}
	}
	if w == nil {
		w = &ctxWatch{ctx: ctx}
		k.watches = append(k.watches, w)
		// For a context that has ended, fire runs at once on a
		// goroutine of its own, which waits for wmu.
		w.stop = context.AfterFunc(ctx, func() { k.fire(w) })
	}
	f.kit, f.cw, f.prev, f.next = k, w, nil, w.head
	if w.head != nil {
		w.head.prev = f
	}
	w.head = f
}

// unwatch takes f out of its watch, which is dropped once it holds no
// flight. Its context may end at the same moment: fire then finds f out
// of the list, or takes it first, and the outcome's Finish and the
// context's race as they do with a watch of their own.
func (k *Kit) unwatch(f *Flight) {
	k.wmu.Lock()
	w := f.cw
	if w == nil {
		k.wmu.Unlock()
		return
	}
	if f.prev != nil {
		f.prev.next = f.next
	} else {
		w.head = f.next
	}
	if f.next != nil {
		f.next.prev = f.prev
	}
	f.cw, f.prev, f.next = nil, nil, nil
	var stop func() bool
	if w.head == nil {
		k.drop(w)
		stop = w.stop
	}
	k.wmu.Unlock()
	if stop != nil {
		stop()
	}
}

// fire finishes every flight of w, whose context ended.
func (k *Kit) fire(w *ctxWatch) {
	k.wmu.Lock()
	k.drop(w)
	var fs []*Flight
	for f := w.head; f != nil; {
		next := f.next
		f.cw, f.prev, f.next = nil, nil, nil
		fs = append(fs, f)
		f = next
	}
	w.head = nil
	k.wmu.Unlock()
	err := w.ctx.Err()
	for _, f := range fs {
		f.Finish(err)
	}
}

// drop removes w from k's watches, if it is still there.
func (k *Kit) drop(w *ctxWatch) {
	for i, c := range k.watches {
		if c == w {
			last := len(k.watches) - 1
			k.watches[i] = k.watches[last]
			k.watches[last] = nil
			k.watches = k.watches[:last]
			return
		}
	}
}

// Open read-locks the gate and reports true unless the Kit is closed;
// then the gate is left at once. After true the caller calls Leave.
func (k *Kit) Open() bool {
	k.gate.RLock()
	if k.Closed() {
		k.gate.RUnlock()
		return false
	}
	return true
}

// Leave ends what Open (or Enter) began.
func (k *Kit) Leave() { k.gate.RUnlock() }

// Go runs fn on a goroutine that Wait waits for, and reports true; once
// the Kit is closed it starts nothing and reports false. Checking closed
// and counting the goroutine under one lock, which Close takes to mark
// the Kit closed, keeps a goroutine from being counted after Close began
// to wait.
func (k *Kit) Go(fn func()) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.shut {
		return false
	}
	k.wg.Add(1)
	go func() {
		defer k.wg.Done()
		fn()
	}()
	return true
}

// Close marks the Kit closed once a Publish inside the gate has left it,
// and wakes every Acquire waiting for room. It reports whether this call
// closed it: false for a second Close.
func (k *Kit) Close() bool {
	k.gate.Lock()
	defer k.gate.Unlock()
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.shut {
		return false
	}
	k.shut = true
	close(k.closing)
	return true
}

// Wait waits for the goroutines Go started, until ctx ends; it returns
// ctx.Err() then, leaving them running.
func (k *Kit) Wait(ctx context.Context) error {
	waited := make(chan struct{})
	go func() {
		k.wg.Wait()
		close(waited)
	}()
	select {
	case <-waited:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
