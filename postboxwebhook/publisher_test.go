package postboxwebhook_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/pubtest"
	"github.com/postbox-go/postbox/postboxwebhook"
)

// Every bad field is named at once, and no secret, header value or URL
// credential appears in the error.
func TestConfigValidation(t *testing.T) {
	const hidden = "hunter2-value"
	cfg := &postboxwebhook.Config{Destinations: []postboxwebhook.Destination{
		{
			Topics:      "bad topic",
			URL:         "ftp://user:" + hidden + "@example.com/x",
			Secrets:     []postboxwebhook.Secret{"whsec_c2hvcnQ=", postboxwebhook.Secret(hidden)},
			Timeout:     time.Millisecond,
			MaxInFlight: -1,
			Headers: map[string]string{
				"Bad Name":          "x",
				"webhook-signature": hidden,
				"X-Broken":          hidden + "\r\nInjected: 1",
				"ce-source":         hidden,
				"Content-Type":      hidden,
				"X-Fine":            hidden,
			},
		},
		{Topics: "orders.*", URL: "https://example.com/orders?token=" + hidden, Secrets: []postboxwebhook.Secret{postboxwebhook.Secret(newSecret(t))}},
		{Topics: "orders.created", URL: "https://example.com/created"},
		{Topics: "x", URL: "http:///nohost"},
		{Topics: "y", URL: "https://example.com/a#frag"},
	}}
	_, err := postboxwebhook.New(cfg)
	var ce *postbox.ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("New: %v, want a *postbox.ConfigError", err)
	}
	got := map[string]bool{}
	for _, p := range ce.Problems {
		got[p.Field] = true
	}
	for _, f := range []string{
		"Destinations[0].Topics", "Destinations[0].URL", "Destinations[0].Secrets[0]", "Destinations[0].Secrets[1]",
		"Destinations[0].Timeout", "Destinations[0].MaxInFlight",
		`Destinations[0].Headers["Bad Name"]`, `Destinations[0].Headers["webhook-signature"]`,
		`Destinations[0].Headers["X-Broken"]`, `Destinations[0].Headers["ce-source"]`, `Destinations[0].Headers["Content-Type"]`,
		"Destinations[2].Topics", "Destinations[2].Secrets",
		"Destinations[3].URL", "Destinations[3].Secrets", "Destinations[4].URL", "Destinations[4].Secrets",
	} {
		if !got[f] {
			t.Errorf("no problem reported for %s", f)
		}
	}
	if len(ce.Problems) != 17 {
		t.Errorf("%d problems, want 17: %v", len(ce.Problems), err)
	}
	if strings.Contains(err.Error(), hidden) || strings.Contains(err.Error(), "c2hvcnQ") {
		t.Fatalf("the error quotes a secret, a header value or a credential: %v", err)
	}
	if _, err := postboxwebhook.New(nil); !errors.As(err, &ce) || ce.Problems[0].Field != "Destinations" {
		t.Fatalf("New(nil): %v, want a problem with Destinations", err)
	}
	p := publisher(t, one("https://example.com/hook", newSecret(t)))
	d := p.Config().Destinations[0]
	if d.Timeout != postboxwebhook.DefaultTimeout || d.MaxInFlight != postboxwebhook.DefaultMaxInFlight {
		t.Fatalf("defaults not filled in: %+v", d)
	}
}

