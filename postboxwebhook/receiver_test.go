package postboxwebhook_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/postboxwebhook"
)

// processor records deliveries and answers with verdict.
type processor struct {
	mu      sync.Mutex
	got     []*postbox.Delivery
	verdict func(d *postbox.Delivery) postbox.Verdict
}

func (p *processor) Process(_ context.Context, d *postbox.Delivery) postbox.Verdict {
	p.mu.Lock()
	p.got = append(p.got, d)
	p.mu.Unlock()
	if p.verdict == nil {
		return postbox.Verdict{Action: postbox.Ack}
	}
	return p.verdict(d)
}

func (p *processor) deliveries() []*postbox.Delivery {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*postbox.Delivery(nil), p.got...)
}

// receiver serves a Receiver for secret and proc on a test server.
func receiver(t *testing.T, secret string, proc postbox.Processor, cfg *postboxwebhook.ReceiverConfig) *httptest.Server {
	t.Helper()
	v, err := postboxwebhook.NewVerifier(secret)
	if err != nil {
		t.Fatal(err)
	}
	if cfg == nil {
		cfg = &postboxwebhook.ReceiverConfig{}
	}
	cfg.Logger = quiet
	rc, err := postboxwebhook.NewReceiver(v, proc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return server(t, rc)
}

// signedRequest builds a request signed with secret at ts.
func signedRequest(t *testing.T, url, secret, id string, ts time.Time, body []byte) *http.Request {
	t.Helper()
	s, err := postboxwebhook.NewSigner(secret)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("webhook-id", id)
	req.Header.Set("webhook-timestamp", strconv.FormatInt(ts.Unix(), 10))
	req.Header.Set("webhook-signature", s.Sign(id, ts, body))
	return req
}

// do sends req and returns the response's status.
func do(t *testing.T, req *http.Request) int {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// A Publisher's request arrives as the Delivery the envelope describes.
func TestReceiverDelivery(t *testing.T) {
	secret := newSecret(t)
	proc := &processor{}
	srv := receiver(t, secret, proc, &postboxwebhook.ReceiverConfig{IgnoreHeaders: []string{"X-Proxy-Hop"}})
	cfg := one(srv.URL, secret)
	cfg.Destinations[0].Headers = map[string]string{"Authorization": "Bearer dest-token", "X-Proxy-Hop": "1"}
	p := publisher(t, cfg)
	env := envelope("orders.created", "order-€7", `{"id":7}`)
	env.Headers[postbox.HeaderContentType] = "application/json"
	env.Headers[postbox.HeaderSubject] = `Euro € 😀 "quoted" 100%`
	env.Headers["Tenant"] = "acme"
	env.Headers["traceparent"] = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	if err := publish(t, p, context.Background(), env); err != nil {
		t.Fatal(err)
	}
	got := proc.deliveries()
	if len(got) != 1 {
		t.Fatalf("%d deliveries, want 1", len(got))
	}
	d := got[0]
	if d.ID != env.ID || d.Topic != env.Topic || d.Key != env.Key || string(d.Payload) != string(env.Payload) || d.Delivered != 0 {
		t.Fatalf("delivery %+v does not match envelope %+v", d, env)
	}
	want := map[string]string{
		"ce-id": env.ID, "ce-type": "orders.created", "ce-specversion": "1.0", "ce-source": "postboxwebhook-test",
		"ce-time": env.Headers[postbox.HeaderTime], "ce-partitionkey": "order-€7", "ce-subject": `Euro € 😀 "quoted" 100%`,
		"content-type": "application/json", "tenant": "acme", "traceparent": env.Headers["traceparent"],
	}
	for k, v := range want {
		if d.Headers[k] != v {
			t.Errorf("header %s = %q, want %q", k, d.Headers[k], v)
		}
	}
	if len(d.Headers) != len(want) {
		t.Errorf("headers %v: want exactly %d (transport, signature and credential headers left out)", d.Headers, len(want))
	}
}

// The Receiver's answers, and how the sending Publisher counts them.
func TestReceiverStatus(t *testing.T) {
	secret := newSecret(t)
	proc := &processor{verdict: func(d *postbox.Delivery) postbox.Verdict {
		switch string(d.Payload) {
		case "retry":
			return postbox.Verdict{Action: postbox.Retry, Delay: 1500 * time.Millisecond, Err: errors.New("handler failed")}
		case "dead":
			return postbox.Verdict{Action: postbox.DeadLettered, Err: errors.New("handler failed")}
		case "weird":
			return postbox.Verdict{Action: postbox.Action(42)}
		}
		return postbox.Verdict{Action: postbox.Ack}
	}}
	srv := receiver(t, secret, proc, &postboxwebhook.ReceiverConfig{MaxBodyBytes: 1024})
	p := publisher(t, one(srv.URL, secret))
	status := func(err error) int {
		var se *postboxwebhook.StatusError
		if errors.As(err, &se) {
			return se.StatusCode
		}
		return 0
	}

	if err := publish(t, p, context.Background(), envelope("t", "", "ok")); err != nil {
		t.Fatalf("ack: %v", err)
	}
	if err := publish(t, p, context.Background(), envelope("t", "", "dead")); err != nil {
		t.Fatalf("dead-lettered: %v, want an ack (the consumer keeps the dead letter)", err)
	}
	err := publish(t, p, context.Background(), envelope("t", "", "retry"))
	mustInfra(t, err)
	var se *postboxwebhook.StatusError
	if !errors.As(err, &se) || se.StatusCode != http.StatusServiceUnavailable || se.RetryAfter != 2*time.Second {
		t.Fatalf("retry: %v, want 503 with Retry-After 2", err)
	}
	if err := publish(t, p, context.Background(), envelope("t", "", "weird")); status(err) != 500 {
		t.Fatalf("unknown action: %v, want 500", err)
	}
	err = publish(t, p, context.Background(), envelope("t", "", strings.Repeat("x", 1025)))
	mustPermanent(t, err, postboxwebhook.ErrRejected)
	if status(err) != http.StatusRequestEntityTooLarge {
		t.Fatalf("body over the cap: %v, want 413", err)
	}
	other := publisher(t, one(srv.URL, newSecret(t)))
	err = publish(t, other, context.Background(), envelope("t", "", "ok"))
	mustMessage(t, err, postboxwebhook.ErrRejected)
	if status(err) != http.StatusUnauthorized {
		t.Fatalf("wrong secret: %v, want 401", err)
	}

	now := time.Now()
	cases := []struct {
		name string
		req  func() *http.Request
		want int
	}{
		{"expired", func() *http.Request {
			return signedRequest(t, srv.URL, secret, "msg_1", now.Add(-time.Hour), []byte("ok"))
		}, http.StatusUnauthorized},
		{"tampered", func() *http.Request {
			r := signedRequest(t, srv.URL, secret, "msg_1", now, []byte("ok"))
			r.Body = io.NopCloser(strings.NewReader("OK"))
			return r
		}, http.StatusUnauthorized},
		{"unsigned", func() *http.Request {
			r, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("ok"))
			return r
		}, http.StatusBadRequest},
		{"bad timestamp", func() *http.Request {
			r := signedRequest(t, srv.URL, secret, "msg_1", now, []byte("ok"))
			r.Header.Set("webhook-timestamp", "soon")
			return r
		}, http.StatusBadRequest},
		{"id with a space", func() *http.Request {
			return signedRequest(t, srv.URL, secret, "msg 1", now, []byte("ok"))
		}, http.StatusBadRequest},
		{"bad attribute encoding", func() *http.Request {
			r := signedRequest(t, srv.URL, secret, "msg_1", now, []byte("ok"))
			r.Header.Set("ce-subject", "%C0%A0")
			return r
		}, http.StatusBadRequest},
		{"chunked body over the cap", func() *http.Request {
			body := []byte(strings.Repeat("y", 4096))
			r := signedRequest(t, srv.URL, secret, "msg_1", now, body)
			r.ContentLength = -1
			r.Body = io.NopCloser(bytes.NewReader(body))
			return r
		}, http.StatusRequestEntityTooLarge},
		{"GET", func() *http.Request {
			r, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
			return r
		}, http.StatusMethodNotAllowed},
	}
	before := len(proc.deliveries())
	for _, c := range cases {
		if got := do(t, c.req()); got != c.want {
			t.Errorf("%s: status %d, want %d", c.name, got, c.want)
		}
	}
	if n := len(proc.deliveries()) - before; n != 0 {
		t.Fatalf("%d refused requests reached the processor", n)
	}
}

func TestReceiverConfigValidation(t *testing.T) {
	_, err := postboxwebhook.NewReceiver(nil, nil, &postboxwebhook.ReceiverConfig{MaxBodyBytes: -1, IgnoreHeaders: []string{"ok", "not ok"}})
	var ce *postbox.ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("NewReceiver: %v, want a *postbox.ConfigError", err)
	}
	var fields []string
	for _, p := range ce.Problems {
		fields = append(fields, p.Field)
	}
	if strings.Join(fields, ",") != "verifier,processor,MaxBodyBytes,IgnoreHeaders[1]" {
		t.Fatalf("problems %v", fields)
	}
}
