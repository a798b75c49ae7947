package postbox_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/testdb"
	"github.com/postbox-go/postbox/postboxdriver"
	"github.com/postbox-go/postbox/postboxmigrate"
	"github.com/postbox-go/postbox/postboxpgx"
)

// vtStore is a Store that counts inserts. Every other method is left to
// the nil embedded interface and panics: validation must come before any of
// them.
type vtStore struct {
	postboxdriver.Store[struct{}]
	inserts atomic.Int64
	rows    atomic.Int64
}

func (s *vtStore) Insert(_ context.Context, rows []postboxdriver.Row) error {
	s.inserts.Add(1)
	s.rows.Add(int64(len(rows)))
	return nil
}

// UnwrapExecutor returns the store itself: its transaction is a stand-in.
func (s *vtStore) UnwrapExecutor(struct{}) postboxdriver.Executor { return s }

type vtDriver struct{ s *vtStore }

func (d vtDriver) Open(string) (postboxdriver.Store[struct{}], error) { return d.s, nil }

func vtClient(t *testing.T, cfg *postbox.Config) (*postbox.Client[struct{}], *vtStore) {
	t.Helper()
	s := &vtStore{}
	c, err := postbox.NewClient[struct{}](vtDriver{s}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c, s
}

// validMessage passes every rule.
func validMessage() postbox.Message {
	return postbox.Message{
		Topic:       "orders.created",
		Key:         "order-1",
		Payload:     []byte(`{"id":1}`),
		Headers:     map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
		Source:      "/shop",
		Subject:     "order-1",
		ContentType: "application/json",
	}
}

type messageCase struct {
	name   string
	edit   func(m *postbox.Message)
	field  string // "" means the message is accepted
	reason string // the exact reason, or a prefix ending in "..."
	value  string // the exact Value, checked when not ""
}

// headers makes n headers, named h000..., nameLen bytes each, with values
// of valueLen bytes.
func headers(n, nameLen, valueLen int) map[string]string {
	h := make(map[string]string, n)
	for i := range n {
		h[fmt.Sprintf("h%0*d", nameLen-1, i)] = strings.Repeat("v", valueLen)
	}
	return h
}

func messageCases() []messageCase {
	const maxKey = postbox.MaxKeyBytes
	topicRule := "only ASCII letters, digits and . _ : - are allowed"
	cases := []messageCase{
		{name: "valid", edit: func(*postbox.Message) {}},
		{name: "minimal", edit: func(m *postbox.Message) { *m = postbox.Message{Topic: "t"} }},

		// id
		{name: "id generated", edit: func(m *postbox.Message) { m.ID = "" }},
		{name: "id UUIDv7", edit: func(m *postbox.Message) { m.ID = postbox.NewID() }},
		{name: "id UUIDv4", edit: func(m *postbox.Message) { m.ID = "9b2d1c4e-5f6a-4b7c-8d9e-0f1a2b3c4d5e" }},
		{name: "id garbage", edit: func(m *postbox.Message) { m.ID = "order-1" }, field: "id", reason: "is not a UUID in canonical lower-case form", value: "order-1"},
		{name: "id without hyphens", edit: func(m *postbox.Message) { m.ID = "0190a5d8ac96774bbccab302099a8057" }, field: "id", reason: "is not a UUID in canonical lower-case form"},
		{name: "id urn", edit: func(m *postbox.Message) { m.ID = "urn:uuid:0190a5d8-ac96-774b-bcca-b302099a8057" }, field: "id", reason: "is not a UUID in canonical lower-case form"},
		{name: "id braces", edit: func(m *postbox.Message) { m.ID = "{0190a5d8-ac96-774b-bcca-b302099a8057}" }, field: "id", reason: "is not a UUID in canonical lower-case form"},
		{name: "id hyphens misplaced", edit: func(m *postbox.Message) { m.ID = "0190a5d8a-c96-774b-bcca-b302099a8057" }, field: "id", reason: "is not a UUID in canonical lower-case form"},
		{name: "id non-hex", edit: func(m *postbox.Message) { m.ID = "0190a5d8-ac96-774b-bcca-b302099a805g" }, field: "id", reason: "is not a UUID in canonical lower-case form"},
		{name: "id with space", edit: func(m *postbox.Message) { m.ID = " 0190a5d8-ac96-774b-bcca-b302099a805" }, field: "id", reason: "is not a UUID in canonical lower-case form"},

		// topic
		{name: "topic every allowed character", edit: func(m *postbox.Message) { m.Topic = "az.AZ_09:-" }},
		{name: "topic 255 bytes", edit: func(m *postbox.Message) { m.Topic = strings.Repeat("t", 255) }},
		{name: "topic 256 bytes", edit: func(m *postbox.Message) { m.Topic = strings.Repeat("t", 256) }, field: "topic", reason: "is 256 bytes, over the limit of 255",
			value: strings.Repeat("t", 61) + "..."},
		{name: "topic empty", edit: func(m *postbox.Message) { m.Topic = "" }, field: "topic", reason: "is empty"},
	}
	for i, bad := range []string{" ", "/", "*", ">", "#", "!", "?", "@", "\x00", "\n", "\x7f", "é", "\xff", "+", "$", "~", "%", ","} {
		topic := "orders" + bad + "x"
		cases = append(cases, messageCase{
			name: fmt.Sprintf("topic character %d %q", i, bad), edit: func(m *postbox.Message) { m.Topic = topic },
			field: "topic", reason: fmt.Sprintf("has %q at byte 6; %s", bad, topicRule),
		})
	}
	cases = append(cases, []messageCase{
		// key
		{name: "key empty", edit: func(m *postbox.Message) { m.Key = "" }},
		{name: "key 255 bytes", edit: func(m *postbox.Message) { m.Key = strings.Repeat("k", maxKey) }},
		{name: "key 256 bytes", edit: func(m *postbox.Message) { m.Key = strings.Repeat("k", maxKey+1) }, field: "key", reason: "is 256 bytes, over the limit of 255"},
		{name: "key 127 two-byte runes", edit: func(m *postbox.Message) { m.Key = strings.Repeat("é", 127) }},
		{name: "key 128 two-byte runes", edit: func(m *postbox.Message) { m.Key = strings.Repeat("é", 128) }, field: "key", reason: "is 256 bytes, over the limit of 255"},
		{name: "key any text", edit: func(m *postbox.Message) { m.Key = "customer/42 · 東京" }},
		{name: "key invalid UTF-8", edit: func(m *postbox.Message) { m.Key = "k\xff" }, field: "key", reason: "is not valid UTF-8 text"},
		{name: "key NUL", edit: func(m *postbox.Message) { m.Key = "a\x00b" }, field: "key", reason: "is not valid UTF-8 text"},

		// payload (the cap is 16 bytes in this table)
		{name: "payload nil", edit: func(m *postbox.Message) { m.Payload = nil }},
		{name: "payload at the cap", edit: func(m *postbox.Message) { m.Payload = make([]byte, 16) }},
		{name: "payload over the cap", edit: func(m *postbox.Message) { m.Payload = make([]byte, 17) }, field: "payload", reason: "is 17 bytes, over the limit of 16", value: "-"},
		{name: "payload binary", edit: func(m *postbox.Message) { m.Payload = []byte{0, 0xff, 0xfe} }},

		// headers: count
		{name: "headers none", edit: func(m *postbox.Message) { m.Headers = nil }},
		{name: "headers 64", edit: func(m *postbox.Message) { m.Headers = headers(64, 4, 1) }},
		{name: "headers 65", edit: func(m *postbox.Message) { m.Headers = headers(65, 4, 1) }, field: "headers", reason: "has 65 entries, over the limit of 64", value: "-"},
		// headers: names
		{name: "header name 128 bytes", edit: func(m *postbox.Message) { m.Headers = map[string]string{strings.Repeat("n", 128): "v"} }},
		{name: "header name 129 bytes", edit: func(m *postbox.Message) { m.Headers = map[string]string{strings.Repeat("n", 129): "v"} }, field: "headers", reason: "header name must be 1 to 128 bytes"},
		{name: "header name empty", edit: func(m *postbox.Message) { m.Headers = map[string]string{"": "v"} }, field: "headers", reason: "header name must be 1 to 128 bytes"},
		{name: "header name token characters", edit: func(m *postbox.Message) { m.Headers = map[string]string{"a!#$%&'*+^`|~.-_Z9": "v"} }},
	}...)
	for _, bad := range []string{" ", "(", ")", "/", "\"", ",", ";", "=", "?", "@", "[", "]", "{", "}", "\\", "\t", "\x00", "\x7f", "é"} {
		name := "x" + bad + "y"
		cases = append(cases, messageCase{
			name: fmt.Sprintf("header name with %q", bad), edit: func(m *postbox.Message) { m.Headers = map[string]string{name: "v"} },
			field: "headers", reason: fmt.Sprintf("header name has %q; names are HTTP tokens", bad[0]), value: name,
		})
	}
	for _, reserved := range []string{"ce-id", "CE-Type", "ce-", "nats-msg-id", "Nats-Expected-Stream", "postbox-attempt", "POSTBOX-x", "content-type", "Content-Type"} {
		cases = append(cases, messageCase{
			name: "header reserved " + reserved, edit: func(m *postbox.Message) { m.Headers = map[string]string{reserved: "v"} },
			field: "headers", reason: "header name is reserved (ce-*, ce_*, cloudEvents*, nats-*, postbox-*, content-type)", value: reserved,
		})
	}
	for _, free := range []string{"x-ce-id", "ce", "nats", "contenttype", "content-type-x", "content-length", "postbox"} {
		cases = append(cases, messageCase{name: "header not reserved " + free, edit: func(m *postbox.Message) { m.Headers = map[string]string{free: "v"} }})
	}
	cases = append(cases, []messageCase{
		// headers: values
		{name: "header value empty", edit: func(m *postbox.Message) { m.Headers = map[string]string{"h": ""} }},
		{name: "header value tab and unicode", edit: func(m *postbox.Message) { m.Headers = map[string]string{"h": "a\tb é € 東 \u2028 \u0085"} }},
		{name: "header value 4096 bytes", edit: func(m *postbox.Message) { m.Headers = map[string]string{"h": strings.Repeat("v", 4096)} }},
		{name: "header value 4097 bytes", edit: func(m *postbox.Message) { m.Headers = map[string]string{"h": strings.Repeat("v", 4097)} }, field: "headers", reason: "header value is 4097 bytes, over the limit of 4096", value: "h"},
		{name: "header value newline", edit: func(m *postbox.Message) { m.Headers = map[string]string{"h": "a\nb"} }, field: "headers", reason: "header value must be UTF-8 text without control characters", value: "h"},
		{name: "header value CR", edit: func(m *postbox.Message) { m.Headers = map[string]string{"h": "a\rb"} }, field: "headers", reason: "header value must be UTF-8 text without control characters"},
		{name: "header value NUL", edit: func(m *postbox.Message) { m.Headers = map[string]string{"h": "\x00"} }, field: "headers", reason: "header value must be UTF-8 text without control characters"},
		{name: "header value DEL", edit: func(m *postbox.Message) { m.Headers = map[string]string{"h": "\x7f"} }, field: "headers", reason: "header value must be UTF-8 text without control characters"},
		{name: "header value ESC", edit: func(m *postbox.Message) { m.Headers = map[string]string{"h": "\x1b[31m"} }, field: "headers", reason: "header value must be UTF-8 text without control characters"},
		{name: "header value invalid UTF-8", edit: func(m *postbox.Message) { m.Headers = map[string]string{"h": "\xc3"} }, field: "headers", reason: "header value must be UTF-8 text without control characters"},
		// headers: total size, names and values together
		{name: "headers total at the limit", edit: func(m *postbox.Message) { m.Headers = headers(16, 3, 4093) }},
		{name: "headers total over the limit", edit: func(m *postbox.Message) {
			m.Headers = headers(16, 3, 4093)
			m.Headers["h00"] += "v"
		}, field: "headers", reason: "total 65537 bytes, over the limit of 65536", value: "-"},
	}...)
	for _, f := range []struct {
		field string
		set   func(m *postbox.Message, v string)
	}{
		{"source", func(m *postbox.Message, v string) { m.Source = v }},
		{"subject", func(m *postbox.Message, v string) { m.Subject = v }},
		{"content_type", func(m *postbox.Message, v string) { m.ContentType = v }},
	} {
		const rule = "must be printable text of at most 4096 bytes"
		cases = append(cases,
			messageCase{name: f.field + " empty", edit: func(m *postbox.Message) { f.set(m, "") }},
			messageCase{name: f.field + " 4096 bytes", edit: func(m *postbox.Message) { f.set(m, strings.Repeat("s", 4096)) }},
			messageCase{name: f.field + " unicode and tab", edit: func(m *postbox.Message) { f.set(m, "urn:東京\tx") }},
			messageCase{name: f.field + " 4097 bytes", edit: func(m *postbox.Message) { f.set(m, strings.Repeat("s", 4097)) }, field: f.field, reason: rule},
			messageCase{name: f.field + " newline", edit: func(m *postbox.Message) { f.set(m, "a\nb") }, field: f.field, reason: rule, value: "a\nb"},
			messageCase{name: f.field + " NUL", edit: func(m *postbox.Message) { f.set(m, "\x00") }, field: f.field, reason: rule},
			messageCase{name: f.field + " invalid UTF-8", edit: func(m *postbox.Message) { f.set(m, "\xff") }, field: f.field, reason: rule},
		)
	}
	return cases
}

// TestMessageValidation runs every rule of Message validation through
// WriteTx and Write: the bad message is the second of a batch of three, so
// its index shows in the field, and no insert happens at all.
func TestMessageValidation(t *testing.T) {
	c, s := vtClient(t, &postbox.Config{MaxPayloadBytes: 16})
	ctx := context.Background()
	for _, tc := range messageCases() {
		t.Run(tc.name, func(t *testing.T) {
			m := validMessage()
			tc.edit(&m)
			before := s.inserts.Load()
			for _, write := range []struct {
				name string
				do   func(...postbox.Message) error
			}{
				{"WriteTx", func(ms ...postbox.Message) error { return c.WriteTx(ctx, struct{}{}, ms...) }},
				{"Write", func(ms ...postbox.Message) error { return c.Write(ctx, ms...) }},
			} {
				err := write.do(validMessage(), m, validMessage())
				if tc.field == "" {
					if err != nil {
						t.Fatalf("%s rejected a valid message: %v", write.name, err)
					}
					continue
				}
				checkValidationError(t, err, "messages[1]."+tc.field, tc.reason, tc.value)
				if n := s.inserts.Load(); n != before {
					t.Fatalf("%s: an invalid batch reached the store", write.name)
				}
			}
		})
	}
}

func checkValidationError(t *testing.T, err error, field, reason, value string) {
	t.Helper()
	var ve *postbox.ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("got %v (%T), want a *ValidationError", err, err)
	}
	if ve.Field != field {
		t.Errorf("Field = %q, want %q", ve.Field, field)
	}
	if ve.Reason != reason {
		t.Errorf("Reason = %q, want %q", ve.Reason, reason)
	}
	switch value {
	case "":
	case "-":
		if ve.Value != "" {
			t.Errorf("Value = %q, want none", ve.Value)
		}
	default:
		if ve.Value != value {
			t.Errorf("Value = %q, want %q", ve.Value, value)
		}
	}
	if len(ve.Value) > 64 {
		t.Errorf("Value is %d bytes, not shortened for display", len(ve.Value))
	}
	want := "postbox: invalid " + field
	if !strings.HasPrefix(err.Error(), want) || !strings.HasSuffix(err.Error(), ": "+reason) {
		t.Errorf("Error() = %q, want %q...%q", err, want, reason)
	}
}

