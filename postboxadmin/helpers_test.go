package postboxadmin_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/sqlitetest"
	"github.com/postbox-go/postbox/internal/testdb"
	"github.com/postbox-go/postbox/postboxadmin"
	"github.com/postbox-go/postbox/postboxdriver"
	"github.com/postbox-go/postbox/postboxmigrate"
	"github.com/postbox-go/postbox/postboxpgx"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// *postbox.Inbox serves the consumer endpoints whatever its transaction
// type.
var (
	_ postboxadmin.ConsumerDead = (*postbox.Inbox[pgx.Tx])(nil)
	_ postboxadmin.ConsumerDead = (*postbox.Inbox[*sql.Tx])(nil)
)

const (
	adminToken = "admin-token-0123456789abcdef"
	readToken  = "read-token-0123456789abcdef"
	// adminName is the admin token's Name: the actor of its replays.
	adminName = "ops-oncall"
)

func tokens() []postboxadmin.Token {
	return []postboxadmin.Token{
		{Name: adminName, Value: adminToken, Scope: postboxadmin.ScopeAdmin},
		{Name: "grafana", Value: readToken, Scope: postboxadmin.ScopeRead},
	}
}

var quiet = slog.New(slog.DiscardHandler)

// fixture is a migrated database with three dead messages, two published
// ones, one pending, and two consumer dead letters.
type fixture struct {
	admin *postbox.Admin
	inbox postboxadmin.ConsumerDead
	// dead maps each dead message's key to its id.
	dead map[string]string
	// agePublished moves every published row's publish time 8 days back.
	agePublished func(t *testing.T)
	// bury dead-letters a delivery at consumer.
	bury func(t *testing.T, consumer, id string)
	// kill writes m, whose payload must start with "poison", and drains
	// it dead; it returns its id.
	kill func(t *testing.T, m postbox.Message) string
	// exec runs a statement on PostgreSQL's fixture, {p} standing for
	// the table prefix.
	exec func(t *testing.T, sql string, args ...any)
}

// The dead messages' payloads: the publisher rejects any payload that
// starts with "poison".
var (
	poisonText   = []byte(`poison {"order":3}`)
	poisonBinary = []byte("poison\xff\xfe\x00")
)

func failHandler[TTx any](context.Context, TTx, *postbox.Delivery) error {
	return errors.New("handler refused")
}

// populate writes the fixture's messages through client, drains it, and
// buries two deliveries at inbox.
func populate[TTx any](t testing.TB, client *postbox.Client[TTx], inbox *postbox.Inbox[TTx], admin *postbox.Admin) map[string]string {
	t.Helper()
	ctx := context.Background()
	if err := client.Write(ctx,
		postbox.Message{Topic: "orders.created", Key: "o1", Payload: []byte(`{"order":1}`)},
		postbox.Message{Topic: "orders.paid", Key: "o2", Payload: []byte(`{"order":2}`)},
		postbox.Message{Topic: "orders.created", Key: "o3", Payload: poisonText},
		postbox.Message{Topic: "orders.refunded", Key: "o4", Payload: poisonBinary},
		postbox.Message{Topic: "orders.refunded", Key: "o5", Payload: poisonText},
	); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if err := client.Write(ctx, postbox.Message{Topic: "orders.paid", Key: "o6"}); err != nil {
		t.Fatal(err)
	}
	ds, err := admin.ListDead(ctx, postbox.DeadFilter{})
	if err != nil || len(ds) != 3 {
		t.Fatalf("dead messages after the drain: %d, %v", len(ds), err)
	}
	dead := map[string]string{}
	for _, d := range ds {
		dead[d.Key] = d.ID
	}
	bury(t, inbox, "billing", "m-1")
	bury(t, inbox, "shipping/eu", "m 2")
	return dead
}

func bury[TTx any](t testing.TB, inbox *postbox.Inbox[TTx], consumer, id string) {
	t.Helper()
	v := inbox.Handle(context.Background(), consumer, &postbox.Delivery{ID: id, Topic: "orders.paid", Key: "o2", Payload: []byte("x"),
		Headers: map[string]string{"trace": "abc"}}, failHandler[TTx])
	if v.Action != postbox.DeadLettered {
		t.Fatalf("delivery %s/%s: %v", consumer, id, v)
	}
}

func publisher() postbox.Publisher {
	return postbox.PublisherFunc(func(_ context.Context, env *postbox.Envelope) error {
		if bytes.HasPrefix(env.Payload, []byte("poison")) {
			return postbox.NewMessageError(errors.New("rejected by the broker"))
		}
		return nil
	})
}

