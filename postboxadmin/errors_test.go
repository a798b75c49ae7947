package postboxadmin_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/testdb"
	"github.com/postbox-go/postbox/postboxadmin"
	"github.com/postbox-go/postbox/postboxpgx"
)

// TestBadRequests sends every kind of bad request: each gets its status,
// a JSON error naming the field at fault, and changes nothing.
func TestBadRequests(t *testing.T) {
	f := postgresFixture(t)
	a := serve(t, &postboxadmin.Config{Admin: f.admin, ConsumerDead: f.inbox, Tokens: tokens()})
	id := f.dead["o3"]
	long := strings.Repeat("k", postbox.MaxKeyBytes+1)
	for _, c := range []struct {
		name, method, path, body string
		status                   int
		field, msg               string
	}{
		// Bodies.
		{"malformed JSON", "POST", "/v1/dead/requeue", `{"ids":`, 400, "", "malformed JSON"},
		{"syntax error", "POST", "/v1/dead/requeue", `{"ids" 1}`, 400, "", "malformed JSON"},
		{"not an object", "POST", "/v1/dead/delete", `["x"]`, 400, "", "must be a JSON object"},
		{"null body", "POST", "/v1/dead/delete", `null`, 400, "", "must be a JSON object"},
		{"empty body", "POST", "/v1/replay", ``, 400, "", "must be a JSON object"},
		{"data after the object", "POST", "/v1/dead/delete", `{"all":true} {}`, 400, "", "data after the object"},
		{"unknown field", "POST", "/v1/dead/requeue", `{"idz":[]}`, 400, "idz", "unknown field"},
		{"field given twice", "POST", "/v1/dead/delete", `{"all":false,"all":true}`, 400, "all", "given twice"},
		{"field given twice, escaped", "POST", "/v1/dead/requeue", `{"all":false,"a\u006cl":true}`, 400, "all", "given twice"},
		{"field in another case", "POST", "/v1/dead/requeue", `{"IDS":["` + id + `"]}`, 400, "IDS", "unknown field"},
		{"ids not an array", "POST", "/v1/dead/requeue", `{"ids":"` + id + `"}`, 400, "ids", "array of strings"},
		{"ids of numbers", "POST", "/v1/dead/requeue", `{"ids":[1]}`, 400, "ids", "array of strings"},
		{"all not a bool", "POST", "/v1/dead/delete", `{"all":"yes"}`, 400, "all", "true or false"},
		{"topic a number", "POST", "/v1/dead/delete", `{"topic":7}`, 400, "topic", "a string"},
		{"dry_run a string", "POST", "/v1/replay", `{"since":"1h","dry_run":"no"}`, 400, "dry_run", "true or false"},
		{"prune with a field", "POST", "/v1/prune", `{"older_than":"1h"}`, 400, "older_than", "unknown field"},
		{"prune with an array", "POST", "/v1/prune", `[]`, 400, "", "must be a JSON object"},
		// Values.
		{"bad id", "POST", "/v1/dead/requeue", `{"ids":["` + id + `","x';--"]}`, 400, "ids[1]", "UUID"},
		{"bad id in path", "GET", "/v1/dead/x';--", "", 400, "id", "UUID"},
		{"upper-case id", "GET", "/v1/dead/" + strings.ToUpper(id), "", 400, "id", "UUID"},
		{"bad time", "POST", "/v1/dead/delete", `{"since":"yesterday"}`, 400, "since", "RFC 3339"},
		{"negative duration", "POST", "/v1/dead/delete", `{"until":"-2h"}`, 400, "until", "between 0 and 100 years"},
		{"huge duration", "POST", "/v1/dead/delete", `{"since":"99999999999d"}`, 400, "since", "RFC 3339"},
		{"too many years", "POST", "/v1/dead/delete", `{"since":"40000d"}`, 400, "since", "100 years"},
		{"since after until", "POST", "/v1/dead/delete", `{"since":"1h","until":"2h"}`, 400, "since", "before until"},
		{"bad topic", "POST", "/v1/dead/delete", `{"topic":"bad topic"}`, 400, "topic", "only ASCII letters"},
		{"NUL in key", "POST", "/v1/dead/delete", `{"key":"a\u0000b"}`, 400, "key", "UTF-8"},
		{"long key", "POST", "/v1/dead/delete", `{"key":"` + long + `"}`, 400, "key", "over the limit"},
		{"empty selection", "POST", "/v1/dead/requeue", `{}`, 400, "", `"all": true`},
		{"empty selection with nulls", "POST", "/v1/dead/delete", `{"ids":null,"topic":null,"all":false}`, 400, "", "no messages selected"},
		{"replay without since", "POST", "/v1/replay", `{"topic":"orders.paid"}`, 400, "since", "required"},
		{"replay past the horizon", "POST", "/v1/replay", `{"since":"30d"}`, 422, "since", "retention horizon"},
		{"replay window reversed", "POST", "/v1/replay", `{"since":"1h","until":"2h"}`, 400, "since", "before until"},
		{"replay bad topic", "POST", "/v1/replay", `{"since":"1h","topic":"a/b"}`, 400, "topic", "only ASCII"},
		{"replay NUL key", "POST", "/v1/replay", `{"since":"1h","key":"\u0000"}`, 400, "key", "UTF-8"},
		// Query strings.
		{"bad topic query", "GET", "/v1/dead?topic=bad%20topic", "", 400, "topic", "only ASCII"},
		{"invalid UTF-8 key", "GET", "/v1/dead?key=%FF", "", 400, "key", "UTF-8"},
		{"bad since query", "GET", "/v1/dead?since=soon", "", 400, "since", "RFC 3339"},
		{"limit zero", "GET", "/v1/dead?limit=0", "", 400, "limit", "1 to 10000"},
		{"limit text", "GET", "/v1/replays?limit=ten", "", 400, "limit", "1 to 10000"},
		{"limit too high", "GET", "/v1/consumers/dead?limit=10001", "", 400, "limit", "1 to 10000"},
		{"unknown parameter", "GET", "/v1/dead?topc=orders.paid", "", 400, "topc", "unknown query parameter"},
		{"repeated parameter", "GET", "/v1/dead?topic=a&topic=b", "", 400, "topic", "once"},
		{"parameter on status", "GET", "/v1/status?verbose=1", "", 400, "verbose", "unknown query parameter"},
		{"malformed query", "GET", "/v1/dead?topic=%zz", "", 400, "", "malformed query"},
		{"consumer with a control character", "GET", "/v1/consumers/dead?consumer=a%01", "", 400, "consumer", "printable"},
		{"consumer window reversed", "GET", "/v1/consumers/dead?since=1h&until=2h", "", 400, "since", "before until"},
		{"consumer too long", "GET", "/v1/consumers/" + strings.Repeat("c", 201) + "/dead/m-1", "", 400, "consumer", "printable"},
		{"dead letter id too long", "DELETE", "/v1/consumers/billing/dead/" + strings.Repeat("i", 256), "", 400, "id", "printable"},
		// Paths and methods.
		{"missing dead message", "GET", "/v1/dead/" + postbox.NewID(), "", 404, "", "not found"},
		{"missing dead letter", "GET", "/v1/consumers/billing/dead/nope", "", 404, "", "not found"},
		{"unknown path", "GET", "/v1/nothing", "", 404, "", "no endpoint"},
		{"wrong method", "PUT", "/v1/status", "{}", 405, "", "not allowed"},
		{"GET on a POST path", "GET", "/v1/dead/requeue", "", 405, "", "allowed: POST"},
		{"POST on a GET path", "POST", "/v1/replays", "{}", 405, "", "not allowed"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := a.do(t, c.method, c.path, adminToken, c.body)
			if r.status != c.status || r.field() != c.field || !strings.Contains(r.errText(), c.msg) {
				t.Fatalf("%s %s %s:\n got %d field %q: %s\nwant %d field %q with %q", c.method, c.path, c.body, r.status, r.field(), r.body, c.status, c.field, c.msg)
			}
			if r.status == 405 && r.header.Get("Allow") == "" {
				t.Fatal("405 without Allow")
			}
		})
	}
	// Nothing changed.
	if r := a.must(t, 200, "GET", "/v1/status", readToken, ""); r.json["pending"] != 1.0 || r.json["dead"] != 3.0 || r.json["published_kept"] != 2.0 {
		t.Fatalf("status after bad requests: %s", r)
	}
	if got := list(t, a.must(t, 200, "GET", "/v1/replays", readToken, ""), "replays"); len(got) != 0 {
		t.Fatalf("bad replays were audited: %v", got)
	}
}

