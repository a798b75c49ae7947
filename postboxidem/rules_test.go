package postboxidem_test

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/postbox-go/postbox/postboxdriver"
	"github.com/postbox-go/postbox/postboxidem"
)

func TestRules(t *testing.T) { each(t, testRules[pgx.Tx], testRules[*sql.Tx]) }

// testRules walks one table of requests through one server, in order: each
// step states the response and what has run and committed so far.
func testRules[TTx any](t *testing.T, e *env[TTx]) {
	a := newApp(e)
	mw := e.middleware(t, testConfig())
	requiredCfg := testConfig()
	requiredCfg.Required = true
	required := e.middleware(t, requiredCfg)
	root := http.NewServeMux()
	root.Handle("/", mw.Handler(a.routes()))
	root.Handle("/required/orders", required.Handler(http.HandlerFunc(a.createOrder)))
	srv := serve(t, a, root)

	long := strings.Repeat("k", 256)
	atCap := strings.Repeat("b", 1024)
	overCap := strings.Repeat("b", 1025)
	var first reply // the response of the first step

	steps := []struct {
		name               string
		method, path, body string
		keys               []string
		status             int
		replayed           bool
		code, field        string
		runs               int64 // handler executions so far
		orders, outbox     int   // committed rows so far
		check              func(t *testing.T, r reply)
	}{
		{name: "first request runs and commits", method: "POST", path: "/orders", body: `{"a":1}`, keys: []string{"k1"},
			status: 201, runs: 1, orders: 1, outbox: 1, check: func(t *testing.T, r reply) {
				first = r
				if r.header.Get("Set-Cookie") == "" || r.header.Get("Location") == "" {
					t.Errorf("the live response lost headers: %v", r.header)
				}
			}},
		{name: "retry replays the stored response", method: "POST", path: "/orders", body: `{"a":1}`, keys: []string{"k1"},
			status: 201, replayed: true, runs: 1, orders: 1, outbox: 1, check: func(t *testing.T, r reply) {
				if r.body != first.body {
					t.Errorf("replayed body %q, first %q", r.body, first.body)
				}
				for _, h := range []string{"Location", "X-Run", "Content-Type"} {
					if r.header.Get(h) != first.header.Get(h) {
						t.Errorf("replayed %s %q, first %q", h, r.header.Get(h), first.header.Get(h))
					}
				}
				if r.header.Get("Set-Cookie") != "" {
					t.Errorf("Set-Cookie replayed: %q", r.header.Get("Set-Cookie"))
				}
			}},
		{name: "quoted key is the same key", method: "POST", path: "/orders", body: `{"a":1}`, keys: []string{`"k1"`},
			status: 201, replayed: true, runs: 1, orders: 1, outbox: 1},
		{name: "same key with another body is 422", method: "POST", path: "/orders", body: `{"a":2}`, keys: []string{"k1"},
			status: 422, code: postboxidem.CodeFingerprintMismatch, field: "body", runs: 1, orders: 1, outbox: 1},
		{name: "same key with another query is another request", method: "POST", path: "/orders?x=1", body: `{"a":1}`, keys: []string{"k1"},
			status: 201, runs: 2, orders: 2, outbox: 2},
		{name: "another caller with the same key is another request", method: "POST", path: "/orders", body: `{"a":1}`, keys: []string{"k1", "", "X-User", "bob"},
			status: 201, runs: 3, orders: 3, outbox: 3},
		{name: "that caller's retry replays its own response", method: "POST", path: "/orders", body: `{"a":1}`, keys: []string{"k1", "", "X-User", "bob"},
			status: 201, replayed: true, runs: 3, orders: 3, outbox: 3, check: func(t *testing.T, r reply) {
				if r.header.Get("X-Run") != "3" {
					t.Errorf("replayed run %q, want bob's run 3", r.header.Get("X-Run"))
				}
			}},
		{name: "a 4xx is stored and committed", method: "POST", path: "/reject", body: `x`, keys: []string{"k1"},
			status: 400, runs: 4, orders: 4, outbox: 4},
		{name: "a stored 4xx is replayed", method: "POST", path: "/reject", body: `x`, keys: []string{"k1"},
			status: 400, replayed: true, runs: 4, orders: 4, outbox: 4, check: func(t *testing.T, r reply) {
				if strings.TrimSpace(r.body) != "rejected" {
					t.Errorf("body %q", r.body)
				}
			}},
		{name: "a 5xx rolls back", method: "POST", path: "/fail", body: `x`, keys: []string{"k2"},
			status: 500, runs: 5, orders: 4, outbox: 4},
		{name: "a 5xx released the key: the retry runs", method: "POST", path: "/fail", body: `x`, keys: []string{"k2"},
			status: 500, runs: 6, orders: 4, outbox: 4},
		{name: "a released key keeps its body: another body is 422", method: "POST", path: "/fail", body: `y`, keys: []string{"k2"},
			status: 422, code: postboxidem.CodeFingerprintMismatch, runs: 6, orders: 4, outbox: 4},
		{name: "502 first", method: "POST", path: "/flaky", body: `x`, keys: []string{"k3"},
			status: 502, runs: 7, orders: 4, outbox: 4},
		{name: "then the retry succeeds", method: "POST", path: "/flaky", body: `x`, keys: []string{"k3"},
			status: 201, runs: 8, orders: 5, outbox: 5},
		{name: "and is replayed", method: "POST", path: "/flaky", body: `x`, keys: []string{"k3"},
			status: 201, replayed: true, runs: 8, orders: 5, outbox: 5},
		{name: "a 429 rolls back and releases", method: "POST", path: "/throttle", body: `x`, keys: []string{"k4"},
			status: 429, runs: 9, orders: 5, outbox: 5},
		{name: "the retry after a 429 runs", method: "POST", path: "/throttle", body: `x`, keys: []string{"k4"},
			status: 201, runs: 10, orders: 6, outbox: 6},
		{name: "a panic rolls back and releases", method: "POST", path: "/panic", body: `x`, keys: []string{"k5"},
			status: 0, runs: 11, orders: 6, outbox: 6},
		{name: "the retry after a panic runs", method: "POST", path: "/panic", body: `x`, keys: []string{"k5"},
			status: 201, runs: 12, orders: 7, outbox: 7},
		{name: "no key passes through", method: "POST", path: "/orders", body: `x`,
			status: 201, runs: 13, orders: 8, outbox: 8},
		{name: "no key passes through again: nothing is recorded", method: "POST", path: "/orders", body: `x`,
			status: 201, runs: 14, orders: 9, outbox: 9},
		{name: "a method not covered passes through", method: "PUT", path: "/orders", body: `x`, keys: []string{"k6"},
			status: 201, runs: 15, orders: 10, outbox: 10},
		{name: "a method not covered is never replayed", method: "PUT", path: "/orders", body: `x`, keys: []string{"k6"},
			status: 201, runs: 16, orders: 11, outbox: 11},
		{name: "missing key on a route that requires one", method: "POST", path: "/required/orders", body: `x`,
			status: 400, code: postboxidem.CodeKeyMissing, field: postboxidem.HeaderKey, runs: 16, orders: 11, outbox: 11},
		{name: "a route that requires a key runs with one", method: "POST", path: "/required/orders", body: `x`, keys: []string{"k7"},
			status: 201, runs: 17, orders: 12, outbox: 12},
		{name: "key of 256 bytes", method: "POST", path: "/orders", body: `x`, keys: []string{long},
			status: 400, code: postboxidem.CodeKeyInvalid, field: postboxidem.HeaderKey, runs: 17, orders: 12, outbox: 12},
		{name: "key with a tab", method: "POST", path: "/orders", body: `x`, keys: []string{"a\tb"},
			status: 400, code: postboxidem.CodeKeyInvalid, runs: 17, orders: 12, outbox: 12},
		{name: "key not ASCII", method: "POST", path: "/orders", body: `x`, keys: []string{"ключ"},
			status: 400, code: postboxidem.CodeKeyInvalid, runs: 17, orders: 12, outbox: 12},
		{name: "empty quoted key", method: "POST", path: "/orders", body: `x`, keys: []string{`""`},
			status: 400, code: postboxidem.CodeKeyInvalid, runs: 17, orders: 12, outbox: 12},
		{name: "key with parameters", method: "POST", path: "/orders", body: `x`, keys: []string{`"k";a=1`},
			status: 400, code: postboxidem.CodeKeyInvalid, runs: 17, orders: 12, outbox: 12},
		{name: "key header twice", method: "POST", path: "/orders", body: `x`, keys: []string{"k8", "k9"},
			status: 400, code: postboxidem.CodeKeyInvalid, runs: 17, orders: 12, outbox: 12},
		{name: "body over the cap", method: "POST", path: "/orders", body: overCap, keys: []string{"k8"},
			status: 413, code: postboxidem.CodeBodyTooLarge, field: "body", runs: 17, orders: 12, outbox: 12},
		{name: "body at the cap", method: "POST", path: "/orders", body: atCap, keys: []string{"k8"},
			status: 201, runs: 18, orders: 13, outbox: 13},
		{name: "response over the cache cap reaches the live caller in full", method: "POST", path: "/big", body: `x`, keys: []string{"k9"},
			status: 201, runs: 19, orders: 14, outbox: 14, check: func(t *testing.T, r reply) {
				id, _ := strconv.ParseInt(strings.TrimPrefix(strings.SplitN(r.body, "\n", 2)[0], "order "), 10, 64)
				if len(r.body) != 4096 || r.body != string(bigBody(id)) {
					t.Errorf("live body of %d bytes, want the full 4096: %.40q", len(r.body), r.body)
				}
			}},
		{name: "its retry gets the sentinel, never a second run", method: "POST", path: "/big", body: `x`, keys: []string{"k9"},
			status: 409, replayed: true, code: postboxidem.CodeResponseNotStored, runs: 19, orders: 14, outbox: 14, check: func(t *testing.T, r reply) {
				if r.problem.OriginalStatus != 201 || r.header.Get("Retry-After") != "" {
					t.Errorf("sentinel: original status %d, Retry-After %q", r.problem.OriginalStatus, r.header.Get("Retry-After"))
				}
			}},
	}
	for _, s := range steps {
		r := send(srv.URL, s.method, s.path, s.body, s.keys...)
		if s.status == 0 {
			if r.err == nil {
				t.Errorf("%s: got %s, want the connection to fail", s.name, r)
			}
		} else if r.status != s.status || r.replayed() != s.replayed {
			t.Errorf("%s: got %s, want %d replayed=%t", s.name, r, s.status, s.replayed)
		}
		if s.code != "" && r.problem.Code != s.code {
			t.Errorf("%s: code %q, want %q (%s)", s.name, r.problem.Code, s.code, r.body)
		}
		if s.field != "" && r.problem.Field != s.field {
			t.Errorf("%s: field %q, want %q", s.name, r.problem.Field, s.field)
		}
		if s.code != "" && r.problem.Error == "" {
			t.Errorf("%s: no error message in %q", s.name, r.body)
		}
		if got := a.runs.Load(); got != s.runs {
			t.Errorf("%s: %d handler runs, want %d", s.name, got, s.runs)
		}
		if got := e.count(t, "orders", ""); got != s.orders {
			t.Errorf("%s: %d orders, want %d", s.name, got, s.orders)
		}
		if got := e.outbox(t); got != int64(s.outbox) {
			t.Errorf("%s: %d outbox messages, want %d", s.name, got, s.outbox)
		}
		if s.check != nil && r.err == nil {
			s.check(t, r)
		}
	}

	t.Run("body over the cap without a length", func(t *testing.T) {
		req, _ := http.NewRequest("POST", srv.URL+"/orders", io.MultiReader(strings.NewReader(overCap)))
		req.Header.Set(postboxidem.HeaderKey, "k10")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 413 || req.ContentLength != 0 {
			t.Errorf("got %d (request length %d), want 413 on a chunked body", resp.StatusCode, req.ContentLength)
		}
	})

	t.Run("an expired record no longer answers", func(t *testing.T) {
		before := a.runs.Load()
		e.exec(t, e.sql.expireRecords)
		r := send(srv.URL, "POST", "/orders", `{"a":3}`, "k1") // another body: the old record is gone
		if r.status != 201 || r.replayed() || a.runs.Load() != before+1 {
			t.Errorf("got %s after %d runs, want a new run", r, a.runs.Load()-before)
		}
		r = send(srv.URL, "POST", "/orders", `{"a":3}`, "k1")
		if !r.replayed() {
			t.Errorf("got %s, want a replay of the new record", r)
		}
	})

	t.Run("the record keeps what the rules say", func(t *testing.T) {
		// k2 failed twice (released), k9's response was too large.
		if n := e.count(t, "idempotency", "state = 'failed'"); n != 1 {
			t.Errorf("%d failed records, want 1 (k2)", n)
		}
		if n := e.count(t, "idempotency", "body IS NULL AND state = 'succeeded'"); n != 1 {
			t.Errorf("%d sentinels, want 1 (k9)", n)
		}
		if n := e.count(t, "idempotency", "state = 'processing'"); n != 0 {
			t.Errorf("%d claims still processing", n)
		}
	})

	t.Run("cleanup deletes the expired records in batches", func(t *testing.T) {
		total := e.count(t, "idempotency", "")
		e.exec(t, e.sql.expireRecords)
		r := send(srv.URL, "POST", "/orders", `fresh`, "k11") // one record that has not expired
		if r.status != 201 {
			t.Fatalf("got %s", r)
		}
		small := testConfig()
		small.CleanupBatch = 2
		n, err := e.middleware(t, small).Cleanup(context.Background())
		if err != nil || n != total {
			t.Fatalf("Cleanup = %d, %v; want %d", n, err, total)
		}
		if left := e.count(t, "idempotency", ""); left != 1 {
			t.Errorf("%d records left, want the fresh one", left)
		}
	})
}

