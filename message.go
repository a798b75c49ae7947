package postbox

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/postbox-go/postbox/internal/printable"
)

// Limits on messages. The payload cap is configurable (Config.MaxPayloadBytes).
const (
	MaxTopicBytes       = 255
	MaxKeyBytes         = 255
	MaxHeaders          = 64
	MaxHeaderNameBytes  = 128
	MaxHeaderValueBytes = 4096
	MaxHeadersBytes     = 64 << 10
)

// Message is one message to write. Only Topic is required.
type Message struct {
	// ID identifies the message everywhere: the outbox row, the broker's
	// message id (Nats-Msg-Id, AMQP message-id) and the inbox. Empty means
	// a new UUIDv7 is made before the insert; set it yourself (NewID) when
	// you need to know it.
	ID string
	// Topic names what happened, e.g. "orders.created". Letters, digits and
	// . _ : - only, at most 255 bytes. Publishers map it to a subject,
	// routing key or topic.
	Topic string
	// Key orders messages: those with one key are published in write
	// order, one at a time. Empty means no order and full parallelism.
	Key string
	// Payload is sent as it is, up to Config.MaxPayloadBytes.
	Payload []byte
	// Headers travel with the message. Names are HTTP tokens; names
	// beginning with "ce-", "ce_", "cloudEvents:", "cloudEvents_",
	// "nats-", "postbox-", and "content-type" are reserved.
	Headers map[string]string

	// CloudEvents attributes, sent in binary mode (ce-* headers).
	Source      string    // ce-source; empty means Config.Source
	Subject     string    // ce-subject
	Time        time.Time // ce-time, when the change happened; zero means now
	ContentType string    // content-type, e.g. "application/json"
}

// NewID returns a new message id, a UUIDv7: unique, and sortable by time.
func NewID() string { return uuid.Must(uuid.NewV7()).String() }

// Header names the relay adds on every envelope, and those a writer stores.
const (
	HeaderSpecVersion  = "ce-specversion"
	HeaderID           = "ce-id"
	HeaderType         = "ce-type"
	HeaderSource       = "ce-source"
	HeaderSubject      = "ce-subject"
	HeaderTime         = "ce-time"
	HeaderPartitionKey = "ce-partitionkey"
	HeaderContentType  = "content-type"
	// HeaderReplayHorizon is the producer's replay horizon, which the
	// relay sets on every envelope from its Config.Retention: how long its
	// history keeps the message, so how long after a publish a replay
	// under the message's id can still send it, in whole seconds, or
	// "forever" when the history is kept forever. An Inbox keeps the
	// message's record at least that long plus RedeliveryMargin, even past
	// its own InboxRetention (design §5, "The dedupe horizon").
	HeaderReplayHorizon = "postbox-replay-horizon"
)

// ReplayHorizonForever is HeaderReplayHorizon's value for a history kept
// forever.
const ReplayHorizonForever = "forever"

// replayHorizon is HeaderReplayHorizon's value for a history kept for
// retention (negative: forever).
func replayHorizon(retention time.Duration) string {
	if retention < 0 {
		return ReplayHorizonForever
	}
	return strconv.FormatInt(int64(retention/time.Second), 10)
}

// maxHorizonSeconds is the longest horizon read as a duration (100
// years); a longer one is read as forever.
const maxHorizonSeconds = 100 * 365 * 24 * 3600

// parseReplayHorizon reads a HeaderReplayHorizon value: the horizon, with
// forever true for "forever" (or one beyond 100 years), and ok false for
// a value that is neither a number of seconds nor "forever".
func parseReplayHorizon(v string) (horizon time.Duration, forever, ok bool) {
	if v == ReplayHorizonForever {
		return 0, true, true
	}
	n, err := strconv.ParseInt(v, 10, 64)
	switch {
	case err != nil || n < 0:
		return 0, false, false
	case n > maxHorizonSeconds:
		return 0, true, true
	}
	return time.Duration(n) * time.Second, false, true
}

