package postboxadmin_test

import (
	"context"
	"encoding/base64"
	"errors"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/postboxadmin"
	"github.com/postbox-go/postbox/postboxdriver"
)

// browser is an HTTP client that keeps cookies and does not follow
// redirects, as the dashboard's tests read each answer.
type browser struct {
	ts  *httptest.Server
	c   *http.Client
	jar *cookiejar.Jar
}

func newBrowser(t *testing.T, ts *httptest.Server) *browser {
	t.Helper()
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	c := *ts.Client()
	c.Jar = jar
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &browser{ts: ts, c: &c, jar: jar}
}

// page is an answer with its body as text.
type page struct {
	status int
	header http.Header
	body   string
}

func (b *browser) get(t *testing.T, path string) *page {
	t.Helper()
	return b.do(t, http.MethodGet, path, nil)
}

func (b *browser) post(t *testing.T, path string, form url.Values) *page {
	t.Helper()
	return b.do(t, http.MethodPost, path, form)
}

func (b *browser) do(t *testing.T, method, path string, form url.Values) *page {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequestWithContext(context.Background(), method, b.ts.URL+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		// As a browser sends on a form post of the same origin.
		req.Header.Set("Origin", b.ts.URL)
	}
	res, err := b.c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return &page{status: res.StatusCode, header: res.Header, body: string(raw)}
}

var csrfInput = regexp.MustCompile(`name="csrf_token" value="([^"]+)"`)

// csrf reads the session's CSRF token from a page.
func (p *page) csrf(t *testing.T) string {
	t.Helper()
	m := csrfInput.FindStringSubmatch(p.body)
	if m == nil {
		t.Fatalf("no CSRF token on the page:\n%s", p.body)
	}
	return m[1]
}

// signedIn is a fixture, its server with tokens, and a browser signed in
// with token.
func signedIn(t *testing.T, token string) (*fixture, *api, *browser) {
	t.Helper()
	f := postgresFixture(t)
	a := serve(t, &postboxadmin.Config{Admin: f.admin, ConsumerDead: f.inbox, Tokens: tokens()})
	b := newBrowser(t, a.ts)
	b.signIn(t, token)
	return f, a, b
}

// signIn signs b in with token.
func (b *browser) signIn(t *testing.T, token string) {
	t.Helper()
	p := b.post(t, "/signin", url.Values{"token": {token}, "next": {"/"}})
	if p.status != http.StatusSeeOther || p.header.Get("Location") != "/" {
		t.Fatalf("sign-in: %d %s\n%s", p.status, p.header.Get("Location"), p.body)
	}
}

func sessionCookie(t *testing.T, h http.Header) *http.Cookie {
	t.Helper()
	for _, c := range (&http.Response{Header: h}).Cookies() {
		if c.Name == "postbox_session" {
			return c
		}
	}
	t.Fatalf("no session cookie in %v", h)
	return nil
}

