// Package keyorder keeps the deliveries of each key in stream order for a
// subscriber that hands them to the processor one at a time per key,
// holding later ones while an earlier one is being retried.
//
// Each key has a line of its deliveries, by their place in the stream.
// At most one delivery of a key is active (being processed, waiting for
// its retry, being fetched back), and only the line's head can become
// active. The others wait behind it, either held (the subscriber keeps
// the delivery's content in memory, on a place of its window) or as
// markers (the content is not kept: the broker delivers it again, or the
// subscriber fetches it back, when its turn comes).
//
// Held deliveries take places of the subscriber's window. If they could
// take every place, the subscriber could never take in the delivery the
// key waits for, so at most half the window holds them: past that
// (Crowded), a delivery that is not to start is made a marker.
//
// A marker may wait for a delivery that never comes (the broker gave up
// on the message, it was deleted, another subscriber took it): a marker
// can be given a wait, after which Expire gives it up, and PushOut
// extends every wait when the broker could not be reached, since a lost
// nak or a restarted broker delays its redelivery.
//
// An Order is not safe for concurrent use: the subscriber guards it with
// its own lock.
package keyorder

import (
	"iter"
	"sort"
	"time"
)

// Pos is a delivery's place in its stream: Hi, then Lo. A NATS stream
// sequence is Hi alone; a Redis entry id ms-seq is Hi=ms, Lo=seq.
type Pos struct{ Hi, Lo uint64 }

// Before reports whether p comes before o in the stream.
func (p Pos) Before(o Pos) bool { return p.Hi < o.Hi || p.Hi == o.Hi && p.Lo < o.Lo }

// State is where a delivery stands in its key's line.
type State int

const (
	// Held: waiting, its content kept on a place of the window.
	Held State = iota
	// Marker: waiting, its content not kept.
	Marker
	// Active: the one delivery of its key being handled.
	Active
)

// Entry is the part of a subscriber's delivery record that the Order
// keeps. A record embeds it.
type Entry struct {
	key     string
	pos     Pos
	state   State
	due     time.Time // a marker's expected redelivery
	expires time.Time // when waiting for it is given up; zero: never
}

// Base returns e; a record that embeds Entry satisfies Item with it.
func (e *Entry) Base() *Entry { return e }

// Key returns the delivery's key.
func (e *Entry) Key() string { return e.key }

// Pos returns the delivery's place in the stream.
func (e *Entry) Pos() Pos { return e.pos }

// State returns where the delivery stands.
func (e *Entry) State() State { return e.state }

// Due returns when a marker's redelivery is expected.
func (e *Entry) Due() time.Time { return e.due }

// Item is a delivery record that embeds Entry.
type Item interface {
	comparable
	Base() *Entry
}

type line[E Item] struct {
	entries []E // by Pos; the active one keeps its place
	active  E
	busy    bool // active is set
}

// Order holds the lines of a subscriber's keys.
type Order[E Item] struct {
	lines      map[string]*line[E]
	held       int
	markers    int
	maxHeld    int
	maxMarkers int
}

// New returns an Order for a window of window places: at most half of
// them hold deliveries, and at most maxMarkers markers are made by
// Crowded's rule (0: no bound).
func New[E Item](window, maxMarkers int) *Order[E] {
	return &Order[E]{lines: map[string]*line[E]{}, maxHeld: window / 2, maxMarkers: maxMarkers}
}

// Held returns the number of held deliveries.
func (o *Order[E]) Held() int { return o.held }

// Markers returns the number of markers.
func (o *Order[E]) Markers() int { return o.markers }

// Crowded reports whether held deliveries take more than half the window,
// and markers may still be made: then a delivery that does not start
// now is made a marker.
func (o *Order[E]) Crowded() bool {
	return o.held > o.maxHeld && (o.maxMarkers == 0 || o.markers < o.maxMarkers)
}

// Add files x, held, under key at pos and returns it. If the key's line
// has a delivery at pos already, x is not filed and that one is returned
// instead: the caller tells a redelivery it waited for from a copy.
func (o *Order[E]) Add(key string, pos Pos, x E) E {
	l := o.lines[key]
	if l == nil {
		l = &line[E]{}
		o.lines[key] = l
	}
	i := sort.Search(len(l.entries), func(i int) bool { return !l.entries[i].Base().pos.Before(pos) })
	if i < len(l.entries) && l.entries[i].Base().pos == pos {
		return l.entries[i]
	}
	e := x.Base()
	e.key, e.pos, e.state = key, pos, Held
	e.due, e.expires = time.Time{}, time.Time{}
	l.entries = append(l.entries, x)
	copy(l.entries[i+1:], l.entries[i:])
	l.entries[i] = x
	o.held++
	return x
}

// Ahead returns the deliveries before x in its key's line, head first,
// the active one included.
func (o *Order[E]) Ahead(x E) iter.Seq[E] {
	return func(yield func(E) bool) {
		l := o.lines[x.Base().key]
		if l == nil {
			return
		}
		for _, y := range l.entries {
			if y == x || !yield(y) {
				return
			}
		}
	}
}

// First returns the first delivery of key's line, active or not.
func (o *Order[E]) First(key string) (first E, ok bool) {
	l := o.lines[key]
	if l == nil || len(l.entries) == 0 {
		return first, false
	}
	return l.entries[0], true
}

