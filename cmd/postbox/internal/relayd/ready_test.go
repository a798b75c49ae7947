package relayd_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/postbox-go/postbox/cmd/postbox/internal/relayd"
	"github.com/postbox-go/postbox/internal/testdb"
)

// closedPort returns a loopback address where nothing listens.
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// /readyz checks every broker a route uses, and each routed topic against
// its route's limits; topics no route takes are reported as unrouted in
// the status and the metrics and do not fail readiness. Webhooks are
// routes like the brokers: rows of their topics are POSTed to them.
func TestReadyChecksBrokersAndRouteLimits(t *testing.T) {
	ctx := context.Background()
	pool, prefix := testdb.Migrated(t)
	_, natsURL := embeddedNATS(t)
	var received atomic.Int64
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		received.Add(1)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer hook.Close()

	cfg, err := relayd.Parse([]byte(`
nats:
  streams: [{name: RDY, subjects: ["orders.>", "slow.>"]}]
redis: {url: "redis://`+closedPort(t)+`/0"}
webhooks:
  - {name: partner, url: "`+hook.URL+`/hook", secrets: ["${HOOK_SECRET}"]}
routes:
  - {topics: "orders.*", publisher: nats, max_pending: 2}
  - {topics: "slow.*", publisher: nats, max_pending_age: 1h}
  - {topics: "audit.*", publisher: redis}
  - {topics: "partner.*", publisher: "webhook:partner"}
ready: {max_pending_age: 5m}
relay: {lease: 3s, poll_interval: 20ms}
admin: {listen: "127.0.0.1:0"}
`), env(map[string]string{"POSTBOX_DATABASE_URL": testdb.PostgresURL(), "POSTBOX_PREFIX": prefix, "POSTBOX_NATS_URL": natsURL,
		"HOOK_SECRET": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}))
	if err != nil {
		t.Fatal(err)
	}
	d, err := relayd.Start(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = d.Stop(ctx) }()

	// Rows that wait (retries due in an hour: a row that never failed is
	// due at once), created in the past: three of orders (over its
	// route's count), one of slow, ten minutes old (within its route's
	// hour), one of a topic no route takes, ten minutes old (past the
	// default 5m, but not this relay's to publish).
	if _, err := pool.Exec(ctx, `INSERT INTO `+prefix+`outbox (id, topic, payload, created_at, available_at, attempts) VALUES
 (gen_random_uuid(), 'orders.paid', '\x00', now() - interval '1 minute', now() + interval '1 hour', 1),
 (gen_random_uuid(), 'orders.paid', '\x00', now() - interval '1 minute', now() + interval '1 hour', 1),
 (gen_random_uuid(), 'orders.paid', '\x00', now() - interval '1 minute', now() + interval '1 hour', 1),
 (gen_random_uuid(), 'slow.report', '\x00', now() - interval '10 minutes', now() + interval '1 hour', 1),
 (gen_random_uuid(), 'unknown.thing', '\x00', now() - interval '10 minutes', now(), 0)`); err != nil {
		t.Fatal(err)
	}
	err = d.Ready(ctx)
	if err == nil {
		t.Fatal("ready with redis down and orders over its limit")
	}
	msg := err.Error()
	for _, want := range []string{"topic orders.paid: 3 messages pending (limit 2, route orders.*)", "redis at redis://127.0.0.1:"} {
		if !strings.Contains(msg, want) {
			t.Errorf("readiness error lacks %q:\n%s", want, msg)
		}
	}
	for _, not := range []string{"unknown.thing", "slow.report", "NATS", "webhook"} {
		if strings.Contains(msg, not) {
			t.Errorf("readiness error names %q:\n%s", not, msg)
		}
	}

	get := func(path string) string {
		resp, err := http.Get("http://" + d.Addr() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	var st struct {
		UnroutedPending int64 `json:"unrouted_pending"`
		Topics          []struct {
			Topic  string `json:"topic"`
			Routed bool   `json:"routed"`
		} `json:"topics"`
	}
	if err := json.Unmarshal([]byte(get("/v1/status")), &st); err != nil {
		t.Fatal(err)
	}
	if st.UnroutedPending != 1 {
		t.Errorf("unrouted_pending %d, want 1", st.UnroutedPending)
	}
	for _, tp := range st.Topics {
		if tp.Routed != (tp.Topic != "unknown.thing") {
			t.Errorf("topic %s routed %v", tp.Topic, tp.Routed)
		}
	}
	if m := get("/metrics"); !strings.Contains(m, `postbox_topic_unrouted{shard="0",topic="unknown.thing"} 1`) || !strings.Contains(m, `postbox_unrouted_pending{shard="0"} 1`) {
		t.Errorf("metrics lack the unrouted topic:\n%s", m)
	}
	if body := get("/v1/consumers/dead"); !strings.Contains(body, `"dead_letters": []`) {
		t.Errorf("consumers' dead messages not served: %s", body)
	}
	if page := get("/"); !strings.Contains(page, `<th scope="row">unknown.thing</th><td>unrouted (waits)</td>`) {
		t.Errorf("dashboard does not mark the unrouted topic")
	}

	// A webhook route publishes; a webhook that stops answering fails
	// readiness.
	if _, err := pool.Exec(ctx, `INSERT INTO `+prefix+`outbox (id, topic, payload) VALUES (gen_random_uuid(), 'partner.signup', '{}')`); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for received.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the webhook never received the message")
		}
		time.Sleep(10 * time.Millisecond)
	}
	hook.Close()
	if err := d.Ready(ctx); err == nil || !strings.Contains(err.Error(), "webhook partner: ") {
		t.Fatalf("ready with the webhook's host closed: %v", err)
	}
}
