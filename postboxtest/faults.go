package postboxtest

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/postbox-go/postbox"
)

// ErrCrashedBeforeMark is what Faulty reports for a publish it let through
// to the broker but pretends the relay never recorded.
var ErrCrashedBeforeMark = errors.New("postboxtest: relay crashed between the broker's ack and its mark")

// Faulty wraps a Publisher with faults a test switches on, to show how the
// code under test behaves when things go wrong:
//
//   - CrashAfterPublish: the broker stores the message, then the relay
//     "crashes" before recording it, so it is sent again later — the copy
//     every consumer must absorb (by id, through an Inbox).
//   - Stall: every publish waits, as a broker that is slow or black-holed;
//     past the relay's batch deadline this is an infrastructure failure.
//   - FailNext: the next publishes fail with an error of the test's choice
//     (postbox.NewMessageError for a rejection that spends an attempt, any
//     other error for an outage that spends none).
//
// Safe for concurrent use.
type Faulty struct {
	inner postbox.Publisher

	mu        sync.Mutex
	crashNext int
	stall     time.Duration
	failNext  int
	failErr   error
}

// NewFaulty wraps p, with no fault switched on.
func NewFaulty(p postbox.Publisher) *Faulty { return &Faulty{inner: p} }

// CrashAfterPublish makes the next n publishes reach the broker and then
// fail as an infrastructure failure, as if the relay had died before its
// mark: the relay publishes them again, under the same ids.
func (f *Faulty) CrashAfterPublish(n int) {
	f.mu.Lock()
	f.crashNext = n
	f.mu.Unlock()
}

// Stall makes every publish wait d (or until its context ends) before it
// goes through; zero ends the stall.
func (f *Faulty) Stall(d time.Duration) {
	f.mu.Lock()
	f.stall = d
	f.mu.Unlock()
}

// FailNext makes the next n publishes fail with err without reaching the
// broker.
func (f *Faulty) FailNext(n int, err error) {
	f.mu.Lock()
	f.failNext, f.failErr = n, err
	f.mu.Unlock()
}

// Publish implements postbox.Publisher.
func (f *Faulty) Publish(ctx context.Context, env *postbox.Envelope, done func(error)) {
	f.mu.Lock()
	stall, crash := f.stall, false
	var fail error
	switch {
	case f.failNext > 0:
		f.failNext--
		fail = f.failErr
	case f.crashNext > 0:
		f.crashNext--
		crash = true
	}
	f.mu.Unlock()
	if fail != nil {
		done(fail)
		return
	}
	if stall > 0 {
		t := time.NewTimer(stall)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			done(ctx.Err())
			return
		}
	}
	if !crash {
		f.inner.Publish(ctx, env, done)
		return
	}
	f.inner.Publish(ctx, env, func(err error) {
		if err == nil {
			err = ErrCrashedBeforeMark
		}
		done(err)
	})
}
