package postbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/testdb"
	"github.com/postbox-go/postbox/postboxdriver"
	"github.com/postbox-go/postbox/postboxmigrate"
	"github.com/postbox-go/postbox/postboxpgx"
	"github.com/postbox-go/postbox/postboxtest"
)

// sqlInjections are strings that would break out of a quoted literal or
// an identifier if any statement spliced them in.
var sqlInjections = []string{
	`x'; DROP TABLE {p}outbox; --`,
	`x" OR "1"="1`,
	`' OR '1'='1`,
	`x\'; DELETE FROM {p}published; --`,
	"x`; DROP TABLE {p}dead; --",
	`$1; TRUNCATE {p}outbox`,
	`x'||(SELECT count(*) FROM {p}outbox)||'`,
	"x\x00y",
}

// Every identifier and filter that reaches SQL, given SQL: prefixes and
// topics are refused with a typed error; keys, actors, consumers and
// payloads travel as parameters, match nothing they should not, and come
// back as written; no table loses a row.
func TestSQLInjection(t *testing.T) {
	t.Run("postgres", func(t *testing.T) {
		pool, prefix := testdb.Migrated(t)
		injectionSuite(t, postboxpgx.New(pool), prefix)
	})
	t.Run("sqlite", func(t *testing.T) {
		d := testdb.SQLiteDriver(t)
		m, err := postboxmigrate.New(d, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := m.Up(context.Background()); err != nil {
			t.Fatal(err)
		}
		injectionSuite(t, d, postbox.DefaultPrefix)
	})
}

func injectionSuite[TTx any](t *testing.T, d postboxdriver.Driver[TTx], prefix string) {
	ctx := context.Background()
	broker := postboxtest.NewBroker(nil)
	client, err := postbox.NewClient(d, &postbox.Config{Prefix: prefix, Publisher: broker})
	if err != nil {
		t.Fatal(err)
	}
	admin, inbox := client.Admin(), client.Inbox()
	expand := func(s string) string { return strings.ReplaceAll(s, "{p}", prefix) }

	// Prefixes are identifiers spliced into SQL: refused before any use.
	for _, s := range sqlInjections {
		var ve *postbox.ValidationError
		if _, err := postbox.NewClient(d, &postbox.Config{Prefix: expand(s), Publisher: broker}); !errors.As(err, &ve) && !isConfigError(err) {
			t.Errorf("prefix %q: %v, want a typed error", s, err)
		}
		if _, err := postboxtest.ExpireLeases(ctx, d, expand(s)); err == nil {
			t.Errorf("ExpireLeases took prefix %q", s)
		}
		// Topics are refused at write time and as filters.
		err := client.Write(ctx, postbox.Message{Topic: expand(s)})
		if !errors.As(err, &ve) {
			t.Errorf("topic %q: %v, want *ValidationError", s, err)
		}
		if _, err := admin.ListDead(ctx, postbox.DeadFilter{Topic: expand(s)}); !errors.As(err, &ve) {
			t.Errorf("dead filter topic %q: %v, want *ValidationError", s, err)
		}
	}

	// Keys, payloads and header values are data: stored and sent as
	// written, or refused whole with a typed error (a NUL byte).
	var msgs []postbox.Message
	accepted := map[string]bool{}
	for _, s := range sqlInjections {
		m := postbox.Message{Topic: "orders.paid", Key: expand(s), Payload: []byte(expand(s)), Headers: map[string]string{"x-note": expand(s)}}
		err := client.Write(ctx, m)
		var ve *postbox.ValidationError
		switch {
		case err == nil:
			msgs = append(msgs, m)
			accepted[s] = true
		case !errors.As(err, &ve):
			t.Fatalf("write key %q: %v, want success or *ValidationError", s, err)
		}
	}
	if len(msgs) < len(sqlInjections)-1 {
		t.Fatalf("only %d of %d keys accepted", len(msgs), len(sqlInjections))
	}
	if res, err := client.Drain(ctx); err != nil || res.Published != len(msgs) {
		t.Fatalf("drain: %+v, %v", res, err)
	}
	got := map[string]bool{}
	for _, env := range broker.Messages() {
		if string(env.Payload) != env.Key || env.Headers["x-note"] != env.Key {
			t.Errorf("message %s came back changed: key %q payload %q header %q", env.ID, env.Key, env.Payload, env.Headers["x-note"])
		}
		got[env.Key] = true
	}
	for _, m := range msgs {
		if !got[m.Key] {
			t.Errorf("key %q was not published as written", m.Key)
		}
	}

	// Filters and free text reach SQL as parameters: they match nothing.
	for _, s := range sqlInjections {
		if !accepted[s] {
			continue
		}
		s = expand(s)
		if ds, err := admin.ListDead(ctx, postbox.DeadFilter{Key: s}); err != nil || len(ds) != 0 {
			t.Errorf("dead filter key %q: %d rows, %v", s, len(ds), err)
		}
		if n, err := admin.DeleteDead(ctx, postbox.DeadSelection{DeadFilter: postbox.DeadFilter{Key: s}}); err != nil || n != 0 {
			t.Errorf("delete dead by key %q: %d, %v", s, n, err)
		}
		now := time.Now()
		if n, err := admin.Replay(ctx, postbox.ReplayRequest{Since: now.Add(-time.Hour), Until: now.Add(time.Minute), Key: s + "-none", Actor: s, DryRun: true}); err != nil || n != 0 {
			t.Errorf("replay by key %q: %d, %v", s, n, err)
		}
		if ls, err := inbox.ListDead(ctx, postbox.DeadFilter{Consumer: s}); err == nil && len(ls) != 0 {
			t.Errorf("inbox dead letters for consumer %q: %d rows", s, len(ls))
		}
	}
	audits, err := admin.Replays(ctx, 100)
	if err != nil {
		t.Fatal(err)
	}
	actors := map[string]bool{}
	for _, a := range audits {
		actors[a.Actor] = true
	}
	for _, s := range sqlInjections {
		if accepted[s] && !actors[expand(s)] {
			t.Errorf("the audit does not hold actor %q as written", expand(s))
		}
	}

	// Nothing was dropped, truncated or deleted along the way.
	st, err := admin.Status(ctx)
	if err != nil {
		t.Fatalf("status after the attempts: %v", err)
	}
	if st.Pending != 0 {
		t.Errorf("pending = %d, want 0", st.Pending)
	}
	if res, err := client.Drain(ctx); err != nil || res.Published != 0 {
		t.Errorf("outbox after the attempts: %+v, %v", res, err)
	}
	if n, err := admin.Replay(ctx, postbox.ReplayRequest{Since: time.Now().Add(-time.Hour), Until: time.Now().Add(time.Minute), Actor: "test", DryRun: true}); err != nil || n != len(msgs) {
		t.Errorf("published history holds %d rows (%v), want %d", n, err, len(msgs))
	}
}

func isConfigError(err error) bool {
	var ce *postbox.ConfigError
	return errors.As(err, &ce)
}
