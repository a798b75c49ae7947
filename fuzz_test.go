package postbox

// Fuzz targets for bad input. Their seed corpora live in
// testdata/fuzz/<FuzzName>/; run one with
//
//	go test -run='^$' -fuzz=FuzzValidateTopic -fuzztime=30s .
//
// Each target checks its function against an oracle written from the
// documented rule, not from the code under test. The hashed files in the
// corpora are inputs these targets found that once broke a rule; they stay
// as regression cases.

import (
	"encoding/json"
	"errors"
	"maps"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// topicRE is the documented topic rule, and the outbox table's CHECK.
var topicRE = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,255}$`)

func FuzzValidateTopic(f *testing.F) {
	f.Add("orders.created")
	f.Fuzz(func(t *testing.T, topic string) {
		err := ValidateTopic(topic)
		if ok := topicRE.MatchString(topic); ok != (err == nil) {
			t.Fatalf("ValidateTopic(%q) = %v, but the documented rule says valid=%v", topic, err, ok)
		}
		if err == nil {
			return
		}
		ve, ok := err.(*ValidationError) //nolint:errorlint // the exact type is the contract
		if !ok || ve.Field != "topic" || ve.Reason == "" || len(ve.Value) > 64 {
			t.Fatalf("ValidateTopic(%q) = %#v, want a *ValidationError on topic", topic, err)
		}
	})
}

// prefixOK is the documented prefix rule, written out by hand.
func prefixOK(p string) bool {
	if len(p) < 1 || len(p) > 32 {
		return false
	}
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch {
		case c >= 'a' && c <= 'z', c == '_':
		case c >= '0' && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

func FuzzValidatePrefix(f *testing.F) {
	f.Add("postbox_")
	f.Fuzz(func(t *testing.T, prefix string) {
		err := ValidatePrefix(prefix)
		if ok := prefixOK(prefix); ok != (err == nil) {
			t.Fatalf("ValidatePrefix(%q) = %v, but the documented rule says valid=%v", prefix, err, ok)
		}
		if err != nil {
			if ve, ok := err.(*ValidationError); !ok || ve.Field != "Prefix" { //nolint:errorlint // the exact type is the contract
				t.Fatalf("ValidatePrefix(%q) = %#v, want a *ValidationError on Prefix", prefix, err)
			}
			return
		}
		// The prefix is spliced into SQL: nothing but identifier bytes.
		if strings.ContainsAny(prefix, "\"';- .\x00\n") {
			t.Fatalf("accepted %q", prefix)
		}
	})
}

func FuzzDecodeHeaders(f *testing.F) {
	f.Add([]byte(`{"ce-source":"/shop","traceparent":"00-01"}`))
	f.Add([]byte(`{"a": "\u00e9\"x", "b":"\ud83d\ude00", "a":"last"}`))
	f.Add([]byte(" { } "))
	f.Fuzz(checkDecodeHeaders)
}

// checkDecodeHeaders holds DecodeHeaders to encoding/json and to its
// contract on the column b.
func checkDecodeHeaders(t *testing.T, b []byte) {
	t.Helper()
	h, err := DecodeHeaders(b)
	// Differential: whatever encoding/json reads as an object of
	// non-null strings, the scanner reads the same.
	var ref map[string]*string
	if json.Unmarshal(b, &ref) == nil && ref != nil && !slices.Contains(slices.Collect(maps.Values(ref)), nil) {
		if err != nil {
			t.Fatalf("encoding/json reads %q as headers, DecodeHeaders fails: %v", b, err)
		}
		for k, v := range ref {
			if h[k] != *v {
				t.Fatalf("%q: header %q = %q, encoding/json reads %q", b, k, h[k], *v)
			}
		}
		if len(h) != len(ref) {
			t.Fatalf("%q: %d headers, encoding/json reads %d", b, len(h), len(ref))
		}
	}
	if err != nil {
		if h != nil {
			t.Fatalf("error %v with a non-nil map", err)
		}
		return
	}
	if h == nil {
		t.Fatal("nil map without an error")
	}
	if len(b) > 0 && !json.Valid(b) {
		t.Fatalf("accepted %q, which is not JSON", b)
	}
	// The contract: a JSON object whose values are strings.
	var raw map[string]any
	if len(b) > 0 {
		if err := json.Unmarshal(b, &raw); err != nil {
			t.Fatalf("accepted %q, which is not a JSON object: %v", b, err)
		}
		for k, v := range raw {
			if _, ok := v.(string); !ok {
				t.Fatalf("value of %q is %T (%v), not a string, and is accepted; see TestDecodeHeadersContract", k, v, v)
			}
		}
	}
	re, err := json.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	h2, err := DecodeHeaders(re)
	if err != nil {
		t.Fatalf("re-encoded headers %s do not decode: %v", re, err)
	}
	if !reflect.DeepEqual(h, h2) {
		t.Fatalf("round trip changed the headers:\n%q\n%q", h, h2)
	}
}

// canonicalUUID is 8-4-4-4-12 hex digits.
var canonicalUUID = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// text is the documented rule for header values and the CloudEvents
// attributes: UTF-8 without control characters other than tab.
func text(s string, limit int) bool {
	if len(s) > limit || !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if r == 0x7f || r < 0x20 && r != '\t' {
			return false
		}
	}
	return true
}

func headerNameOK(n string) bool {
	if n == "" || len(n) > MaxHeaderNameBytes {
		return false
	}
	for i := 0; i < len(n); i++ {
		c := n[i]
		// RFC 9110 tchar.
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !alnum && strings.IndexByte("!#$%&'*+-.^_`|~", c) < 0 {
			return false
		}
	}
	l := strings.ToLower(n)
	for _, p := range []string{"ce-", "ce_", "cloudevents:", "cloudevents_", "nats-", "postbox-"} {
		if strings.HasPrefix(l, p) {
			return false
		}
	}
	return l != "content-type"
}

