package postboxredis_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/pubtest"
	"github.com/postbox-go/postbox/postboxredis"
)

// problemFields returns the fields a *postbox.ConfigError names.
func problemFields(t *testing.T, err error) map[string]bool {
	t.Helper()
	var ce *postbox.ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("got %v, want a *postbox.ConfigError", err)
	}
	out := map[string]bool{}
	for _, p := range ce.Problems {
		out[p.Field] = true
	}
	return out
}

func TestConfigValidation(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: redisAddr()})
	t.Cleanup(func() { _ = c.Close() })

	_, err := postboxredis.New(c, &postboxredis.Config{
		Stream: "a b", StreamPrefix: "x:", MaxLen: -1, DedupeWindow: time.Millisecond,
		PublishTimeout: time.Hour, MaxPending: -1, Pipelines: 1000, MaxBatch: -1,
		MaxEntryBytes: 10, MinReplicas: -1, ReplicaTimeout: time.Second,
	})
	got := problemFields(t, err)
	for _, f := range []string{"Stream", "StreamPrefix", "MaxLen", "DedupeWindow", "PublishTimeout", "MaxPending", "Pipelines", "MaxBatch", "MaxEntryBytes", "MinReplicas", "ReplicaTimeout"} {
		if !got[f] {
			t.Errorf("problem with %s not reported: %v", f, err)
		}
	}
	_, err = postboxredis.New(c, &postboxredis.Config{StreamPrefix: "bad prefix", TrimExact: true, DisableDedupe: true, DedupeWindow: time.Minute})
	got = problemFields(t, err)
	for _, f := range []string{"StreamPrefix", "TrimExact", "DedupeWindow"} {
		if !got[f] {
			t.Errorf("problem with %s not reported: %v", f, err)
		}
	}
	_, err = postboxredis.New(c, &postboxredis.Config{MinReplicas: 1, ReplicaTimeout: time.Minute, PublishTimeout: 2 * time.Minute})
	if got := problemFields(t, err); !got["ReplicaTimeout"] {
		t.Errorf("a ReplicaTimeout over the client's ReadTimeout was accepted: %v", err)
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{redisAddr()}})
	t.Cleanup(func() { _ = cc.Close() })
	_, err = postboxredis.New(cc, &postboxredis.Config{MinReplicas: 1})
	if got := problemFields(t, err); !got["MinReplicas"] {
		t.Errorf("MinReplicas on a cluster client was accepted: %v", err)
	}
	if _, err := postboxredis.New(nil, nil); err == nil || errors.As(err, new(*postbox.ConfigError)) {
		t.Errorf("New without a client: %v", err)
	}

	d := (*postboxredis.Config)(nil).WithDefaults()
	if d.PublishTimeout != postboxredis.DefaultPublishTimeout || d.MaxPending != postboxredis.DefaultMaxPending ||
		d.DedupeWindow != postboxredis.DefaultDedupeWindow || d.Pipelines != postboxredis.DefaultPipelines ||
		d.MaxBatch != postboxredis.DefaultMaxBatch || d.MaxEntryBytes != postboxredis.DefaultMaxEntryBytes || d.ReplicaTimeout != 0 {
		t.Fatalf("defaults: %+v", d)
	}
	if err := d.Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	if d := (&postboxredis.Config{DisableDedupe: true}).WithDefaults(); d.DedupeWindow != 0 || d.Validate() != nil {
		t.Fatalf("DisableDedupe: %+v", d)
	}
}

func TestStreamNames(t *testing.T) {
	for _, ok := range []string{"orders", "events:orders.created", "{tenant-1}:orders", "a{b}c}", "ünïcode"} {
		if err := postboxredis.ValidateStreamName(ok); err != nil {
			t.Errorf("ValidateStreamName(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"", "a b", "tab\there", "nul\x00", "\xff", "a}b", "{}b}", strings.Repeat("s", postboxredis.MaxStreamNameBytes+1)} {
		if err := postboxredis.ValidateStreamName(bad); !errors.Is(err, postboxredis.ErrInvalidStream) {
			t.Errorf("ValidateStreamName(%q) = %v, want ErrInvalidStream", bad, err)
		}
	}
	c := redis.NewClient(&redis.Options{Addr: redisAddr()})
	t.Cleanup(func() { _ = c.Close() })
	p := publisher(t, c, &postboxredis.Config{StreamPrefix: "events:"})
	if s, err := p.Stream("orders.created"); err != nil || s != "events:orders.created" {
		t.Fatalf("Stream = %q, %v", s, err)
	}
	p = publisher(t, c, &postboxredis.Config{Stream: "all"})
	if s, err := p.Stream("orders.created"); err != nil || s != "all" {
		t.Fatalf("Stream = %q, %v", s, err)
	}
}