func TestPayloadDefaultCap(t *testing.T) {
	c, s := vtClient(t, nil)
	ctx := context.Background()
	if err := c.Write(ctx, postbox.Message{Topic: "t", Payload: make([]byte, postbox.DefaultMaxPayloadBytes)}); err != nil {
		t.Fatalf("payload at the default cap: %v", err)
	}
	err := c.Write(ctx, postbox.Message{Topic: "t", Payload: make([]byte, postbox.DefaultMaxPayloadBytes+1)})
	checkValidationError(t, err, "messages[0].payload", "is 1048577 bytes, over the limit of 1048576", "-")
	if s.inserts.Load() != 1 {
		t.Fatalf("inserts = %d, want 1", s.inserts.Load())
	}
}

func TestValidateTopic(t *testing.T) {
	if err := postbox.ValidateTopic("a.b_c:d-E9"); err != nil {
		t.Fatal(err)
	}
	err := postbox.ValidateTopic("a b")
	var ve *postbox.ValidationError
	if !errors.As(err, &ve) || ve.Field != "topic" || ve.Value != "a b" {
		t.Fatalf("got %#v", err)
	}
}

type validatorFunc func(topic string, payload []byte) error

func (f validatorFunc) ValidatePayload(topic string, payload []byte) error { return f(topic, payload) }

