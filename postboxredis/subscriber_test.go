package postboxredis_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/postboxredis"
)

// processor is a Processor that records deliveries and answers with
// verdict (nil: Ack).
type processor struct {
	mu      sync.Mutex
	got     []postbox.Delivery
	at      []time.Time
	verdict func(ctx context.Context, d *postbox.Delivery) postbox.Verdict
	changed chan struct{}
}

func newProcessor(verdict func(ctx context.Context, d *postbox.Delivery) postbox.Verdict) *processor {
	return &processor{verdict: verdict, changed: make(chan struct{}, 1)}
}

func (p *processor) Process(ctx context.Context, d *postbox.Delivery) postbox.Verdict {
	p.mu.Lock()
	p.got = append(p.got, *d)
	p.at = append(p.at, time.Now())
	p.mu.Unlock()
	select {
	case p.changed <- struct{}{}:
	default:
	}
	if p.verdict == nil {
		return postbox.Verdict{Action: postbox.Ack}
	}
	return p.verdict(ctx, d)
}

func (p *processor) deliveries() ([]postbox.Delivery, []time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]postbox.Delivery(nil), p.got...), append([]time.Time(nil), p.at...)
}

// waitFor waits, at most 30s, until cond holds over the deliveries.
func (p *processor) waitFor(t *testing.T, what string, cond func([]postbox.Delivery) bool) []postbox.Delivery {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		got, _ := p.deliveries()
		if cond(got) {
			return got
		}
		select {
		case <-p.changed:
		case <-deadline:
			t.Fatalf("timed out waiting for %s (%d deliveries so far)", what, len(got))
		}
	}
}

func atLeast(n int) func([]postbox.Delivery) bool {
	return func(got []postbox.Delivery) bool { return len(got) >= n }
}

// add adds an entry with the given fields, as a producer other than the
// Publisher might.
func add(t *testing.T, c redis.UniversalClient, stream string, values ...any) string {
	t.Helper()
	id, err := c.XAdd(context.Background(), &redis.XAddArgs{Stream: stream, Values: values}).Result()
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func TestSubscriberConfigValidation(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: redisAddr()})
	t.Cleanup(func() { _ = c.Close() })
	_, err := postboxredis.NewSubscriber(c, &postboxredis.SubscriberConfig{
		Consumer: "has space", MaxInFlight: -1, Block: time.Hour, MinIdle: time.Millisecond,
		ClaimInterval: time.Second, IdleConsumerTTL: time.Millisecond,
	})
	got := problemFields(t, err)
	for _, f := range []string{"Stream", "Group", "Consumer", "MaxInFlight", "Block", "MinIdle", "ClaimInterval", "IdleConsumerTTL"} {
		if !got[f] {
			t.Errorf("problem with %s not reported: %v", f, err)
		}
	}
	if _, err := postboxredis.NewSubscriber(nil, &postboxredis.SubscriberConfig{Stream: "s", Group: "g"}); err == nil || errors.As(err, new(*postbox.ConfigError)) {
		t.Errorf("NewSubscriber without a client: %v", err)
	}
	s, err := postboxredis.NewSubscriber(c, &postboxredis.SubscriberConfig{Stream: "s", Group: "g"})
	if err != nil {
		t.Fatal(err)
	}
	d := s.Config()
	if d.MaxInFlight != postboxredis.DefaultMaxInFlight || d.Block != postboxredis.DefaultBlock || d.MinIdle != postboxredis.DefaultMinIdle ||
		d.ClaimInterval != postboxredis.DefaultClaimInterval || d.IdleConsumerTTL != postboxredis.DefaultIdleConsumerTTL || d.Logger == nil {
		t.Fatalf("defaults: %+v", d)
	}
	if err := s.Run(context.Background(), nil); err == nil {
		t.Fatal("Run without a Processor succeeded")
	}
}

func TestEnsureGroup(t *testing.T) {
	c := client(t, nil)
	ctx := context.Background()
	name := uniqueName()
	cleanup(t, name)
	for range 2 { // idempotent
		if err := postboxredis.EnsureGroup(ctx, c, name, "g", postboxredis.StartAtEnd); err != nil {
			t.Fatal(err)
		}
	}
	if typ := c.Type(ctx, name).Val(); typ != "stream" {
		t.Fatalf("EnsureGroup made a %q", typ)
	}
	for _, bad := range [][3]string{{"a b", "g", "0"}, {name, "", "0"}, {name, "g", "latest"}, {name, "g", ""}} {
		if err := postboxredis.EnsureGroup(ctx, c, bad[0], bad[1], bad[2]); err == nil {
			t.Errorf("EnsureGroup(%q, %q, %q) succeeded", bad[0], bad[1], bad[2])
		}
	}
	if err := postboxredis.EnsureGroup(ctx, c, name, "h", "1-0"); err != nil {
		t.Fatalf("start at an entry id: %v", err)
	}
}