// TestWireFormat reads back what a publish adds: one entry with the
// fields id, topic, key, payload and headers, the payload byte for byte.
func TestWireFormat(t *testing.T) {
	c := client(t, nil)
	name := stream(t, c, "g")
	p := publisher(t, c, &postboxredis.Config{Stream: name})
	ctx := context.Background()
	env := envelope("orders.created", "order-7", "")
	env.Payload = []byte("binary\x00\xff\xfe payload")
	env.Headers["tenant"] = "acme <&>"
	if err := publish(t, p, ctx, env); err != nil {
		t.Fatal(err)
	}
	keyless := envelope("orders.created", "", "x")
	keyless.Headers = nil
	if err := publish(t, p, ctx, keyless); err != nil {
		t.Fatal(err)
	}
	msgs, err := c.XRange(ctx, name, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) != 2 {
		t.Fatalf("%d entries, want 2", len(msgs))
	}
	v := msgs[0].Values
	if len(v) != 5 || v["id"] != env.ID || v["topic"] != "orders.created" || v["key"] != "order-7" || v["payload"] != string(env.Payload) {
		t.Fatalf("entry %v", v)
	}
	var h map[string]string
	if err := json.Unmarshal([]byte(v["headers"].(string)), &h); err != nil {
		t.Fatal(err)
	}
	if h["tenant"] != "acme <&>" || h[postbox.HeaderID] != env.ID || h[postbox.HeaderPartitionKey] != "order-7" || len(h) != len(env.Headers) {
		t.Fatalf("headers %v, want %v", h, env.Headers)
	}
	v = msgs[1].Values
	if len(v) != 5 || v["key"] != "" || v["headers"] != "{}" {
		t.Fatalf("keyless entry %v", v)
	}
}

// TestDedupe publishes one id twice: one entry, and the guard's key
// holds the entry's id in the stream's slot for the window.
func TestDedupe(t *testing.T) {
	c := client(t, nil)
	ctx := context.Background()
	for _, tagged := range []bool{false, true} {
		t.Run(fmt.Sprintf("hashTag=%v", tagged), func(t *testing.T) {
			name := uniqueName()
			if tagged {
				name = "{" + name + "}:events"
			}
			cleanup(t, name)
			if err := postboxredis.EnsureGroup(ctx, c, name, "g", "0"); err != nil {
				t.Fatal(err)
			}
			p := publisher(t, c, &postboxredis.Config{Stream: name, DedupeWindow: 30 * time.Second})
			env := envelope("t", "k", "x")
			for range 3 {
				if err := publish(t, p, ctx, env); err != nil {
					t.Fatal(err)
				}
			}
			if n := c.XLen(ctx, name).Val(); n != 1 {
				t.Fatalf("%d entries for one id published three times", n)
			}
			key := "{" + name + "}" + postboxredis.DedupeKeySuffix + env.ID
			if tagged {
				key = name + postboxredis.DedupeKeySuffix + env.ID
				t.Cleanup(func() { c.Del(context.Background(), key) })
			}
			ids, _ := c.XRange(ctx, name, "-", "+").Result()
			if got := c.Get(ctx, key).Val(); len(ids) != 1 || got != ids[0].ID {
				t.Fatalf("dedupe key %q holds %q, want the entry id %v", key, got, ids)
			}
			if ttl := c.PTTL(ctx, key).Val(); ttl <= 25*time.Second || ttl > 30*time.Second {
				t.Fatalf("dedupe key expires in %s, want about 30s", ttl)
			}
			if c.ClusterKeySlot(ctx, key).Val() != c.ClusterKeySlot(ctx, name).Val() {
				// CLUSTER KEYSLOT answers on a standalone server too.
				t.Fatalf("dedupe key %q and stream %q hash to different slots", key, name)
			}
		})
	}
	t.Run("Disabled", func(t *testing.T) {
		name := stream(t, c, "g")
		p := publisher(t, c, &postboxredis.Config{Stream: name, DisableDedupe: true})
		env := envelope("t", "", "x")
		for range 2 {
			if err := publish(t, p, ctx, env); err != nil {
				t.Fatal(err)
			}
		}
		if n := c.XLen(ctx, name).Val(); n != 2 {
			t.Fatalf("%d entries without the guard, want 2", n)
		}
	})
}