func TestInProgress(t *testing.T) { each(t, testInProgress[pgx.Tx], testInProgress[*sql.Tx]) }

// testInProgress: duplicates of a request still running get 409 with
// Retry-After, and the replay once it has finished.
func testInProgress[TTx any](t *testing.T, e *env[TTx]) {
	a := newApp(e)
	srv := serve(t, a, e.middleware(t, testConfig()).Handler(a.routes()))
	done := make(chan reply, 1)
	go func() { done <- send(srv.URL, "POST", "/block", "x", "b1") }()
	recv(t, a.started, "the handler to start")

	r := send(srv.URL, "POST", "/block", "x", "b1")
	retry, _ := strconv.Atoi(r.header.Get("Retry-After"))
	if r.status != 409 || r.problem.Code != postboxidem.CodeInProgress || retry < 1 || retry > 3600 {
		t.Errorf("duplicate while running: got %s, Retry-After %q", r, r.header.Get("Retry-After"))
	}
	if r = send(srv.URL, "POST", "/block", "y", "b1"); r.status != 422 {
		t.Errorf("another body while running: got %s, want 422", r)
	}
	a.unblock()
	first := recv(t, done, "the first request")
	if first.status != 201 || first.replayed() {
		t.Fatalf("first: %s", first)
	}
	if r = send(srv.URL, "POST", "/block", "x", "b1"); r.status != 201 || !r.replayed() || r.body != first.body {
		t.Errorf("after it finished: got %s, want the replay of %s", r, first)
	}
	if a.runs.Load() != 1 || e.count(t, "orders", "") != 1 || e.outbox(t) != 1 {
		t.Errorf("runs %d, orders %d, outbox %d; want 1 each", a.runs.Load(), e.count(t, "orders", ""), e.outbox(t))
	}
}