func postgresFixture(t testing.TB) *fixture {
	t.Helper()
	pool := testdb.Pool(t)
	prefix := testdb.Prefix(t)
	testdb.DropPrefix(t, pool, prefix)
	d := postboxpgx.New(pool)
	f := newFixture(t, d, prefix)
	f.agePublished = func(t *testing.T) {
		if _, err := pool.Exec(context.Background(), `UPDATE `+prefix+`published SET published_at = now() - interval '8 days'`); err != nil {
			t.Fatal(err)
		}
	}
	f.exec = func(t *testing.T, sql string, args ...any) {
		t.Helper()
		if _, err := pool.Exec(context.Background(), strings.ReplaceAll(sql, "{p}", prefix), args...); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

func sqliteFixture(t testing.TB) *fixture {
	t.Helper()
	d := sqlitetest.Driver(t)
	const prefix = "adm_"
	f := newFixture(t, d, prefix)
	f.agePublished = func(t *testing.T) {
		if _, err := d.DB().Exec(`UPDATE ` + prefix + `published SET published_at = published_at - 8 * 86400000`); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

func newFixture[TTx any](t testing.TB, d postboxdriver.Driver[TTx], prefix string) *fixture {
	t.Helper()
	ctx := context.Background()
	m, err := postboxmigrate.New(d, &postboxmigrate.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	client, err := postbox.NewClient(d, &postbox.Config{Prefix: prefix, Publisher: publisher(), MaxAttempts: 1, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	inboxClient, err := postbox.NewClient(d, &postbox.Config{Prefix: prefix, MaxAttempts: 1, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	inbox := inboxClient.Inbox()
	adminClient, err := postbox.NewClient(d, &postbox.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	admin := adminClient.Admin()
	return &fixture{admin: admin, inbox: inbox, dead: populate(t, client, inbox, admin),
		bury: func(t *testing.T, consumer, id string) { bury(t, inbox, consumer, id) },
		kill: func(t *testing.T, m postbox.Message) string {
			t.Helper()
			m.ID = postbox.NewID()
			if err := client.Write(ctx, m); err != nil {
				t.Fatal(err)
			}
			if _, err := client.Drain(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := admin.GetDead(ctx, m.ID); err != nil {
				t.Fatalf("message %s is not dead: %v", m.ID, err)
			}
			return m.ID
		}}
}

// api is a running server and a client for it.
type api struct {
	srv *postboxadmin.Server
	ts  *httptest.Server
}

func serve(t testing.TB, cfg *postboxadmin.Config) *api {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	srv, err := postboxadmin.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	return &api{srv: srv, ts: ts}
}

// response is an answer, its body decoded where it is JSON.
type response struct {
	status int
	header http.Header
	body   []byte
	json   map[string]any
}

// field and errText read an error answer.
func (r *response) field() string   { s, _ := r.json["field"].(string); return s }
func (r *response) errText() string { s, _ := r.json["error"].(string); return s }

func (r *response) String() string { return string(r.body) }

// do sends a request with token (none when empty) and body (none when
// empty).
func (a *api) do(t *testing.T, method, path, token, body string, headers ...string) *response {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(context.Background(), method, a.ts.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		if headers[i] == "Host" {
			req.Host = headers[i+1] // the client sends req.Host, not the header
			continue
		}
		req.Header.Set(headers[i], headers[i+1])
	}
	res, err := a.ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	out := &response{status: res.StatusCode, header: res.Header, body: b}
	if strings.HasPrefix(res.Header.Get("Content-Type"), "application/json") && method != http.MethodHead {
		if err := json.Unmarshal(b, &out.json); err != nil {
			t.Fatalf("%s %s: a JSON answer that does not decode as an object: %v\n%s", method, path, err, b)
		}
	}
	return out
}

// must sends a request and requires want.
func (a *api) must(t *testing.T, want int, method, path, token, body string) *response {
	t.Helper()
	r := a.do(t, method, path, token, body)
	if r.status != want {
		t.Fatalf("%s %s %s: status %d, want %d\n%s", method, path, body, r.status, want, r.body)
	}
	return r
}

// list returns the array at key of a JSON answer.
func list(t *testing.T, r *response, key string) []map[string]any {
	t.Helper()
	raw, ok := r.json[key].([]any)
	if !ok {
		t.Fatalf("no array %q in %s", key, r.body)
	}
	out := make([]map[string]any, len(raw))
	for i, v := range raw {
		out[i] = v.(map[string]any)
	}
	return out
}
