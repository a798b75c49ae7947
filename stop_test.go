package postbox_test

import (
	"context"
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

// lateRenewalStore holds the relay's second Coordinate, a renewal, until
// the relay is being stopped, and lets it reach the database then: behind
// the relay's leave if the relay gave up on it, as a database reached
// late would run it, or at once if the relay still waits for it.
type lateRenewalStore struct {
	postboxdriver.Store[pgx.Tx]
	calls     atomic.Int32
	listening chan struct{} // the relay listens for signals
	stopping  chan struct{} // the relay's stop began: its listen ended
	entered   chan struct{} // the renewal is held
	gaveUp    chan struct{} // the relay abandoned the renewal
	left      chan struct{} // the relay's leave ran
	served    chan struct{} // the renewal ran on the database
	leaveOnce sync.Once
}

func (s *lateRenewalStore) init() {
	s.listening, s.stopping, s.entered = make(chan struct{}), make(chan struct{}), make(chan struct{})
	s.gaveUp, s.left, s.served = make(chan struct{}), make(chan struct{}), make(chan struct{})
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
	close(s.entered)
	type result struct {
		m   postboxdriver.Membership
		err error
	}
	res := make(chan result, 1)
	go func() {
		defer close(s.served)
		<-s.stopping
		select {
		case <-s.gaveUp:
			<-s.left
		case <-time.After(200 * time.Millisecond):
		}
		m, err := s.Store.Coordinate(context.Background(), id, ttl, want, drop, settled)
		res <- result{m, err}
	}()
	select {
	case r := <-res:
		return r.m, r.err
	case <-ctx.Done():
		close(s.gaveUp)
		return postboxdriver.Membership{}, ctx.Err()
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