func TestMaxLen(t *testing.T) {
	c := client(t, nil)
	ctx := context.Background()
	name := stream(t, c, "g")
	p := publisher(t, c, &postboxredis.Config{Stream: name, MaxLen: 10, TrimExact: true})
	for i := range 30 {
		if err := publish(t, p, ctx, envelope("t", "", fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	msgs, err := c.XRange(ctx, name, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) != 10 || msgs[0].Values["payload"] != "20" {
		t.Fatalf("%d entries, want the last 10 (payloads 20 to 29)", len(msgs))
	}
}

// TestManyOutstanding publishes 3,000 messages from 8 goroutines at once,
// more than the window holds: each is added once and reported once.
func TestManyOutstanding(t *testing.T) {
	c := client(t, nil)
	ctx := context.Background()
	name := stream(t, c, "g")
	p := publisher(t, c, &postboxredis.Config{Stream: name, MaxPending: 256, MaxBatch: 64})
	const workers, per = 8, 375
	var mu sync.Mutex
	ids := map[string]bool{}
	var wg sync.WaitGroup
	errs := make(chan error, workers*per)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var inner sync.WaitGroup
			for i := range per {
				env := envelope("t", "", fmt.Sprintf("%d-%d", w, i))
				mu.Lock()
				ids[env.ID] = true
				mu.Unlock()
				inner.Add(1)
				var once sync.Once
				p.Publish(ctx, env, func(err error) {
					once.Do(inner.Done)
					if err != nil {
						errs <- err
					}
				})
			}
			inner.Wait()
		}()
	}
	waited := make(chan struct{})
	go func() { wg.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(30 * time.Second):
		t.Fatal("publishes not settled within 30s")
	}
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := p.Pending(); n != 0 {
		t.Fatalf("%d publishes still pending", n)
	}
	msgs, err := c.XRange(ctx, name, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, m := range msgs {
		id := m.Values["id"].(string)
		if !ids[id] || seen[id] {
			t.Fatalf("entry for id %s unexpected or repeated", id)
		}
		seen[id] = true
	}
	if len(seen) != len(ids) {
		t.Fatalf("%d entries for %d messages", len(seen), len(ids))
	}
}

// TestWindowFull: with the window full, a Publish waits, and gives up
// when its context ends; Close fails what is still awaiting a reply.
func TestWindowFull(t *testing.T) {
	srv := newFakeRedis(t, "") // never answers
	cl := redis.NewClient(&redis.Options{Addr: srv.addr(), MaxRetries: -1, ReadTimeout: 10 * time.Second, DialTimeout: 10 * time.Second})
	t.Cleanup(func() { _ = cl.Close() })
	p, err := postboxredis.New(cl, &postboxredis.Config{Stream: "s", MaxPending: 1, PublishTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	first := pubtest.NewResult(t)
	p.Publish(context.Background(), envelope("t", "", "1"), first.Done)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	mustInfra(t, publish(t, p, ctx, envelope("t", "", "2")), context.DeadlineExceeded)

	closed := make(chan error, 1)
	go func() {
		cctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		closed <- p.Close(cctx)
	}()
	mustInfra(t, first.Wait(10*time.Second), postboxredis.ErrClosed)
	srv.close() // the client's read fails, and the pipeline returns
	if err := <-closed; err != nil {
		t.Fatalf("Close: %v", err)
	}
}

// TestMinReplicas: with no replica attached, WAIT returns 0 and the
// publish fails as an infrastructure failure, though the entry is
// stored; the relay's retry is absorbed by the dedupe guard.
func TestMinReplicas(t *testing.T) {
	c := client(t, nil)
	ctx := context.Background()
	if n := c.Info(ctx, "replication").Val(); strings.Contains(n, "connected_slaves:") && !strings.Contains(n, "connected_slaves:0") {
		t.Skip("this Redis has replicas attached")
	}
	name := stream(t, c, "g")
	p := publisher(t, c, &postboxredis.Config{Stream: name, MinReplicas: 1, ReplicaTimeout: 50 * time.Millisecond})
	env := envelope("t", "", "x")
	for range 2 {
		mustInfra(t, publish(t, p, ctx, env), postboxredis.ErrNotReplicated)
	}
	if n := c.XLen(ctx, name).Val(); n != 1 {
		t.Fatalf("%d entries, want the one the first publish stored", n)
	}
}

// TestCheckDurability: the machine's Redis keeps nothing on disk, which
// the check reports.
func TestCheckDurability(t *testing.T) {
	c := client(t, nil)
	ctx := context.Background()
	cfg := c.ConfigGet(ctx, "appendonly").Val()
	warnings, err := postboxredis.CheckDurability(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, w := range warnings {
		found = found || strings.Contains(w, "appendonly is off")
		t.Log(w)
	}
	if cfg["appendonly"] != "yes" && !found {
		t.Fatalf("appendonly %q not reported: %v", cfg["appendonly"], warnings)
	}
	if _, err := postboxredis.CheckDurability(ctx, nil); err == nil {
		t.Fatal("CheckDurability without a client succeeded")
	}
	srv := newFakeRedis(t, "ERR unknown command 'CONFIG'")
	fc := redis.NewClient(&redis.Options{Addr: srv.addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = fc.Close() })
	if _, err := postboxredis.CheckDurability(ctx, fc); err == nil {
		t.Fatal("CheckDurability succeeded on a server that refuses CONFIG")
	}
}
