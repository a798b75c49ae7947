package postboxwebhook

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/configcheck"
	"github.com/postbox-go/postbox/internal/pubkit"
)

// Defaults, as documented on Destination.
const (
	// DefaultTimeout leaves half of the relay's default BatchDeadline
	// (10s) for the rest of the batch, so a receiver that hangs comes back
	// as an infrastructure failure inside the batch rather than as an
	// abandoned publish at its deadline.
	DefaultTimeout = 5 * time.Second
	// DefaultMaxInFlight bounds the requests open to one destination.
	DefaultMaxInFlight = 64
)

// Bounds checked by Validate.
const (
	MinTimeout     = 10 * time.Millisecond
	MaxTimeout     = 10 * time.Minute
	maxMaxInFlight = 10_000
	maxURLBytes    = 2048
	maxIdleConns   = 1024

	maxResponseHeaderBytes = 64 << 10
)

// Config configures a Publisher. WithDefaults fills in the zero fields and
// Validate checks the result, naming every bad field at once.
type Config struct {
	// Destinations receive the messages. A message goes to the first
	// destination whose Topics pattern matches its topic (the rule of
	// postbox.Route); a topic no destination matches fails as a message
	// failure wrapping ErrNoDestination. At least one is required.
	Destinations []Destination

	// Client sends the requests. Default: a client of the Publisher's own,
	// with http.DefaultTransport's dial, TLS and proxy settings and enough
	// idle connections per host for every destination's MaxInFlight; Close
	// closes its idle connections. A Client given here is copied, and the
	// copy never follows redirects (see the package documentation); its
	// Timeout, if set, applies on top of each destination's Timeout.
	Client *http.Client
}

// Destination is one receiver: a URL, the secrets to sign with, and the
// topics it takes.
type Destination struct {
	// Topics selects the messages sent here: an exact topic
	// ("orders.created"), a prefix ending in "*" ("orders.*"), or "*" for
	// every topic. Required.
	Topics string

	// URL is the http or https URL the messages are POSTed to. Required.
	// Errors and String show it without user information or query.
	URL string

	// Secrets sign every request, each "whsec_" followed by the base64 of
	// 24 to 512 random bytes; the webhook-signature header carries one
	// signature per secret. To rotate, list the new secret and the old
	// one until every receiver knows the new one, then drop the old.
	// At least one is required. Secrets never appear in errors or in the
	// output of String.
	Secrets []Secret

	// Timeout bounds one request, from connecting to reading the status
	// line and the (drained, capped) response body. A request that runs
	// out of time fails as an infrastructure failure, and the relay sends
	// the message again later under the same webhook-id. Keep it under
	// the relay's BatchDeadline (postbox.Config, 10s by default): the
	// relay gives up on a batch at its deadline, cancelling the requests
	// still open. Default 5s.
	Timeout time.Duration

	// Headers are sent with every request to this destination, after the
	// message's own headers: a message header of the same name is
	// replaced, so a credential set here (Authorization) cannot be
	// overridden by a message. Values never appear in errors or in String.
	Headers map[string]string

	// MaxInFlight bounds the requests open to this destination at once;
	// Publish blocks (until its context ends) while they are all busy.
	// Default 64.
	MaxInFlight int
}

// WithDefaults returns a copy of c with every zero field set to its
// default. c may be nil.
func (c *Config) WithDefaults() *Config {
	var out Config
	if c != nil {
		out = *c
	}
	out.Destinations = slices.Clone(out.Destinations)
	for i := range out.Destinations {
		d := &out.Destinations[i]
		if d.Timeout == 0 {
			d.Timeout = DefaultTimeout
		}
		if d.MaxInFlight == 0 {
			d.MaxInFlight = DefaultMaxInFlight
		}
		d.Secrets = slices.Clone(d.Secrets)
		d.Headers = maps.Clone(d.Headers)
	}
	return &out
}

// Validate checks a Config that WithDefaults has filled in. It returns a
// *postbox.ConfigError listing every bad field, or nil.
func (c *Config) Validate() error {
	_, err := c.compile()
	return err
}

// destination is a validated Destination, ready to send.
type destination struct {
	Destination
	index   int
	url     *url.URL
	display string // the URL without credentials or query
	signer  *Signer
	window  *pubkit.Window // MaxInFlight requests; made by New
}

