package postboxwebhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/postbox-go/postbox"
)

// The Standard Webhooks headers.
const (
	HeaderWebhookID        = "webhook-id"
	HeaderWebhookTimestamp = "webhook-timestamp"
	HeaderWebhookSignature = "webhook-signature"
)

// SecretPrefix starts every secret: "whsec_" followed by the key in
// standard base64 (with padding).
const SecretPrefix = "whsec_"

// Bounds on a secret's key, in bytes once decoded. The specification asks
// for at least 24 random bytes.
const (
	MinSecretBytes = 24
	MaxSecretBytes = 512
)

// DefaultTolerance is how far a webhook-timestamp may be from the
// receiver's clock, either way, before Verify refuses the request.
const DefaultTolerance = 5 * time.Minute

// signatureVersion tags an HMAC-SHA256 signature in webhook-signature.
const signatureVersion = "v1"

// Verification failures. Verify wraps one of them; test with errors.Is.
var (
	// ErrMissingHeaders: webhook-id, webhook-timestamp or
	// webhook-signature is absent or empty.
	ErrMissingHeaders = errors.New("postboxwebhook: missing webhook-id, webhook-timestamp or webhook-signature")
	// ErrInvalidHeaders: webhook-timestamp is not a plain decimal number
	// of seconds.
	ErrInvalidHeaders = errors.New("postboxwebhook: invalid webhook headers")
	// ErrTimestamp: webhook-timestamp is further from now than the
	// tolerance; an old request may be a replay.
	ErrTimestamp = errors.New("postboxwebhook: webhook-timestamp outside the tolerance")
	// ErrBadSignature: no v1 signature in webhook-signature matches any
	// of the verifier's secrets.
	ErrBadSignature = errors.New("postboxwebhook: no matching signature")
)

// Secret is a signing secret, "whsec_" followed by base64. It prints as
// "whsec_(redacted)" through fmt and log/slog, so a logged Config does
// not leak it.
type Secret string

const redacted = SecretPrefix + "(redacted)"

// String implements fmt.Stringer without revealing the secret.
func (Secret) String() string { return redacted }

// GoString implements fmt.GoStringer without revealing the secret.
func (Secret) GoString() string { return redacted }

// LogValue implements slog.LogValuer without revealing the secret.
func (Secret) LogValue() slog.Value { return slog.StringValue(redacted) }

// key decodes the secret. Its errors never include the secret.
func (s Secret) key() ([]byte, error) {
	b64, ok := strings.CutPrefix(string(s), SecretPrefix)
	if !ok {
		return nil, fmt.Errorf("must start with %q", SecretPrefix)
	}
	key, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return nil, errors.New(`must be "whsec_" followed by standard base64 with padding`)
	}
	if len(key) < MinSecretBytes || len(key) > MaxSecretBytes {
		return nil, fmt.Errorf("key is %d bytes; it must be %d to %d random bytes", len(key), MinSecretBytes, MaxSecretBytes)
	}
	return key, nil
}

func keys(field string, secrets []Secret) ([][]byte, []*postbox.ValidationError) {
	var ps []*postbox.ValidationError
	if len(secrets) == 0 {
		ps = append(ps, &postbox.ValidationError{Field: field, Reason: "needs at least one secret"})
	}
	out := make([][]byte, 0, len(secrets))
	for i, s := range secrets {
		k, err := s.key()
		if err != nil {
			// The value stays out of the error: it is a secret, or
			// something close to one.
			ps = append(ps, &postbox.ValidationError{Field: fmt.Sprintf("%s[%d]", field, i), Reason: err.Error()})
			continue
		}
		out = append(out, k)
	}
	return out, ps
}

func toSecrets(ss []string) []Secret {
	out := make([]Secret, len(ss))
	for i, s := range ss {
		out[i] = Secret(s)
	}
	return out
}

func configError(ps []*postbox.ValidationError) error {
	if len(ps) == 0 {
		return nil
	}
	return &postbox.ConfigError{Problems: ps}
}

// mac returns base64(HMAC-SHA256(key, id "." timestamp "." body)).
func mac(key []byte, id string, ts int64, body []byte) string {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(id))
	h.Write([]byte{'.'})
	h.Write(strconv.AppendInt(nil, ts, 10))
	h.Write([]byte{'.'})
	h.Write(body)
	return base64.StdEncoding.EncodeToString(h.Sum(nil))
}

// Signer makes webhook-signature values. It is safe for concurrent use.
type Signer struct {
	keys [][]byte
}

// NewSigner returns a Signer that signs with every secret, in order: during
// a rotation, pass the new secret and the old one, and receivers holding
// either accept the request. An invalid secret returns a
// *postbox.ConfigError that names it by position, never by value.
func NewSigner(secrets ...string) (*Signer, error) {
	ks, ps := keys("secrets", toSecrets(secrets))
	if err := configError(ps); err != nil {
		return nil, err
	}
	return &Signer{keys: ks}, nil
}