// TestClassification publishes to a receiver answering each status, and
// checks how the relay would count it.
func TestClassification(t *testing.T) {
	secret := newSecret(t)
	cases := []struct {
		codes   []int
		want    error // nil: acknowledged
		message bool  // a message failure, else infrastructure
	}{
		{[]int{200, 201, 202, 204, 299}, nil, false},
		{[]int{400, 401, 403, 404, 405, 409, 410, 413, 415, 422, 431, 451, 499}, postboxwebhook.ErrRejected, true},
		{[]int{300, 301, 302, 303, 304, 307, 308}, postboxwebhook.ErrRedirect, true},
		{[]int{408, 429, 500, 501, 502, 503, 504, 599, 600}, postboxwebhook.ErrUnavailable, false},
	}
	for _, c := range cases {
		for _, code := range c.codes {
			t.Run(strconv.Itoa(code), func(t *testing.T) {
				var hits atomic.Int32
				srv := server(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					hits.Add(1)
					if code >= 300 && code < 400 {
						w.Header().Set("Location", "https://elsewhere.example/hook?token=s3cret")
					}
					if code == 429 || code == 503 {
						w.Header().Set("Retry-After", "7")
					}
					w.WriteHeader(code)
					_, _ = io.WriteString(w, "reason:\tfield \x01 price\nis missing")
				}))
				p := publisher(t, one(srv.URL+"/hook", secret))
				err := publish(t, p, context.Background(), envelope("orders.created", "", "{}"))
				if hits.Load() != 1 {
					t.Fatalf("%d requests, want 1 (redirects are not followed)", hits.Load())
				}
				if got := postboxwebhook.ClassifyStatus(code); !errors.Is(got, c.want) || (got == nil) != (c.want == nil) {
					t.Fatalf("ClassifyStatus(%d) = %v, want %v", code, got, c.want)
				}
				if c.want == nil {
					if err != nil {
						t.Fatalf("status %d: %v, want an ack", code, err)
					}
					return
				}
				switch {
				case code == 410 || code == 413 || code == 431:
					// Gone, Content Too Large, Request Header Fields Too
					// Large: no retry can succeed.
					mustPermanent(t, err, c.want)
				case c.message:
					mustMessage(t, err, c.want)
				default:
					mustInfra(t, err)
				}
				var se *postboxwebhook.StatusError
				if !errors.As(err, &se) || se.StatusCode != code || !errors.Is(err, c.want) {
					t.Fatalf("status %d: %v, want a *StatusError wrapping %v", code, err, c.want)
				}
				if code != 304 && se.Body != "reason: field price is missing" {
					t.Fatalf("body quoted as %q", se.Body)
				}
				if (code == 429 || code == 503) && se.RetryAfter != 7*time.Second {
					t.Fatalf("RetryAfter %s, want 7s", se.RetryAfter)
				}
				if code >= 300 && code < 400 && code != 304 && se.Location != "https://elsewhere.example/hook?(redacted)" {
					t.Fatalf("Location %q", se.Location)
				}
				if strings.Contains(err.Error(), "s3cret") {
					t.Fatalf("the error quotes a credential: %v", err)
				}
			})
		}
	}
}

// The response body is drained up to a limit and quoted briefly; a huge
// answer neither stalls nor bloats the error.
func TestLargeResponseBody(t *testing.T) {
	for _, code := range []int{200, 422} {
		srv := server(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(code)
			chunk := strings.Repeat("x", 64<<10)
			for range 64 { // 4 MiB
				if _, err := io.WriteString(w, chunk); err != nil {
					return
				}
			}
		}))
		p := publisher(t, one(srv.URL, newSecret(t)))
		err := publish(t, p, context.Background(), envelope("t", "", "x"))
		if code == 200 && err != nil {
			t.Fatalf("200 with a large body: %v", err)
		}
		if code == 422 {
			var se *postboxwebhook.StatusError
			if !errors.As(err, &se) || len(se.Body) > 256 {
				t.Fatalf("422 with a large body: %v", err)
			}
		}
	}
}

func TestTransportFailuresAreInfrastructure(t *testing.T) {
	t.Run("ConnectionRefused", func(t *testing.T) {
		p := publisher(t, one(refusedURL(t), newSecret(t)))
		err := publish(t, p, context.Background(), envelope("t", "", "x"))
		mustInfra(t, err)
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
			t.Fatalf("connection refused reported as %v", err)
		}
	})
	t.Run("UntrustedCertificate", func(t *testing.T) {
		srv := httptest.NewUnstartedServer(status(204))
		srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshake
		srv.StartTLS()
		t.Cleanup(srv.Close)
		p := publisher(t, one(srv.URL, newSecret(t)))
		mustInfra(t, publish(t, p, context.Background(), envelope("t", "", "x")))
	})
	t.Run("CanceledContext", func(t *testing.T) {
		var hits atomic.Int32
		srv := server(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
		p := publisher(t, one(srv.URL, newSecret(t)))
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		err := publish(t, p, ctx, envelope("t", "", "x"))
		mustInfra(t, err)
		if !errors.Is(err, context.Canceled) || hits.Load() != 0 {
			t.Fatalf("canceled publish: %v after %d requests", err, hits.Load())
		}
	})
	t.Run("ContextEndsInFlight", func(t *testing.T) {
		arrived := make(chan struct{})
		srv := server(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			hang(r)
			close(arrived)
			<-r.Context().Done()
		}))
		p := publisher(t, one(srv.URL, newSecret(t)))
		ctx, cancel := context.WithCancel(context.Background())
		r := pubtest.NewResult(t)
		p.Publish(ctx, envelope("t", "", "x"), r.Done)
		<-arrived
		cancel()
		if err := r.Wait(15 * time.Second); !errors.Is(err, context.Canceled) || postbox.IsMessageError(err) {
			t.Fatalf("publish whose context ended: %v, want context.Canceled as infrastructure", err)
		}
	})
}

