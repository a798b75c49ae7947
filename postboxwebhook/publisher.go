package postboxwebhook

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/configcheck"
	"github.com/postbox-go/postbox/internal/printable"
	"github.com/postbox-go/postbox/internal/pubkit"
)

// Errors this package reports as the cause of a message failure. The
// Publisher wraps them with postbox.NewMessageError; errors.Is finds them
// through that wrapper.
var (
	// ErrNoDestination means no destination's Topics pattern matches the
	// message's topic. The relay's routes normally keep such a message
	// from reaching the Publisher.
	ErrNoDestination = errors.New("postboxwebhook: no destination for the topic")
	// ErrInvalidHeader means a message header cannot travel as an HTTP
	// header, or names one the Publisher or the HTTP client sets.
	ErrInvalidHeader = errors.New("postboxwebhook: invalid header")
	// ErrInvalidID means the message id cannot be a webhook-id: empty,
	// over 255 bytes, or holding a space, a control character, a
	// non-ASCII byte or a "." (which would make the signed content
	// ambiguous).
	ErrInvalidID = errors.New("postboxwebhook: invalid message id")
	// ErrRedirect is the cause of a 3xx answer: the Publisher does not
	// follow redirects.
	ErrRedirect = errors.New("postboxwebhook: the receiver answered with a redirect")
	// ErrRejected is the cause of a 4xx answer other than 408 and 429.
	ErrRejected = errors.New("postboxwebhook: the receiver rejected the message")
)

// Infrastructure failures.
var (
	// ErrUnavailable is the cause of a 5xx, 408 or 429 answer, or of any
	// status outside 200-599.
	ErrUnavailable = errors.New("postboxwebhook: the receiver is unavailable")
	// ErrClosed fails the publishes cut off by Close, and every Publish
	// after it.
	ErrClosed = errors.New("postboxwebhook: publisher closed")
)

// ClassifyStatus tells how an HTTP status counts: nil for 2xx (the
// acknowledgement), ErrRedirect for 3xx and ErrRejected for 4xx other
// than 408 and 429 (message failures), and ErrUnavailable for 408, 429,
// 5xx and anything else (infrastructure).
func ClassifyStatus(code int) error {
	switch {
	case code >= 200 && code <= 299:
		return nil
	case code >= 300 && code <= 399:
		return ErrRedirect
	case code == http.StatusRequestTimeout || code == http.StatusTooManyRequests:
		return ErrUnavailable
	case code >= 400 && code <= 499:
		return ErrRejected
	}
	return ErrUnavailable
}

// StatusError is a non-2xx answer. Publish reports it wrapped with
// postbox.NewMessageError when ClassifyStatus says so; it unwraps to
// ErrRedirect, ErrRejected or ErrUnavailable.
type StatusError struct {
	URL        string        // the destination, without credentials or query
	StatusCode int           // e.g. 422
	Status     string        // e.g. "422 Unprocessable Entity"
	Location   string        // of a redirect, without credentials or query
	RetryAfter time.Duration // from a Retry-After header, or 0
	Body       string        // the start of the response body, printable
}

func (e *StatusError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "postboxwebhook: POST %s: %s", e.URL, e.Status)
	if e.Location != "" {
		fmt.Fprintf(&b, " (to %s; update the destination's URL, redirects are not followed)", e.Location)
	}
	if e.RetryAfter > 0 {
		fmt.Fprintf(&b, " (retry after %s)", e.RetryAfter)
	}
	if e.Body != "" {
		fmt.Fprintf(&b, ": %s", e.Body)
	}
	return b.String()
}

// Unwrap returns the class of the status: ErrRedirect, ErrRejected or
// ErrUnavailable.
func (e *StatusError) Unwrap() error { return ClassifyStatus(e.StatusCode) }

// Limits on a response, which the Publisher reads only to reuse the
// connection and to quote in an error.
const (
	maxDrainBytes  = 64 << 10
	maxDetailBytes = 256
	maxIDBytes     = 255
	userAgent      = "postboxwebhook"
)

// DefaultContentType is sent when a message has no content type: the
// payload is opaque bytes to postbox.
const DefaultContentType = "application/octet-stream"

// Publisher POSTs envelopes to webhook destinations and reports each one
// done on the receiver's 2xx. It implements postbox.Publisher; its methods
// are safe for concurrent use.
//
// Each publish runs on a goroutine of its own for the length of one
// request; Close waits for them.
type Publisher struct {
	cfg    *Config
	dsts   []*destination
	client *http.Client
	owned  bool // the Publisher made client, and closes its idle connections
	// kit runs each request on a goroutine Close waits for, wakes a
	// Publish waiting for a slot at Close, and its context cancels the
	// requests when Close gives up waiting.
	kit *pubkit.Kit
}

