package postboxdrivertest

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/postboxdriver"
)

// sqlRow is a row as a service in another language inserts it.
type sqlRow struct {
	topic   string // "" for contract.t
	key     any    // nil for NULL
	payload []byte
	headers string
}

// insertSQL inserts r with the dialect's own SQL through the harness, as
// the table contract describes, and returns the database's error.
func (s *suite[TTx]) insertSQL(t *testing.T, e *env[TTx], r sqlRow) error {
	t.Helper()
	id := postbox.NewID()
	if r.topic == "" {
		r.topic = "contract.t"
	}
	switch e.store.Dialect() {
	case "mysql":
		q := fmt.Sprintf("INSERT INTO %soutbox (id, topic, `key`, payload, headers) VALUES (?, ?, ?, ?, ?)", e.prefix)
		return s.h.Exec(t, e.d, q, id, r.topic, r.key, r.payload, r.headers)
	case "sqlite":
		key, _ := r.key.(string)
		q := fmt.Sprintf("INSERT INTO %soutbox (id, topic, key, payload, headers, partition) VALUES (?, ?, ?, ?, ?, ?)", e.prefix)
		return s.h.Exec(t, e.d, q, id, r.topic, r.key, r.payload, r.headers, postboxdriver.PartitionOf(key, id, 64))
	}
	q := fmt.Sprintf("INSERT INTO %soutbox (id, topic, key, payload, headers) VALUES ($1, $2, $3, $4, $5::jsonb)", e.prefix)
	return s.h.Exec(t, e.d, q, id, r.topic, r.key, r.payload, r.headers)
}