func TestPayloadValidatorHook(t *testing.T) {
	ctx := context.Background()
	var calls atomic.Int64
	v := validatorFunc(func(topic string, payload []byte) error {
		calls.Add(1)
		switch string(payload) {
		case "typed":
			return &postbox.ValidationError{Field: "payload", Reason: "at /a: must be >= 0"}
		case "plain":
			return errors.New("schema says no")
		}
		return nil
	})
	c, s := vtClient(t, &postbox.Config{Validator: v})
	ok := postbox.Message{Topic: "t", Payload: []byte("fine")}

	err := c.WriteTx(ctx, struct{}{}, ok, ok, postbox.Message{Topic: "t", Payload: []byte("typed")})
	checkValidationError(t, err, "messages[2].payload", "at /a: must be >= 0", "-")
	err = c.Write(ctx, ok, postbox.Message{Topic: "t", Payload: []byte("plain")})
	checkValidationError(t, err, "messages[1].payload", "schema says no", "-")
	if s.inserts.Load() != 0 {
		t.Fatal("a batch the validator refused reached the store")
	}

	// The built-in rules run first: an invalid topic never reaches the hook.
	calls.Store(0)
	err = c.Write(ctx, postbox.Message{Topic: "bad topic", Payload: []byte("typed")})
	checkValidationError(t, err, "messages[0].topic", "has \" \" at byte 3; only ASCII letters, digits and . _ : - are allowed", "bad topic")
	if calls.Load() != 0 {
		t.Error("the validator saw a message with an invalid topic")
	}
	if err := c.Write(ctx, ok, ok); err != nil || s.rows.Load() != 2 {
		t.Fatalf("valid batch: %v, %d rows", err, s.rows.Load())
	}
}