func (c *Config) compile() ([]*destination, error) {
	var ps []*postbox.ValidationError
	bad := func(field string, value any, format string, args ...any) {
		ps = append(ps, configcheck.Problem(field, value, format, args...))
	}
	if len(c.Destinations) == 0 {
		bad("Destinations", "", "needs at least one destination")
	}
	out := make([]*destination, 0, len(c.Destinations))
	for i, d := range c.Destinations {
		field := func(f string) string { return fmt.Sprintf("Destinations[%d].%s", i, f) }
		dst := &destination{Destination: d, index: i}
		if err := postbox.ValidateTopicPattern(d.Topics); err != nil {
			var ve *postbox.ValidationError
			if errors.As(err, &ve) {
				bad(field("Topics"), d.Topics, "%s", ve.Reason)
			}
		}
		for j := range i {
			if postbox.ValidateTopicPattern(c.Destinations[j].Topics) == nil && covers(c.Destinations[j].Topics, d.Topics) {
				bad(field("Topics"), d.Topics, "is never used: Destinations[%d] (%q) comes first and takes every topic it matches", j, c.Destinations[j].Topics)
				break
			}
		}
		u, err := parseURL(d.URL)
		if err != nil {
			bad(field("URL"), redactURLText(d.URL), "%s", err)
		} else {
			dst.url, dst.display = u, redactURL(u)
		}
		ks, kps := keys(field("Secrets"), d.Secrets)
		ps = append(ps, kps...)
		dst.signer = &Signer{keys: ks}
		if d.Timeout < MinTimeout || d.Timeout > MaxTimeout {
			bad(field("Timeout"), d.Timeout, "must be between %s and %s", MinTimeout, MaxTimeout)
		}
		for _, name := range slices.Sorted(maps.Keys(d.Headers)) {
			if err := checkHeader(name, d.Headers[name]); err != nil {
				bad(fmt.Sprintf("%s[%q]", field("Headers"), configcheck.Shorten(name)), "", "%s", err)
			} else if l := strings.ToLower(name); l == contentTypeHeader || strings.HasPrefix(l, ceHeaderPrefix) {
				bad(fmt.Sprintf("%s[%q]", field("Headers"), configcheck.Shorten(name)), "", "content-type and ce-* headers come from each message's CloudEvents attributes")
			}
		}
		if d.MaxInFlight < 1 || d.MaxInFlight > maxMaxInFlight {
			bad(field("MaxInFlight"), d.MaxInFlight, "must be between 1 and %d", maxMaxInFlight)
		}
		out = append(out, dst)
	}
	if len(ps) > 0 {
		return nil, &postbox.ConfigError{Problems: ps}
	}
	return out, nil
}

// covers reports whether every topic pattern b matches is matched by a.
func covers(a, b string) bool {
	la, aPrefix := strings.CutSuffix(a, "*")
	if !aPrefix {
		return a == b
	}
	lb, _ := strings.CutSuffix(b, "*")
	return strings.HasPrefix(lb, la)
}

func parseURL(s string) (*url.URL, error) {
	if s == "" {
		return nil, errors.New("is required")
	}
	if len(s) > maxURLBytes {
		return nil, fmt.Errorf("is %d bytes, over the limit of %d", len(s), maxURLBytes)
	}
	u, err := url.Parse(s)
	if err != nil {
		return nil, errors.New("is not a valid URL")
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, errors.New("must be an absolute http or https URL")
	case u.Host == "" || u.Hostname() == "":
		return nil, errors.New("has no host")
	case u.Fragment != "" || strings.Contains(s, "#"):
		return nil, errors.New("must not have a fragment")
	}
	return u, nil
}

// redactURL shows u without user information or query, which may hold
// credentials.
func redactURL(u *url.URL) string {
	s := u.Scheme + "://" + u.Host + u.EscapedPath()
	if u.RawQuery != "" {
		s += "?(redacted)"
	}
	return s
}

// redactURLText shows an unparsable URL up to its first character that
// could start credentials.
func redactURLText(s string) string {
	if u, err := url.Parse(s); err == nil && u.Scheme != "" && u.Host != "" {
		return redactURL(u)
	}
	if i := strings.IndexAny(s, "@?#"); i >= 0 {
		return s[:i] + "(redacted)"
	}
	return s
}

// String shows the destination without its secrets, header values, or
// the credentials and query of its URL.
func (d Destination) String() string {
	u := "(invalid)"
	if pu, err := parseURL(d.URL); err == nil {
		u = redactURL(pu)
	}
	return fmt.Sprintf("{topics=%s url=%s secrets=%d timeout=%s max_in_flight=%d headers=%v}",
		d.Topics, u, len(d.Secrets), d.Timeout, d.MaxInFlight, slices.Sorted(maps.Keys(d.Headers)))
}

// GoString is String, so that %#v reveals no secret either.
func (d Destination) GoString() string { return d.String() }

// LogValue implements slog.LogValuer with String, so that no handler,
// the JSON one included, reveals a secret.
func (d Destination) LogValue() slog.Value { return slog.StringValue(d.String()) }

// String shows the config without secrets (see Destination.String).
func (c Config) String() string {
	parts := make([]string, len(c.Destinations))
	for i, d := range c.Destinations {
		parts[i] = d.String()
	}
	return "{destinations=[" + strings.Join(parts, " ") + "]}"
}

// GoString is String, so that %#v reveals no secret either.
func (c Config) GoString() string { return c.String() }

// LogValue implements slog.LogValuer with String.
func (c Config) LogValue() slog.Value { return slog.StringValue(c.String()) }

// noRedirects makes a client hand back a redirect response instead of
// following it.
func noRedirects(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// client returns the http.Client the Publisher uses, and whether the
// Publisher owns it (and so closes its idle connections on Close).
func (c *Config) client(dsts []*destination) (*http.Client, bool) {
	if c.Client != nil {
		cl := *c.Client
		cl.CheckRedirect = noRedirects
		return &cl, false
	}
	conns := 0
	for _, d := range dsts {
		conns += d.MaxInFlight
	}
	conns = min(conns, maxIdleConns)
	t := &http.Transport{
		// The settings of http.DefaultTransport, with enough idle
		// connections that MaxInFlight requests to one host reuse theirs
		// instead of dialing anew, and response headers capped well
		// below the default 1 MiB: a webhook's answer needs a status.
		Proxy:                  http.ProxyFromEnvironment,
		DialContext:            (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		ForceAttemptHTTP2:      true,
		MaxIdleConns:           conns,
		MaxIdleConnsPerHost:    conns,
		IdleConnTimeout:        90 * time.Second,
		TLSHandshakeTimeout:    10 * time.Second,
		ExpectContinueTimeout:  time.Second,
		MaxResponseHeaderBytes: maxResponseHeaderBytes,
	}
	return &http.Client{Transport: t, CheckRedirect: noRedirects}, true
}