// ValidateTopic reports whether topic is a valid topic: 1 to 255 bytes of
// letters, digits and . _ : -.
func ValidateTopic(topic string) error {
	if topic == "" {
		return invalid("topic", topic, "is empty")
	}
	if len(topic) > MaxTopicBytes {
		return invalid("topic", topic, "is %d bytes, over the limit of %d", len(topic), MaxTopicBytes)
	}
	for i := 0; i < len(topic); i++ {
		if !topicByte(topic[i]) {
			_, size := utf8.DecodeRuneInString(topic[i:]) // an invalid byte has size 1
			return invalid("topic", topic, "has %q at byte %d; only ASCII letters, digits and . _ : - are allowed", topic[i:i+size], i)
		}
	}
	return nil
}

func topicByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == ':' || c == '-'
}

// tokenByte reports an HTTP token character (RFC 9110 tchar): header
// names travel as HTTP-style headers on NATS and AMQP too.
func tokenByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// reservedHeader reports names postbox or a broker binding gives a meaning
// of their own: CloudEvents attributes in their HTTP (ce-), Kafka (ce_) and
// AMQP (cloudEvents: / cloudEvents_) spellings, NATS's and postbox's own.
func reservedHeader(name string) bool {
	l := strings.ToLower(name)
	for _, p := range [...]string{"ce-", "ce_", "cloudevents:", "cloudevents_", "nats-", "postbox-"} {
		if strings.HasPrefix(l, p) {
			return true
		}
	}
	return l == HeaderContentType
}

// validate checks m as message number i, with the payload cap maxPayload.
func (m *Message) validate(i, maxPayload int) error {
	field := func(f string) string { return fmt.Sprintf("messages[%d].%s", i, f) }
	if m.ID != "" {
		// Lower case only: databases print a uuid in lower case, and the id
		// the writer holds must be the one consumers see.
		if _, err := uuid.Parse(m.ID); err != nil || len(m.ID) != 36 || strings.ToLower(m.ID) != m.ID {
			return invalid(field("id"), m.ID, "is not a UUID in canonical lower-case form")
		}
	}
	if err := ValidateTopic(m.Topic); err != nil {
		ve := err.(*ValidationError) //nolint:errorlint // ValidateTopic returns only this type
		ve.Field = field("topic")
		return ve
	}
	if err := validateKey(field("key"), m.Key); err != nil {
		return err
	}
	if len(m.Payload) > maxPayload {
		return invalid(field("payload"), "", "is %d bytes, over the limit of %d", len(m.Payload), maxPayload)
	}
	if len(m.Headers) > MaxHeaders {
		return invalid(field("headers"), "", "has %d entries, over the limit of %d", len(m.Headers), MaxHeaders)
	}
	// Sorted, so that a message with several bad headers always reports
	// the same one.
	total := 0
	for _, name := range slices.Sorted(maps.Keys(m.Headers)) {
		value := m.Headers[name]
		total += len(name) + len(value)
		if err := validateHeader(name, value); err != nil {
			return invalid(field("headers"), name, "%s", err)
		}
	}
	if total > MaxHeadersBytes {
		return invalid(field("headers"), "", "total %d bytes, over the limit of %d", total, MaxHeadersBytes)
	}
	for _, a := range [...]struct{ name, value string }{{"source", m.Source}, {"subject", m.Subject}, {"content_type", m.ContentType}} {
		if len(a.value) > MaxHeaderValueBytes || !printable.Text(a.value) {
			return invalid(field(a.name), a.value, "must be printable text of at most %d bytes", MaxHeaderValueBytes)
		}
	}
	// ce-time is RFC 3339, whose years have four digits.
	if y := m.Time.Year(); !m.Time.IsZero() && (y < 0 || y > 9999) {
		return invalid(field("time"), m.Time, "year %d is outside 0000-9999, which RFC 3339 cannot carry", y)
	}
	return nil
}