// TestValidatorErrorIsNotModified: a validator may return the same
// *ValidationError value every time (a package-level variable). The Client
// must not rewrite it.
func TestValidatorErrorIsNotModified(t *testing.T) {
	shared := &postbox.ValidationError{Field: "payload", Reason: "not allowed"}
	c, _ := vtClient(t, &postbox.Config{Validator: validatorFunc(func(string, []byte) error { return shared })})
	ctx := context.Background()
	var fields []string
	for range 2 {
		var ve *postbox.ValidationError
		if err := c.Write(ctx, postbox.Message{Topic: "t"}); errors.As(err, &ve) {
			fields = append(fields, ve.Field)
		}
	}
	if shared.Field != "payload" || len(fields) != 2 || fields[1] != "messages[0].payload" {
		t.Fatalf("client.go, Client.rows: the Client sets Field on the validator's own *ValidationError "+
			"instead of a copy, so a shared error value accumulates prefixes (fields seen: %q, shared.Field now %q) "+
			"and concurrent writes race on it", fields, shared.Field)
	}
}

// TestHeaderNameIsToken: header names are HTTP tokens (RFC 9110 tchar),
// which exclude ':'. A name with one cannot be written as an HTTP or NATS
// header line: "a:b: v" reads back as the header "a" with value "b: v".
func TestHeaderNameIsToken(t *testing.T) {
	c, _ := vtClient(t, nil)
	err := c.Write(context.Background(), postbox.Message{Topic: "t", Headers: map[string]string{"x:y": "v"}})
	if err == nil {
		t.Fatalf("message.go, tokenByte: header name \"x:y\" is accepted; tokenByte reuses topicByte, " +
			"which allows ':', a character HTTP tokens do not have")
	}
	checkValidationError(t, err, "messages[0].headers", "header name has ':'; names are HTTP tokens", "x:y")
}

// TestTopicErrorNamesTheCharacter: the reason quotes the offending byte
// with %q, which prints a byte of a multi-byte character as the Latin-1
// character of that value: "ordersé" is said to have 'Ã'.
func TestTopicErrorNamesTheCharacter(t *testing.T) {
	err := postbox.ValidateTopic("ordersé")
	var ve *postbox.ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("got %v", err)
	}
	if strings.Contains(ve.Reason, "Ã") {
		t.Fatalf("message.go, ValidateTopic: reason %q names a character the topic does not contain", ve.Reason)
	}
}

