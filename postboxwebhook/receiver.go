package postboxwebhook

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/configcheck"
	"github.com/postbox-go/postbox/internal/printable"
)

// Receiver defaults and bounds.
const (
	// DefaultMaxBodyBytes caps a request body: postbox's default payload
	// cap (postbox.Config.MaxPayloadBytes).
	DefaultMaxBodyBytes = 1 << 20
	maxMaxBodyBytes     = 64 << 20
)

// ignoredHeaders describe the HTTP exchange rather than the message, or
// carry credentials that must not end up in a dead message; the Receiver
// leaves them out of Delivery.Headers.
var ignoredHeaders = map[string]bool{
	HeaderWebhookID: true, HeaderWebhookTimestamp: true, HeaderWebhookSignature: true,
	"idempotency-key": true, "host": true, "content-length": true, "transfer-encoding": true,
	"connection": true, "keep-alive": true, "proxy-connection": true, "te": true, "trailer": true,
	"upgrade": true, "expect": true, "user-agent": true, "accept-encoding": true,
	"authorization": true, "proxy-authorization": true, "cookie": true,
	"forwarded": true, "via": true, "x-forwarded-for": true, "x-forwarded-host": true,
	"x-forwarded-proto": true, "x-forwarded-port": true, "x-real-ip": true,
}

// ReceiverConfig configures a Receiver. The zero value of every field
// means its default.
type ReceiverConfig struct {
	// MaxBodyBytes caps a request body; a larger one is answered 413,
	// which the sending Publisher counts as a message failure. Default
	// 1 MiB, at most 64 MiB.
	MaxBodyBytes int64

	// IgnoreHeaders are left out of Delivery.Headers, besides the
	// transport, proxy and credential headers always left out (see the
	// package documentation): list here what a proxy in front of the
	// receiver adds, or the names of a destination's static Headers.
	IgnoreHeaders []string

	// Logger receives a line for each refused request. Default
	// slog.Default().
	Logger *slog.Logger
}

// Receiver is an http.Handler that takes webhooks from a Publisher (or any
// Standard Webhooks sender): it verifies each request, hands the message
// to a postbox.Processor (usually postbox.Inbox.Processor, for
// exactly-once effect by webhook-id), and answers as the Verdict says.
type Receiver struct {
	v      *Verifier
	p      postbox.Processor
	max    int64
	ignore map[string]bool
	log    *slog.Logger
}

// NewReceiver returns a Receiver that verifies with v and processes with p.
// cfg may be nil for all defaults; an invalid one returns a
// *postbox.ConfigError naming every bad field.
func NewReceiver(v *Verifier, p postbox.Processor, cfg *ReceiverConfig) (*Receiver, error) {
	var c ReceiverConfig
	if cfg != nil {
		c = *cfg
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	var ps []*postbox.ValidationError
	if v == nil {
		ps = append(ps, configcheck.Problem("verifier", "", "is nil"))
	}
	if p == nil {
		ps = append(ps, configcheck.Problem("processor", "", "is nil"))
	}
	if c.MaxBodyBytes < 1 || c.MaxBodyBytes > maxMaxBodyBytes {
		ps = append(ps, configcheck.Problem("MaxBodyBytes", c.MaxBodyBytes, "must be between 1 and %d", maxMaxBodyBytes))
	}
	ignore := make(map[string]bool, len(ignoredHeaders)+len(c.IgnoreHeaders))
	for name := range ignoredHeaders {
		ignore[name] = true
	}
	for i, name := range c.IgnoreHeaders {
		if !validHeaderName(name) {
			ps = append(ps, configcheck.Problem(fmt.Sprintf("IgnoreHeaders[%d]", i), name, "is not an HTTP header name"))
		}
		ignore[strings.ToLower(name)] = true
	}
	if err := configError(ps); err != nil {
		return nil, err
	}
	return &Receiver{v: v, p: p, max: c.MaxBodyBytes, ignore: ignore, log: c.Logger}, nil
}

// ServeHTTP implements http.Handler. See the package documentation for
// the status codes.
func (rc *Receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "webhooks are POSTed", http.StatusMethodNotAllowed)
		return
	}
	if r.ContentLength > rc.max {
		rc.refuse(w, r, http.StatusRequestEntityTooLarge, fmt.Errorf("body of %d bytes is over the limit of %d", r.ContentLength, rc.max))
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, rc.max))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			rc.refuse(w, r, http.StatusRequestEntityTooLarge, fmt.Errorf("body over the limit of %d bytes", rc.max))
			return
		}
		rc.refuse(w, r, http.StatusBadRequest, fmt.Errorf("reading the body: %w", err))
		return
	}
	if err := rc.v.Verify(r.Header, body); err != nil {
		status := http.StatusUnauthorized
		if errors.Is(err, ErrMissingHeaders) || errors.Is(err, ErrInvalidHeaders) {
			status = http.StatusBadRequest
		}
		rc.refuse(w, r, status, err)
		return
	}
	d, err := rc.delivery(r.Header, body)
	if err != nil {
		rc.refuse(w, r, http.StatusBadRequest, err)
		return
	}
	v := rc.p.Process(r.Context(), d)
	switch v.Action {
	case postbox.Ack, postbox.DeadLettered:
		w.WriteHeader(http.StatusNoContent)
	case postbox.Retry:
		w.Header().Set("Retry-After", strconv.FormatInt(retrySeconds(v.Delay), 10))
		http.Error(w, "not processed; send it again later", http.StatusServiceUnavailable)
	default:
		rc.log.Error("postboxwebhook: the processor returned an unknown action", slog.String("id", d.ID), slog.String("action", v.Action.String()))
		http.Error(w, "not processed", http.StatusInternalServerError)
	}
}

// retrySeconds rounds a delay up to whole seconds, at least one.
func retrySeconds(d time.Duration) int64 {
	s := int64(math.Ceil(d.Seconds()))
	return max(s, 1)
}

func (rc *Receiver) refuse(w http.ResponseWriter, r *http.Request, status int, err error) {
	rc.log.Warn("postboxwebhook: request refused", slog.Int("status", status), slog.String("remote", r.RemoteAddr), slog.Any("error", err))
	http.Error(w, http.StatusText(status), status)
}

// delivery maps a verified request to a postbox.Delivery: the id from
// webhook-id, the topic from ce-type, the key from ce-partitionkey, and
// every other header but the ignored ones, with lower-case names and
// CloudEvents attributes percent-decoded.
func (rc *Receiver) delivery(h http.Header, body []byte) (*postbox.Delivery, error) {
	id := h.Get(HeaderWebhookID)
	if len(id) > postbox.MaxDeliveryIDBytes || !printable.VisibleASCII(id) {
		return nil, fmt.Errorf("webhook-id must be 1 to %d bytes of printable ASCII", postbox.MaxDeliveryIDBytes)
	}
	headers := make(map[string]string, len(h))
	for name, values := range h {
		lower := strings.ToLower(name)
		if rc.ignore[lower] || len(values) == 0 {
			continue
		}
		value := strings.Join(values, ", ")
		if strings.HasPrefix(lower, ceHeaderPrefix) {
			decoded, err := ceDecode(value)
			if err != nil {
				return nil, fmt.Errorf("header %s: %w", configcheck.Shorten(lower), err)
			}
			value = decoded
		}
		headers[lower] = value
	}
	return &postbox.Delivery{
		ID:      id,
		Topic:   headers[postbox.HeaderType],
		Key:     headers[postbox.HeaderPartitionKey],
		Payload: body,
		Headers: headers,
	}, nil
}
