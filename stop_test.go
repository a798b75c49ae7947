package postbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/postboxdriver"
	"github.com/postbox-go/postbox/postboxpgx"
)

// A stop must not abandon the lease renewal it finds in flight. A
// statement the client gave up on still runs on the database once its
// bytes have left (through a pooler, or on a busy server, it may not
// have begun yet); the leave that follows the stop would then run first,
// and the renewal, finding the partitions free, would take them back for
// a whole lease after the relay is gone: a deploy's next relay, or a
// Drain, would wait that long for them.
func TestStopWaitsForTheRenewalInFlight(t *testing.T) {
	d, prefix := newDriver(t)
	ctx := context.Background()
	st := &lateRenewalStore{}
	st.init()
	wrapped := driverFunc(func(p string) (postboxdriver.Store[pgx.Tx], error) {
		s, err := d.Open(p)
		st.Store = s
		return st, err
	})
	pub := postbox.PublisherFunc(func(context.Context, *postbox.Envelope) error { return nil })
	// A lease long enough that the renewal's own deadline (half of it)
	// never ends the hold below, however slowly the test gets to its
	// stop: only the stop may.
	c, err := postbox.NewClient[pgx.Tx](wrapped, &postbox.Config{Prefix: prefix, Publisher: pub, LeaseDuration: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, st.listening, "the relay to listen")
	waitClosed(t, st.entered, "a renewal")
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, st.served, "the renewal to reach the database")

	other, err := postbox.NewClient[pgx.Tx](postboxpgx.New(d.Pool()), &postbox.Config{Prefix: prefix, Publisher: pub})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Drain(ctx); err != nil {
		t.Fatalf("Drain after the relay stopped: %v", err)
	}
}

// lateRenewalStore holds the relay's second Coordinate, a renewal (late),
// until the relay is being stopped: behind the relay's leave if the relay
// gave up on it.
type lateRenewalStore struct {
	postboxdriver.Store[pgx.Tx]
	late
	calls     atomic.Int32
	listening chan struct{} // the relay listens for signals
	stopping  chan struct{} // the relay's stop began: its listen ended
	left      chan struct{} // the relay's leave ran
	leaveOnce sync.Once
}

func (s *lateRenewalStore) init() {
	s.late = newLate()
	s.listening, s.stopping, s.left = make(chan struct{}), make(chan struct{}), make(chan struct{})
}

// Listen stands for the driver's: it hears nothing, and tells the test
// when the relay's stop ends it.
func (s *lateRenewalStore) Listen(ctx context.Context, ready func(), _ func(postboxdriver.Heard)) error {
	ready()
	select {
	case <-s.listening:
	default:
		close(s.listening)
	}
	<-ctx.Done()
	select {
	case <-s.stopping:
	default:
		close(s.stopping)
	}
	return ctx.Err()
}

func (s *lateRenewalStore) Coordinate(ctx context.Context, id string, ttl time.Duration, want, drop, settled []int) (postboxdriver.Membership, error) {
	if ttl == 0 {
		m, err := s.Store.Coordinate(ctx, id, ttl, want, drop, settled)
		s.leaveOnce.Do(func() { close(s.left) })
		return m, err
	}
	if s.calls.Add(1) != 2 {
		return s.Store.Coordinate(ctx, id, ttl, want, drop, settled)
	}
	return runLate(ctx, &s.late, s.stopping, s.left, func() (postboxdriver.Membership, error) {
		return s.Store.Coordinate(context.Background(), id, ttl, want, drop, settled)
	})
}

// late is one statement held as a database reached late holds it: once
// begun closes (the test's stop or cancel), it reaches the database
// behind after (the caller's release) when its caller gave up on it, or
// at once when the caller still waits for it.
type late struct {
	entered chan struct{} // the statement is held
	gaveUp  chan struct{} // its caller abandoned it
	served  chan struct{} // it ran on the database
}

func newLate() late {
	return late{entered: make(chan struct{}), gaveUp: make(chan struct{}), served: make(chan struct{})}
}

