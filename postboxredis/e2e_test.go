package postboxredis_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/pubtest"
	"github.com/postbox-go/postbox/internal/testdb"
	"github.com/postbox-go/postbox/postboxredis"
)

// pipeline is a PostgreSQL outbox relayed to a Redis stream, consumed
// back through an inbox.
type pipeline struct {
	t      *testing.T
	pool   *pgxpool.Pool
	prefix string
	client *postbox.Client[pgx.Tx]
	stream string
	log    *ledger
	pub    *counting
}

// counting counts the outcomes the relay sees, by class, and records
// each acknowledged id with the epoch it was acknowledged in.
type counting struct {
	*postboxredis.Publisher
	infra, message atomic.Int64
	epoch          atomic.Int32
	mu             sync.Mutex
	acked          map[string]int32
}

func (c *counting) Publish(ctx context.Context, env *postbox.Envelope, done func(error)) {
	c.Publisher.Publish(ctx, env, func(err error) {
		switch {
		case err == nil:
			c.mu.Lock()
			c.acked[env.ID] = c.epoch.Load()
			c.mu.Unlock()
		case postbox.IsMessageError(err):
			c.message.Add(1)
		default:
			c.infra.Add(1)
		}
		done(err)
	})
}

// newPipeline makes the stream and its group "billing", the tables, a
// Client relaying through a Publisher on rc, and a Subscriber on rc
// (PerKey) running the inbox's handler, which records each run.
func newPipeline(t *testing.T, ctx context.Context, rc redis.UniversalClient) *pipeline {
	t.Helper()
	admin := client(t, nil)
	name := stream(t, admin, "billing")
	pool, prefix, d := pubtest.Tables(t)
	counted := &counting{Publisher: publisher(t, rc, &postboxredis.Config{Stream: name}), acked: map[string]int32{}}
	c, err := postbox.NewClient(d, &postbox.Config{Prefix: prefix, Publisher: counted, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	inboxClient, err := postbox.NewClient(d, &postbox.Config{Prefix: prefix, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	inbox := inboxClient.Inbox()
	p := &pipeline{t: t, pool: pool, prefix: prefix, client: c, stream: name, log: newLedger(), pub: counted}
	sub := subscriber(t, rc, postboxredis.SubscriberConfig{Stream: name, Group: "billing", PerKey: true, MaxInFlight: 16,
		Block: 100 * time.Millisecond, MinIdle: 5 * time.Second, ClaimInterval: 500 * time.Millisecond})
	running(t, sub, inbox.Processor("billing", func(ctx context.Context, tx pgx.Tx, d *postbox.Delivery) error {
		if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
			return err
		}
		p.log.add(d)
		return nil
	}))
	return p
}

// ledger records the handler's runs: the first delivery of each message
// through the inbox.
type ledger struct {
	mu      sync.Mutex
	runs    map[string]int   // id -> handler runs
	order   map[string][]int // key -> sequence numbers, in handling order
	changed chan struct{}
}

func newLedger() *ledger {
	return &ledger{runs: map[string]int{}, order: map[string][]int{}, changed: make(chan struct{}, 1)}
}

func (l *ledger) add(d *postbox.Delivery) {
	key, n, _ := strings.Cut(string(d.Payload), ":")
	seq, _ := strconv.Atoi(n)
	l.mu.Lock()
	l.runs[d.ID]++
	l.order[key] = append(l.order[key], seq)
	l.mu.Unlock()
	select {
	case l.changed <- struct{}{}:
	default:
	}
}

func (l *ledger) handled(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.runs[id] > 0
}

// waitUntil waits, at most d, until cond holds; it is checked whenever
// the handler ran, and every 100ms for what the handler does not signal.
func (l *ledger) waitUntil(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.After(d)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-l.changed:
		case <-tick.C:
		case <-deadline:
			t.Fatalf("%s: not within %s", what, d)
		}
	}
}

func message(key string, seq int) postbox.Message {
	return postbox.Message{
		ID: postbox.NewID(), Topic: "orders.changed", Key: key,
		Payload: fmt.Appendf(nil, "%s:%d", key, seq), ContentType: "text/plain",
	}
}

// settled checks that every written message is published, none pending
// or dead, and none spent an attempt.
func (p *pipeline) settled(ctx context.Context, written int) {
	t := p.t
	t.Helper()
	st, err := p.client.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Pending != 0 || st.Dead != 0 || st.Published != int64(written) {
		t.Fatalf("stats %+v, want %d published and nothing pending or dead", st, written)
	}
	var spent int
	if err := p.pool.QueryRow(ctx, "SELECT count(*) FROM "+p.prefix+"published WHERE attempts > 0").Scan(&spent); err != nil {
		t.Fatal(err)
	}
	if spent != 0 {
		t.Fatalf("%d messages spent attempts", spent)
	}
	if n := p.pub.message.Load(); n != 0 {
		t.Fatalf("%d publishes failed as message failures", n)
	}
}

func (p *pipeline) pending(ctx context.Context) int64 {
	st, err := p.client.Stats(ctx)
	if err != nil {
		p.t.Fatal(err)
	}
	return st.Pending
}

func (p *pipeline) stop(ctx context.Context) {
	if err := p.client.Stop(ctx); err != nil && !errors.Is(err, postbox.ErrNotStarted) {
		p.t.Errorf("stop: %v", err)
	}
}

// TestEndToEnd writes 2,000 messages over 50 keys to PostgreSQL, relays
// them to Redis with this Publisher, and consumes them back through the
// inbox with this Subscriber (PerKey): every message handled exactly
// once, each key's first deliveries in write order, no attempt spent.
func TestEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test skipped in -short mode")
	}
	const keys, perKey = 50, 40
	ctx, cancel := context.WithTimeout(context.Background(), 55*time.Second)
	defer cancel()
	p := newPipeline(t, ctx, client(t, nil))
	ids := map[string]bool{}
	for i := range perKey {
		msgs := make([]postbox.Message, 0, keys)
		for k := range keys {
			m := message(fmt.Sprintf("order-%02d", k), i)
			ids[m.ID] = true
			msgs = append(msgs, m)
		}
		if err := p.client.Write(ctx, msgs...); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.client.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer p.stop(ctx)
	p.log.waitUntil(t, "every message handled", 45*time.Second, func() bool {
		p.log.mu.Lock()
		defer p.log.mu.Unlock()
		return len(p.log.runs) == len(ids)
	})
	p.stop(ctx)
	p.settled(ctx, len(ids))
	p.log.mu.Lock()
	defer p.log.mu.Unlock()
	for id, n := range p.log.runs {
		if !ids[id] || n != 1 {
			t.Fatalf("message %s handled %d times (known: %v)", id, n, ids[id])
		}
	}
	for key, seqs := range p.log.order {
		for i, s := range seqs {
			if s != i {
				t.Fatalf("key %s: handled %v, want write order", key, seqs)
			}
		}
	}
	if n := len(p.log.order); n != keys {
		t.Fatalf("%d keys handled, want %d", n, keys)
	}
}