// TestDeterministicErrors: one input, one error. When a message breaks
// several rules of a kind, the rule reported must not depend on map
// iteration order.
func TestDeterministicErrors(t *testing.T) {
	c, _ := vtClient(t, nil)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		m    postbox.Message
	}{
		{"source, subject and content type all bad", postbox.Message{Topic: "t", Source: "\n", Subject: "\n", ContentType: "\n"}},
		{"several bad headers", postbox.Message{Topic: "t", Headers: map[string]string{"a b": "", "ce-id": "", "c\x00": "", "d": "\n"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			seen := map[string]bool{}
			for range 200 {
				seen[c.Write(ctx, tc.m).Error()] = true
			}
			if len(seen) > 1 {
				t.Fatalf("message.go, Message.validate: the same message gives %d different errors, by map iteration order: %q", len(seen), keys(seen))
			}
		})
	}
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestValidationErrorValueIsText: Value is shortened for display, and must
// stay valid UTF-8 when the input was.
func TestValidationErrorValueIsText(t *testing.T) {
	c, _ := vtClient(t, nil)
	err := c.Write(context.Background(), postbox.Message{Topic: "t", Source: strings.Repeat("é", 3000)})
	var ve *postbox.ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("got %v", err)
	}
	if !utf8.ValidString(ve.Value) {
		t.Fatalf("errors.go, invalid: Value is cut at byte 61 without regard to runes, leaving invalid UTF-8: %q", ve.Value)
	}
}