// runLate holds run as l says and returns its result, or ctx's error
// when ctx ends first. A caller that gave up on its first claim releases
// nothing: after is then waited for a few seconds only.
func runLate[T any](ctx context.Context, l *late, begun, after <-chan struct{}, run func() (T, error)) (T, error) {
	close(l.entered)
	type result struct {
		v   T
		err error
	}
	res := make(chan result, 1)
	go func() {
		defer close(l.served)
		<-begun
		select {
		case <-l.gaveUp:
			select {
			case <-after:
			case <-time.After(3 * time.Second):
			}
		case <-time.After(200 * time.Millisecond):
		}
		v, err := run()
		res <- result{v, err}
	}()
	select {
	case r := <-res:
		return r.v, r.err
	case <-ctx.Done():
		close(l.gaveUp)
		var zero T
		return zero, ctx.Err()
	}
}

type driverFunc func(prefix string) (postboxdriver.Store[pgx.Tx], error)

func (f driverFunc) Open(prefix string) (postboxdriver.Store[pgx.Tx], error) { return f(prefix) }

func waitClosed(t *testing.T, ch chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("waited 10s for %s", what)
	}
}

// The inbox retention's claim, renewed before each batch, is no more cut
// short than the relay's renewal: a claim given up on would reach the
// database after the pass's release and hold the task for a whole claim,
// every other process's pass reporting Busy meanwhile.
func TestPruneWaitsForTheClaimInFlight(t *testing.T) {
	// The pass's first claim, and its renewal before the first batch.
	for _, hold := range []int32{1, 2} {
		t.Run(fmt.Sprintf("claim%d", hold), func(t *testing.T) { pruneWaitsForClaim(t, hold) })
	}
}

func pruneWaitsForClaim(t *testing.T, hold int32) {
	d, prefix := newDriver(t)
	st := &lateClaimStore{late: newLate(), hold: hold, cancelled: make(chan struct{}), released: make(chan struct{})}
	wrapped := driverFunc(func(p string) (postboxdriver.Store[pgx.Tx], error) {
		s, err := d.Open(p)
		st.Store = s
		return st, err
	})
	c, err := postbox.NewClient[pgx.Tx](wrapped, &postbox.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := c.Inbox().Prune(ctx)
		done <- err
	}()
	waitClosed(t, st.entered, "the claim")
	cancel()
	close(st.cancelled)
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Prune cancelled during its claim = %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Prune did not return after its context ended")
	}
	waitClosed(t, st.served, "the claim to reach the database")

	other, err := postbox.NewClient[pgx.Tx](postboxpgx.New(d.Pool()), &postbox.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	if res, err := other.Inbox().Prune(context.Background()); err != nil || res.Busy {
		t.Fatalf("Prune after the first pass ended = %+v, %v; want the task free", res, err)
	}
}

// lateClaimStore holds a pass's hold-th ClaimMaintenance (late) until the
// test cancels the pass: behind the pass's release if the pass gave up
// on it.
type lateClaimStore struct {
	postboxdriver.Store[pgx.Tx]
	late
	hold      int32
	calls     atomic.Int32
	cancelled chan struct{} // the test cancelled the pass's context
	released  chan struct{} // the pass released its claim
	once      sync.Once
}

func (s *lateClaimStore) ReleaseMaintenance(ctx context.Context, task, owner string) error {
	err := s.Store.ReleaseMaintenance(ctx, task, owner)
	s.once.Do(func() { close(s.released) })
	return err
}

func (s *lateClaimStore) ClaimMaintenance(ctx context.Context, task, owner string, d time.Duration) (bool, error) {
	if s.calls.Add(1) != s.hold {
		return s.Store.ClaimMaintenance(ctx, task, owner, d)
	}
	return runLate(ctx, &s.late, s.cancelled, s.released, func() (bool, error) {
		return s.Store.ClaimMaintenance(context.Background(), task, owner, d)
	})
}