func TestBodyTooLarge(t *testing.T) {
	f := postgresFixture(t)
	a := serve(t, &postboxadmin.Config{Admin: f.admin, Tokens: tokens(), MaxBodyBytes: 100})
	ids := `"` + strings.Repeat(postbox.NewID()+`","`, 5) + `"`
	r := a.do(t, "POST", "/v1/dead/delete", adminToken, `{"ids":[`+ids+`]}`)
	if r.status != http.StatusRequestEntityTooLarge || !strings.Contains(r.errText(), "over 100 bytes") {
		t.Fatalf("oversized body: %d %s", r.status, r)
	}
	// The default is 1 MiB.
	b := serve(t, &postboxadmin.Config{Admin: f.admin, Tokens: tokens()})
	if r := b.do(t, "POST", "/v1/replay", adminToken, `{"key":"`+strings.Repeat("k", 1<<20)+`"}`); r.status != http.StatusRequestEntityTooLarge {
		t.Fatalf("1 MiB body: %d %s", r.status, r)
	}
}

// TestAuth checks every endpoint without a token, with a wrong one, and
// with the read scope where admin is needed.
func TestAuth(t *testing.T) {
	f := postgresFixture(t)
	a := serve(t, &postboxadmin.Config{Admin: f.admin, ConsumerDead: f.inbox, Tokens: tokens()})
	read := []string{"GET /v1/status", "GET /v1/dead", "GET /v1/dead/" + f.dead["o3"], "GET /v1/replays",
		"GET /v1/consumers/dead", "GET /v1/consumers/billing/dead/m-1"}
	admin := map[string]string{"POST /v1/dead/requeue": `{"ids":["` + postbox.NewID() + `"]}`, "POST /v1/dead/delete": `{"ids":["` + postbox.NewID() + `"]}`,
		"POST /v1/replay": `{"since":"1m","dry_run":true}`, "POST /v1/prune": ``, "DELETE /v1/consumers/billing/dead/nope": ``}
	type call struct{ method, path, body string }
	var all []call
	for _, e := range read {
		m, p, _ := strings.Cut(e, " ")
		all = append(all, call{m, p, ""})
	}
	for e, body := range admin {
		m, p, _ := strings.Cut(e, " ")
		all = append(all, call{m, p, body})
	}
	for _, c := range all {
		for _, bad := range []struct {
			name, auth, challenge string
		}{
			{"no token", "", `Bearer realm="postbox"`},
			{"wrong token", "Bearer " + strings.Repeat("x", len(adminToken)), `error="invalid_token"`},
			{"a prefix of a token", "Bearer " + adminToken[:20], `error="invalid_token"`},
			{"another scheme", "Basic " + adminToken, `error="invalid_request"`},
			{"no token after the scheme", "Bearer ", `error="invalid_request"`},
		} {
			var r *response
			if bad.auth == "" {
				r = a.do(t, c.method, c.path, "", c.body)
			} else {
				r = a.do(t, c.method, c.path, "", c.body, "Authorization", bad.auth)
			}
			if r.status != 401 || !strings.Contains(r.header.Get("WWW-Authenticate"), bad.challenge) || r.errText() == "" {
				t.Errorf("%s %s, %s: %d %q %s", c.method, c.path, bad.name, r.status, r.header.Get("WWW-Authenticate"), r.body)
			}
		}
		// The scheme is case-insensitive.
		if r := a.do(t, c.method, c.path, "", c.body, "Authorization", "bearer "+adminToken); r.status == 401 || r.status == 403 {
			t.Errorf("%s %s with a lower-case scheme: %d %s", c.method, c.path, r.status, r.body)
		}
	}
	for _, e := range read {
		m, p, _ := strings.Cut(e, " ")
		for _, tok := range []string{readToken, adminToken} {
			if r := a.do(t, m, p, tok, ""); r.status != 200 {
				t.Errorf("%s %s with a %s token: %d %s", m, p, tok[:4], r.status, r.body)
			}
		}
	}
	for e, body := range admin {
		m, p, _ := strings.Cut(e, " ")
		r := a.do(t, m, p, readToken, body)
		if r.status != 403 || !strings.Contains(r.header.Get("WWW-Authenticate"), `error="insufficient_scope", scope="admin"`) ||
			!strings.Contains(r.errText(), "admin scope") {
			t.Errorf("%s %s with a read token: %d %s", m, p, r.status, r.body)
		}
		if r := a.do(t, m, p, adminToken, body); r.status >= 400 && r.status != 404 {
			t.Errorf("%s %s with an admin token: %d %s", m, p, r.status, r.body)
		}
	}
	// The probes need no token.
	a.must(t, 200, "GET", "/healthz", "", "")
	a.must(t, 200, "GET", "/readyz", "", "")
	// A browser page of another origin cannot change anything, even
	// holding a token.
	r := a.do(t, "POST", "/v1/dead/delete", adminToken, `{"all":true}`, "Sec-Fetch-Site", "cross-site", "Origin", "https://evil.example")
	if r.status != 403 || !strings.Contains(r.errText(), "cross-origin") {
		t.Fatalf("cross-origin POST: %d %s", r.status, r)
	}
	if r := a.must(t, 200, "GET", "/v1/status", readToken, ""); r.json["dead"] != 3.0 {
		t.Fatalf("status after refused requests: %s", r)
	}
}