// redisServer is the command that starts the machine's Redis: in the
// background, on loopback, keeping nothing on disk.
var redisServer = []string{"redis-server", "--daemonize", "yes", "--bind", "127.0.0.1", "-::1", "--port", "6379",
	"--save", "", "--appendonly", "no", "--dir", "/var/lib/redis", "--logfile", "/var/log/redis/ci.log"}

func startRedis(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, redisServer[0], redisServer[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("redis-server: %w: %s", err, out)
	}
	return nil
}

// awaitRedis waits, at most d, until Redis answers PING.
func awaitRedis(d time.Duration) error {
	c := redis.NewClient(&redis.Options{Addr: redisAddr(), MaxRetries: -1, DialTimeout: time.Second})
	defer c.Close()
	deadline := time.Now().Add(d)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("Redis not back within %s: %w", d, err)
		}
		time.Sleep(50 * time.Millisecond) // polling the server's port: no event to wait on
	}
}

// gate lets a client's new connections through only while open. A
// connection made while it is closed is dropped at once, as if refused.
type gate struct{ open atomic.Bool }

var errGateClosed = errors.New("test gate: Redis restarted, its topology is not restored yet")

func (g *gate) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	if !g.open.Load() {
		_ = conn.Close()
		return nil, &net.OpError{Op: "dial", Net: network, Err: errGateClosed}
	}
	return conn, nil
}

