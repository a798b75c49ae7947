package postboxidem

import (
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/configcheck"
)

// Config configures a Middleware. The zero value of every field means its
// default, documented on the field. New fills the defaults in and checks
// the result, naming every bad field at once in a *postbox.ConfigError.
type Config struct {
	// Prefix names the table: {Prefix}idempotency, created by migration 3
	// (postboxmigrate). Default "postbox_".
	Prefix string

	// TTL is how long a completed request's record is kept and replayed,
	// counted from its completion. A retry after it runs the handler again.
	// At least 1s. Default 24h.
	TTL time.Duration

	// ClaimExpiry is how long a request in progress blocks its duplicates
	// (they get 409) before a retry may take the claim over. It is the
	// recovery time after a server dies mid-request, so keep it above the
	// longest handler run: a handler still running when a retry takes
	// over loses, and its transaction rolls back (see the package doc).
	// Shorter than TTL. Default 1m.
	ClaimExpiry time.Duration

	// MaxBodyBytes caps the request body; a larger one gets 413 and runs
	// nothing. The body is read into memory to be fingerprinted. Default
	// 2 MiB.
	MaxBodyBytes int64

	// MaxResponseBytes caps the response body kept for replay. A larger
	// response still reaches the live caller in full; the record keeps
	// only the fact that the request completed (see the package doc).
	// Default 1 MiB.
	MaxResponseBytes int

	// Required makes the header mandatory on the methods below: a request
	// without it gets 400. Otherwise such a request passes through
	// untouched, with no record and no transaction.
	Required bool

	// Methods are the methods the middleware applies to; others pass
	// through untouched. Default POST and PATCH.
	Methods []string

	// Identity names the caller, e.g. the authenticated user or tenant, and
	// is part of the key: two callers that pick the same Idempotency-Key
	// never see each other's responses. The default, no identity, makes
	// the key space global to the route, which only suits a service with
	// a single client; a multi-tenant service must set it, and run the
	// middleware after its authentication.
	Identity func(*http.Request) string

	// Logger receives store failures and claim takeovers. Default
	// slog.Default().
	Logger *slog.Logger

	// CleanupBatch bounds each delete of expired records. Default 1000.
	CleanupBatch int

	// CleanupInterval is the pause between clean-up passes once Start runs
	// them. Default 10m.
	CleanupInterval time.Duration

	// Metrics, when set, is told the outcome of every request the
	// middleware handles (postboxprom.Metrics implements it).
	Metrics Metrics
}

// Metrics receives the outcome of each request the middleware handles:
// one of the Outcome constants.
type Metrics interface {
	IdempotencyOutcome(outcome string)
}

// Outcomes reported to Metrics.
const (
	OutcomeCompleted        = "completed"         // the handler ran; its response is stored and its transaction committed
	OutcomeReleased         = "released"          // the handler ran and answered 5xx, 408, 425 or 429 (or panicked): rolled back, the key released for a retry
	OutcomeReplayed         = "replayed"          // a retry answered from the record
	OutcomeInProgress       = "in_progress"       // 409: the first request is still running
	OutcomeMismatch         = "mismatch"          // 422: the key came with another body
	OutcomeInvalid          = "invalid"           // 400 or 413: the key or the body was refused
	OutcomeTakenOver        = "taken_over"        // the claim expired while the handler ran and a retry took it over
	OutcomeStoreUnavailable = "store_unavailable" // 503: the store failed; nothing was done
	OutcomeNoKey            = "no_key"            // no Idempotency-Key and none required: passed through
)

// Defaults, as documented on Config.
const (
	DefaultTTL              = 24 * time.Hour
	DefaultClaimExpiry      = time.Minute
	DefaultMaxBodyBytes     = 2 << 20
	DefaultMaxResponseBytes = 1 << 20
	DefaultCleanupBatch     = 1000
	DefaultCleanupInterval  = 10 * time.Minute
)

// Upper bounds: a request body is held in memory, a response body in a row.
const (
	maxMaxBodyBytes     = 1 << 30
	maxMaxResponseBytes = 64 << 20
)

func (c *Config) withDefaults() *Config {
	var out Config
	if c != nil {
		out = *c
	}
	configcheck.Default(&out.Prefix, postbox.DefaultPrefix)
	configcheck.Default(&out.TTL, DefaultTTL)
	configcheck.Default(&out.ClaimExpiry, DefaultClaimExpiry)
	configcheck.Default(&out.MaxBodyBytes, DefaultMaxBodyBytes)
	configcheck.Default(&out.MaxResponseBytes, DefaultMaxResponseBytes)
	if out.Methods == nil {
		out.Methods = []string{http.MethodPost, http.MethodPatch}
	} else {
		out.Methods = append([]string(nil), out.Methods...)
	}
	if out.Identity == nil {
		out.Identity = func(*http.Request) string { return "" }
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	configcheck.Default(&out.CleanupBatch, DefaultCleanupBatch)
	configcheck.Default(&out.CleanupInterval, DefaultCleanupInterval)
	return &out
}

func (c *Config) validate() error {
	var ps configcheck.Problems
	bad := ps.Add
	if err := postbox.ValidatePrefix(c.Prefix); err != nil {
		ps = append(ps, err.(*postbox.ValidationError)) //nolint:errorlint // always this type
	}
	if c.TTL < time.Second {
		bad("TTL", c.TTL, "must be at least 1s")
	}
	if c.ClaimExpiry < time.Millisecond {
		bad("ClaimExpiry", c.ClaimExpiry, "must be at least 1ms")
	} else if c.ClaimExpiry >= c.TTL {
		bad("ClaimExpiry", c.ClaimExpiry, "must be shorter than TTL (%s): a claim outliving its record would be deleted while its request runs", c.TTL)
	}
	if c.MaxBodyBytes < 1 || c.MaxBodyBytes > maxMaxBodyBytes {
		bad("MaxBodyBytes", c.MaxBodyBytes, "must be between 1 and %d", maxMaxBodyBytes)
	}
	if c.MaxResponseBytes < 1 || c.MaxResponseBytes > maxMaxResponseBytes {
		bad("MaxResponseBytes", c.MaxResponseBytes, "must be between 1 and %d", maxMaxResponseBytes)
	}
	if len(c.Methods) == 0 {
		bad("Methods", c.Methods, "must name at least one method")
	}
	for i, m := range c.Methods {
		if !isToken(m) {
			bad(fmt.Sprintf("Methods[%d]", i), m, "must be an HTTP method token")
		}
	}
	if c.CleanupBatch < 1 || c.CleanupBatch > 100_000 {
		bad("CleanupBatch", c.CleanupBatch, "must be between 1 and 100000")
	}
	if c.CleanupInterval < time.Second {
		bad("CleanupInterval", c.CleanupInterval, "must be at least 1s")
	}
	return ps.Err()
}

// isToken reports whether s is an RFC 9110 token, the syntax of a method.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}