// checkTrace checks the headers m stores once the writer's trace context
// is added to its own, against the rules its own headers meet: the
// database holds every row to them (the table contract), so a tracer that
// broke them would fail the caller's transaction.
func (m *Message) checkTrace(i int, trace map[string]string) error {
	if len(trace) == 0 {
		return nil
	}
	field := fmt.Sprintf("messages[%d].headers", i)
	n, total := len(m.Headers), 0
	for name, value := range m.Headers {
		total += len(name) + len(value)
	}
	for _, name := range slices.Sorted(maps.Keys(trace)) {
		if _, own := m.Headers[name]; own {
			continue // the message's own value wins
		}
		n++
		total += len(name) + len(trace[name])
		if err := validateHeader(name, trace[name]); err != nil {
			return invalid(field, name, "the tracer's trace context: %s", err)
		}
	}
	if n > MaxHeaders {
		return invalid(field, "", "has %d entries with the tracer's trace context, over the limit of %d", n, MaxHeaders)
	}
	if total > MaxHeadersBytes {
		return invalid(field, "", "total %d bytes with the tracer's trace context, over the limit of %d", total, MaxHeadersBytes)
	}
	return nil
}

func validateHeader(name, value string) error {
	if name == "" || len(name) > MaxHeaderNameBytes {
		return fmt.Errorf("header name must be 1 to %d bytes", MaxHeaderNameBytes)
	}
	for i := 0; i < len(name); i++ {
		if !tokenByte(name[i]) {
			return fmt.Errorf("header name has %q; names are HTTP tokens", name[i])
		}
	}
	if reservedHeader(name) {
		return fmt.Errorf("header name is reserved (ce-*, ce_*, cloudEvents*, nats-*, postbox-*, content-type)")
	}
	if len(value) > MaxHeaderValueBytes {
		return fmt.Errorf("header value is %d bytes, over the limit of %d", len(value), MaxHeaderValueBytes)
	}
	if !printable.Text(value) {
		return fmt.Errorf("header value must be UTF-8 text without control characters")
	}
	return nil
}

// encodeHeaders renders what a message stores in the headers column: its
// own headers and its CloudEvents attributes. The attributes derived from
// the row itself (id, type, partition key) are added by the relay instead,
// so a row written by another language through the table contract gets
// them too.
func encodeHeaders(m *Message, source string, now time.Time, trace map[string]string) ([]byte, error) {
	return json.Marshal(storedHeaders(m, source, now, trace))
}

// storedHeaders is the map encodeHeaders renders.
func storedHeaders(m *Message, source string, now time.Time, trace map[string]string) map[string]string {
	h := make(map[string]string, len(m.Headers)+len(trace)+4)
	// The writer's trace context first, so that headers the message sets
	// itself (a trace context carried from elsewhere) win.
	for k, v := range trace {
		h[k] = v
	}
	for k, v := range m.Headers {
		h[k] = v
	}
	if m.Source != "" {
		source = m.Source
	}
	h[HeaderSource] = source
	if m.Subject != "" {
		h[HeaderSubject] = m.Subject
	}
	t := m.Time
	if t.IsZero() {
		t = now
	}
	h[HeaderTime] = t.UTC().Format(time.RFC3339Nano)
	if m.ContentType != "" {
		h[HeaderContentType] = m.ContentType
	}
	return h
}

// newEnvelope is the envelope the relay hands a publisher for a row: its
// stored headers h (taken over) with the CloudEvents attributes derived
// from the row itself and the replay horizon (HeaderReplayHorizon, from
// replayHorizon: set at publish, never stored in the row, so it always
// says the publishing relay's retention and costs the table nothing). The
// relay and the write-time check (MessageChecker) both build it here, so
// the check sees what the publisher will.
func newEnvelope(id, topic, key string, payload []byte, h map[string]string, source, horizon string, created time.Time, attempt int) *Envelope {
	h[HeaderSpecVersion] = "1.0"
	h[HeaderReplayHorizon] = horizon
	h[HeaderID] = id
	h[HeaderType] = topic
	if h[HeaderSource] == "" {
		h[HeaderSource] = source
	}
	if h[HeaderTime] == "" {
		h[HeaderTime] = created.UTC().Format(time.RFC3339Nano)
	}
	if key != "" {
		h[HeaderPartitionKey] = key
	}
	return &Envelope{ID: id, Topic: topic, Key: key, Payload: payload, Headers: h, CreatedAt: created, Attempt: attempt}
}

