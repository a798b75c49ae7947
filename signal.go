package postbox

import (
	"context"
	"errors"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/postbox-go/postbox/postboxdriver"
)

// Change signals between processes (Config.NoSignals). A write wakes the
// relay in its own process directly (Client.notify); relays in other
// processes hear of it through the database, when its driver carries
// signals (postboxdriver.Signaler and Listener: PostgreSQL's NOTIFY and
// LISTEN). A signal is a hint: one lost costs the poll's latency, never a
// message, and one that arrives before the writer's commit makes the relay
// read on its fast poll until the rows are there.

const (
	// signalTimeout bounds one signal.
	signalTimeout = 5 * time.Second
	// signalSpacing is the least time between the starts of two signals
	// of one Client: at most 200 a second, whatever its write rate, each
	// at most this late. At 2 ms the signals cost 16 writers a few
	// percent of their commits; at 5 ms nothing measurable (BENCHMARKS.md,
	// "LISTEN/NOTIFY study").
	signalSpacing = 5 * time.Millisecond
)

// signaler sends the change signals of one Client's writes: one at a time,
// at least signalSpacing apart, on a goroutine that runs only while a
// signal is due, so that the writes made meanwhile share the next. A
// NOTIFY takes a database-wide lock until its transaction commits, so one
// in each writer's transaction would make writers commit one at a time;
// these are sent outside the writers' transactions, and the writers never
// wait for them.
type signaler struct {
	s      postboxdriver.Signaler
	log    *slog.Logger
	mu     sync.Mutex
	due    bool // a write since the last signal began
	early  bool // one of those was signalled before its commit
	active bool // the sending goroutine runs
}

func newSignaler(store any, cfg *Config) *signaler {
	s, ok := store.(postboxdriver.Signaler)
	if !ok || cfg.NoSignals {
		return nil
	}
	return &signaler{s: s, log: cfg.Logger}
}

// send asks for a signal for a write, early when it has not committed
// yet; a nil signaler sends none.
func (s *signaler) send(early bool) {
	if s == nil {
		return
	}
	s.mu.Lock()
	s.due = true
	s.early = s.early || early
	if s.active {
		s.mu.Unlock()
		return
	}
	s.active = true
	s.mu.Unlock()
	go s.run()
}

func (s *signaler) run() {
	for {
		s.mu.Lock()
		if !s.due {
			s.active = false
			s.mu.Unlock()
			return
		}
		committed := !s.early
		s.due, s.early = false, false
		s.mu.Unlock()
		began := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), signalTimeout)
		err := s.s.Signal(ctx, committed)
		cancel()
		if err != nil {
			// A debug line only: the write itself succeeded, relays
			// elsewhere find its rows by polling, and a database that
			// cannot take a signal fails the writes loudly enough (or
			// the pool was closed under a last signal).
			s.log.Debug("postbox could not send a change signal; relays in other processes find the rows by polling", slog.Any("error", err))
		}
		if wait := signalSpacing - time.Since(began); wait > 0 {
			time.Sleep(wait)
		}
	}
}

// listen hears the change signals of writers in every process and wakes
// the lanes, so that rows written elsewhere are read at once rather than
// at the next poll. After a failure it listens again, after a pause that
// doubles; connections that cannot carry signals (a transaction pooler,
// postboxdriver.ErrNoSignals) are logged once and left to the polls.
func (r *relay) listen(ctx context.Context, l postboxdriver.Listener) {
	pause := time.Duration(0)
	for ctx.Err() == nil {
		err := l.Listen(ctx, func() {
			pause = 0
			r.listening.Store(true)
			r.log.Debug("postbox relay listens for change signals")
			// What another relay announced before this relay listened
			// (a release for it as it joined, say) was not heard: a
			// renewal now sees it.
			r.renewNow()
		}, func(h postboxdriver.Heard) {
			r.signals.Add(1)
			if h.Relays {
				r.renewNow()
				return
			}
			kind := wakeEarly
			if h.Committed {
				kind = wakeHeard
			}
			r.wakeFor(h.Partitions, kind, nil)
		})
		r.listening.Store(false)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, postboxdriver.ErrNoSignals) {
			r.log.Info("postbox relay hears no change signals on this database; it finds rows written by other processes by polling", slog.Any("error", err))
			return
		}
		pause = min(max(pause*2, minInfraPause), maxInfraPause)
		r.log.Warn("postbox relay stopped listening for change signals; it polls meanwhile", slog.Any("error", err), slog.Duration("retry", pause))
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
}

// wakeFor wakes the lanes that read parts, every reading lane for nil,
// with a wake-up of kind. A partition the relay does not hold wakes none:
// its owner hears of the write too. A wake-up for committed rows that
// names them (ids) names to each lane the rows of its partitions.
func (r *relay) wakeFor(parts []int, kind wakeKind, ids []written) {
	if parts == nil {
		r.notifyLanes(kind)
		return
	}
	r.mu.Lock()
	held, active := r.heldInOrder(), r.active
	r.mu.Unlock()
	if active == 0 {
		return
	}
	laneOf := func(p int) (*lane, bool) {
		i := sort.SearchInts(held, p)
		if i < len(held) && held[i] == p {
			return r.lanes[i%active], true
		}
		return nil, false
	}
	if ids == nil {
		for _, p := range parts {
			if l, ok := laneOf(p); ok {
				l.notify(kind)
			}
		}
		return
	}
	byLane := map[*lane][]written{}
	for _, w := range ids {
		if l, ok := laneOf(w.part); ok {
			byLane[l] = append(byLane[l], w)
		}
	}
	for l, ws := range byLane {
		l.wake.send(kind, 0, ws)
	}
}