// TestMessageIDStoredAsGiven: G7 says the id a writer chooses is the id
// everywhere. PostgreSQL's uuid type prints ids in lower case, so an
// upper-case id comes back different from the one written.
func TestMessageIDStoredAsGiven(t *testing.T) {
	ctx := context.Background()
	pool, prefix := testdb.Migrated(t)
	d := postboxpgx.New(pool)
	c, err := postbox.NewClient(d, &postbox.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	id := strings.ToUpper(postbox.NewID())
	err = c.Write(ctx, postbox.Message{ID: id, Topic: "t"})
	if err != nil {
		var ve *postbox.ValidationError
		if !errors.As(err, &ve) || ve.Field != "messages[0].id" {
			t.Fatalf("got %v, want nil or a *ValidationError on the id", err)
		}
		return // refused: fine
	}
	var stored string
	if err := pool.QueryRow(ctx, `SELECT id::text FROM `+prefix+`outbox`).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if stored != id {
		t.Fatalf("message.go, Message.validate: upper-case id %s is accepted as canonical, but the outbox "+
			"stores and publishes %s, so the id the writer holds is not the one consumers see (G7)", id, stored)
	}
}

// TestLongestPrefixFitsPostgres: a prefix ValidatePrefix accepts must make
// names PostgreSQL keeps whole. It silently cuts identifiers to 63 bytes,
// and a cut name can collide with another or miss a later DROP.
func TestLongestPrefixFitsPostgres(t *testing.T) {
	ctx := context.Background()
	pool := testdb.Pool(t)
	prefix := testdb.Prefix(t)
	prefix += strings.Repeat("x", postboxdriver.MaxPrefixLen-len(prefix))
	if err := postbox.ValidatePrefix(prefix); err != nil {
		t.Fatal(err)
	}
	testdb.DropPrefix(t, pool, prefix)
	m, err := postboxmigrate.New(postboxpgx.New(pool), &postboxmigrate.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	names, dropped := map[string]bool{}, map[string]bool{}
	drop := regexp.MustCompile(`DROP (?:CONSTRAINT|TRIGGER|INDEX|TABLE|FUNCTION) (?:IF EXISTS )?(` + prefix + `[a-z0-9_]*)`)
	for _, mig := range m.Migrations() {
		for _, name := range regexp.MustCompile(prefix+`[a-z0-9_]*`).FindAllString(mig.SQL, -1) {
			names[name] = true
		}
		for _, d := range drop.FindAllStringSubmatch(mig.SQL, -1) {
			dropped[d[1]] = true
		}
	}
	if len(names) < 3 {
		t.Fatalf("found only %d names in the migrations", len(names))
	}
	var cut []string
	for _, name := range slices.Sorted(maps.Keys(names)) {
		var found bool
		err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_class WHERE relname = $1)
			OR EXISTS (SELECT 1 FROM pg_constraint WHERE conname = $1)
			OR EXISTS (SELECT 1 FROM pg_proc WHERE proname = $1)
			OR EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = $1)`, name).Scan(&found)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case len(name) > 63:
			cut = append(cut, fmt.Sprintf("%s (%d bytes)", strings.TrimPrefix(name, prefix), len(name)))
		case !found && !dropped[name]:
			t.Errorf("%s is named in the migrations but does not exist", name)
		case found && dropped[name] && !recreated(m.Migrations(), name):
			t.Errorf("%s is dropped by a migration but still exists", name)
		}
	}
	if len(cut) > 0 {
		t.Fatalf("with a prefix of the longest length ValidatePrefix accepts, "+
			"PostgreSQL silently cuts these names to 63 bytes: {prefix}%s", strings.Join(cut, ", {prefix}"))
	}
}

// recreated says whether a migration creates name again (CREATE TRIGGER
// name, or a constraint or function of that name) after one drops it.
func recreated(migs []postboxdriver.Migration, name string) bool {
	var droppedAt int
	for i, mig := range migs {
		if strings.Contains(mig.SQL, "DROP CONSTRAINT "+name) || strings.Contains(mig.SQL, "DROP TRIGGER "+name) {
			droppedAt = i
		}
	}
	for _, mig := range migs[droppedAt:] {
		if regexp.MustCompile(`(CREATE (OR REPLACE )?(TRIGGER|FUNCTION)|ADD CONSTRAINT) ` + regexp.QuoteMeta(name) + `\b`).MatchString(mig.SQL) {
			return true
		}
	}
	return false
}

// configCase sets one field of a defaulted Config.
type configCase struct {
	name  string
	edit  func(c *postbox.Config)
	field string // "" means valid
	// reason is the exact reason when not "".
	reason string
}

func configCases() []configCase {
	long := func(n int) string { return strings.Repeat("s", n) }
	return []configCase{
		{name: "defaults", edit: func(*postbox.Config) {}},

		{name: "Prefix underscore only", edit: func(c *postbox.Config) { c.Prefix = "_" }},
		{name: "Prefix 32 characters", edit: func(c *postbox.Config) { c.Prefix = "p" + strings.Repeat("_", 31) }},
		{name: "Prefix without underscore", edit: func(c *postbox.Config) { c.Prefix = "pb" }},
		{name: "Prefix 33 characters", edit: func(c *postbox.Config) { c.Prefix = "p" + strings.Repeat("_", 32) }, field: "Prefix"},
		{name: "Prefix upper case", edit: func(c *postbox.Config) { c.Prefix = "Postbox_" }, field: "Prefix",
			reason: "must be lower-case letters, digits and _, not starting with a digit, at most 32 characters"},
		{name: "Prefix leading digit", edit: func(c *postbox.Config) { c.Prefix = "1pb_" }, field: "Prefix"},
		{name: "Prefix hyphen", edit: func(c *postbox.Config) { c.Prefix = "pb-" }, field: "Prefix"},
		{name: "Prefix quote", edit: func(c *postbox.Config) { c.Prefix = `pb";drop table x;--` }, field: "Prefix"},
		{name: "Prefix dot", edit: func(c *postbox.Config) { c.Prefix = "public.pb_" }, field: "Prefix"},
		{name: "Prefix trailing newline", edit: func(c *postbox.Config) { c.Prefix = "pb_\n" }, field: "Prefix"},
		{name: "Prefix non-ASCII", edit: func(c *postbox.Config) { c.Prefix = "pé_" }, field: "Prefix"},

		{name: "Source 4096 bytes", edit: func(c *postbox.Config) { c.Source = long(4096) }},
		{name: "Source 4097 bytes", edit: func(c *postbox.Config) { c.Source = long(4097) }, field: "Source", reason: "must be printable text of at most 4096 bytes"},
		{name: "Source control character", edit: func(c *postbox.Config) { c.Source = "a\x01" }, field: "Source"},
		{name: "Source invalid UTF-8", edit: func(c *postbox.Config) { c.Source = "\xff" }, field: "Source"},

		{name: "MaxPayloadBytes 1", edit: func(c *postbox.Config) { c.MaxPayloadBytes = 1 }},
		{name: "MaxPayloadBytes 64 MiB", edit: func(c *postbox.Config) { c.MaxPayloadBytes = 64 << 20 }},
		{name: "MaxPayloadBytes over 64 MiB", edit: func(c *postbox.Config) { c.MaxPayloadBytes = 64<<20 + 1 }, field: "MaxPayloadBytes", reason: "must be between 1 and 67108864"},
		{name: "MaxPayloadBytes negative", edit: func(c *postbox.Config) { c.MaxPayloadBytes = -1 }, field: "MaxPayloadBytes"},

		{name: "BatchSize 100000", edit: func(c *postbox.Config) { c.BatchSize = 100_000 }},
		{name: "BatchSize 100001", edit: func(c *postbox.Config) { c.BatchSize = 100_001 }, field: "BatchSize", reason: "must be between 1 and 100000"},
		{name: "BatchSize negative", edit: func(c *postbox.Config) { c.BatchSize = -5 }, field: "BatchSize"},

		{name: "PublishWindow 1", edit: func(c *postbox.Config) { c.PublishWindow = 1 }},
		{name: "PublishWindow 100001", edit: func(c *postbox.Config) { c.PublishWindow = 100_001 }, field: "PublishWindow", reason: "must be between 1 and 100000"},
		{name: "PublishWindow negative", edit: func(c *postbox.Config) { c.PublishWindow = -1 }, field: "PublishWindow"},

		{name: "MaxAttempts 1", edit: func(c *postbox.Config) { c.MaxAttempts = 1 }},
		{name: "MaxAttempts 1000000", edit: func(c *postbox.Config) { c.MaxAttempts = 1_000_000 }},
		{name: "MaxAttempts 1000001", edit: func(c *postbox.Config) { c.MaxAttempts = 1_000_001 }, field: "MaxAttempts", reason: "must be between 1 and 1000000"},
		{name: "MaxAttempts negative", edit: func(c *postbox.Config) { c.MaxAttempts = -1 }, field: "MaxAttempts"},

		{name: "MaxCrashes 1", edit: func(c *postbox.Config) { c.MaxCrashes = 1 }},
		{name: "MaxCrashes 1001", edit: func(c *postbox.Config) { c.MaxCrashes = 1001 }, field: "MaxCrashes", reason: "must be between 1 and 1000"},
		{name: "MaxCrashes negative", edit: func(c *postbox.Config) { c.MaxCrashes = -1 }, field: "MaxCrashes"},

		{name: "LeaseDuration 100ms", edit: func(c *postbox.Config) { c.LeaseDuration, c.BatchDeadline = 100*time.Millisecond, 50*time.Millisecond }},
		{name: "LeaseDuration 99ms", edit: func(c *postbox.Config) { c.LeaseDuration, c.BatchDeadline = 99*time.Millisecond, 50*time.Millisecond }, field: "LeaseDuration", reason: "must be at least 100ms"},
		{name: "LeaseDuration negative", edit: func(c *postbox.Config) { c.LeaseDuration = -time.Minute; c.BatchDeadline = -2 * time.Minute }, field: "LeaseDuration,BatchDeadline"},

		{name: "BatchDeadline 10ms", edit: func(c *postbox.Config) { c.BatchDeadline = 10 * time.Millisecond }},
		{name: "BatchDeadline 9ms", edit: func(c *postbox.Config) { c.BatchDeadline = 9 * time.Millisecond }, field: "BatchDeadline", reason: "must be at least 10ms"},
		{name: "BatchDeadline equal to LeaseDuration", edit: func(c *postbox.Config) { c.BatchDeadline = c.LeaseDuration }, field: "BatchDeadline",
			reason: "must be shorter than LeaseDuration (4s), so a batch ends before its lease can pass to another relay"},
		{name: "BatchDeadline just under LeaseDuration", edit: func(c *postbox.Config) { c.BatchDeadline = c.LeaseDuration - time.Nanosecond }},

		{name: "BackoffBase 1ms", edit: func(c *postbox.Config) { c.BackoffBase = time.Millisecond }},
		{name: "BackoffBase under 1ms", edit: func(c *postbox.Config) { c.BackoffBase = time.Millisecond - 1 }, field: "BackoffBase", reason: "must be at least 1ms"},
		{name: "BackoffBase negative", edit: func(c *postbox.Config) { c.BackoffBase = -time.Second }, field: "BackoffBase"},

		{name: "BackoffMax equal to BackoffBase", edit: func(c *postbox.Config) { c.BackoffMax = c.BackoffBase }},
		{name: "BackoffMax shorter than BackoffBase", edit: func(c *postbox.Config) { c.BackoffMax = c.BackoffBase - 1 }, field: "BackoffMax",
			reason: "must not be shorter than BackoffBase (1s)"},

		{name: "PollInterval 1ms", edit: func(c *postbox.Config) { c.PollInterval = time.Millisecond }},
		{name: "PollInterval under 1ms", edit: func(c *postbox.Config) { c.PollInterval = time.Microsecond }, field: "PollInterval", reason: "must be at least 1ms"},
		{name: "PollInterval negative", edit: func(c *postbox.Config) { c.PollInterval = -1 }, field: "PollInterval"},

		{name: "RelayID 200 bytes", edit: func(c *postbox.Config) { c.RelayID = long(200) }},
		{name: "RelayID 201 bytes", edit: func(c *postbox.Config) { c.RelayID = long(201) }, field: "RelayID", reason: "must be printable text of at most 200 bytes"},
		{name: "RelayID newline", edit: func(c *postbox.Config) { c.RelayID = "relay\n1" }, field: "RelayID"},
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range configCases() {
		t.Run(tc.name, func(t *testing.T) {
			c := (*postbox.Config)(nil).WithDefaults()
			tc.edit(c)
			err := c.Validate()
			if tc.field == "" {
				if err != nil {
					t.Fatalf("rejected: %v", err)
				}
				return
			}
			var ce *postbox.ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("got %v (%T), want a *ConfigError", err, err)
			}
			var fields []string
			for _, p := range ce.Problems {
				fields = append(fields, p.Field)
			}
			if got := strings.Join(fields, ","); got != tc.field {
				t.Fatalf("fields %s, want %s (%v)", got, tc.field, err)
			}
			if tc.reason != "" && ce.Problems[0].Reason != tc.reason {
				t.Errorf("Reason = %q, want %q", ce.Problems[0].Reason, tc.reason)
			}
			var ve *postbox.ValidationError
			if !errors.As(err, &ve) || ve != ce.Problems[0] {
				t.Error("errors.As to *ValidationError does not reach the problem")
			}
		})
	}
}

