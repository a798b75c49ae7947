package pubkit

import "context"

// Window bounds a Publisher's unsettled publishes: a publish holds a slot
// from before it is sent until the broker settles it, even when its done
// was called earlier because its context ended. Its methods are safe for
// concurrent use.
type Window struct {
	slots chan struct{} // a token per slot held
	// excl is held by an acquire of more than one slot while it collects
	// them, so that single acquires cannot starve it; they pass through
	// it.
	excl    chan struct{}
	settled chan struct{} // a token after every release, for Drain
	closing <-chan struct{}
	closed  error
}

// NewWindow returns a window of size slots. An Acquire waiting for room
// gives up with closed once closing is closed.
func NewWindow(size int, closing <-chan struct{}, closed error) *Window {
	return &Window{
		slots:   make(chan struct{}, size),
		excl:    make(chan struct{}, 1),
		settled: make(chan struct{}, 1),
		closing: closing,
		closed:  closed,
	}
}

// Size returns the number of slots.
func (w *Window) Size() int { return cap(w.slots) }

// Pending returns the number of slots held.
func (w *Window) Pending() int { return len(w.slots) }

// Acquire takes weight slots (1 to Size), waiting while the window is
// full. It returns ctx.Err() if ctx ends first, or the closed error if
// closing is closed first, holding no slot then; a free slot is taken
// even when ctx has ended or closing is closed, as a send that is ready
// wins over the rest.
func (w *Window) Acquire(ctx context.Context, weight int) error {
	// Pass through excl, or hold it while collecting several slots.
	if err := w.send(ctx, w.excl); err != nil {
		return err
	}
	if weight == 1 {
		<-w.excl
	}
	for n := range weight {
		if err := w.send(ctx, w.slots); err != nil {
			w.Release(n)
			if weight > 1 {
				<-w.excl
			}
			return err
		}
	}
	if weight > 1 {
		<-w.excl
	}
	return nil
}

// send puts a token on ch, at once if there is room, else waiting until
// ctx ends or closing is closed.
func (w *Window) send(ctx context.Context, ch chan<- struct{}) error {
	select {
	case ch <- struct{}{}:
		return nil
	default:
	}
	select {
	case ch <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-w.closing:
		return w.closed
	}
}

// Release frees n slots.
func (w *Window) Release(n int) {
	for range n {
		<-w.slots
	}
	if n > 0 {
		select {
		case w.settled <- struct{}{}:
		default:
		}
	}
}

// Drain waits until no slot is held, or until ctx ends, returning
// ctx.Err() then. Slots acquired meanwhile are waited for too.
func (w *Window) Drain(ctx context.Context) error {
	// A release between the check and the select leaves a token in
	// settled, so the select does not miss it.
	for w.Pending() > 0 {
		select {
		case <-w.settled:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}