// Each destination has its own timeout: a request to a slow destination
// with a long timeout outlives a fast one's timeout and succeeds.
func TestPerDestinationTimeout(t *testing.T) {
	release := make(chan struct{})
	hung := server(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hang(r)
		<-r.Context().Done()
	}))
	slow := server(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hang(r)
		select {
		case <-release:
			w.WriteHeader(http.StatusNoContent)
		case <-r.Context().Done():
		}
	}))
	secret := postboxwebhook.Secret(newSecret(t))
	p := publisher(t, &postboxwebhook.Config{Destinations: []postboxwebhook.Destination{
		{Topics: "hung", URL: hung.URL, Secrets: []postboxwebhook.Secret{secret}, Timeout: 100 * time.Millisecond},
		{Topics: "slow", URL: slow.URL, Secrets: []postboxwebhook.Secret{secret}, Timeout: 10 * time.Second},
	}})
	slowResult := pubtest.NewResult(t)
	began := time.Now()
	p.Publish(context.Background(), envelope("slow", "", "x"), slowResult.Done)
	err := publish(t, p, context.Background(), envelope("hung", "", "x"))
	mustInfra(t, err)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "timeout 100ms") {
		t.Fatalf("hung destination: %v, want its 100ms timeout", err)
	}
	if d := time.Since(began); d < 100*time.Millisecond {
		t.Fatalf("timed out after %s, before the 100ms timeout", d)
	}
	// The slow destination's request has now been open longer than the
	// hung one's timeout; it still succeeds.
	close(release)
	if err := slowResult.Wait(15 * time.Second); err != nil {
		t.Fatalf("slow destination with a 10s timeout: %v", err)
	}
}

func TestMessageFailuresBeforeSending(t *testing.T) {
	var hits atomic.Int32
	srv := server(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	secret := postboxwebhook.Secret(newSecret(t))
	p := publisher(t, &postboxwebhook.Config{Destinations: []postboxwebhook.Destination{
		{Topics: "orders.*", URL: srv.URL, Secrets: []postboxwebhook.Secret{secret}},
	}})
	mod := func(f func(env *postbox.Envelope)) *postbox.Envelope {
		env := envelope("orders.created", "", "x")
		f(env)
		return env
	}
	cases := []struct {
		name string
		env  *postbox.Envelope
		want error
	}{
		{"no destination", envelope("users.created", "", "x"), postboxwebhook.ErrNoDestination},
		{"empty id", mod(func(e *postbox.Envelope) { e.ID = "" }), postboxwebhook.ErrInvalidID},
		{"dotted id", mod(func(e *postbox.Envelope) { e.ID = "a.1" }), postboxwebhook.ErrInvalidID},
		{"id with a space", mod(func(e *postbox.Envelope) { e.ID = "a 1" }), postboxwebhook.ErrInvalidID},
		{"signature header", mod(func(e *postbox.Envelope) { e.Headers["webhook-signature"] = "v1,x" }), postboxwebhook.ErrInvalidHeader},
		{"host header", mod(func(e *postbox.Envelope) { e.Headers["Host"] = "evil.example" }), postboxwebhook.ErrInvalidHeader},
		{"content-length header", mod(func(e *postbox.Envelope) { e.Headers["Content-Length"] = "1" }), postboxwebhook.ErrInvalidHeader},
		{"header name", mod(func(e *postbox.Envelope) { e.Headers["a b"] = "x" }), postboxwebhook.ErrInvalidHeader},
		{"header value", mod(func(e *postbox.Envelope) { e.Headers["x-a"] = "1\r\nInjected: yes" }), postboxwebhook.ErrInvalidHeader},
		{"names differing in case", mod(func(e *postbox.Envelope) { e.Headers["X-A"], e.Headers["x-a"] = "1", "2" }), postboxwebhook.ErrInvalidHeader},
		{"attribute not UTF-8", mod(func(e *postbox.Envelope) { e.Headers["ce-subject"] = "\xff" }), postboxwebhook.ErrInvalidHeader},
		{"content type", mod(func(e *postbox.Envelope) { e.Headers["content-type"] = "text/plain\n" }), postboxwebhook.ErrInvalidHeader},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if errors.Is(c.want, postboxwebhook.ErrNoDestination) {
				// Destinations are configuration: a message failure,
				// retried, so that a fixed configuration delivers it.
				mustMessage(t, publish(t, p, context.Background(), c.env), c.want)
				return
			}
			mustPermanent(t, publish(t, p, context.Background(), c.env), c.want)
			if err := p.CheckMessage(c.env); !errors.Is(err, c.want) {
				t.Errorf("CheckMessage = %v, want it to refuse with %v", err, c.want)
			}
		})
	}
	if hits.Load() != 0 {
		t.Fatalf("%d requests sent for messages that cannot be sent", hits.Load())
	}
}