// TestConfigListsEveryProblem breaks every field at once: all are listed,
// in one *ConfigError, and NewClient returns it.
func TestConfigListsEveryProblem(t *testing.T) {
	cfg := &postbox.Config{
		Prefix:          "Bad-Prefix",
		Source:          "a\nb",
		MaxPayloadBytes: -1,
		BatchSize:       -1,
		PublishWindow:   200_000,
		MaxAttempts:     -3,
		LeaseDuration:   time.Millisecond,
		BatchDeadline:   time.Second,
		BackoffBase:     time.Microsecond,
		BackoffMax:      time.Nanosecond,
		PollInterval:    time.Nanosecond,
		RelayID:         "\x00",
	}
	want := []string{"Prefix", "Source", "MaxPayloadBytes", "BatchSize", "PublishWindow", "MaxAttempts",
		"LeaseDuration", "BackoffBase", "PollInterval", "BatchDeadline", "BackoffMax", "RelayID"}
	_, err := postbox.NewClient[struct{}](vtDriver{&vtStore{}}, cfg)
	var ce *postbox.ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("got %v, want a *ConfigError", err)
	}
	got := map[string]bool{}
	for _, p := range ce.Problems {
		got[p.Field] = true
	}
	for _, f := range want {
		if !got[f] {
			t.Errorf("%s is not listed: %v", f, err)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d fields listed, want %d: %v", len(got), len(want), err)
	}
	if !strings.HasPrefix(err.Error(), fmt.Sprintf("postbox: invalid config (%d problems): invalid Prefix", len(ce.Problems))) {
		t.Errorf("message: %v", err)
	}
	var ve *postbox.ValidationError
	if !errors.As(err, &ve) || ve.Field != "Prefix" {
		t.Errorf("errors.As gave %v", ve)
	}
}

