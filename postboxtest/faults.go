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
//     past the lease the relay's batch was read under this is an
//     infrastructure failure.
//   - FailNext: the next publishes fail with an error of the test's choice
//     (postbox.NewMessageError for a rejection that spends an attempt, any
//     other error for an outage that spends none).
//   - AfterPublish: a function of the test's runs after the broker's ack
//     and before the relay hears of it — where ExpireLeases makes a relay
//     lose its partitions mid-batch.
//
// Safe for concurrent use.
type Faulty struct {
	inner postbox.Publisher

	mu        sync.Mutex
	crashNext int
	stall     time.Duration
	failNext  int
	failErr   error
	after     func(*postbox.Envelope)
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

// AfterPublish makes every publish the broker acknowledges run fn before
// the relay is told, until it is called again with nil. fn runs on the
// publisher's goroutine, once per message; it must not block for long.
func (f *Faulty) AfterPublish(fn func(env *postbox.Envelope)) {
	f.mu.Lock()
	f.after = fn
	f.mu.Unlock()
}

// Publish implements postbox.Publisher.
func (f *Faulty) Publish(ctx context.Context, env *postbox.Envelope, done func(error)) {
	f.mu.Lock()
	stall, crash, after := f.stall, false, f.after
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
	if !crash && after == nil {
		f.inner.Publish(ctx, env, done)
		return
	}
	f.inner.Publish(ctx, env, func(err error) {
		if err == nil && after != nil {
			after(env)
		}
		if err == nil && crash {
			err = ErrCrashedBeforeMark
		}
		done(err)
	})
}