func jsonObject(t *testing.T, h map[string]string) string {
	t.Helper()
	b, err := json.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// tableContractRules inserts rows with SQL that break each of Go's message
// rules: every one fails in the writer's statement with an error naming
// the rule, and writes nothing. The largest message Go accepts passes.
func (s *suite[TTx]) tableContractRules(t *testing.T) {
	if s.h.Exec == nil {
		t.Fatal("Harness.Exec is not set: the suite inserts rows with the dialect's own SQL")
	}
	e := s.setup(t)
	ctx := context.Background()
	many := func(n, valueLen int) map[string]string {
		h := map[string]string{}
		for i := range n {
			h[fmt.Sprintf("h%03d", i)] = strings.Repeat("v", valueLen)
		}
		return h
	}
	bad := []struct {
		rule    string
		payload []byte
		headers string
	}{
		{"header_values", nil, `{"a": 1}`},
		{"header_values", nil, `{"a": null}`},
		{"header_values", nil, `{"a": {"b": "c"}}`},
		{"header_names", nil, `{"a b": "x"}`},
		{"header_names", nil, `{"": "x"}`},
		{"header_names", nil, `{"é": "x"}`},
		{"header_names", nil, jsonObject(t, map[string]string{strings.Repeat("n", 129): "x"})},
		{"header_reserved", nil, `{"Nats-Expected-Stream": "other"}`},
		{"header_reserved", nil, `{"nats-msg-id": "x"}`},
		{"header_reserved", nil, `{"ce-id": "x"}`},
		{"header_reserved", nil, `{"CE-Source": "x"}`},
		{"header_reserved", nil, `{"ce_type": "x"}`},
		{"header_reserved", nil, `{"cloudEvents_id": "x"}`},
		{"header_reserved", nil, `{"postbox-x": "x"}`},
		{"header_reserved", nil, `{"Content-Type": "text/plain"}`},
		{"header_text", nil, `{"a": "line\nbreak"}`},
		{"header_text", nil, `{"a": "\u0001"}`},
		{"header_text", nil, `{"a": "\u007f"}`},
		{"header_text", nil, jsonObject(t, map[string]string{"a": strings.Repeat("x", 4097)})},
		{"headers_count", nil, jsonObject(t, many(65, 1))},
		{"headers_size", nil, jsonObject(t, many(17, 4000))},
		{"payload_size", make([]byte, 64<<20+1), `{}`},
	}
	for _, b := range bad {
		err := s.insertSQL(t, e, sqlRow{payload: b.payload, headers: b.headers})
		want := e.prefix + "outbox_" + b.rule + "_check"
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("headers %.60s: err = %v, want one naming %s", b.headers, err, want)
		}
	}
	// The rules of the topic, the key and the headers' shape.
	for _, b := range []struct {
		rule string
		row  sqlRow
	}{
		{"topic", sqlRow{topic: "a topic", headers: `{}`}},
		{"topic", sqlRow{topic: strings.Repeat("t", 256), headers: `{}`}},
		{"key", sqlRow{key: "", headers: `{}`}},
		{"key", sqlRow{key: strings.Repeat("k", 256), headers: `{}`}},
		{"headers", sqlRow{headers: `["a"]`}},
	} {
		b.row.payload = []byte("p")
		err := s.insertSQL(t, e, b.row)
		want := e.prefix + "outbox_" + b.rule + "_check"
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("topic %.20q key %.20v headers %s: err = %v, want one naming %s", b.row.topic, b.row.key, b.row.headers, err, want)
		}
	}
	// A key holding a NUL byte, which Go refuses: PostgreSQL refuses such
	// text itself, naming no rule (SQLSTATE 22021); the others name the
	// key rule.
	for _, key := range []string{"a\x00b", "\x00", "k\x00"} {
		err := s.insertSQL(t, e, sqlRow{key: key, payload: []byte("p"), headers: `{}`})
		want := e.prefix + "outbox_key_check"
		if e.store.Dialect() == "postgres" {
			want = "SQLSTATE 22021"
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("key %q: err = %v, want one naming %s", key, err, want)
		}
	}
	// An update of the headers is held to the same rules.
	if err := s.insertSQL(t, e, sqlRow{payload: []byte("p"), headers: `{"a": "b"}`}); err != nil {
		t.Fatal(err)
	}
	upd := fmt.Sprintf(`UPDATE %soutbox SET headers = '{"nats-rollup": "all"}'`, e.prefix)
	if err := s.h.Exec(t, e.d, upd); err == nil || !strings.Contains(err.Error(), e.prefix+"outbox_header_reserved_check") {
		t.Errorf("update of the headers: err = %v, want the reserved rule", err)
	}

	// The header limits themselves pass: 64 headers of 65536 bytes in
	// all, the four attributes a writer stores (also at their own limit),
	// a tab.
	largest := many(64, 1020) // 64 × (4 + 1020) = 65536 bytes
	largest["ce-source"] = strings.Repeat("s", postbox.MaxHeaderValueBytes)
	largest["ce-subject"] = "tab\there"
	largest["ce-time"] = "2026-12-01T00:00:00Z"
	largest["content-type"] = "application/json"
	if err := s.insertSQL(t, e, sqlRow{key: "k", payload: []byte("p"), headers: jsonObject(t, largest)}); err != nil {
		t.Fatalf("the largest row Go accepts: %v", err)
	}
	if st := e.stats(t); st.Pending != 2 {
		t.Fatalf("pending = %d, want 2: a refused insert must write nothing", st.Pending)
	}

	// Every row Go writes passes the database's rules: the same message
	// at Go's limits, through WriteTx.
	c := e.client(t, nil, postbox.Config{})
	user := map[string]string{}
	for k, v := range largest {
		if k != "ce-source" && k != "ce-subject" && k != "ce-time" && k != "content-type" {
			user[k] = v
		}
	}
	m := postbox.Message{Topic: "contract.go", Key: "k", Payload: []byte("p"), Headers: user,
		Source: strings.Repeat("s", postbox.MaxHeaderValueBytes), Subject: strings.Repeat("u", postbox.MaxHeaderValueBytes),
		ContentType: strings.Repeat("c", postbox.MaxHeaderValueBytes)}
	if err := c.Write(ctx, m); err != nil {
		t.Fatalf("Go's largest message: %v", err)
	}
}
