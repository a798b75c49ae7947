package postboxidem_test

import (
	"context"
	"database/sql"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/postboxdriver"
	"github.com/postbox-go/postbox/postboxidem"
	"github.com/postbox-go/postbox/postboxpgx"
)

func TestConfigDefaults(t *testing.T) {
	m, err := postboxidem.New(postboxpgx.New(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	c := m.Config()
	if c.Prefix != "postbox_" || c.TTL != 24*time.Hour || c.ClaimExpiry != time.Minute ||
		c.MaxBodyBytes != 2<<20 || c.MaxResponseBytes != 1<<20 || c.Required ||
		!slices.Equal(c.Methods, []string{"POST", "PATCH"}) || c.Identity == nil || c.Logger == nil ||
		c.CleanupBatch != 1000 || c.CleanupInterval != 10*time.Minute {
		t.Errorf("defaults: %+v", c)
	}
	if id := c.Identity(&http.Request{}); id != "" {
		t.Errorf("default identity %q, want none", id)
	}
}

func TestConfigValidation(t *testing.T) {
	_, err := postboxidem.New(postboxpgx.New(nil), &postboxidem.Config{
		Prefix:           "Bad-Prefix",
		TTL:              time.Millisecond,
		ClaimExpiry:      -time.Second,
		MaxBodyBytes:     -1,
		MaxResponseBytes: 65 << 20,
		Methods:          []string{"POST", "NOT A METHOD", ""},
		CleanupBatch:     -5,
		CleanupInterval:  time.Millisecond,
	})
	var ce *postbox.ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("error %v, want a *postbox.ConfigError", err)
	}
	var fields []string
	for _, p := range ce.Problems {
		fields = append(fields, p.Field)
	}
	want := []string{"Prefix", "TTL", "ClaimExpiry", "MaxBodyBytes", "MaxResponseBytes", "Methods[1]", "Methods[2]", "CleanupBatch", "CleanupInterval"}
	if !slices.Equal(fields, want) {
		t.Errorf("problems %v, want %v", fields, want)
	}
	var ve *postbox.ValidationError
	if !errors.As(err, &ve) || ve.Field != "Prefix" {
		t.Errorf("errors.As finds %+v, want the Prefix problem", ve)
	}

	_, err = postboxidem.New(postboxpgx.New(nil), &postboxidem.Config{TTL: time.Minute, ClaimExpiry: time.Minute})
	if !errors.As(err, &ce) || len(ce.Problems) != 1 || ce.Problems[0].Field != "ClaimExpiry" || !strings.Contains(err.Error(), "shorter than TTL") {
		t.Errorf("ClaimExpiry = TTL: %v", err)
	}
	_, err = postboxidem.New(postboxpgx.New(nil), &postboxidem.Config{Methods: []string{}})
	if !errors.As(err, &ce) || ce.Problems[0].Field != "Methods" {
		t.Errorf("no methods: %v", err)
	}
}

type driverFunc[TTx any] func(prefix string) (postboxdriver.Store[TTx], error)

func (f driverFunc[TTx]) Open(prefix string) (postboxdriver.Store[TTx], error) { return f(prefix) }

func TestDriverOpenError(t *testing.T) {
	failing := driverFunc[pgx.Tx](func(string) (postboxdriver.Store[pgx.Tx], error) { return nil, errors.New("no") })
	if _, err := postboxidem.New(failing, nil); err == nil {
		t.Error("an Open error was swallowed")
	}
}

func TestTxFromContextOutside(t *testing.T) {
	if _, ok := postboxidem.TxFromContext[pgx.Tx](context.Background()); ok {
		t.Error("a transaction outside the middleware")
	}
}

func TestCleanupLoop(t *testing.T) { each(t, testCleanupLoop[pgx.Tx], testCleanupLoop[*sql.Tx]) }

// testCleanupLoop: Start runs clean-up passes that delete expired records
// but never a claim still held, and Stop ends them.
func testCleanupLoop[TTx any](t *testing.T, e *env[TTx]) {
	a := newApp(e)
	srv := serve(t, a, e.middleware(t, testConfig()).Handler(a.routes()))
	for _, k := range []string{"c1", "c2", "c3"} {
		if r := send(srv.URL, "POST", "/orders", "x", k); r.status != 201 {
			t.Fatal(r)
		}
	}
	if r := send(srv.URL, "POST", "/reject", "x", "c4"); r.status != 400 {
		t.Fatal(r)
	}
	// Every record is past its TTL; c4 is a claim that still holds, as a
	// server that died mid-request leaves it until the claim expires.
	e.exec(t, e.sql.holdClaims)
	e.exec(t, e.sql.expireRecords)

	cfg := testConfig()
	cfg.CleanupInterval = time.Second
	m := e.middleware(t, cfg)
	ctx := context.Background()
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.Start(ctx); !errors.Is(err, postboxidem.ErrStarted) {
		t.Errorf("second Start: %v", err)
	}
	deadline := time.Now().Add(wait)
	for e.count(t, "idempotency", "") != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("%d records left after %s", e.count(t, "idempotency", ""), wait)
		}
		time.Sleep(10 * time.Millisecond) // polling, within the bound
	}
	if err := m.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.Stop(ctx); !errors.Is(err, postboxidem.ErrNotStarted) {
		t.Errorf("second Stop: %v", err)
	}
	if n := e.count(t, "idempotency", "state = 'processing'"); n != 1 {
		t.Errorf("the held claim was deleted")
	}
	// The held claim blocks its key even past its record's TTL.
	if r := send(srv.URL, "POST", "/reject", "x", "c4"); r.status != 409 {
		t.Errorf("the held claim's key: %s, want 409", r)
	}
}

func TestParseKey(t *testing.T) {
	for _, c := range []struct {
		in, key string
		ok      bool
	}{
		{"abc", "abc", true},
		{`"abc"`, "abc", true},
		{"  abc ", "abc", true},
		{`"a\"b\\c"`, `a"b\c`, true},
		{`"a,b"`, "a,b", true},
		{`"a b"`, "a b", true},
		{"8e03978e-40d5-43e8-bc93-6894a57f9324", "8e03978e-40d5-43e8-bc93-6894a57f9324", true},
		{strings.Repeat("x", 255), strings.Repeat("x", 255), true},
		{`"` + strings.Repeat("x", 255) + `"`, strings.Repeat("x", 255), true},
		{strings.Repeat("x", 256), "", false},
		{`"` + strings.Repeat("x", 256) + `"`, "", false},
		{"", "", false},
		{"   ", "", false},
		{`""`, "", false},
		{`"abc`, "", false},
		{`"abc"x`, "", false},
		{`"abc";p=1`, "", false},
		{`"a\nb"`, "", false},
		{`"a\`, "", false},
		{"a,b", "", false},
		{`a"b`, "", false},
		{`a\b`, "", false},
		{"a\tb", "", false},
		{"a\x7fb", "", false},
		{"ключ", "", false},
		{`"ключ"`, "", false},
	} {
		key, err := postboxidem.ParseKey(c.in)
		if (err == nil) != c.ok || key != c.key {
			t.Errorf("ParseKey(%q) = %q, %v; want %q ok=%t", c.in, key, err, c.key, c.ok)
		}
	}
}