// TestRequest checks the request on the wire: body, content type,
// Standard Webhooks headers with a signature per secret, CloudEvents
// attributes percent-encoded, the message's and the destination's headers.
func TestRequest(t *testing.T) {
	oldS, newS := newSecret(t), newSecret(t)
	got := make(chan *http.Request, 2)
	bodies := make(chan []byte, 2)
	srv := server(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- r
		bodies <- b
		w.WriteHeader(http.StatusOK)
	}))
	cfg := one(srv.URL+"/hooks/orders?tenant=acme", newS, oldS)
	cfg.Destinations[0].Headers = map[string]string{"Authorization": "Bearer dest-token", "X-Team": "dest"}
	p := publisher(t, cfg)

	env := envelope("orders.created", "order-7", `{"id":7}`)
	env.Headers[postbox.HeaderContentType] = "application/json"
	env.Headers[postbox.HeaderSubject] = "Euro € 😀"
	env.Headers["tenant"] = "acme"
	env.Headers["X-Team"] = "message"
	env.Headers["traceparent"] = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	before := time.Now().Unix()
	if err := publish(t, p, context.Background(), env); err != nil {
		t.Fatal(err)
	}
	r, body := <-got, <-bodies
	if r.Method != http.MethodPost || r.URL.Path != "/hooks/orders" || r.URL.Query().Get("tenant") != "acme" {
		t.Fatalf("request %s %s", r.Method, r.URL)
	}
	if string(body) != `{"id":7}` {
		t.Fatalf("body %q", body)
	}
	h := r.Header
	want := map[string]string{
		"Content-Type":    "application/json",
		"Webhook-Id":      env.ID,
		"Idempotency-Key": env.ID,
		"Ce-Id":           env.ID,
		"Ce-Type":         "orders.created",
		"Ce-Specversion":  "1.0",
		"Ce-Source":       "postboxwebhook-test",
		"Ce-Partitionkey": "order-7",
		"Ce-Subject":      "Euro%20%E2%82%AC%20%F0%9F%98%80", // the binding's own example
		"Ce-Time":         env.Headers[postbox.HeaderTime],
		"Tenant":          "acme",
		"Traceparent":     env.Headers["traceparent"],
		"Authorization":   "Bearer dest-token",
		"X-Team":          "dest", // the destination's header wins
	}
	for k, v := range want {
		if got := h.Values(k); len(got) != 1 || got[0] != v {
			t.Errorf("%s: %q, want %q", k, got, v)
		}
	}
	if h.Get("Ce-Datacontenttype") != "" {
		t.Error("ce-datacontenttype sent in binary mode")
	}
	ts, err := strconv.ParseInt(h.Get("Webhook-Timestamp"), 10, 64)
	if err != nil || ts < before || ts > time.Now().Unix() {
		t.Fatalf("webhook-timestamp %q, want now", h.Get("Webhook-Timestamp"))
	}
	if n := len(strings.Fields(h.Get("Webhook-Signature"))); n != 2 {
		t.Fatalf("webhook-signature %q has %d entries, want one per secret", h.Get("Webhook-Signature"), n)
	}
	for _, s := range []string{oldS, newS} {
		v, err := postboxwebhook.NewVerifier(s)
		if err != nil {
			t.Fatal(err)
		}
		if err := v.Verify(h, body); err != nil {
			t.Fatalf("a receiver with one of the secrets: %v", err)
		}
	}

	// No content type: application/octet-stream.
	if err := publish(t, p, context.Background(), envelope("orders.created", "", "raw")); err != nil {
		t.Fatal(err)
	}
	r = <-got
	<-bodies
	if ct := r.Header.Get("Content-Type"); ct != postboxwebhook.DefaultContentType {
		t.Fatalf("Content-Type %q without a content-type header, want %s", ct, postboxwebhook.DefaultContentType)
	}
}