const fuzzMaxPayload = 64

var messageFields = map[string]bool{"id": true, "topic": true, "key": true, "payload": true, "headers": true, "source": true, "subject": true, "content_type": true}

func FuzzMessageValidate(f *testing.F) {
	f.Add("", "orders.created", "k", []byte("{}"), "traceparent", "00-01", "", "", "/shop", "order-1", "application/json")
	f.Fuzz(func(t *testing.T, id, topic, key string, payload []byte, h1, v1, h2, v2, source, subject, contentType string) {
		m := &Message{ID: id, Topic: topic, Key: key, Payload: payload, Source: source, Subject: subject, ContentType: contentType}
		if h1 != "" || v1 != "" || h2 != "" || v2 != "" {
			m.Headers = map[string]string{h1: v1, h2: v2}
		}
		err := m.validate(0, fuzzMaxPayload)
		if err != nil {
			ve, ok := err.(*ValidationError) //nolint:errorlint // the exact type is the contract
			if !ok {
				t.Fatalf("got %T %v, want a *ValidationError", err, err)
			}
			f, found := strings.CutPrefix(ve.Field, "messages[0].")
			if !found || !messageFields[f] || ve.Reason == "" || len(ve.Value) > 64 {
				t.Fatalf("malformed error %#v", ve)
			}
			if again := m.validate(0, fuzzMaxPayload); again.Error() != err.Error() {
				t.Fatalf("%v, then %v; see TestDeterministicErrors", err, again)
			}
			return
		}
		// Accepted: every documented rule holds.
		switch {
		case id != "" && !canonicalUUID.MatchString(id):
			t.Fatalf("accepted id %q", id)
		case !topicRE.MatchString(topic):
			t.Fatalf("accepted topic %q", topic)
		case len(key) > MaxKeyBytes || !utf8.ValidString(key) || strings.IndexByte(key, 0) >= 0:
			t.Fatalf("accepted key %q", key)
		case len(payload) > fuzzMaxPayload:
			t.Fatalf("accepted a %d-byte payload", len(payload))
		case !text(source, MaxHeaderValueBytes) || !text(subject, MaxHeaderValueBytes) || !text(contentType, MaxHeaderValueBytes):
			t.Fatalf("accepted attributes %q %q %q", source, subject, contentType)
		}
		for n, v := range m.Headers {
			if strings.Contains(n, ":") {
				t.Fatalf("header name %q accepted; see TestHeaderNameIsToken", n)
			}
			if !headerNameOK(n) || !text(v, MaxHeaderValueBytes) {
				t.Fatalf("accepted header %q: %q", n, v)
			}
		}
		b, err := encodeHeaders(m, DefaultSource, time.Now(), nil)
		if err != nil {
			t.Fatalf("encodeHeaders failed on a valid message: %v", err)
		}
		if _, err := DecodeHeaders(b); err != nil {
			t.Fatalf("stored headers %s do not decode: %v", b, err)
		}
	})
}