// TestBrokerRestart stops Redis while the relay publishes and the
// subscriber consumes, and starts it again.
//
// The machine's Redis keeps nothing on disk, so the restart empties it:
// the stream, its group and the dedupe keys are gone, and so is every
// entry the old server held. What the test proves:
//
//   - Every failure the relay saw while Redis was down or coming back is
//     an infrastructure failure: no message failure, and no message
//     spent an attempt (published rows with attempts > 0: none).
//   - Published means stored: every id the old server acknowledged was
//     in its stream when it stopped (read while writes were paused, just
//     before the shutdown).
//   - The relay republishes whatever it had not marked: every written
//     message ends in the published table, nothing pending or dead.
//   - Nothing acknowledged by the restarted server is lost: every id it
//     acknowledged is handled, once. The only messages not handled are
//     entries the old server had stored and acknowledged and nobody had
//     consumed when it stopped: lost with its memory, as any Redis
//     without persistence loses them (see the package documentation's
//     durability notes). Their number is logged.
//   - The Subscriber survives the restart and consumes from the new
//     server; no handler runs twice.
//
// The group must exist again before publishes and reads reach the new
// server, or the first publishes would fail with ErrNoStream (a message
// failure, rightly: publishing creates no stream). With persistence the
// stream survives a restart; here the test re-creates it, as an
// operator's start-up step would, and the relay's and the subscriber's
// client get connections to the new server only once it is done (their
// connections pass a gate that opens after EnsureGroup).
func TestBrokerRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("broker restart test skipped in -short mode")
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server not installed")
	}
	if redisAddr() != "127.0.0.1:6379" {
		t.Skip("the restart test stops the machine's Redis at 127.0.0.1:6379 only")
	}
	// Other packages' tests use this Redis too: they wait while it restarts.
	testdb.ExclusiveService(t, "redis")
	admin := client(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 58*time.Second)
	defer cancel()
	t.Cleanup(func() {
		// Whatever happened, leave Redis running.
		if awaitRedis(time.Second) == nil {
			return
		}
		if err := startRedis(context.Background()); err != nil {
			t.Errorf("start Redis: %v", err)
		}
		if err := awaitRedis(20 * time.Second); err != nil {
			t.Error(err)
		}
	})
	var g gate
	g.open.Store(true)
	rc := client(t, func(o *redis.Options) {
		o.Dialer = g.dial
		o.MaxRetries = 1
		o.DialTimeout = time.Second
	})
	p := newPipeline(t, ctx, rc)
	if err := p.client.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer p.stop(ctx)

	// A writer keeps writing while Redis goes and comes back.
	var mu sync.Mutex
	var written []string
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(written)
	}
	stopWriter := make(chan struct{})
	writerDone := make(chan error, 1)
	go func() {
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			msgs := make([]postbox.Message, 0, 10)
			for k := range 10 {
				msgs = append(msgs, message(fmt.Sprintf("order-%02d", (i*10+k)%50), i))
			}
			if err := p.client.Write(ctx, msgs...); err != nil {
				writerDone <- err
				return
			}
			mu.Lock()
			for _, m := range msgs {
				written = append(written, m.ID)
			}
			mu.Unlock()
			select {
			case <-stopWriter:
				writerDone <- nil
				return
			case <-tick.C:
			}
		}
	}()
	waitWritten := func(n int) {
		deadline := time.After(15 * time.Second)
		for count() < n {
			select {
			case err := <-writerDone:
				t.Fatalf("writer stopped: %v", err)
			case <-deadline:
				t.Fatalf("wrote %d of %d", count(), n)
			case <-time.After(10 * time.Millisecond): // the writer's pace
			}
		}
	}
	p.log.waitUntil(t, "200 messages handled", 15*time.Second, func() bool {
		p.log.mu.Lock()
		defer p.log.mu.Unlock()
		return len(p.log.runs) >= 200
	})

	runID := func() string {
		info := admin.Info(ctx, "server").Val()
		_, id, _ := strings.Cut(info, "run_id:")
		id, _, _ = strings.Cut(id, "\r\n")
		return id
	}
	oldRun := runID()

	// Freeze writes, read what the old server holds, and stop it.
	if err := admin.Do(ctx, "client", "pause", 10000, "write").Err(); err != nil {
		t.Fatal(err)
	}
	held := map[string]bool{}
	entries, err := admin.XRange(ctx, p.stream, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		held[e.Values["id"].(string)] = true
	}
	stopAt := time.Now()
	if out, err := exec.CommandContext(ctx, "redis-cli", "-p", "6379", "shutdown", "nosave").CombinedOutput(); err != nil && awaitRedis(100*time.Millisecond) == nil {
		t.Fatalf("redis-cli shutdown: %v: %s", err, out)
	}
	g.open.Store(false) // from here a new server is kept from the clients until its group exists
	// Keep Redis down while 200 more messages are written and until the
	// relay has met the outage: the client itself rides out a short one
	// (it retries its dials), and then no publish fails at all.
	waitWritten(count() + 200)
	p.log.waitUntil(t, "an infrastructure failure seen by the relay", 15*time.Second, func() bool { return p.pub.infra.Load() > 0 })
	if err := startRedis(ctx); err != nil {
		t.Fatal(err)
	}
	if err := awaitRedis(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	if id := runID(); id == oldRun || id == "" {
		t.Fatalf("Redis was not restarted: run_id %q before and %q after", oldRun, id)
	}
	if err := postboxredis.EnsureGroup(ctx, admin, p.stream, "billing", postboxredis.StartAtBeginning); err != nil {
		t.Fatal(err)
	}
	p.pub.epoch.Store(1)
	g.open.Store(true)
	back := time.Now()
	waitWritten(count() + 200) // and after it is back
	close(stopWriter)
	if err := <-writerDone; err != nil {
		t.Fatal(err)
	}
	total := count()

	// Every message published to the new server is handled.
	p.log.waitUntil(t, "every message published and handled", 40*time.Second, func() bool {
		if p.pending(ctx) != 0 {
			return false
		}
		p.pub.mu.Lock()
		defer p.pub.mu.Unlock()
		for id, epoch := range p.pub.acked {
			if epoch == 1 && !p.log.handled(id) {
				return false
			}
		}
		return true
	})
	p.stop(ctx)
	p.settled(ctx, total)

	p.pub.mu.Lock()
	defer p.pub.mu.Unlock()
	lost := 0
	for id, epoch := range p.pub.acked {
		if epoch == 0 && !held[id] {
			t.Fatalf("message %s was acknowledged by the old server but not in its stream", id)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, id := range written {
		if p.log.handled(id) {
			continue
		}
		if epoch, ok := p.pub.acked[id]; !ok || epoch != 0 || !held[id] {
			t.Fatalf("message %s not handled, and not an entry the old server held (acked %v, epoch %d, held %v)", id, ok, epoch, held[id])
		}
		lost++
	}
	p.log.mu.Lock()
	defer p.log.mu.Unlock()
	for id, n := range p.log.runs {
		if n != 1 {
			t.Fatalf("message %s handled %d times", id, n)
		}
	}
	t.Logf("%d messages written; %d failures seen by the relay, all infrastructure; down %s, caught up %s after Redis was back",
		total, p.pub.infra.Load(), back.Sub(stopAt).Round(time.Millisecond), time.Since(back).Round(time.Millisecond))
	t.Logf("%d entries held by the old server at the stop; %d of them unconsumed and lost with it (no persistence); none other", len(held), lost)
}