// Head returns the head of key's line when nothing of the key is active.
func (o *Order[E]) Head(key string) (head E, ok bool) {
	if l := o.lines[key]; l == nil || l.busy {
		return head, false
	}
	return o.First(key)
}

// Next makes the head of key's line active and returns it, when nothing
// of the key is active and the head is held.
func (o *Order[E]) Next(key string) (next E, ok bool) {
	h, ok := o.Head(key)
	if !ok || h.Base().state != Held {
		return next, false
	}
	o.Activate(h)
	return h, true
}

// Activate makes x, the head of its line, the key's active delivery.
func (o *Order[E]) Activate(x E) {
	o.leave(x.Base())
	x.Base().state = Active
	l := o.lines[x.Base().key]
	l.active, l.busy = x, true
}

// Active returns key's active delivery.
func (o *Order[E]) Active(key string) (active E, ok bool) {
	if l := o.lines[key]; l != nil && l.busy {
		return l.active, true
	}
	return active, false
}

// ToMarker makes x a marker: a held delivery whose content is dropped, or
// the active one, which gives its key's turn up and waits in its place
// for its redelivery, expected after delay. With a positive giveUp the
// wait is given up that long after (see Expire); otherwise the marker
// waits as long as it takes.
func (o *Order[E]) ToMarker(x E, now time.Time, delay, giveUp time.Duration) {
	e := x.Base()
	o.leave(e)
	if l := o.lines[e.key]; e.state == Active && l.busy && l.active == x {
		var zero E
		l.active, l.busy = zero, false
	}
	e.state = Marker
	o.markers++
	e.due, e.expires = now.Add(delay), time.Time{}
	if giveUp > 0 {
		e.expires = e.due.Add(giveUp)
	}
}

// Fill makes a marker held again: its content is back.
func (o *Order[E]) Fill(x E) {
	e := x.Base()
	o.leave(e)
	e.state = Held
	e.due, e.expires = time.Time{}, time.Time{}
	o.held++
}

// leave takes e out of its state's count.
func (o *Order[E]) leave(e *Entry) {
	switch e.state {
	case Held:
		o.held--
	case Marker:
		o.markers--
	}
}

// Remove takes x out of its line, which is dropped once empty.
func (o *Order[E]) Remove(x E) {
	e := x.Base()
	l := o.lines[e.key]
	if l == nil {
		return
	}
	for i, y := range l.entries {
		if y == x {
			l.entries = append(l.entries[:i], l.entries[i+1:]...)
			o.leave(e)
			break
		}
	}
	if l.busy && l.active == x {
		var zero E
		l.active, l.busy = zero, false
	}
	if len(l.entries) == 0 && !l.busy {
		delete(o.lines, e.key)
	}
}

// PushOut moves the end of every marker's wait to end at the earliest.
func (o *Order[E]) PushOut(end time.Time) {
	for _, l := range o.lines {
		for _, x := range l.entries {
			if e := x.Base(); e.state == Marker && !e.expires.IsZero() && e.expires.Before(end) {
				e.expires = end
			}
		}
	}
}

// Overdue returns the markers whose wait ended before now, leaving them
// in their lines: the caller asks whether to give them up (Remove) or wait
// on (Extend).
func (o *Order[E]) Overdue(now time.Time) []E {
	var out []E
	for _, l := range o.lines {
		for _, x := range l.entries {
			if e := x.Base(); e.state == Marker && !e.expires.IsZero() && now.After(e.expires) {
				out = append(out, x)
			}
		}
	}
	return out
}

// IsMarker reports whether x is still a marker in its key's line: not
// filled by its redelivery, nor removed.
func (o *Order[E]) IsMarker(x E) bool {
	e := x.Base()
	if e.state != Marker {
		return false
	}
	if l := o.lines[e.key]; l != nil {
		for _, y := range l.entries {
			if y == x {
				return true
			}
		}
	}
	return false
}

// Extend moves the end of marker x's wait to end.
func (o *Order[E]) Extend(x E, end time.Time) {
	if e := x.Base(); e.state == Marker {
		e.expires = end
	}
}

// Expire removes the markers whose wait ended before now and returns
// them.
func (o *Order[E]) Expire(now time.Time) []E {
	var out []E
	for key, l := range o.lines {
		kept := l.entries[:0]
		for _, x := range l.entries {
			if e := x.Base(); e.state == Marker && !e.expires.IsZero() && now.After(e.expires) {
				out = append(out, x)
				o.markers--
				continue
			}
			kept = append(kept, x)
		}
		clear(l.entries[len(kept):])
		l.entries = kept
		if len(l.entries) == 0 && !l.busy {
			delete(o.lines, key)
		}
	}
	return out
}

// Keys returns the keys that have a line.
func (o *Order[E]) Keys() iter.Seq[string] {
	return func(yield func(string) bool) {
		for key := range o.lines {
			if !yield(key) {
				return
			}
		}
	}
}

// All returns every delivery in a line, the active ones included.
func (o *Order[E]) All() iter.Seq[E] {
	return func(yield func(E) bool) {
		for _, l := range o.lines {
			for _, x := range l.entries {
				if !yield(x) {
					return
				}
			}
		}
	}
}

// Clear forgets every line.
func (o *Order[E]) Clear() {
	clear(o.lines)
	o.held, o.markers = 0, 0
}
