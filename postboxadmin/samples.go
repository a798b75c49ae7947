package postboxadmin

import (
	"sync"
	"time"

	"github.com/postbox-go/postbox"
)

// The overview's charts are drawn from samples the server keeps: one per
// status read (by the dashboard, its refresh, or any client of
// GET /v1/status), at most one per sampleEvery, in a ring of sampleCount.
// No goroutine samples on its own: the history covers the time someone
// was looking, which is when a chart is read, and costs nothing when no
// one is.
const (
	sampleCount = 180
	sampleEvery = 2 * time.Second
)

// sample is the outbox's state at one time.
type sample struct {
	At time.Time `json:"at"`
	// Pending counts the pending messages, OldestAge is the oldest's age
	// in seconds.
	Pending   int64   `json:"pending"`
	OldestAge float64 `json:"oldest_age"`
	// Rate is the messages published per second over the last minute;
	// Lag is the longest commit-to-ack time of those, in seconds.
	Rate float64 `json:"rate"`
	Lag  float64 `json:"lag"`
}

func sampleOf(st *postbox.Status, at time.Time) sample {
	out := sample{At: at.UTC().Truncate(time.Second), Pending: st.Pending, OldestAge: st.OldestPendingAge.Seconds()}
	var n int64
	for _, t := range st.Topics {
		n += t.PublishedLastMinute
		out.Lag = max(out.Lag, t.PublishLagLastMinute.Seconds())
	}
	out.Rate = float64(n) / 60
	return out
}

// samples is a ring of samples, oldest first.
type samples struct {
	mu   sync.Mutex
	ring []sample
	next int // where the next sample goes once the ring is full
}

func newSamples(n int) *samples { return &samples{ring: make([]sample, 0, n)} }

// add records st, unless the last sample is under sampleEvery old.
func (s *samples) add(st *postbox.Status, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if last, ok := s.lastLocked(); ok && now.Sub(last.At) < sampleEvery {
		return
	}
	smp := sampleOf(st, now)
	if len(s.ring) < cap(s.ring) {
		s.ring = append(s.ring, smp)
		return
	}
	s.ring[s.next] = smp
	s.next = (s.next + 1) % len(s.ring)
}

func (s *samples) lastLocked() (sample, bool) {
	if len(s.ring) == 0 {
		return sample{}, false
	}
	if len(s.ring) < cap(s.ring) {
		return s.ring[len(s.ring)-1], true
	}
	return s.ring[(s.next+len(s.ring)-1)%len(s.ring)], true
}

// all returns the samples, oldest first.
func (s *samples) all() []sample {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]sample, 0, len(s.ring))
	if len(s.ring) < cap(s.ring) {
		return append(out, s.ring...)
	}
	out = append(out, s.ring[s.next:]...)
	return append(out, s.ring[:s.next]...)
}