func TestConfigDefaults(t *testing.T) {
	c := (*postbox.Config)(nil).WithDefaults()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.Prefix != postbox.DefaultPrefix || c.Source != postbox.DefaultSource || c.Logger == nil ||
		c.MaxPayloadBytes != postbox.DefaultMaxPayloadBytes || c.BatchSize != postbox.DefaultBatchSize ||
		c.PublishWindow != postbox.DefaultPublishWindow || c.LeaseDuration != postbox.DefaultLeaseDuration ||
		c.BatchDeadline != min(postbox.DefaultBatchDeadline, postbox.DefaultLeaseDuration/3) || c.BackoffBase != postbox.DefaultBackoffBase ||
		c.BackoffMax != postbox.DefaultBackoffMax || c.MaxAttempts != postbox.DefaultMaxAttempts ||
		c.MaxCrashes != postbox.DefaultMaxCrashes || c.PollInterval != postbox.DefaultPollInterval {
		t.Errorf("defaults: %s", c)
	}
	// A short lease brings the default deadline under it.
	short := (&postbox.Config{LeaseDuration: 3 * time.Second}).WithDefaults()
	if short.BatchDeadline != time.Second {
		t.Errorf("BatchDeadline = %s with a 3s lease, want 1s", short.BatchDeadline)
	}
	if err := (&postbox.Config{LeaseDuration: 100 * time.Millisecond}).WithDefaults().Validate(); err != nil {
		t.Errorf("the shortest lease with a default deadline: %v", err)
	}
	// WithDefaults copies: the caller's Config is left alone.
	in := &postbox.Config{BatchSize: 7}
	_ = in.WithDefaults()
	if in.Prefix != "" || in.BatchSize != 7 {
		t.Error("WithDefaults changed its receiver")
	}
}

// traceTracer injects fixed headers as a writer's trace context.
type traceTracer map[string]string

func (tr traceTracer) Inject(_ context.Context, h map[string]string) {
	for k, v := range tr {
		h[k] = v
	}
}
func (traceTracer) StartPublish(context.Context, *postbox.Envelope) func(error) {
	return func(error) {}
}
func (traceTracer) StartHandle(ctx context.Context, _ string, _ *postbox.Delivery) (context.Context, func(postbox.Verdict)) {
	return ctx, func(postbox.Verdict) {}
}

// The headers a message stores with the writer's trace context meet the
// rules the database holds every row to: a write the trace context would
// push over them is refused in Go, before any statement.
func TestTraceContextMeetsHeaderRules(t *testing.T) {
	full := headers(postbox.MaxHeaders, 8, 8)
	cases := []struct {
		name   string
		trace  traceTracer
		msg    map[string]string
		reason string
	}{
		{"one too many", traceTracer{"traceparent": "00-1-2-01"}, full, "with the tracer's trace context, over the limit of 64"},
		{"reserved name", traceTracer{"nats-msg-id": "x"}, nil, "the tracer's trace context: header name is reserved"},
		{"control character", traceTracer{"baggage": "a\nb"}, nil, "the tracer's trace context: header value must be UTF-8 text"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, s := vtClient(t, &postbox.Config{Tracer: tc.trace})
			m := postbox.Message{Topic: "t", Headers: tc.msg}
			err := c.WriteTx(context.Background(), struct{}{}, m)
			var ve *postbox.ValidationError
			if !errors.As(err, &ve) || ve.Field != "messages[0].headers" || !strings.Contains(ve.Reason, tc.reason) {
				t.Fatalf("err = %v, want a *ValidationError on messages[0].headers saying %q", err, tc.reason)
			}
			if s.inserts.Load() != 0 {
				t.Fatal("a refused write reached the store")
			}
		})
	}
	// The message's own header of the same name wins, and counts once.
	c, _ := vtClient(t, &postbox.Config{Tracer: traceTracer{"h0000000": "x"}})
	if err := c.WriteTx(context.Background(), struct{}{}, postbox.Message{Topic: "t", Headers: full}); err != nil {
		t.Fatalf("a trace header the message sets itself: %v", err)
	}
}