func TestServeMux(t *testing.T) { each(t, testServeMux[pgx.Tx], testServeMux[*sql.Tx]) }

// testServeMux: the middleware per route and around a whole ServeMux, with
// path values reaching the handler, and the path part of the key.
func testServeMux[TTx any](t *testing.T, e *env[TTx]) {
	a := newApp(e)
	mw := e.middleware(t, testConfig())
	inner := http.NewServeMux()
	inner.Handle("POST /accounts/{id}/deposits", mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ok := postboxidem.TxFromContext[TTx](r.Context()); !ok {
			http.Error(w, "no transaction", http.StatusInternalServerError)
			return
		}
		w.Header().Set("X-Account", r.PathValue("id"))
		a.createOrder(w, r)
	})))
	inner.HandleFunc("GET /accounts/{id}", func(w http.ResponseWriter, r *http.Request) {
		_, ok := postboxidem.TxFromContext[TTx](r.Context())
		w.Header().Set("X-Tx", strconv.FormatBool(ok))
	})
	perRoute := serve(t, a, inner)

	r1 := send(perRoute.URL, "POST", "/accounts/1/deposits", "10", "d1")
	r2 := send(perRoute.URL, "POST", "/accounts/2/deposits", "10", "d1")
	r3 := send(perRoute.URL, "POST", "/accounts/1/deposits", "10", "d1")
	if r1.status != 201 || r1.header.Get("X-Account") != "1" || r2.status != 201 || r2.replayed() || r2.header.Get("X-Account") != "2" {
		t.Errorf("two routes, one key: %s / %s", r1, r2)
	}
	if !r3.replayed() || r3.body != r1.body || r3.header.Get("X-Account") != "1" {
		t.Errorf("retry on route 1: %s, want the replay of %s", r3, r1)
	}
	if r := send(perRoute.URL, "GET", "/accounts/1", "", "d1"); r.header.Get("X-Tx") != "false" {
		t.Errorf("a GET got a transaction: %s", r)
	}

	// Around the whole mux: the routing happens inside the middleware.
	whole := serve(t, a, mw.Handler(a.routes()))
	w1 := send(whole.URL, "POST", "/orders", "x", "d1")
	w2 := send(whole.URL, "POST", "/orders", "x", "d1")
	if w1.status != 201 || w1.replayed() || !w2.replayed() {
		t.Errorf("whole mux: %s / %s", w1, w2)
	}
	if r := send(whole.URL, "POST", "/nowhere", "x", "d2"); r.status != 404 {
		t.Errorf("unrouted: %s", r)
	}
	if r := send(whole.URL, "POST", "/nowhere", "x", "d2"); r.status != 404 || !r.replayed() {
		t.Errorf("a 404 is an answer and is stored: %s", r)
	}
	if a.runs.Load() != 3 || e.count(t, "orders", "") != 3 || e.outbox(t) != 3 {
		t.Errorf("runs %d, orders %d, outbox %d; want 3 each", a.runs.Load(), e.count(t, "orders", ""), e.outbox(t))
	}
}

func TestNotMigrated(t *testing.T) {
	e := newSQLite(t)
	other := *e
	other.prefix = "missing_"
	mw := other.middleware(t, testConfig())
	a := newApp(e)
	srv := serve(t, a, mw.Handler(a.routes()))
	if r := send(srv.URL, "POST", "/orders", "x", "n1"); r.status != 503 || r.problem.Code != postboxidem.CodeStoreUnavailable || r.header.Get("Retry-After") != "1" {
		t.Errorf("got %s, want 503 store_unavailable", r)
	}
	if a.runs.Load() != 0 {
		t.Errorf("the handler ran without a record")
	}
	_, err := mw.Cleanup(context.Background())
	if !errors.Is(err, postboxdriver.ErrNotMigrated) {
		t.Errorf("Cleanup error %v, want ErrNotMigrated", err)
	}
}