// TestRunWithoutGroup: subscribing creates nothing, and a missing group
// or stream ends Run with ErrNoGroup.
func TestRunWithoutGroup(t *testing.T) {
	c := client(t, nil)
	name := stream(t, c, "other")
	missing := uniqueName()
	cleanup(t, missing)
	for _, cfg := range []postboxredis.SubscriberConfig{{Stream: name, Group: "nope"}, {Stream: missing, Group: "g"}} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		err := subscriber(t, c, cfg).Run(ctx, newProcessor(nil))
		cancel()
		if !errors.Is(err, postboxredis.ErrNoGroup) {
			t.Fatalf("Run on %s > %s: %v, want ErrNoGroup", cfg.Stream, cfg.Group, err)
		}
	}
	if n := c.Exists(context.Background(), missing).Val(); n != 0 {
		t.Fatal("Run created the stream")
	}
}

// TestForeignEntries reads entries other producers added: the id from
// ce-id when there is no id field, no headers field at all, headers that
// are not JSON; an entry with no id at all is acknowledged unseen.
func TestForeignEntries(t *testing.T) {
	c := client(t, nil)
	name := stream(t, c, "g")
	add(t, c, name, "payload", "lost") // no id anywhere
	add(t, c, name, "headers", `{"ce-id":"id-1","ce-type":"orders.created","ce-partitionkey":"k1"}`, "payload", "one")
	add(t, c, name, "id", "id-2", "payload", "two")
	add(t, c, name, "id", "id-3", "headers", "not json", "payload", "three")
	proc := newProcessor(nil)
	running(t, subscriber(t, c, postboxredis.SubscriberConfig{Stream: name, Group: "g", Block: 50 * time.Millisecond}), proc)
	got := proc.waitFor(t, "three deliveries", atLeast(3))
	byID := map[string]postbox.Delivery{}
	for _, d := range got {
		byID[d.ID] = d
	}
	if d := byID["id-1"]; d.Topic != "orders.created" || d.Key != "k1" || string(d.Payload) != "one" || d.Delivered != 1 {
		t.Fatalf("id-1: %+v", d)
	}
	if d := byID["id-2"]; d.Topic != name || d.Key != "" || string(d.Payload) != "two" || d.Headers == nil {
		t.Fatalf("id-2: %+v", d)
	}
	if d := byID["id-3"]; string(d.Payload) != "three" || len(d.Headers) != 0 {
		t.Fatalf("id-3: %+v", d)
	}
	waitSettled(t, c, name, "g")
	if got, _ := proc.deliveries(); len(got) != 3 {
		t.Fatalf("%d deliveries, want 3", len(got))
	}
}

