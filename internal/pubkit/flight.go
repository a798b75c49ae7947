package pubkit

import (
	"context"
	"sync/atomic"
	"time"
)

// Flight is one publish on its way, from its start to its outcome. An
// adapter embeds it in its own record of the publish. Its done is called
// exactly once, whichever path reports first: the broker's answer, the
// end of the publish's context or its timeout, or Close.
type Flight struct {
	done   func(error)
	called atomic.Bool
	stop   func() bool        // unregisters the context watch; nil before a watch
	timer  *time.Timer        // Watch's timeout; nil without one
	cancel context.CancelFunc // ends WatchContext's context; nil without one

	window *Window
	weight int
	held   atomic.Bool // holds weight slots of window

	// The shared watch of the flight's context (Kit.Enter): the Kit
	// whose watches hold it, and its place in its watch's list, guarded
	// by that Kit's wmu.
	kit        *Kit
	cw         *ctxWatch
	prev, next *Flight
}

// Base returns f: a record that embeds Flight is a Record.
func (f *Flight) Base() *Flight { return f }

// Start sets the done to call with the outcome. It is called before the
// flight is shared.
func (f *Flight) Start(done func(error)) { f.done = done }

// Hold records that the flight holds weight slots of w, for Release.
func (f *Flight) Hold(w *Window, weight int) {
	f.window, f.weight = w, weight
	f.held.Store(true)
}

// Watch finishes the flight when ctx ends, or when timeout (if positive)
// passes first, with why(ctx.Err()); ctx.Err() is nil when the timeout
// passed. A nil why, for a watch without a timeout, reports ctx.Err() as
// it is. Watch is called before the flight is shared. It costs a context
// watch and a timer, not a context of its own: WatchContext is for a
// client call that takes one.
func (f *Flight) Watch(ctx context.Context, timeout time.Duration, why func(ctxErr error) error) {
	fire := func() { f.Finish(whyNot(ctx, why)) }
	f.stop = context.AfterFunc(ctx, fire)
	if timeout > 0 {
		f.timer = time.AfterFunc(timeout, fire)
	}
}

// WatchContext is Watch that also returns a context ending with either,
// for a client call that takes one.
func (f *Flight) WatchContext(ctx context.Context, timeout time.Duration, why func(ctxErr error) error) context.Context {
	if timeout <= 0 {
		f.Watch(ctx, 0, why)
		return ctx
	}
	wctx, cancel := context.WithTimeout(ctx, timeout)
	f.cancel = cancel
	f.stop = context.AfterFunc(wctx, func() { f.Finish(whyNot(ctx, why)) })
	return wctx
}

// whyNot is the outcome of a watch of ctx that fired: why(ctx.Err()), or
// ctx.Err() itself without a why.
func whyNot(ctx context.Context, why func(ctxErr error) error) error {
	if why == nil {
		return ctx.Err()
	}
	return why(ctx.Err())
}

// Stop unregisters the watch and frees its timer: the outcome is known.
func (f *Flight) Stop() {
	if f.kit != nil {
		f.kit.unwatch(f)
	}
	if f.stop != nil {
		f.stop()
	}
	if f.timer != nil {
		f.timer.Stop()
	}
	if f.cancel != nil {
		f.cancel()
	}
}

// Release frees the flight's slots, once whoever calls it: the broker
// settled the publish.
func (f *Flight) Release() {
	if f.held.CompareAndSwap(true, false) {
		f.window.Release(f.weight)
	}
}

// Finish calls done with err, unless it was called already.
//
// Paths race to it. Say the context ends while the broker's
// acknowledgement is being read: the context watch calls Finish(ctx.Err())
// and wins the swap; the acknowledgement's Finish(nil) then does nothing.
// The relay takes the message as not published and sends it again later
// under the same id, which the broker's or the consumers' deduplication
// absorbs. In the other order the acknowledgement is reported and the
// context's end is ignored. Either way done runs exactly once.
func (f *Flight) Finish(err error) {
	if f.called.CompareAndSwap(false, true) {
		f.done(err)
	}
}

// Finished reports whether done was called.
func (f *Flight) Finished() bool { return f.called.Load() }

// Settle reports the broker's outcome: it stops the watch and frees the
// slots before calling done, so that Pending no longer counts the publish
// when done runs and a done that publishes again finds room.
func (f *Flight) Settle(err error) {
	f.Stop()
	f.Release()
	f.Finish(err)
}
