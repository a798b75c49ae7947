package postbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/postbox-go/postbox"
)

type capture struct {
	mu  sync.Mutex
	got []string
}

func (c *capture) Publish(_ context.Context, env *postbox.Envelope, done func(error)) {
	c.mu.Lock()
	c.got = append(c.got, env.Topic+":"+string(env.Payload))
	c.mu.Unlock()
	done(nil)
}

func (c *capture) list() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return fmt.Sprint(c.got)
}

func TestRouting(t *testing.T) {
	d, prefix := newDriver(t)
	ctx := context.Background()
	orders, audit := &capture{}, &capture{}

	// A relay that knows only orders.*: an audit row waits, and so does
	// the rest of its key.
	old, err := postbox.NewClient(d, &postbox.Config{Prefix: prefix, Routes: []postbox.Route{{Topics: "orders.*", Publisher: orders}}})
	if err != nil {
		t.Fatal(err)
	}
	var ve *postbox.ValidationError
	if err := old.Write(ctx, postbox.Message{Topic: "audit.login"}); !errors.As(err, &ve) || ve.Field != "messages[0].topic" {
		t.Fatalf("writing an unrouted topic: %v", err)
	}
	// Another service (or a newer version) writes topics this one does not know.
	writer, err := postbox.NewClient(d, &postbox.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	if err := writer.Write(ctx,
		postbox.Message{Topic: "orders.created", Key: "o1", Payload: []byte("1")},
		postbox.Message{Topic: "audit.order", Key: "o1", Payload: []byte("2")},
		postbox.Message{Topic: "orders.paid", Key: "o1", Payload: []byte("3")},
		postbox.Message{Topic: "orders.paid", Key: "o2", Payload: []byte("4")},
	); err != nil {
		t.Fatal(err)
	}
	if res, err := old.Drain(ctx); err != nil || res.Published != 2 || res.Waiting != 2 {
		t.Fatalf("old relay: %+v, %v", res, err)
	}
	if got := orders.list(); got != "[orders.created:1 orders.paid:4]" {
		t.Fatalf("orders got %s", got)
	}

	// A relay that knows both takes over: the audit row, then its key.
	both, err := postbox.NewClient(d, &postbox.Config{Prefix: prefix, Routes: []postbox.Route{
		{Topics: "orders.*", Publisher: orders}, {Topics: "audit.*", Publisher: audit},
	}})
	if err != nil {
		t.Fatal(err)
	}
	for {
		res, err := both.Drain(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if res.Waiting == 0 {
			break
		}
	}
	if got := orders.list(); got != "[orders.created:1 orders.paid:4 orders.paid:3]" {
		t.Fatalf("orders got %s", got)
	}
	if got := audit.list(); got != "[audit.order:2]" {
		t.Fatalf("audit got %s", got)
	}
	st, err := both.Stats(ctx)
	if err != nil || st.Dead != 0 || st.Pending != 0 {
		t.Fatalf("stats %+v %v", st, err)
	}

	// A catch-all Publisher takes what no route matches.
	rest := &capture{}
	c, err := postbox.NewClient(d, &postbox.Config{Prefix: prefix, Publisher: rest, Routes: []postbox.Route{{Topics: "orders.*", Publisher: orders}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Write(ctx, postbox.Message{Topic: "misc", Payload: []byte("5")}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if rest.list() != "[misc:5]" {
		t.Fatalf("catch-all got %s", rest.list())
	}

	var ce *postbox.ConfigError
	if _, err := postbox.NewClient(d, &postbox.Config{Prefix: prefix, Routes: []postbox.Route{{Topics: "orders.**"}, {Topics: "bad topic*", Publisher: orders}}}); !errors.As(err, &ce) || len(ce.Problems) != 3 {
		t.Fatalf("bad routes: %v", err)
	}
}

type pickyPublisher struct{ capture }

func (*pickyPublisher) CheckMessage(env *postbox.Envelope) error {
	if env.Headers["bad"] != "" {
		return errors.New("header bad is not allowed here")
	}
	if len(env.Payload) > 3 {
		return errors.New("payload over 3 bytes")
	}
	if env.Headers[postbox.HeaderPartitionKey] != env.Key || env.Headers[postbox.HeaderID] != env.ID || env.ID == "" {
		return errors.New("the envelope is not the one the relay would build")
	}
	return nil
}

// A route's publisher can refuse, at write time, a message it could never
// deliver; nothing of the call is written.
func TestRoutePublisherChecksMessages(t *testing.T) {
	d, prefix := newDriver(t)
	ctx := context.Background()
	c, err := postbox.NewClient(d, &postbox.Config{Prefix: prefix, Routes: []postbox.Route{{Topics: "*", Publisher: &pickyPublisher{}}}})
	if err != nil {
		t.Fatal(err)
	}
	var ve *postbox.ValidationError
	err = c.Write(ctx, postbox.Message{Topic: "ok"}, postbox.Message{Topic: "ok", Headers: map[string]string{"bad": "1"}})
	if !errors.As(err, &ve) || ve.Field != "messages[1]" {
		t.Fatalf("err = %v", err)
	}
	if st, _ := c.Stats(ctx); st.Pending != 0 {
		t.Fatalf("%d rows written", st.Pending)
	}
	if err := c.Write(ctx, postbox.Message{Topic: "ok", Key: "k", Payload: []byte("toolong")}); !errors.As(err, &ve) || ve.Field != "messages[0]" {
		t.Fatalf("payload: err = %v", err)
	}
	if err := c.Write(ctx, postbox.Message{Topic: "ok", Key: "k", Payload: []byte("ok")}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"ce_id", "cloudEvents:type", "CloudEvents_source", "CE-ID"} {
		if err := c.Write(ctx, postbox.Message{Topic: "ok", Headers: map[string]string{name: "x"}}); !errors.As(err, &ve) {
			t.Fatalf("reserved header %q accepted: %v", name, err)
		}
	}
}