// TestClaimFromDeadConsumer: entries a consumer read and never settled
// are claimed once idle for MinIdle, delivered with their raised
// delivery count, and the dead consumer is deleted once it has nothing
// pending and stayed idle for IdleConsumerTTL.
func TestClaimFromDeadConsumer(t *testing.T) {
	c := client(t, nil)
	ctx := context.Background()
	name := stream(t, c, "g")
	p := publisher(t, c, &postboxredis.Config{Stream: name})
	for i := range 5 {
		if err := publish(t, p, ctx, envelope("t", "", fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	// "dead" reads every entry and dies.
	if err := c.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "dead", Streams: []string{name, ">"}, Count: 10}).Err(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	proc := newProcessor(nil)
	running(t, subscriber(t, c, postboxredis.SubscriberConfig{
		Stream: name, Group: "g", Block: 50 * time.Millisecond,
		MinIdle: 300 * time.Millisecond, ClaimInterval: 50 * time.Millisecond, IdleConsumerTTL: 700 * time.Millisecond,
	}), proc)
	got := proc.waitFor(t, "five claimed deliveries", atLeast(5))
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Fatalf("claimed after %s, before MinIdle", d)
	}
	for _, d := range got {
		if d.Delivered != 2 {
			t.Fatalf("claimed delivery counted %d, want 2", d.Delivered)
		}
	}
	deadline := time.After(20 * time.Second)
	for {
		consumers := c.XInfoConsumers(ctx, name, "g").Val()
		dead := false
		for _, x := range consumers {
			dead = dead || x.Name == "dead"
		}
		if !dead {
			break
		}
		select {
		case <-deadline:
			t.Fatalf("the dead consumer was not deleted: %+v", consumers)
		case <-time.After(50 * time.Millisecond): // polling Redis: no event to wait on
		}
	}
}

// TestHeldEntriesNotClaimed: an entry whose handler runs far longer than
// MinIdle is kept from the group's other subscriber, which claims every
// 20ms, and is delivered once.
func TestHeldEntriesNotClaimed(t *testing.T) {
	c := client(t, nil)
	ctx := context.Background()
	name := stream(t, c, "g")
	p := publisher(t, c, &postboxredis.Config{Stream: name})
	cfg := postboxredis.SubscriberConfig{Stream: name, Group: "g", Block: 50 * time.Millisecond,
		MinIdle: 300 * time.Millisecond, ClaimInterval: 20 * time.Millisecond}
	release := make(chan struct{})
	slow := newProcessor(func(ctx context.Context, _ *postbox.Delivery) postbox.Verdict {
		<-release
		return postbox.Verdict{Action: postbox.Ack}
	})
	running(t, subscriber(t, c, cfg), slow)
	if err := publish(t, p, ctx, envelope("t", "", "slow")); err != nil {
		t.Fatal(err)
	}
	slow.waitFor(t, "the delivery", atLeast(1))
	other := newProcessor(nil)
	running(t, subscriber(t, c, cfg), other)
	// Observe for five times MinIdle: the other subscriber claims every
	// 20ms and must find nothing idle.
	<-time.After(1500 * time.Millisecond)
	close(release)
	waitSettled(t, c, name, "g")
	if got, _ := other.deliveries(); len(got) != 0 {
		t.Fatalf("the other subscriber claimed %d held entries", len(got))
	}
}

// TestRetryHeldAndRedelivered: a Retry is held for its delay and
// delivered again by the same Run with the delivery count raised; later
// entries of its key wait (PerKey).
func TestRetryHeldAndRedelivered(t *testing.T) {
	c := client(t, nil)
	ctx := context.Background()
	name := stream(t, c, "g")
	p := publisher(t, c, &postboxredis.Config{Stream: name})
	first, second := envelope("t", "k", "0"), envelope("t", "k", "1")
	for _, env := range []*postbox.Envelope{first, second} {
		if err := publish(t, p, ctx, env); err != nil {
			t.Fatal(err)
		}
	}
	var tries atomic.Int32
	proc := newProcessor(func(_ context.Context, d *postbox.Delivery) postbox.Verdict {
		if d.ID == first.ID && tries.Add(1) < 3 {
			return postbox.Verdict{Action: postbox.Retry, Delay: 150 * time.Millisecond}
		}
		return postbox.Verdict{Action: postbox.Ack}
	})
	running(t, subscriber(t, c, postboxredis.SubscriberConfig{Stream: name, Group: "g", PerKey: true, Block: 50 * time.Millisecond}), proc)
	got := proc.waitFor(t, "four deliveries", atLeast(4))
	_, at := proc.deliveries()
	want := []struct {
		id        string
		delivered int
	}{{first.ID, 1}, {first.ID, 2}, {first.ID, 3}, {second.ID, 1}}
	for i, w := range want {
		if got[i].ID != w.id || got[i].Delivered != w.delivered {
			t.Fatalf("delivery %d: %s (delivered %d), want %s (delivered %d)", i, got[i].ID, got[i].Delivered, w.id, w.delivered)
		}
	}
	for i := 1; i < 3; i++ {
		if d := at[i].Sub(at[i-1]); d < 150*time.Millisecond {
			t.Fatalf("redelivered after %s, before the 150ms delay", d)
		}
	}
	waitSettled(t, c, name, "g")
}

// TestHandBackOnStop: when Run ends it hands back what it holds: a
// retried entry becomes claimable when its delay is over, entries queued
// behind it at once; another subscriber of the group takes them over in
// key order.
func TestHandBackOnStop(t *testing.T) {
	c := client(t, nil)
	ctx := context.Background()
	name := stream(t, c, "g")
	p := publisher(t, c, &postboxredis.Config{Stream: name})
	var envs []*postbox.Envelope
	for i := range 3 {
		env := envelope("t", "k", fmt.Sprint(i))
		envs = append(envs, env)
		if err := publish(t, p, ctx, env); err != nil {
			t.Fatal(err)
		}
	}
	cfg := postboxredis.SubscriberConfig{Stream: name, Group: "g", PerKey: true, Block: 50 * time.Millisecond,
		MinIdle: 3 * time.Second, ClaimInterval: 20 * time.Millisecond}
	const delay = 400 * time.Millisecond
	first := newProcessor(func(context.Context, *postbox.Delivery) postbox.Verdict {
		return postbox.Verdict{Action: postbox.Retry, Delay: delay}
	})
	stop := running(t, subscriber(t, c, cfg), first)
	first.waitFor(t, "the first delivery", atLeast(1))
	stop()
	// The Retry was answered right after the delivery was recorded.
	verdict, firstAt := first.deliveries()
	if len(verdict) != 1 || verdict[0].ID != envs[0].ID {
		t.Fatalf("the first Run processed %d entries, want only the head of the key", len(verdict))
	}

	second := newProcessor(nil)
	running(t, subscriber(t, c, cfg), second)
	got := second.waitFor(t, "three deliveries", atLeast(3))
	_, at := second.deliveries()
	// Claimable when the delay is over, measured from the verdict; without
	// the hand-back it would take MinIdle from the last touch.
	if d := at[0].Sub(firstAt[0]); d < delay || d > cfg.MinIdle-500*time.Millisecond {
		for i := range got {
			t.Logf("%d: %s delivered %d at %s", i, got[i].Payload, got[i].Delivered, at[i].Sub(firstAt[0]))
		}
		t.Fatalf("the retried entry was claimed %s after its Retry verdict, want after the %s delay and well before MinIdle (%s)", d, delay, cfg.MinIdle)
	}
	for i, d := range got[:3] {
		if d.ID != envs[i].ID || d.Delivered != 2 {
			t.Fatalf("delivery %d: %s (delivered %d), want %s (delivered 2)", i, d.ID, d.Delivered, envs[i].ID)
		}
	}
}

// TestMaxInFlight: no more deliveries than MaxInFlight are processed at
// once, and each entry once.
func TestMaxInFlight(t *testing.T) {
	c := client(t, nil)
	ctx := context.Background()
	name := stream(t, c, "g")
	p := publisher(t, c, &postboxredis.Config{Stream: name})
	for i := range 60 {
		if err := publish(t, p, ctx, envelope("t", "", fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	var active, peak atomic.Int32
	proc := newProcessor(func(context.Context, *postbox.Delivery) postbox.Verdict {
		n := active.Add(1)
		for {
			m := peak.Load()
			if n <= m || peak.CompareAndSwap(m, n) {
				break
			}
		}
		time.Sleep(2 * time.Millisecond) // the handler's work
		active.Add(-1)
		return postbox.Verdict{Action: postbox.Ack}
	})
	running(t, subscriber(t, c, postboxredis.SubscriberConfig{Stream: name, Group: "g", MaxInFlight: 4, Block: 50 * time.Millisecond}), proc)
	got := proc.waitFor(t, "60 deliveries", atLeast(60))
	if n := peak.Load(); n > 4 || n < 2 {
		t.Fatalf("peak concurrency %d, want 2 to 4", n)
	}
	seen := map[string]bool{}
	for _, d := range got {
		if seen[d.ID] {
			t.Fatalf("%s delivered twice", d.ID)
		}
		seen[d.ID] = true
	}
}

// TestConsumerDeletedOnStop: a Run with a generated name removes its
// consumer when it ends with nothing pending.
func TestConsumerDeletedOnStop(t *testing.T) {
	c := client(t, nil)
	ctx := context.Background()
	name := stream(t, c, "g")
	p := publisher(t, c, &postboxredis.Config{Stream: name})
	if err := publish(t, p, ctx, envelope("t", "", "x")); err != nil {
		t.Fatal(err)
	}
	proc := newProcessor(nil)
	stop := running(t, subscriber(t, c, postboxredis.SubscriberConfig{Stream: name, Group: "g", Block: 50 * time.Millisecond}), proc)
	proc.waitFor(t, "the delivery", atLeast(1))
	waitSettled(t, c, name, "g")
	if n := len(c.XInfoConsumers(ctx, name, "g").Val()); n != 1 {
		t.Fatalf("%d consumers while running, want 1", n)
	}
	stop()
	if cs := c.XInfoConsumers(ctx, name, "g").Val(); len(cs) != 0 {
		t.Fatalf("consumers left after Run: %+v", cs)
	}
}

// TestTrimmedPendingEntries: entries trimmed from the stream while
// pending are reported by the claim pass and not delivered; the Run
// goes on.
func TestTrimmedPendingEntries(t *testing.T) {
	c := client(t, nil)
	ctx := context.Background()
	name := stream(t, c, "g")
	p := publisher(t, c, &postboxredis.Config{Stream: name})
	for i := range 3 {
		if err := publish(t, p, ctx, envelope("t", "", fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "dead", Streams: []string{name, ">"}, Count: 10}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.XTrimMaxLen(ctx, name, 0).Err(); err != nil {
		t.Fatal(err)
	}
	later := envelope("t", "", "later")
	if err := publish(t, p, ctx, later); err != nil {
		t.Fatal(err)
	}
	proc := newProcessor(nil)
	running(t, subscriber(t, c, postboxredis.SubscriberConfig{Stream: name, Group: "g", Block: 50 * time.Millisecond,
		MinIdle: 100 * time.Millisecond, ClaimInterval: 20 * time.Millisecond}), proc)
	proc.waitFor(t, "the later entry", atLeast(1))
	waitSettled(t, c, name, "g")
	if got, _ := proc.deliveries(); len(got) != 1 || got[0].ID != later.ID {
		t.Fatalf("deliveries %+v, want only the later entry", got)
	}
}

// TestHotKeyDoesNotStall: a key whose head waits out a retry, with many
// entries behind it, holds at most half the window; the entries behind
// it past that are dropped from memory and fetched back in their turn,
// so other keys flow meanwhile and the hot key still runs in order.
func TestHotKeyDoesNotStall(t *testing.T) {
	c := client(t, nil)
	ctx := context.Background()
	name := stream(t, c, "g")
	p := publisher(t, c, &postboxredis.Config{Stream: name})
	const hot, cold = 20, 20
	for i := range hot {
		if err := publish(t, p, ctx, envelope("t", "hot", fmt.Sprintf("hot:%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	for i := range cold {
		if err := publish(t, p, ctx, envelope("t", fmt.Sprintf("cold-%d", i), fmt.Sprintf("cold-%d:0", i))); err != nil {
			t.Fatal(err)
		}
	}
	const delay = 1500 * time.Millisecond
	proc := newProcessor(func(_ context.Context, d *postbox.Delivery) postbox.Verdict {
		if string(d.Payload) == "hot:0" && d.Delivered == 1 {
			return postbox.Verdict{Action: postbox.Retry, Delay: delay}
		}
		return postbox.Verdict{Action: postbox.Ack}
	})
	running(t, subscriber(t, c, postboxredis.SubscriberConfig{Stream: name, Group: "g", PerKey: true, MaxInFlight: 4,
		Block: 50 * time.Millisecond}), proc)
	got := proc.waitFor(t, "every entry", atLeast(hot+cold+1))
	_, at := proc.deliveries()
	var retried time.Time
	for i, d := range got {
		if string(d.Payload) == "hot:0" && d.Delivered == 2 {
			retried = at[i]
		}
	}
	next := 0
	for i, d := range got {
		key, n, _ := strings.Cut(string(d.Payload), ":")
		if key != "hot" {
			if !at[i].Before(retried) {
				t.Fatalf("%s handled %s after the hot key's retry: the hot key stalled the Run", key, at[i].Sub(retried))
			}
			continue
		}
		if d.Delivered == 1 && n == "0" {
			continue // the first try of the head
		}
		if n != fmt.Sprint(next) {
			t.Fatalf("hot key: handled %s when %d was due", n, next)
		}
		if want := 1 + btoi(n == "0"); d.Delivered != want {
			t.Fatalf("hot:%s delivered %d, want %d", n, d.Delivered, want)
		}
		next++
	}
	if next != hot {
		t.Fatalf("hot key: %d of %d handled", next, hot)
	}
	waitSettled(t, c, name, "g")
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// waitSettled waits, at most 10s, until nothing is pending in group.
func waitSettled(t *testing.T, c redis.UniversalClient, stream, group string) {
	t.Helper()
	ctx := context.Background()
	deadline := time.After(10 * time.Second)
	for {
		p, err := c.XPending(ctx, stream, group).Result()
		if err == nil && p.Count == 0 {
			return
		}
		select {
		case <-deadline:
			t.Fatalf("still pending in %s > %s: %+v (%v)", stream, group, p, err)
		case <-time.After(10 * time.Millisecond): // polling Redis: no event to wait on
		}
	}
}