func TestCloudEventsHeaderCodec(t *testing.T) {
	for _, s := range []string{"", "plain", "a b\"c%d", "Euro € 😀", "tab\there", "\x7f\x00", "100%"} {
		enc := postboxwebhook.CEEncode(s)
		for i := 0; i < len(enc); i++ {
			if c := enc[i]; c <= ' ' || c >= 0x7f || c == '"' {
				t.Fatalf("encoded %q as %q, which holds %q", s, enc, c)
			}
		}
		dec, err := postboxwebhook.CEDecode(enc)
		if err != nil || dec != s {
			t.Fatalf("round trip of %q: %q, %v", s, dec, err)
		}
	}
	for in, want := range map[string]string{
		`"quoted value"`:     "quoted value",
		`"esc\"aped\\"`:      `esc"aped\`,
		"lower%e2%82%ac":     "lower€",
		"%41%42":             "AB",
		`"%20in quotes%20"`:  " in quotes ",
		"plain-ascii_value.": "plain-ascii_value.",
	} {
		if got, err := postboxwebhook.CEDecode(in); err != nil || got != want {
			t.Errorf("CEDecode(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"%", "%4", "%zz", "%C0%A0", "%FF", `"a\"`, `"a"b"`} {
		if _, err := postboxwebhook.CEDecode(bad); err == nil {
			t.Errorf("CEDecode(%q) accepted", bad)
		}
	}
}

// Routing follows postbox.Route: the first matching pattern wins.
func TestRouting(t *testing.T) {
	hits := make(chan string, 3)
	handler := func(name string) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits <- name })
	}
	secret := []postboxwebhook.Secret{postboxwebhook.Secret(newSecret(t))}
	p := publisher(t, &postboxwebhook.Config{Destinations: []postboxwebhook.Destination{
		{Topics: "orders.created", URL: server(t, handler("exact")).URL, Secrets: secret},
		{Topics: "orders.*", URL: server(t, handler("prefix")).URL, Secrets: secret},
		{Topics: "*", URL: server(t, handler("all")).URL, Secrets: secret},
	}})
	for topic, want := range map[string]string{"orders.created": "exact", "orders.paid": "prefix", "users.created": "all"} {
		if err := publish(t, p, context.Background(), envelope(topic, "", "x")); err != nil {
			t.Fatal(err)
		}
		if got := <-hits; got != want {
			t.Fatalf("topic %s went to %s, want %s", topic, got, want)
		}
	}
}

// MaxInFlight bounds the open requests per destination; a Publish waits
// for a slot until its context ends.
func TestMaxInFlight(t *testing.T) {
	arrived := make(chan struct{}, 2)
	gate := make(chan struct{})
	srv := server(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hang(r)
		arrived <- struct{}{}
		<-gate
	}))
	cfg := one(srv.URL, newSecret(t))
	cfg.Destinations[0].MaxInFlight = 2
	p := publisher(t, cfg)
	first, second := pubtest.NewResult(t), pubtest.NewResult(t)
	p.Publish(context.Background(), envelope("t", "", "1"), first.Done)
	p.Publish(context.Background(), envelope("t", "", "2"), second.Done)
	<-arrived
	<-arrived
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := publish(t, p, ctx, envelope("t", "", "3"))
	if !errors.Is(err, context.DeadlineExceeded) || postbox.IsMessageError(err) {
		t.Fatalf("publish beyond MaxInFlight: %v, want its context's end as infrastructure", err)
	}
	close(gate)
	if err := first.Wait(15 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := second.Wait(15 * time.Second); err != nil {
		t.Fatal(err)
	}
}

// Concurrent publishes from many goroutines: each done runs once, and no
// destination ever has more than MaxInFlight requests open.
func TestConcurrentPublish(t *testing.T) {
	const maxInFlight, goroutines, each = 4, 8, 50
	var open, peak, total atomic.Int32
	srv := server(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := open.Add(1)
		defer open.Add(-1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		total.Add(1)
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			t.Error(err)
		}
		if r.Header.Get("Ce-Type") == "fail" {
			w.WriteHeader(http.StatusUnprocessableEntity)
		}
	}))
	cfg := one(srv.URL, newSecret(t))
	cfg.Destinations[0].MaxInFlight = maxInFlight
	p := publisher(t, cfg)
	var wg sync.WaitGroup
	errs := make(chan error, goroutines*each)
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				topic := "ok"
				if i%10 == 0 {
					topic = "fail"
				}
				err := publishAsync(p, envelope(topic, fmt.Sprintf("k%d", g), strconv.Itoa(i)))
				if (topic == "fail") != postbox.IsMessageError(err) || topic == "ok" && err != nil {
					errs <- fmt.Errorf("topic %s: %w", topic, err)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if total.Load() != goroutines*each {
		t.Fatalf("%d requests, want %d", total.Load(), goroutines*each)
	}
	if peak.Load() > maxInFlight {
		t.Fatalf("%d requests open at once, over MaxInFlight %d", peak.Load(), maxInFlight)
	}
}

// Close fails later publishes, waits for open ones until its context
// ends, then cancels them.
func TestClose(t *testing.T) {
	arrived := make(chan struct{}, 1)
	srv := server(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hang(r)
		arrived <- struct{}{}
		<-r.Context().Done()
	}))
	p, err := postboxwebhook.New(one(srv.URL, newSecret(t)))
	if err != nil {
		t.Fatal(err)
	}
	open := pubtest.NewResult(t)
	p.Publish(context.Background(), envelope("t", "", "x"), open.Done)
	<-arrived
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := p.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close with a request open past its context: %v", err)
	}
	if err := open.Wait(15 * time.Second); !errors.Is(err, postboxwebhook.ErrClosed) || postbox.IsMessageError(err) {
		t.Fatalf("request cut off by Close: %v, want ErrClosed as infrastructure", err)
	}
	err = publish(t, p, context.Background(), envelope("t", "", "x"))
	if !errors.Is(err, postboxwebhook.ErrClosed) || postbox.IsMessageError(err) {
		t.Fatalf("publish after Close: %v, want ErrClosed as infrastructure", err)
	}
	if err := p.Close(context.Background()); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// A caller's Client is used (here one that trusts a test TLS server), but
// never follows redirects.
func TestCallerClient(t *testing.T) {
	var redirected atomic.Int32
	target := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { redirected.Add(1) }))
	t.Cleanup(target.Close)
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/moved" {
			http.Redirect(w, r, target.URL, http.StatusTemporaryRedirect)
			return
		}
		w.WriteHeader(http.StatusAccepted)
	}))
	t.Cleanup(srv.Close)
	client := srv.Client()
	t.Cleanup(client.CloseIdleConnections)
	secret := []postboxwebhook.Secret{postboxwebhook.Secret(newSecret(t))}
	p := publisher(t, &postboxwebhook.Config{Client: client, Destinations: []postboxwebhook.Destination{
		{Topics: "moved", URL: srv.URL + "/moved", Secrets: secret},
		{Topics: "*", URL: srv.URL + "/hook", Secrets: secret},
	}})
	if err := publish(t, p, context.Background(), envelope("ok", "", "x")); err != nil {
		t.Fatalf("over TLS with the caller's client: %v", err)
	}
	mustMessage(t, publish(t, p, context.Background(), envelope("moved", "", "x")), postboxwebhook.ErrRedirect)
	if redirected.Load() != 0 {
		t.Fatal("the redirect was followed")
	}
	if client.CheckRedirect != nil {
		t.Fatal("the caller's client was changed")
	}
}

// publishAsync publishes without the testing.T, for other goroutines.
func publishAsync(p postbox.Publisher, env *postbox.Envelope) error {
	ch := make(chan error, 2)
	p.Publish(context.Background(), env, func(err error) { ch <- err })
	select {
	case err := <-ch:
		select {
		case <-ch:
			return errors.New("done called twice")
		default:
		}
		return err
	case <-time.After(15 * time.Second):
		return errors.New("done not called within 15s")
	}
}