// New returns a Publisher for cfg's destinations. An invalid cfg returns a
// *postbox.ConfigError naming every bad field (secrets and header values
// are never quoted). Call Close when done.
func New(cfg *Config) (*Publisher, error) {
	c := cfg.WithDefaults()
	dsts, err := c.compile()
	if err != nil {
		return nil, err
	}
	client, owned := c.client(dsts)
	kit := pubkit.New(0, ErrClosed)
	for _, d := range dsts {
		d.window = pubkit.NewWindow(d.MaxInFlight, kit.Closing(), ErrClosed)
	}
	return &Publisher{cfg: c, dsts: dsts, client: client, owned: owned, kit: kit}, nil
}

// Config returns the publisher's configuration, defaults filled in.
func (p *Publisher) Config() Config { return *p.cfg.WithDefaults() }

func matchTopic(pattern, topic string) bool {
	if lit, ok := strings.CutSuffix(pattern, "*"); ok {
		return strings.HasPrefix(topic, lit)
	}
	return pattern == topic
}

func (p *Publisher) route(topic string) *destination {
	for _, d := range p.dsts {
		if matchTopic(d.Topics, topic) {
			return d
		}
	}
	return nil
}

// Publish POSTs env to its topic's destination and calls done once: nil on
// a 2xx, a message failure on a 3xx or a 4xx other than 408 and 429 (and
// for a message that cannot be sent), an infrastructure failure
// otherwise. It blocks while the destination has MaxInFlight requests
// open, until ctx ends.
func (p *Publisher) Publish(ctx context.Context, env *postbox.Envelope, done func(error)) {
	d := p.route(env.Topic)
	if d == nil {
		done(postbox.NewMessageError(fmt.Errorf("%w %q", ErrNoDestination, configcheck.Shorten(env.Topic))))
		return
	}
	header, err := requestHeader(d, env)
	if err != nil {
		// The same envelope would make the same headers again.
		done(postbox.Permanent(err))
		return
	}
	if err := ctx.Err(); err != nil {
		done(err)
		return
	}
	if err := d.window.Acquire(ctx, 1); err != nil {
		done(err)
		return
	}
	if !p.kit.Go(func() { p.send(ctx, d, env, header, done) }) {
		d.window.Release(1)
		done(ErrClosed)
	}
}

// requestHeader builds every header of env's request but the timestamp
// and the signature, which are made when it is sent.
func requestHeader(d *destination, env *postbox.Envelope) (http.Header, error) {
	if err := checkID(env.ID); err != nil {
		return nil, err
	}
	h := make(http.Header, len(env.Headers)+len(d.Headers)+6)
	contentType, altContentType := "", ""
	for name, value := range env.Headers {
		lower := strings.ToLower(name)
		switch {
		case lower == contentTypeHeader:
			contentType = value
			continue
		case lower == "ce-datacontenttype":
			// Binary mode carries datacontenttype in Content-Type only.
			altContentType = value
			continue
		case strings.HasPrefix(lower, ceHeaderPrefix):
			if !validHeaderName(name) || !utf8.ValidString(value) {
				return nil, fmt.Errorf("%w %q: a CloudEvents attribute must be a token name with a UTF-8 value", ErrInvalidHeader, configcheck.Shorten(name))
			}
			value = ceEncode(value)
		default:
			if err := checkHeader(name, value); err != nil {
				return nil, fmt.Errorf("%w: %w", ErrInvalidHeader, err)
			}
		}
		key := http.CanonicalHeaderKey(name)
		if _, dup := h[key]; dup {
			return nil, fmt.Errorf("%w %q: the message has two headers of this name, differing in case only", ErrInvalidHeader, configcheck.Shorten(name))
		}
		h[key] = []string{value}
	}
	if contentType == "" {
		contentType = altContentType
	}
	if contentType == "" {
		contentType = DefaultContentType
	} else if !validHeaderValue(contentType) {
		return nil, fmt.Errorf("%w: content-type has a value that cannot travel in HTTP", ErrInvalidHeader)
	}
	for name, value := range d.Headers {
		h.Set(name, value)
	}
	h.Set("Content-Type", contentType)
	h.Set("User-Agent", userAgent)
	h.Set(HeaderWebhookID, env.ID)
	// Go's client treats a POST with an Idempotency-Key as safe to send
	// again on a fresh connection when a pooled one turns out closed, which
	// a receiver that keys on it (postboxidem, or its inbox by webhook-id)
	// absorbs.
	h.Set("Idempotency-Key", env.ID)
	return h, nil
}

func checkID(id string) error {
	if id == "" || len(id) > maxIDBytes {
		return fmt.Errorf("%w %q: must be 1 to %d bytes", ErrInvalidID, configcheck.Shorten(id), maxIDBytes)
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c <= ' ' || c >= 0x7f || c == '.' {
			return fmt.Errorf("%w %q: has %q at byte %d", ErrInvalidID, configcheck.Shorten(id), c, i)
		}
	}
	return nil
}