func FuzzHeaderRoundTrip(f *testing.F) {
	f.Add("traceparent", "00-01", "x-tenant", "acme", "/shop", "order-1", "application/json", "postbox", int64(1767225600), int64(5))
	f.Fuzz(func(t *testing.T, h1, v1, h2, v2, source, subject, contentType, cfgSource string, sec, nsec int64) {
		m := &Message{Topic: "t", Headers: map[string]string{h1: v1, h2: v2}, Source: source, Subject: subject, ContentType: contentType}
		if sec != 0 || nsec != 0 {
			m.Time = time.Unix(sec, nsec)
		}
		if m.validate(0, 0) != nil {
			return
		}
		if (&Config{Source: cfgSource}).WithDefaults().Validate() != nil {
			return // NewClient would refuse this Config
		}
		cfgSource = (&Config{Source: cfgSource}).WithDefaults().Source
		now := time.Date(2026, 11, 29, 12, 0, 0, 123456789, time.FixedZone("x", 3600))

		b, err := encodeHeaders(m, cfgSource, now, nil)
		if err != nil {
			t.Fatalf("encodeHeaders: %v", err)
		}
		h, err := DecodeHeaders(b)
		if err != nil {
			t.Fatalf("DecodeHeaders(%s): %v", b, err)
		}
		want := map[string]string{}
		for k, v := range m.Headers {
			want[k] = v
		}
		want[HeaderSource] = cfgSource
		if source != "" {
			want[HeaderSource] = source
		}
		if subject != "" {
			want[HeaderSubject] = subject
		}
		if contentType != "" {
			want[HeaderContentType] = contentType
		}
		at := now
		if !m.Time.IsZero() {
			at = m.Time
		}
		got, err := time.Parse(time.RFC3339Nano, h[HeaderTime])
		if err != nil {
			if y := at.UTC().Year(); y < 0 || y > 9999 {
				t.Fatalf("year %d stored as ce-time %q; see TestMessageTimeIsRFC3339", y, h[HeaderTime])
			}
			t.Fatalf("ce-time %q is not RFC 3339: %v", h[HeaderTime], err)
		}
		if !got.Equal(at) {
			t.Fatalf("ce-time %q is %v, want %v", h[HeaderTime], got, at)
		}
		delete(h, HeaderTime)
		if !reflect.DeepEqual(h, want) {
			t.Fatalf("headers came back as\n%q\nwant\n%q", h, want)
		}
	})
}

// TestMessageTimeIsRFC3339: ce-time must be an RFC 3339 timestamp, which
// has four-digit years. Message.Time is not checked, and a time outside
// years 0000-9999 is stored as a ce-time no consumer can parse.
func TestMessageTimeIsRFC3339(t *testing.T) {
	for _, at := range []time.Time{
		time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC),
	} {
		m := &Message{Topic: "t", Time: at}
		if err := m.validate(0, 0); err != nil {
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("got %v", err)
			}
			continue // refused: fine
		}
		b, err := encodeHeaders(m, DefaultSource, time.Now(), nil)
		if err != nil {
			continue // refused: fine
		}
		h, _ := DecodeHeaders(b)
		if _, err := time.Parse(time.RFC3339Nano, h[HeaderTime]); err != nil {
			t.Fatalf("message.go, Message.validate/encodeHeaders: Time %v is accepted and stored as ce-time %q, "+
				"which is not RFC 3339: %v", at, h[HeaderTime], err)
		}
	}
}

// TestDecodeHeadersContract: DecodeHeaders takes a JSON object whose values
// are strings; anything else is an error.
func TestDecodeHeadersContract(t *testing.T) {
	for in, want := range map[string]map[string]string{
		``:                      {},
		`{}`:                    {},
		` {"a":"b"} `:           {"a": "b"},
		`{"a":"\u00e9\n"}`:      {"a": "é\n"},
		`null`:                  nil,
		`[]`:                    nil,
		`"x"`:                   nil,
		`{"a":1}`:               nil,
		`{"a":{"b":"c"}}`:       nil,
		`{"a":"b"} {}`:          nil,
		`{"a":"b"`:              nil,
		`{"a":["b"]}`:           nil,
		`{"a":true}`:            nil,
		"\xef\xbb\xbf{\"a\":1}": nil,
	} {
		h, err := DecodeHeaders([]byte(in))
		if want == nil {
			if err == nil {
				t.Errorf("DecodeHeaders(%q) = %q, want an error", in, h)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(h, want) {
			t.Errorf("DecodeHeaders(%q) = %q, %v; want %q", in, h, err, want)
		}
	}
	if h, err := DecodeHeaders([]byte(`{"a":null}`)); err == nil {
		t.Fatalf("message.go, DecodeHeaders: {\"a\":null} is accepted as %q; encoding/json leaves null map values "+
			"as \"\", so a row written through the table contract with a null header is published with an empty one", h)
	}
}
