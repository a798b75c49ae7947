package postboxdrivertest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/postbox-go/postbox"
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
func (s *suite[TTx]) sqlInjection(t *testing.T) {
	e := s.setup(t)
	d, prefix := e.d, e.prefix
	ctx := context.Background()
	broker := &recorder{}
	client, err := postbox.NewClient(d, &postbox.Config{Prefix: prefix, Publisher: broker})
	if err != nil {
		t.Fatal(err)
	}
	admin, inbox := client.Admin(), client.Inbox()
	expand := func(s string) string { return strings.ReplaceAll(s, "{p}", prefix) }

	// Prefixes are identifiers spliced into SQL: refused before any use.
	for _, inj := range sqlInjections {
		var ve *postbox.ValidationError
		if _, err := postbox.NewClient(d, &postbox.Config{Prefix: expand(inj), Publisher: broker}); !errors.As(err, &ve) && !isConfigError(err) {
			t.Errorf("prefix %q: %v, want a typed error", inj, err)
		}
		if _, err := d.Open(expand(inj)); err == nil {
			t.Errorf("the driver opened prefix %q", inj)
		}
		// Topics are refused at write time and as filters.
		err := client.Write(ctx, postbox.Message{Topic: expand(inj)})
		if !errors.As(err, &ve) {
			t.Errorf("topic %q: %v, want *ValidationError", inj, err)
		}
		if _, err := admin.ListDead(ctx, postbox.DeadFilter{Topic: expand(inj)}); !errors.As(err, &ve) {
			t.Errorf("dead filter topic %q: %v, want *ValidationError", inj, err)
		}
	}

	// Keys, payloads and header values are data: stored and sent as
	// written, or refused whole with a typed error (a NUL byte).
	var msgs []postbox.Message
	accepted := map[string]bool{}
	for _, inj := range sqlInjections {
		m := postbox.Message{Topic: "orders.paid", Key: expand(inj), Payload: []byte(expand(inj)), Headers: map[string]string{"x-note": expand(inj)}}
		err := client.Write(ctx, m)
		var ve *postbox.ValidationError
		switch {
		case err == nil:
			msgs = append(msgs, m)
			accepted[inj] = true
		case !errors.As(err, &ve):
			t.Fatalf("write key %q: %v, want success or *ValidationError", inj, err)
		}
	}
	if len(msgs) < len(sqlInjections)-1 {
		t.Fatalf("only %d of %d keys accepted", len(msgs), len(sqlInjections))
	}
	if res, err := client.Drain(ctx); err != nil || res.Published != len(msgs) {
		t.Fatalf("drain: %+v, %v", res, err)
	}
	got := map[string]bool{}
	for _, env := range broker.snapshot() {
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
	for _, inj := range sqlInjections {
		if !accepted[inj] {
			continue
		}
		v := expand(inj)
		if ds, err := admin.ListDead(ctx, postbox.DeadFilter{Key: v}); err != nil || len(ds) != 0 {
			t.Errorf("dead filter key %q: %d rows, %v", v, len(ds), err)
		}
		if n, err := admin.DeleteDead(ctx, postbox.DeadSelection{DeadFilter: postbox.DeadFilter{Key: v}}); err != nil || n != 0 {
			t.Errorf("delete dead by key %q: %d, %v", v, n, err)
		}
		now := time.Now()
		if n, err := admin.Replay(ctx, postbox.ReplayRequest{Since: now.Add(-time.Hour), Until: now.Add(time.Minute), Key: v + "-none", Actor: v, DryRun: true}); err != nil || n != 0 {
			t.Errorf("replay by key %q: %d, %v", v, n, err)
		}
		for _, f := range []postbox.DeadFilter{{Consumer: v}, {IDs: []string{v}}, {Key: v}} {
			if ls, err := inbox.ListDead(ctx, f); err == nil && len(ls) != 0 {
				t.Errorf("consumers' dead messages for %+v: %d rows", f, len(ls))
			}
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
	for _, inj := range sqlInjections {
		if accepted[inj] && !actors[expand(inj)] {
			t.Errorf("the audit does not hold actor %q as written", expand(inj))
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