// send runs on a goroutine of p.kit, which Close waits for until done
// has returned. The slot is freed before done runs, so the relay's next
// Publish, which done may trigger, finds it.
func (p *Publisher) send(ctx context.Context, d *destination, env *postbox.Envelope, header http.Header, done func(error)) {
	err := p.do(ctx, d, env, header)
	d.window.Release(1)
	done(err)
}

func (p *Publisher) do(ctx context.Context, d *destination, env *postbox.Envelope, header http.Header) error {
	rctx, cancel := context.WithTimeout(ctx, d.Timeout)
	defer cancel()
	stop := context.AfterFunc(p.kit.Context(), cancel)
	defer stop()

	req, err := http.NewRequestWithContext(rctx, http.MethodPost, d.url.String(), bytes.NewReader(env.Payload))
	if err != nil {
		return fmt.Errorf("postboxwebhook: POST %s: %w", d.display, err)
	}
	req.Header = header
	now := time.Now()
	req.Header.Set(HeaderWebhookTimestamp, strconv.FormatInt(now.Unix(), 10))
	req.Header.Set(HeaderWebhookSignature, d.signer.Sign(env.ID, now, env.Payload))

	resp, err := p.client.Do(req)
	if err != nil {
		return p.transportError(ctx, d, rctx, err)
	}
	defer resp.Body.Close()
	cause := ClassifyStatus(resp.StatusCode)
	if cause == nil {
		// Acknowledged. The body is drained for the connection's sake
		// only; a failure to read it changes nothing.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxDrainBytes))
		return nil
	}
	detail := make([]byte, maxDetailBytes)
	n, _ := io.ReadFull(resp.Body, detail)
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxDrainBytes))
	se := &StatusError{
		URL:        d.display,
		StatusCode: resp.StatusCode,
		Status:     resp.Status,
		RetryAfter: retryAfter(resp.Header.Get("Retry-After"), now),
		Body:       printable.OneLine(detail[:n]),
	}
	if se.Status == "" {
		se.Status = strconv.Itoa(resp.StatusCode)
	}
	if errors.Is(cause, ErrRedirect) {
		if loc, err := resp.Location(); err == nil {
			se.Location = redactURL(loc)
		}
	}
	switch {
	case errors.Is(cause, ErrUnavailable):
		return se
	case permanentStatus(resp.StatusCode):
		return postbox.Permanent(se)
	}
	return postbox.NewMessageError(se)
}

// permanentStatus reports the 4xx answers that say no retry of this
// message can succeed: 410 Gone (the receiver retired the endpoint for
// good), 413 Content Too Large and 431 Request Header Fields Too Large
// (this message will always be too large for it). The relay buries such a
// message at once; the other 4xx answers (400, 401, 403, 404, 422, ...)
// may be a receiver's passing state or configuration, and spend the
// budget as message failures.
func permanentStatus(code int) bool {
	return code == http.StatusGone || code == http.StatusRequestEntityTooLarge || code == http.StatusRequestHeaderFieldsTooLarge
}

// transportError reports a request that got no answer. Every such failure
// is the infrastructure's: the receiver may be down, slow, or behind a
// broken network, DNS or TLS setup, and none of that is the message's
// fault.
func (p *Publisher) transportError(ctx context.Context, d *destination, rctx context.Context, err error) error {
	// A *url.Error quotes the whole URL, query included; report its cause
	// under the redacted URL instead.
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("postboxwebhook: POST %s: %w", d.display, ctx.Err())
	case p.kit.Context().Err() != nil:
		return fmt.Errorf("postboxwebhook: POST %s: %w", d.display, ErrClosed)
	case errors.Is(rctx.Err(), context.DeadlineExceeded):
		return fmt.Errorf("postboxwebhook: POST %s: no answer within the destination's timeout %s: %w", d.display, d.Timeout, context.DeadlineExceeded)
	}
	return fmt.Errorf("postboxwebhook: POST %s: %w", d.display, err)
}

// retryAfter parses a Retry-After header: seconds, or an HTTP date.
func retryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseInt(v, 10, 64); err == nil {
		if s <= 0 || s > int64(24*time.Hour/time.Second) {
			return 0
		}
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now).Round(time.Second)
	}
	return 0
}

// Close stops the Publisher: every later Publish, and every Publish
// waiting for a slot, fails with ErrClosed (an infrastructure failure).
// Close waits for the requests already sent until ctx ends, then cancels
// them (their publishes fail with ErrClosed) and waits for them to end. It
// closes the idle connections of the client it made. It returns ctx's
// error when it had to cancel requests.
func (p *Publisher) Close(ctx context.Context) error {
	p.kit.Close()
	err := p.kit.Wait(ctx)
	p.kit.Cancel()
	if err != nil {
		_ = p.kit.Wait(context.Background()) // the requests end with the Kit's context
	}
	if p.owned {
		p.client.CloseIdleConnections()
	}
	return err
}