// TestNoTokens runs the token-less mode: everything is admin, for loopback
// clients addressing a loopback host only.
func TestNoTokens(t *testing.T) {
	f := postgresFixture(t)
	a := serve(t, &postboxadmin.Config{Admin: f.admin})
	a.must(t, 200, "GET", "/v1/status", "", "")
	if r := a.must(t, 200, "POST", "/v1/replay", "", `{"since":"1h","dry_run":true}`); r.json["actor"] != postboxadmin.AnonymousActor {
		t.Fatalf("replay: %s", r)
	}
	if got := list(t, a.must(t, 200, "GET", "/v1/replays", "", ""), "replays"); got[0]["actor"] != "anonymous@loopback" {
		t.Fatalf("audit: %v", got)
	}
	for _, host := range []string{"localhost", "[::1]:8081", "127.0.0.2"} {
		if r := a.do(t, "GET", "/v1/status", "", "", "Host", host); r.status != 200 {
			t.Errorf("Host %s: %d %s", host, r.status, r)
		}
	}
	// DNS rebinding: a page of evil.example whose name now resolves here.
	if r := a.do(t, "GET", "/v1/status", "", "", "Host", "evil.example"); r.status != 403 || !strings.Contains(r.errText(), "loopback") {
		t.Fatalf("foreign Host: %d %s", r.status, r)
	}
	// The handler mounted on a server that other hosts reach.
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("GET", "http://127.0.0.1/v1/status", nil)
	req.RemoteAddr = "192.0.2.7:4242"
	a.srv.Handler().ServeHTTP(rec, req)
	if rec.Code != 403 {
		t.Fatalf("non-loopback client: %d %s", rec.Code, rec.Body)
	}
}