// DecodeHeaders parses a stored headers column: a JSON object whose values
// are strings. Anything else is an error; the relay buries such a row rather
// than guess.
//
// The relay decodes every row's headers, so this is a scanner for exactly
// that shape rather than encoding/json (which cost a fifth of the relay's
// CPU). The column is copied into one string, of which every plain name
// and value is a part; strings with escapes are unescaped on their own,
// and those it cannot read simply (surrogates, bad escapes, non-ASCII
// bytes) are handed to encoding/json one at a time.
func DecodeHeaders(b []byte) (map[string]string, error) {
	if len(b) == 0 {
		return map[string]string{}, nil
	}
	d := headerDecoder{b: b, s: string(b)}
	h, err := d.object()
	if err != nil {
		return nil, fmt.Errorf("postbox: headers are not a JSON object of strings: %w", err)
	}
	return h, nil
}

// envelopeAttributes is how many headers newEnvelope adds to those of a
// row that stores its ce-source and ce-time, as a writer's rows do:
// DecodeHeaders makes room for them, so the relay's map is made once.
const envelopeAttributes = 5

type headerDecoder struct {
	b []byte
	s string // b as a string; plain names and values are parts of it
	i int
}

func (d *headerDecoder) space() {
	for d.i < len(d.b) {
		switch d.b[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

func (d *headerDecoder) expect(c byte) error {
	d.space()
	if d.i >= len(d.b) {
		return fmt.Errorf("unexpected end, want %q", c)
	}
	if d.b[d.i] != c {
		return fmt.Errorf("offset %d: %q, want %q", d.i, d.b[d.i], c)
	}
	d.i++
	return nil
}

// sizeHint is the size to make the map of the object in d.b: an entry
// has four quotes unless its strings hold escaped ones, so a quarter of
// the quotes bounds the entries (capped at MaxHeaders, for an object
// whose strings hold many), plus the attributes newEnvelope adds.
func (d *headerDecoder) sizeHint() int {
	return min(bytes.Count(d.b, []byte{'"'})/4, MaxHeaders) + envelopeAttributes
}

func (d *headerDecoder) object() (map[string]string, error) {
	if err := d.expect('{'); err != nil {
		return nil, err
	}
	d.space()
	if d.i < len(d.b) && d.b[d.i] == '}' {
		d.i++
		return make(map[string]string, 8), d.end()
	}
	h := make(map[string]string, d.sizeHint())
	for {
		k, err := d.str()
		if err != nil {
			return nil, err
		}
		if err := d.expect(':'); err != nil {
			return nil, err
		}
		v, err := d.str()
		if err != nil {
			return nil, fmt.Errorf("header %q: %w", k, err)
		}
		h[k] = v // a repeated name keeps the last value, as encoding/json does
		d.space()
		if d.i >= len(d.b) {
			return nil, fmt.Errorf("unexpected end of object")
		}
		switch d.b[d.i] {
		case ',':
			d.i++
		case '}':
			d.i++
			return h, d.end()
		default:
			return nil, fmt.Errorf("offset %d: %q, want ',' or '}'", d.i, d.b[d.i])
		}
	}
}

func (d *headerDecoder) end() error {
	d.space()
	if d.i != len(d.b) {
		return fmt.Errorf("offset %d: data after the object", d.i)
	}
	return nil
}

// plainByte reports the bytes a JSON string holds as they are, as far as
// the scanner can tell on its own: printable ASCII but the quote and the
// backslash.
var plainByte = func() (t [256]bool) {
	for c := 0x20; c < 0x80; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// special8 reports whether the eight bytes of w (little-endian) hold one
// that is not a plainByte: a quote, a backslash, a control character or
// a non-ASCII byte. No borrow crosses into a byte from plain bytes below
// it, so the lowest such byte always shows, and none shows without one.
func special8(w uint64) bool {
	const lo, hi = 0x0101010101010101, 0x8080808080808080
	q := w ^ '"'*lo
	e := w ^ '\\'*lo
	return ((w-0x20*lo)&^w|(q-lo)&^q|(e-lo)&^e|w)&hi != 0
}

// str reads a JSON string. Plain ones (no escape, valid UTF-8, no control
// character) are parts of d.s; those with escapes are unescaped by
// unescape when it can, else by encoding/json, which also repairs invalid
// UTF-8.
func (d *headerDecoder) str() (string, error) {
	d.space()
	if d.i >= len(d.b) || d.b[d.i] != '"' {
		if d.i < len(d.b) && d.b[d.i] == 'n' {
			return "", fmt.Errorf("offset %d: null, want a string", d.i)
		}
		return "", fmt.Errorf("offset %d: want a string", d.i)
	}
	start := d.i
	escaped, ascii := false, true
	for j := start + 1; ; {
		// Plain bytes eight at a time, then one at a time up to the next
		// other one.
		for j+8 <= len(d.b) && !special8(binary.LittleEndian.Uint64(d.b[j:])) {
			j += 8
		}
		for j < len(d.b) && plainByte[d.b[j]] {
			j++
		}
		if j >= len(d.b) {
			break
		}
		switch c := d.b[j]; {
		case c == '"':
			d.i = j + 1
			raw := d.b[start+1 : j]
			switch {
			case !escaped && (ascii || utf8.Valid(raw)):
				// encoding/json would copy it as it is.
				return d.s[start+1 : j], nil
			case escaped && ascii:
				if s, ok := unescape(raw); ok {
					return s, nil
				}
			}
			var s string
			if err := json.Unmarshal(d.b[start:j+1], &s); err != nil {
				return "", err
			}
			return s, nil
		case c == '\\':
			escaped = true
			j += 2 // past the escaped byte, so an escaped quote does not end the string
		case c < 0x20:
			return "", fmt.Errorf("offset %d: control character in a string", j)
		default:
			ascii = false
			j++
		}
	}
	return "", fmt.Errorf("unterminated string")
}

// unescape decodes the inside of a JSON string with escapes, as
// encoding/json does, when it holds only printable ASCII and the escapes
// \" \\ \/ \b \f \n \r \t and \uXXXX outside the surrogates. For
// anything else it returns false, leaving it to encoding/json.
func unescape(raw []byte) (string, bool) {
	var sb strings.Builder
	sb.Grow(len(raw))
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		if c != '\\' {
			if c < 0x20 || c >= 0x80 {
				return "", false
			}
			sb.WriteByte(c)
			continue
		}
		i++
		if i >= len(raw) {
			return "", false
		}
		switch raw[i] {
		case '"', '\\', '/':
			sb.WriteByte(raw[i])
		case 'b':
			sb.WriteByte('\b')
		case 'f':
			sb.WriteByte('\f')
		case 'n':
			sb.WriteByte('\n')
		case 'r':
			sb.WriteByte('\r')
		case 't':
			sb.WriteByte('\t')
		case 'u':
			if i+4 >= len(raw) {
				return "", false
			}
			var r rune
			for _, h := range raw[i+1 : i+5] {
				switch {
				case h >= '0' && h <= '9':
					h -= '0'
				case h >= 'a' && h <= 'f':
					h -= 'a' - 10
				case h >= 'A' && h <= 'F':
					h -= 'A' - 10
				default:
					return "", false
				}
				r = r<<4 | rune(h)
			}
			if utf16.IsSurrogate(r) {
				return "", false
			}
			sb.WriteRune(r)
			i += 4
		default:
			return "", false
		}
	}
	return sb.String(), true
}
