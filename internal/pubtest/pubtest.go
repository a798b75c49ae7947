// Package pubtest holds what the broker adapters' tests share to drive a
// postbox.Publisher: an outcome that checks the Publisher's contract (done
// called exactly once) and a bounded wait for it, checks of a failure's
// class, a Publisher counting failures by class, the outbox tables of an
// end-to-end test, and a log destination tests read while the code under
// test writes to it.
package pubtest

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/postbox-go/postbox"
)

// Result collects one publish's outcome. A second call of Done fails the
// test when it ends: a Publisher calls done exactly once.
type Result struct {
	t     testing.TB
	calls atomic.Int32
	ch    chan error
}

// NewResult returns a Result for one publish in t.
func NewResult(t testing.TB) *Result {
	r := &Result{t: t, ch: make(chan error, 1)}
	t.Cleanup(func() {
		if n := r.calls.Load(); n > 1 {
			t.Errorf("done called %d times", n)
		}
	})
	return r
}

// Done is the done callback to hand to Publish.
func (r *Result) Done(err error) {
	if r.calls.Add(1) == 1 {
		r.ch <- err
	}
}

// Calls reports how many times Done was called so far.
func (r *Result) Calls() int { return int(r.calls.Load()) }

// Wait returns the outcome, failing the test if none comes within d.
func (r *Result) Wait(d time.Duration) error {
	r.t.Helper()
	select {
	case err := <-r.ch:
		return err
	case <-time.After(d):
		r.t.Fatalf("done not called within %s", d)
		return nil
	}
}

// Publish publishes env with p and returns its outcome, waiting at most d.
func Publish(t testing.TB, ctx context.Context, p postbox.Publisher, env *postbox.Envelope, d time.Duration) error {
	t.Helper()
	r := NewResult(t)
	p.Publish(ctx, env, r.Done)
	return r.Wait(d)
}