// A browser without a session is sent to the sign-in form; a good token
// gets a session cookie that scripts cannot read, that other sites'
// pages do not send, that is Secure over TLS, and that ends; a bad one
// gets the form again with the reason.
func TestDashboardSignInSetsASafeCookie(t *testing.T) {
	f := postgresFixture(t)
	a := serve(t, &postboxadmin.Config{Admin: f.admin, ConsumerDead: f.inbox, Tokens: tokens()})
	b := newBrowser(t, a.ts)

	if p := b.get(t, "/dead?topic=orders.created"); p.status != http.StatusSeeOther || p.header.Get("Location") != "/signin?next=%2Fdead%3Ftopic%3Dorders.created" {
		t.Fatalf("no session: %d %q", p.status, p.header.Get("Location"))
	}
	form := b.get(t, "/signin?next=/dead")
	if form.status != 200 || !strings.Contains(form.body, `<label for="token">Token</label>`) || !strings.Contains(form.body, `name="next" value="/dead"`) {
		t.Fatalf("sign-in form: %d\n%s", form.status, form.body)
	}
	if p := b.get(t, "/signin?next=//evil.example/"); !strings.Contains(p.body, `name="next" value="/"`) {
		t.Fatalf("sign-in keeps a redirect to another host:\n%s", p.body)
	}
	bad := b.post(t, "/signin", url.Values{"token": {"not-a-token-0123456789"}})
	if bad.status != http.StatusUnauthorized || !strings.Contains(bad.body, "That token is not one this server accepts.") ||
		strings.Contains(bad.header.Get("Set-Cookie"), "postbox_session") {
		t.Fatalf("bad token: %d %v\n%s", bad.status, bad.header, bad.body)
	}

	ok := b.post(t, "/signin", url.Values{"token": {adminToken}, "next": {"/dead"}})
	if ok.status != http.StatusSeeOther || ok.header.Get("Location") != "/dead" {
		t.Fatalf("sign-in: %d %q", ok.status, ok.header.Get("Location"))
	}
	c := sessionCookie(t, ok.header)
	raw := ok.header.Get("Set-Cookie")
	if !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || c.Secure || c.Path != "/" || len(c.Value) < 40 ||
		c.MaxAge <= 0 || c.MaxAge > int(postboxadmin.DefaultSessionLifetime/time.Second) || !strings.Contains(raw, "Expires=") {
		t.Fatalf("session cookie over plain HTTP: %s", raw)
	}
	if p := b.get(t, "/dead"); p.status != 200 || !strings.Contains(p.body, "ops-oncall") || !strings.Contains(p.body, "(admin scope)") {
		t.Fatalf("dead messages after sign-in: %d\n%s", p.status, p.body)
	}
	// The page's script reads the API with the session; the session
	// changes nothing through the API.
	if p := b.get(t, "/v1/status"); p.status != 200 || !strings.Contains(p.body, `"holders"`) {
		t.Fatalf("status with the session: %d %s", p.status, p.body)
	}
	if p := b.do(t, http.MethodPost, "/v1/dead/requeue", url.Values{}); p.status != http.StatusUnauthorized {
		t.Fatalf("API change with only a session: %d %s", p.status, p.body)
	}

	// Signing out ends the session on the server, not only in the browser.
	overview := b.get(t, "/")
	if p := b.post(t, "/signout", url.Values{"csrf_token": {overview.csrf(t)}}); p.status != http.StatusSeeOther || p.header.Get("Location") != "/signin" ||
		sessionCookie(t, p.header).MaxAge >= 0 {
		t.Fatalf("sign-out: %d %v", p.status, p.header)
	}
	replayed := newBrowser(t, a.ts)
	u, _ := url.Parse(a.ts.URL)
	replayed.jar.SetCookies(u, []*http.Cookie{{Name: "postbox_session", Value: c.Value}})
	if p := replayed.get(t, "/"); p.status != http.StatusSeeOther {
		t.Fatalf("the signed-out session still works: %d", p.status)
	}

	// Over TLS, or behind a proxy that terminates it, the cookie is Secure.
	srv, err := postboxadmin.New(&postboxadmin.Config{Admin: f.admin, Tokens: tokens(), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	tls := httptest.NewTLSServer(srv.Handler())
	defer tls.Close()
	if p := newBrowser(t, tls).post(t, "/signin", url.Values{"token": {readToken}}); !sessionCookie(t, p.header).Secure {
		t.Fatalf("session cookie over TLS: %v", p.header)
	}
	proxied := serve(t, &postboxadmin.Config{Admin: f.admin, Tokens: tokens(), SecureCookies: true})
	if p := newBrowser(t, proxied.ts).post(t, "/signin", url.Values{"token": {readToken}}); !sessionCookie(t, p.header).Secure {
		t.Fatalf("session cookie with SecureCookies: %v", p.header)
	}
}

// Every change made from the dashboard needs the session's CSRF token: a
// form without it, or with another session's, changes nothing.
func TestDashboardRefusesActionsWithoutTheCSRFToken(t *testing.T) {
	f, a, b := signedIn(t, adminToken)
	other := newBrowser(t, a.ts)
	other.signIn(t, adminToken)
	othersToken := other.get(t, "/dead").csrf(t)
	id := f.dead["o3"]

	for name, form := range map[string]url.Values{
		"none":            {"ids": {id}},
		"empty":           {"ids": {id}, "csrf_token": {""}},
		"another session": {"ids": {id}, "csrf_token": {othersToken}},
		"wrong":           {"ids": {id}, "csrf_token": {strings.Repeat("A", 43)}},
	} {
		for _, path := range []string{"/dead/requeue", "/dead/delete", "/consumers/delete", "/replay/run", "/signout"} {
			if p := b.post(t, path, form); p.status != http.StatusForbidden || !strings.Contains(p.body, "CSRF token does not match") {
				t.Fatalf("%s with CSRF token %s: %d\n%s", path, name, p.status, p.body)
			}
		}
	}
	if _, err := f.admin.GetDead(context.Background(), id); err != nil {
		t.Fatalf("a refused form changed the message: %v", err)
	}
	// A form of another origin is refused before its token is read.
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, a.ts.URL+"/dead/delete", strings.NewReader("ids="+id))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	res, err := b.c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = res.Body.Close()
	if res.StatusCode != http.StatusForbidden {
		t.Fatalf("cross-site form: %d", res.StatusCode)
	}

	// With the token, the confirmation's form requeues.
	confirm := b.get(t, "/dead/confirm?action=requeue&ids="+id)
	if confirm.status != 200 || !strings.Contains(confirm.body, "Requeue 1 dead message?") {
		t.Fatalf("confirmation: %d\n%s", confirm.status, confirm.body)
	}
	if p := b.post(t, "/dead/requeue", url.Values{"ids": {id}, "csrf_token": {confirm.csrf(t)}}); p.status != 200 ||
		!strings.Contains(p.body, "1 dead message requeued") {
		t.Fatalf("requeue: %d\n%s", p.status, p.body)
	}
	if _, err := f.admin.GetDead(context.Background(), id); !errors.Is(err, postboxdriver.ErrNotFound) {
		t.Fatalf("requeued message still dead: %v", err)
	}
}

// A read token's session sees every page but acts on none, and is told
// why.
func TestDashboardReadScopeSeesButCannotAct(t *testing.T) {
	f, _, b := signedIn(t, readToken)
	id := f.dead["o3"]

	for _, path := range []string{"/", "/dead", "/dead/show?id=" + id, "/consumers", "/consumers/show?consumer=billing&id=m-1", "/replay", "/replays"} {
		p := b.get(t, path)
		if p.status != 200 || !strings.Contains(p.body, "grafana") || !strings.Contains(p.body, "read scope: can see, cannot act") {
			t.Fatalf("%s: %d\n%s", path, p.status, p.body)
		}
		if strings.Contains(p.body, `name="ids"`) || strings.Contains(p.body, "Requeue…") || strings.Contains(p.body, "Dry run…") {
			t.Fatalf("%s offers a read session an action:\n%s", path, p.body)
		}
	}
	if p := b.get(t, "/dead/confirm?action=delete&ids="+id); p.status != http.StatusForbidden ||
		!strings.Contains(p.body, "grafana has the read scope, which can see but not act: this needs the admin scope") {
		t.Fatalf("read confirmation: %d\n%s", p.status, p.body)
	}
	csrf := b.get(t, "/dead").csrf(t) // the sign-out form's
	for _, path := range []string{"/dead/delete", "/dead/requeue", "/consumers/requeue", "/replay/preview"} {
		if p := b.post(t, path, url.Values{"ids": {id}, "consumer": {"billing"}, "since": {"1h"}, "csrf_token": {csrf}}); p.status != http.StatusForbidden ||
			!strings.Contains(p.body, "needs the admin scope") {
			t.Fatalf("read %s: %d\n%s", path, p.status, p.body)
		}
	}
	if _, err := f.admin.GetDead(context.Background(), id); err != nil {
		t.Fatalf("a read session changed the message: %v", err)
	}
}

// A payload, header, error, key or consumer name is data from outside:
// every page shows it as text.
func TestDashboardShowsHostileMessagesAsText(t *testing.T) {
	f, _, b := signedIn(t, adminToken)
	const hostile = `<script>alert(1)</script>`
	id := f.kill(t, postbox.Message{Topic: "orders.created", Key: `k"><img src=x onerror=alert(2)>`,
		Payload: []byte("poison " + hostile), Headers: map[string]string{"x-evil": `"><img src=x onerror=alert(3)>`}})
	binary := f.kill(t, postbox.Message{Topic: "orders.created", Payload: []byte("poison\xff<script>")})
	f.bury(t, hostile, `<img src=x onerror=alert(4)>`)

	check := func(path string, wants ...string) {
		t.Helper()
		p := b.get(t, path)
		if p.status != 200 {
			t.Fatalf("%s: %d\n%s", path, p.status, p.body)
		}
		body := strings.NewReplacer(`<script src="/static/dashboard.js" defer></script>`, "", `<script type="application/json" id="samples">`, "").Replace(p.body)
		if strings.Contains(body, "<script") || strings.Contains(body, "<img") {
			t.Fatalf("%s shows markup from a message:\n%s", path, p.body)
		}
		for _, w := range wants {
			if !strings.Contains(p.body, w) {
				t.Fatalf("%s lacks %q:\n%s", path, w, p.body)
			}
		}
	}
	check("/dead/show?id="+id, "poison &lt;script&gt;alert(1)&lt;/script&gt;", "&#34;&gt;&lt;img src=x onerror=alert(3)&gt;", "x-evil",
		"k&#34;&gt;&lt;img src=x onerror=alert(2)&gt;")
	check("/dead/show?id="+binary, "not UTF-8 text: shown as hex and as base64", "70 6f 69 73 6f 6e ff 3c", strings.TrimSuffix(base64Of("poison\xff<script>"), "+"))
	check("/dead", "k&#34;&gt;&lt;img")
	check("/", "&lt;script&gt;alert(1)&lt;/script&gt;")
	check("/consumers", "&lt;script&gt;alert(1)&lt;/script&gt;", "&lt;img src=x onerror=alert(4)&gt;")
	check("/consumers/show?consumer="+url.QueryEscape(hostile)+"&id="+url.QueryEscape(`<img src=x onerror=alert(4)>`), "handler refused")
	if p := b.get(t, "/dead/show?id="+id); !strings.Contains(p.header.Get("Content-Security-Policy"), "script-src 'self'") ||
		p.header.Get("X-Content-Type-Options") != "nosniff" {
		t.Fatalf("page headers: %v", p.header)
	}
}

// Without tokens (loopback only) there is no sign-in; the page's session
// still carries a CSRF token that every change needs.
func TestDashboardWithoutTokensNeedsNoSignInButChecksCSRF(t *testing.T) {
	f := postgresFixture(t)
	a := serve(t, &postboxadmin.Config{Admin: f.admin, ConsumerDead: f.inbox})
	b := newBrowser(t, a.ts)
	p := b.get(t, "/dead")
	if p.status != 200 || !strings.Contains(p.body, "anonymous@loopback") || strings.Contains(p.body, "Sign out") {
		t.Fatalf("token-less dashboard: %d\n%s", p.status, p.body)
	}
	if s := b.get(t, "/signin"); s.status != http.StatusSeeOther {
		t.Fatalf("token-less sign-in form: %d", s.status)
	}
	id := f.dead["o5"]
	if r := b.post(t, "/dead/delete", url.Values{"ids": {id}}); r.status != http.StatusForbidden {
		t.Fatalf("delete without CSRF: %d\n%s", r.status, r.body)
	}
	confirm := b.get(t, "/dead/confirm?action=delete&ids="+id)
	if r := b.post(t, "/dead/delete", url.Values{"ids": {id}, "csrf_token": {confirm.csrf(t)}}); r.status != 200 || !strings.Contains(r.body, "1 dead message deleted") {
		t.Fatalf("delete: %d\n%s", r.status, r.body)
	}
	if _, err := f.admin.GetDead(context.Background(), id); !errors.Is(err, postboxdriver.ErrNotFound) {
		t.Fatalf("deleted message still dead: %v", err)
	}
}

// The overview lists the process's databases with their state, a down
// one with why, as GET /v1/status does.
func TestDashboardShowsDatabasesUpAndDown(t *testing.T) {
	f := postgresFixture(t)
	since := time.Now().Add(-time.Minute)
	a := serve(t, &postboxadmin.Config{Admin: f.admin, ConsumerDead: f.inbox, Shards: func() []postboxadmin.ShardStatus {
		return []postboxadmin.ShardStatus{
			{Shard: "0", Up: true, Since: since},
			{Shard: "1", Error: "connect: connection refused <b>", Since: since},
		}
	}})
	p := newBrowser(t, a.ts).get(t, "/")
	if p.status != 200 {
		t.Fatalf("overview: %d\n%s", p.status, p.body)
	}
	for _, want := range []string{"<h2>Databases</h2>", `<th scope="row">1</th><td><strong>down</strong>`, "connection refused &lt;b&gt;"} {
		if !strings.Contains(p.body, want) {
			t.Errorf("overview lacks %q:\n%s", want, p.body)
		}
	}
}

func base64Of(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

// A filtered set is counted on the confirmation, with relative times
// fixed, and changed as counted: the outbox's dead messages, the
// consumers', and a replay after its dry run, which warns of the broker's
// duplicate window.
func TestDashboardActsOnAFilteredSet(t *testing.T) {
	f := postgresFixture(t)
	window := func(_ context.Context, topic string) (time.Duration, string, error) {
		return time.Hour, "JetStream stream ORDERS", nil
	}
	a := serve(t, &postboxadmin.Config{Admin: f.admin, ConsumerDead: f.inbox, Tokens: tokens(), DedupeWindow: window})
	b := newBrowser(t, a.ts)
	b.signIn(t, adminToken)
	ctx := context.Background()

	confirm := b.get(t, "/dead/confirm?action=requeue&topic=orders.refunded&since=1h")
	if confirm.status != 200 || !strings.Contains(confirm.body, "Requeue 2 dead messages?") || strings.Contains(confirm.body, `value="1h"`) {
		t.Fatalf("confirmation: %d\n%s", confirm.status, confirm.body)
	}
	since := regexp.MustCompile(`name="since" value="([^"]+)"`).FindStringSubmatch(confirm.body)[1]
	p := b.post(t, "/dead/requeue", url.Values{"topic": {"orders.refunded"}, "since": {since}, "csrf_token": {confirm.csrf(t)}})
	if p.status != 200 || !strings.Contains(p.body, "2 dead messages requeued") {
		t.Fatalf("requeue: %d\n%s", p.status, p.body)
	}
	if left, err := f.admin.ListDead(ctx, postbox.DeadFilter{}); err != nil || len(left) != 1 || left[0].Topic != "orders.created" {
		t.Fatalf("dead after the requeue: %v %v", left, err)
	}
	if p := b.get(t, "/dead/confirm?action=delete"); p.status != http.StatusBadRequest || !strings.Contains(p.body, "no messages selected") {
		t.Fatalf("empty selection: %d\n%s", p.status, p.body)
	}

	confirm = b.get(t, "/consumers/confirm?action=delete&consumer=billing")
	if !strings.Contains(confirm.body, "Delete 1 consumer dead message?") {
		t.Fatalf("consumers' confirmation:\n%s", confirm.body)
	}
	if p := b.post(t, "/consumers/delete", url.Values{"consumer": {"billing"}, "csrf_token": {confirm.csrf(t)}}); !strings.Contains(p.body, "1 consumer dead message deleted") {
		t.Fatalf("consumers' delete: %d\n%s", p.status, p.body)
	}
	if left, err := f.inbox.ListDead(ctx, postbox.DeadFilter{}); err != nil || len(left) != 1 || left[0].Consumer != "shipping/eu" {
		t.Fatalf("consumers' dead after the delete: %v %v", left, err)
	}

	form := b.get(t, "/replay")
	preview := b.post(t, "/replay/preview", url.Values{"since": {"1h"}, "topic": {"orders.paid"}, "csrf_token": {form.csrf(t)}})
	if preview.status != 200 || !strings.Contains(preview.body, "A dry run selects 1 published message") ||
		!strings.Contains(preview.body, "1 of them would be dropped by the broker as copies") || !strings.Contains(preview.body, "JetStream stream ORDERS") {
		t.Fatalf("dry run: %d\n%s", preview.status, preview.body)
	}
	run := url.Values{"csrf_token": {preview.csrf(t)}, "topic": {"orders.paid"}, "mode": {"own"}}
	for _, k := range []string{"since", "until"} {
		run.Set(k, regexp.MustCompile(`name="` + k + `" value="([^"]+)"`).FindStringSubmatch(preview.body)[1])
	}
	if p := b.post(t, "/replay/run", run); p.status != http.StatusConflict || !strings.Contains(p.body, "not replayed: 1 of the 1 message(s) would be dropped") {
		t.Fatalf("replay into the duplicate window: %d\n%s", p.status, p.body)
	}
	run.Set("mode", "new")
	if p := b.post(t, "/replay/run", run); p.status != 200 || !strings.Contains(p.body, "Replayed 1 message as new messages") {
		t.Fatalf("replay as new: %d\n%s", p.status, p.body)
	}
	audit, err := f.admin.Replays(ctx, 10)
	if err != nil || len(audit) != 2 || !audit[1].DryRun || audit[0].DryRun || !audit[0].AsNew || audit[0].Actor != adminName {
		t.Fatalf("audit: %+v %v", audit, err)
	}
	if p := b.get(t, "/replays"); !strings.Contains(p.body, "dry run") || !strings.Contains(p.body, "replay, as new") {
		t.Fatalf("audit page:\n%s", p.body)
	}
}

// Past ten thousand rows, with the table's statistics taken, the status
// reports the history's size as PostgreSQL's estimate, flagged so in the
// API and marked "≈" on the overview; autovacuum is off on the table so
// that its statistics are only those the test takes.
func TestStatusMarksEstimates(t *testing.T) {
	f := postgresFixture(t)
	a := serve(t, &postboxadmin.Config{Admin: f.admin, Tokens: tokens()})
	f.exec(t, `ALTER TABLE {p}published SET (autovacuum_enabled = false)`)
	grow := func(n int) {
		f.exec(t, `INSERT INTO {p}published (seq, id, topic, key, payload, headers, partition, created_at, attempts)
SELECT -g - $2::int, gen_random_uuid(), 't', 'k', '\x00', '{}', 0, now(), 1 FROM generate_series(1, $1::int) g`, n, 1_000_000)
	}
	grow(10_000 - 2) // the fixture published two
	f.exec(t, `ANALYZE {p}published`)
	st := a.must(t, 200, "GET", "/v1/status", readToken, "")
	if st.json["published_kept_estimated"] != false || st.json["pending_estimated"] != false || st.json["published_kept"] != 10_000.0 {
		t.Fatalf("a history of 10,000 rows: %s", st)
	}
	grow(20_000)
	st = a.must(t, 200, "GET", "/v1/status", readToken, "")
	if n, _ := st.json["published_kept"].(float64); st.json["published_kept_estimated"] != true || n < 27_000 || n > 33_000 {
		t.Fatalf("a history of 30,000 rows, analyzed at 10,000: %s", st)
	}
	b := newBrowser(t, a.ts)
	b.signIn(t, readToken)
	if p := b.get(t, "/"); !strings.Contains(p.body, `<dd id="fig-published">≈ `) || strings.Contains(p.body, `<dd id="fig-pending">≈`) {
		t.Fatalf("the overview does not mark the history's estimate alone:\n%s", p.body)
	}
}
