package postbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/postbox-go/postbox"
)

// In-process handlers get the relay's guarantees: per-key order, retries
// with backoff for errors and panics, and the dead table after the budget.
func TestLocalHandlers(t *testing.T) {
	d, prefix := newDriver(t)
	ctx := context.Background()
	local := postbox.NewLocalHandlers()
	var mu sync.Mutex
	got := map[string][]string{}
	calls := 0
	if err := local.Register("orders.paid", func(_ context.Context, env *postbox.Envelope) error {
		mu.Lock()
		defer mu.Unlock()
		calls++
		switch string(env.Payload) {
		case "flaky":
			if env.Attempt == 1 {
				return errors.New("not yet")
			}
		case "panics":
			panic("boom")
		}
		got[env.Key] = append(got[env.Key], string(env.Payload))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	var ve *postbox.ValidationError
	if err := local.Register("bad topic", func(context.Context, *postbox.Envelope) error { return nil }); !errors.As(err, &ve) {
		t.Fatalf("bad topic: %v", err)
	}
	c, err := postbox.NewClient(d, &postbox.Config{Prefix: prefix, Publisher: local, MaxAttempts: 2, BackoffBase: time.Millisecond, BackoffMax: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var msgs []postbox.Message
	for i := range 20 {
		msgs = append(msgs, postbox.Message{Topic: "orders.paid", Key: fmt.Sprintf("k%d", i%4), Payload: []byte(fmt.Sprint(i / 4))})
	}
	msgs = append(msgs,
		postbox.Message{Topic: "orders.paid", Key: "k9", Payload: []byte("flaky")},
		postbox.Message{Topic: "orders.paid", Key: "k8", Payload: []byte("panics")},
		postbox.Message{Topic: "orders.unknown"},
	)
	if err := c.Write(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := c.Drain(ctx); err != nil {
			t.Fatal(err)
		}
		st, err := c.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.Pending == 0 {
			if st.Dead != 2 || st.Published != 21 {
				t.Fatalf("stats %+v, want 21 published and the panicking and unknown ones dead", st)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not done: %+v", st)
		}
		time.Sleep(2 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	for k := range 4 {
		if fmt.Sprint(got[fmt.Sprintf("k%d", k)]) != "[0 1 2 3 4]" {
			t.Fatalf("key k%d handled %v", k, got[fmt.Sprintf("k%d", k)])
		}
	}
	if fmt.Sprint(got["k9"]) != "[flaky]" {
		t.Fatalf("flaky message: %v", got["k9"])
	}
}

// A local function names its failure as any publisher does: a permanent
// one is dead at once, an uncounted retry-after spends no attempt.
func TestLocalHandlersNamedFailures(t *testing.T) {
	d, prefix := newDriver(t)
	ctx := context.Background()
	local := postbox.NewLocalHandlers()
	slow := true
	if err := local.Register("orders.paid", func(_ context.Context, env *postbox.Envelope) error {
		switch string(env.Payload) {
		case "never":
			return postbox.Permanent(errors.New("unknown schema"))
		case "later":
			if slow {
				return postbox.RetryAfter(errors.New("downstream busy"), time.Minute, false)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	c, err := postbox.NewClient(d, &postbox.Config{Prefix: prefix, Publisher: local, MaxAttempts: 25})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Write(ctx, postbox.Message{Topic: "orders.paid", Payload: []byte("never")}); err != nil {
		t.Fatal(err)
	}
	if res, err := c.Drain(ctx); err != nil || res.Dead != 1 || res.Failed != 1 {
		t.Fatalf("Drain = %+v, %v; want dead on the first attempt", res, err)
	}
	if err := c.Write(ctx, postbox.Message{Topic: "orders.paid", Payload: []byte("later")}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Drain(ctx); err == nil || postbox.IsMessageError(err) {
		t.Fatalf("Drain = %v, want the infrastructure failure of an uncounted retry-after", err)
	}
	slow = false
	res, err := c.Drain(ctx)
	if err != nil || res.Published != 1 || res.Failed != 0 {
		t.Fatalf("Drain = %+v, %v", res, err)
	}
}
