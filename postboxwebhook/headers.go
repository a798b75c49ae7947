package postboxwebhook

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/configcheck"
)

// ceHeaderPrefix names CloudEvents attributes in HTTP binary mode.
const ceHeaderPrefix = "ce-"

// contentTypeHeader carries the CloudEvents datacontenttype in binary mode.
const contentTypeHeader = "content-type"

// forbiddenRequestHeaders are the names a message or a destination may not
// set: the signature headers belong to the Publisher, and the rest frame
// the HTTP message or steer the connection, so the client would drop or
// rewrite them without a word.
var forbiddenRequestHeaders = map[string]bool{
	HeaderWebhookID: true, HeaderWebhookTimestamp: true, HeaderWebhookSignature: true,
	"host": true, "content-length": true, "transfer-encoding": true, "connection": true,
	"keep-alive": true, "proxy-connection": true, "te": true, "trailer": true,
	"upgrade": true, "expect": true, "idempotency-key": true,
}

// tokenByte reports an HTTP token character (RFC 9110 tchar).
func tokenByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

func validHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		if !tokenByte(name[i]) {
			return false
		}
	}
	return true
}

// validHeaderValue reports whether value can travel as an HTTP field
// value: UTF-8 without control characters other than tab. (Leading and
// trailing whitespace is allowed, though HTTP strips it on the way.)
func validHeaderValue(value string) bool {
	if !utf8.ValidString(value) {
		return false
	}
	for i := 0; i < len(value); i++ {
		if c := value[i]; c < 0x20 && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}

// checkHeader validates one header a message or a destination sets. The
// value never appears in the error: a destination's headers often carry
// credentials.
func checkHeader(name, value string) error {
	if !validHeaderName(name) {
		return fmt.Errorf("header name %q is not an HTTP token", configcheck.Shorten(name))
	}
	if forbiddenRequestHeaders[strings.ToLower(name)] {
		return fmt.Errorf("header %q is set by the publisher or the HTTP client", name)
	}
	if !validHeaderValue(value) {
		return fmt.Errorf("header %q has a value that cannot travel in HTTP (control characters or invalid UTF-8)", name)
	}
	return nil
}

// ceEncode percent-encodes a CloudEvents attribute value for an HTTP
// header (CloudEvents HTTP binding §3.1.3.2): space, double quote,
// percent, and every byte outside printable ASCII become %XY.
func ceEncode(s string) string {
	n := 0
	for i := 0; i < len(s); i++ {
		if ceEscape(s[i]) {
			n++
		}
	}
	if n == 0 {
		return s
	}
	const hex = "0123456789ABCDEF"
	b := make([]byte, 0, len(s)+2*n)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if ceEscape(c) {
			b = append(b, '%', hex[c>>4], hex[c&15])
			continue
		}
		b = append(b, c)
	}
	return string(b)
}

func ceEscape(c byte) bool {
	return c <= ' ' || c == '"' || c == '%' || c >= 0x7f
}

var errBadEncoding = errors.New("bad percent-encoding")

// ceDecode reverses ceEncode, and also accepts the double-quoted form of
// older senders: quoted-string unescaping, then one round of
// percent-decoding. The result must be UTF-8.
func ceDecode(s string) (string, error) {
	if len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"' {
		var b strings.Builder
		inner := s[1 : len(s)-1]
		for i := 0; i < len(inner); i++ {
			c := inner[i]
			switch c {
			case '\\':
				if i+1 == len(inner) {
					return "", errBadEncoding
				}
				i++
				c = inner[i]
			case '"':
				return "", errBadEncoding
			}
			b.WriteByte(c)
		}
		s = b.String()
	}
	if strings.IndexByte(s, '%') < 0 {
		if !utf8.ValidString(s) {
			return "", errBadEncoding
		}
		return s, nil
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '%' {
			b = append(b, c)
			continue
		}
		if i+2 >= len(s) {
			return "", errBadEncoding
		}
		hi, ok1 := unhex(s[i+1])
		lo, ok2 := unhex(s[i+2])
		if !ok1 || !ok2 {
			return "", errBadEncoding
		}
		b = append(b, hi<<4|lo)
		i += 2
	}
	if !utf8.Valid(b) {
		return "", errBadEncoding
	}
	return string(b), nil
}

func unhex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// CheckMessage implements postbox.MessageChecker: a topic with no
// destination, or a header HTTP cannot carry or the publisher sets itself,
// is refused when the message is written. It builds the request's headers
// as Publish does.
func (p *Publisher) CheckMessage(env *postbox.Envelope) error {
	d := p.route(env.Topic)
	if d == nil {
		return fmt.Errorf("%w for topic %q", ErrNoDestination, configcheck.Shorten(env.Topic))
	}
	_, err := requestHeader(d, env)
	return err
}