// Sign returns the webhook-signature value for a request with webhook-id
// id, webhook-timestamp ts (whole seconds) and body: one "v1,<base64>"
// per secret, separated by spaces.
func (s *Signer) Sign(id string, ts time.Time, body []byte) string {
	var b strings.Builder
	for i, k := range s.keys {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(signatureVersion + ",")
		b.WriteString(mac(k, id, ts.Unix(), body))
	}
	return b.String()
}

// Verifier checks the Standard Webhooks signature of a request. It is safe
// for concurrent use.
type Verifier struct {
	keys      [][]byte
	tolerance time.Duration
	now       func() time.Time
}

// NewVerifier returns a Verifier that accepts a request signed with any of
// secrets ("whsec_..."), with DefaultTolerance. Pass the old and the new
// secret while a rotation is under way. An invalid secret returns a
// *postbox.ConfigError that names it by position, never by value.
func NewVerifier(secrets ...string) (*Verifier, error) {
	ks, ps := keys("secrets", toSecrets(secrets))
	if err := configError(ps); err != nil {
		return nil, err
	}
	return &Verifier{keys: ks, tolerance: DefaultTolerance, now: time.Now}, nil
}

// Bounds of WithTolerance.
const (
	MinTolerance = time.Second
	MaxTolerance = 24 * time.Hour
)

// WithTolerance returns a copy of v that accepts timestamps up to d away
// from its clock, either way. d must be between MinTolerance and
// MaxTolerance: a longer window lets a captured request be replayed for
// longer.
func (v *Verifier) WithTolerance(d time.Duration) (*Verifier, error) {
	if d < MinTolerance || d > MaxTolerance {
		return nil, &postbox.ConfigError{Problems: []*postbox.ValidationError{{
			Field: "tolerance", Value: d.String(), Reason: fmt.Sprintf("must be between %s and %s", MinTolerance, MaxTolerance),
		}}}
	}
	c := *v
	c.tolerance = d
	return &c, nil
}

// Tolerance returns how far a timestamp may be from now.
func (v *Verifier) Tolerance() time.Duration { return v.tolerance }

// maxTimestampDigits bounds webhook-timestamp: seconds until the year
// 2286 take 10 digits; more would overflow time arithmetic long before
// they meant anything.
const maxTimestampDigits = 12

// Verify checks header and body: all three webhook-* headers present, the
// timestamp within the tolerance of now, and at least one "v1,<base64>"
// entry of webhook-signature equal (compared in constant time) to the
// HMAC-SHA256 of "{webhook-id}.{webhook-timestamp}.{body}" under one of
// the secrets. Entries of other versions (such as "v1a", asymmetric) are
// skipped. The error wraps ErrMissingHeaders, ErrInvalidHeaders,
// ErrTimestamp or ErrBadSignature.
func (v *Verifier) Verify(header http.Header, body []byte) error {
	id := header.Get(HeaderWebhookID)
	tsText := header.Get(HeaderWebhookTimestamp)
	sigs := header.Get(HeaderWebhookSignature)
	if id == "" || tsText == "" || sigs == "" {
		return ErrMissingHeaders
	}
	ts, err := parseTimestamp(tsText)
	if err != nil {
		return err
	}
	now := v.now()
	at := time.Unix(ts, 0)
	switch {
	case now.Sub(at) > v.tolerance:
		return fmt.Errorf("%w: %s old, over %s", ErrTimestamp, now.Sub(at).Truncate(time.Second), v.tolerance)
	case at.Sub(now) > v.tolerance:
		return fmt.Errorf("%w: %s in the future, over %s", ErrTimestamp, at.Sub(now).Truncate(time.Second), v.tolerance)
	}
	want := make([][]byte, len(v.keys))
	for i, k := range v.keys {
		want[i] = []byte(mac(k, id, ts, body))
	}
	ok := false
	for _, entry := range strings.Fields(sigs) {
		version, sig, found := strings.Cut(entry, ",")
		if !found || version != signatureVersion {
			continue
		}
		for _, w := range want {
			// Every candidate is compared, so the time taken does not
			// tell which entry or which secret matched.
			if hmac.Equal([]byte(sig), w) {
				ok = true
			}
		}
	}
	if !ok {
		return ErrBadSignature
	}
	return nil
}

// parseTimestamp accepts only plain decimal digits, so the text that was
// signed is the number's canonical form.
func parseTimestamp(s string) (int64, error) {
	if len(s) > maxTimestampDigits || (len(s) > 1 && s[0] == '0') {
		return 0, fmt.Errorf("%w: webhook-timestamp is not a plain number of seconds", ErrInvalidHeaders)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, fmt.Errorf("%w: webhook-timestamp is not a plain number of seconds", ErrInvalidHeaders)
		}
	}
	return strconv.ParseInt(s, 10, 64)
}