func TestStoreFailures(t *testing.T) {
	// Tables that do not exist: 503 saying what to do.
	prefix := testdb.Prefix(t)
	adminClient, err := postbox.NewClient(postboxpgx.New(testdb.Pool(t)), &postbox.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	admin := adminClient.Admin()
	a := serve(t, &postboxadmin.Config{Admin: admin, Tokens: tokens()})
	if r := a.do(t, "GET", "/v1/status", readToken, ""); r.status != 503 || !strings.Contains(r.errText(), "not migrated") {
		t.Fatalf("unmigrated status: %d %s", r.status, r)
	}
	if r := a.do(t, "GET", "/readyz", "", ""); r.status != 503 || r.json["error"] != "the postbox tables are not migrated" {
		t.Fatalf("unmigrated readyz: %d %s", r.status, r)
	}

	// A database that is gone: 500 with a request id and nothing of the
	// driver's message.
	pool := testdb.Pool(t)
	deadClient, err := postbox.NewClient(postboxpgx.New(pool), &postbox.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	dead := deadClient.Admin()
	pool.Close()
	b := serve(t, &postboxadmin.Config{Admin: dead, Tokens: tokens()})
	for _, c := range []struct{ method, path, body string }{
		{"GET", "/v1/status", ""}, {"GET", "/v1/dead", ""}, {"POST", "/v1/dead/delete", `{"all":true}`},
		{"POST", "/v1/replay", `{"since":"1h"}`}, {"POST", "/v1/prune", ""},
	} {
		r := b.do(t, c.method, c.path, adminToken, c.body)
		if r.status != 500 || r.errText() != "internal error; the server log has the detail" || len(r.json["request_id"].(string)) != 16 ||
			strings.Contains(string(r.body), "pool") {
			t.Errorf("%s %s on a closed pool: %d %s", c.method, c.path, r.status, r)
		}
	}
	if r := b.do(t, "GET", "/readyz", "", ""); r.status != 503 || r.json["error"] != "the database is not reachable" {
		t.Fatalf("readyz on a closed pool: %d %s", r.status, r)
	}
}

func TestReadyz(t *testing.T) {
	f := postgresFixture(t)
	failing := serve(t, &postboxadmin.Config{Admin: f.admin, Tokens: tokens(), Ready: func(context.Context) error {
		return errors.New("relay not started")
	}})
	if r := failing.do(t, "GET", "/readyz", "", ""); r.status != 503 || r.json["error"] != "relay not started" || r.json["status"] != "unavailable" {
		t.Fatalf("failing readyz: %d %s", r.status, r)
	}
	slow := serve(t, &postboxadmin.Config{Admin: f.admin, Tokens: tokens(), ReadyTimeout: 10 * time.Millisecond, Ready: func(ctx context.Context) error {
		<-ctx.Done() // bounded by ReadyTimeout
		return ctx.Err()
	}})
	if r := slow.do(t, "GET", "/readyz", "", ""); r.status != 503 || !strings.Contains(r.errText(), "deadline") {
		t.Fatalf("slow readyz: %d %s", r.status, r)
	}
	ok := serve(t, &postboxadmin.Config{Admin: f.admin, Tokens: tokens(), Ready: func(context.Context) error { return nil }})
	ok.must(t, 200, "GET", "/readyz", "", "")
}

func TestMetrics(t *testing.T) {
	f := postgresFixture(t)
	metrics := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		_, _ = w.Write([]byte("postbox_pending 1\n"))
	})
	open := serve(t, &postboxadmin.Config{Admin: f.admin, Tokens: tokens(), Metrics: metrics})
	if r := open.must(t, 200, "GET", "/metrics", "", ""); string(r.body) != "postbox_pending 1\n" {
		t.Fatalf("metrics: %s", r)
	}
	guarded := serve(t, &postboxadmin.Config{Admin: f.admin, Tokens: tokens(), Metrics: metrics, MetricsRequireToken: true})
	guarded.must(t, 401, "GET", "/metrics", "", "")
	guarded.must(t, 200, "GET", "/metrics", readToken, "")
	none := serve(t, &postboxadmin.Config{Admin: f.admin, Tokens: tokens()})
	if r := none.must(t, 404, "GET", "/metrics", "", ""); !strings.Contains(r.errText(), "no metrics handler") {
		t.Fatalf("no metrics: %s", r)
	}
}

func TestConsumerDeadNotConfigured(t *testing.T) {
	f := postgresFixture(t)
	a := serve(t, &postboxadmin.Config{Admin: f.admin, Tokens: tokens()})
	for _, c := range []struct{ method, path string }{
		{"GET", "/v1/consumers/dead"}, {"GET", "/v1/consumers/billing/dead/m-1"}, {"DELETE", "/v1/consumers/billing/dead/m-1"},
	} {
		if r := a.do(t, c.method, c.path, adminToken, ""); r.status != 501 || !strings.Contains(r.errText(), "Config.ConsumerDead") {
			t.Errorf("%s %s: %d %s", c.method, c.path, r.status, r)
		}
	}
	// Still behind the token.
	a.must(t, 401, "GET", "/v1/consumers/dead", "", "")
}

func TestPanicIsJSON(t *testing.T) {
	f := postgresFixture(t)
	a := serve(t, &postboxadmin.Config{Admin: f.admin, Tokens: tokens(), Metrics: http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		panic("metrics exploded")
	})})
	if r := a.do(t, "GET", "/metrics", "", ""); r.status != 500 || r.json["request_id"] == nil || strings.Contains(string(r.body), "exploded") {
		t.Fatalf("panic: %d %s", r.status, r)
	}
}
