package postboxadmin

import (
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/configcheck"
	"github.com/postbox-go/postbox/internal/printable"
)

// Scope is what a token may do.
type Scope string

// The scopes. Admin implies Read.
const (
	// ScopeRead reads: status, dead messages of the outbox and of consumers, the replay
	// audit, the dashboard.
	ScopeRead Scope = "read"
	// ScopeAdmin also changes things: requeue, delete, replay, prune, and
	// the consumers' requeue requests and deletes.
	ScopeAdmin Scope = "admin"
)

// allows reports whether a token of scope s may call an endpoint that
// needs need.
func (s Scope) allows(need Scope) bool {
	return s == ScopeAdmin || s == need
}

// Token is a bearer token the server accepts.
type Token struct {
	// Name identifies the holder: it is the actor recorded in the replay
	// audit and in the server's log of changes. Printable text of 1 to 200
	// bytes. Two tokens may share a name (while one is rotated out).
	Name string
	// Value is the secret sent as "Authorization: Bearer <Value>": at least
	// 16 bytes of visible ASCII (no spaces), unique among the tokens.
	// Generate it, e.g. `openssl rand -base64 32`.
	Value string
	// Scope is ScopeRead or ScopeAdmin.
	Scope Scope
}

// ConsumerDead is the consumers' dead messages. *postbox.Inbox[TTx]
// implements it, for any TTx.
type ConsumerDead interface {
	ListDead(ctx context.Context, f postbox.DeadFilter) ([]postbox.DeadMessage, error)
	GetDead(ctx context.Context, consumer, messageID string) (postbox.DeadMessage, error)
	DeleteDead(ctx context.Context, consumer, messageID string) (bool, error)
	// DeleteDeadSelected deletes the dead messages a selection names.
	DeleteDeadSelected(ctx context.Context, s postbox.DeadSelection) (int, error)
	// RequestRequeue marks the dead messages a selection names for a
	// requeue, which the consumer's running Inbox carries out with its
	// handler.
	RequestRequeue(ctx context.Context, s postbox.DeadSelection) (int, error)
}

// Defaults.
const (
	DefaultMaxBodyBytes    = 1 << 20
	DefaultReadyTimeout    = 2 * time.Second
	DefaultShutdownTimeout = 10 * time.Second
	// MinTokenBytes is the shortest token Value accepted.
	MinTokenBytes = 16
	// AnonymousActor is the actor recorded when no tokens are configured
	// (which is allowed on loopback only).
	AnonymousActor = "anonymous@loopback"
	maxActorBytes  = 200
)

// ShardStatus is one shard's state (Config.Shards).
type ShardStatus struct {
	Shard string
	// Up: its relay runs and reaches its database (postbox.RelayState).
	Up bool
	// Error is why it is down, while it is retried: its relay could not
	// start, or runs and fails to renew its leases, read or record.
	Error string
	// Since is when its relay started, or when its failures began.
	Since time.Time
}

// Config configures a Server. Zero fields take the defaults documented on
// them; New checks the result and names every bad field at once in a
// *postbox.ConfigError.
type Config struct {
	// Admin serves the outbox side. Required.
	Admin *postbox.Admin

	// ConsumerDead serves the consumers' dead messages under
	// /v1/consumers/...; nil answers those endpoints with 501.
	ConsumerDead ConsumerDead

	// Routed, when set, tells whether a relay routes a topic: the status
	// then marks each topic "routed" or not and counts the pending
	// messages of unrouted topics apart ("unrouted_pending"). Rows of
	// an unrouted topic wait, spending no attempt, for a relay that
	// routes it. Nil: every topic counts as routed.
	Routed func(topic string) bool

	// DedupeWindow, when set, tells the duplicate window of the broker a
	// topic goes to (JetStream's Duplicates, the Redis publisher's
	// DedupeWindow). A replay under the messages' own ids then says how
	// many of them the broker would drop as copies, and a real one is
	// refused with 409 while any would be, unless the request accepts it
	// ("accept_dropped") or replays them as new messages ("as_new"). Nil:
	// no broker is known to drop copies.
	DedupeWindow postbox.DedupeWindow

	// Shards, when set, reports the state of every shard of a program
	// that relays several databases (postbox relay); GET /v1/status then
	// lists them ("shards"), the down ones with why.
	Shards func() []ShardStatus

	// Tokens are the bearer tokens accepted. With none, every request is
	// treated as admin: that is only allowed on a loopback address
	// (CheckListen), and the handler then also refuses requests that do not
	// come from, and address, a loopback host.
	Tokens []Token

	// Sessions holds the dashboard's sign-ins (see the package
	// documentation). Nil: the server keeps its own, lasting
	// DefaultSessionLifetime. Share one between Servers mounted in one
	// process to let one sign-in serve them all.
	Sessions *Sessions
	// SecureCookies marks the session cookie Secure even on a request
	// that did not come over TLS: set it when a proxy terminates TLS in
	// front of the server. A request over TLS always gets a Secure cookie.
	SecureCookies bool

	// Dashboards lists the dashboards of other databases served beside
	// this one, for the overview's links (the relay daemon serves one per
	// database). Optional.
	Dashboards []DashboardLink

	// Ready reports whether the process is ready, for /readyz; its error
	// text is shown to unauthenticated callers, so keep secrets out of it.
	// Default: a read of the replay audit through Admin, which fails when
	// the database is unreachable or not migrated (and then says only
	// that, logging the detail).
	Ready func(ctx context.Context) error
	// ReadyTimeout bounds one Ready call. Default 2s.
	ReadyTimeout time.Duration

	// Metrics, when set, is served at GET /metrics (e.g. a Prometheus
	// handler). Without a token unless MetricsRequireToken is set, in
	// which case it needs the read scope.
	Metrics             http.Handler
	MetricsRequireToken bool

	// Logger receives request failures and one line per change (requeue,
	// delete, replay, prune) with its actor. Default slog.Default().
	Logger *slog.Logger

	// MaxBodyBytes caps a request body; a larger one gets 413. Default
	// 1 MiB.
	MaxBodyBytes int64

	// ShutdownTimeout bounds the graceful shutdown of ListenAndServe and
	// Serve once their context ends; connections still open after it are
	// closed. Default 10s.
	ShutdownTimeout time.Duration
}

func (c *Config) withDefaults() *Config {
	var out Config
	if c != nil {
		out = *c
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	configcheck.Default(&out.MaxBodyBytes, DefaultMaxBodyBytes)
	configcheck.Default(&out.ReadyTimeout, DefaultReadyTimeout)
	configcheck.Default(&out.ShutdownTimeout, DefaultShutdownTimeout)
	out.Tokens = append([]Token(nil), out.Tokens...)
	return &out
}

func (c *Config) validate() error {
	var ps []*postbox.ValidationError
	bad := func(field string, value any, format string, args ...any) {
		ps = append(ps, configcheck.Problem(field, value, format, args...))
	}
	if c.Admin == nil {
		bad("Admin", "", "is required")
	}
	if c.MaxBodyBytes < 0 {
		bad("MaxBodyBytes", c.MaxBodyBytes, "must not be negative")
	}
	if c.ReadyTimeout < 0 {
		bad("ReadyTimeout", c.ReadyTimeout, "must not be negative")
	}
	if c.ShutdownTimeout < 0 {
		bad("ShutdownTimeout", c.ShutdownTimeout, "must not be negative")
	}
	seen := make(map[[sha256.Size]byte]int, len(c.Tokens))
	for i, t := range c.Tokens {
		field := func(f string) string { return fmt.Sprintf("Tokens[%d].%s", i, f) }
		if t.Name == "" || len(t.Name) > maxActorBytes || !printable.Text(t.Name) {
			bad(field("Name"), t.Name, "must be printable text of 1 to %d bytes: it is the actor in the replay audit", maxActorBytes)
		}
		// The value is a secret: the errors describe it but never show it.
		switch {
		case t.Value == "":
			bad(field("Value"), "", "is empty")
		case len(t.Value) < MinTokenBytes:
			bad(field("Value"), "", "is %d bytes; at least %d are required", len(t.Value), MinTokenBytes)
		case !printable.VisibleASCII(t.Value):
			bad(field("Value"), "", "must be visible ASCII without spaces, as a bearer token is sent")
		default:
			d := sha256.Sum256([]byte(t.Value))
			if j, dup := seen[d]; dup {
				bad(field("Value"), "", "is the same as Tokens[%d].Value", j)
			} else {
				seen[d] = i
			}
		}
		if t.Scope != ScopeRead && t.Scope != ScopeAdmin {
			bad(field("Scope"), t.Scope, "must be %q or %q", ScopeRead, ScopeAdmin)
		}
	}
	if len(ps) > 0 {
		return &postbox.ConfigError{Problems: ps}
	}
	return nil
}

// ListenError is returned by CheckListen, ListenAndServe and Serve for an
// address they refuse: one that is not loopback while no token is
// configured, which would serve every admin operation to the network.
type ListenError struct {
	Addr string
}

func (e *ListenError) Error() string {
	return fmt.Sprintf("postboxadmin: refusing to listen on %q with no token configured: it is not a loopback address "+
		"(127.0.0.0/8, ::1, localhost), and without a token every request may requeue, delete and replay; "+
		"configure Tokens or listen on 127.0.0.1", e.Addr)
}

// CheckListen reports whether the server configured by cfg may listen on
// addr (host:port). With at least one token, any address is allowed. With
// none, only loopback is: 127.0.0.0/8, ::1 and the name localhost. An empty
// host (":8080") means every interface and is refused, as is any other
// name (it could resolve anywhere). The refusal is a *ListenError; an
// address that is not host:port is a *postbox.ValidationError.
func CheckListen(addr string, cfg *Config) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return configcheck.Problem("addr", addr, "is not host:port: %v", err)
	}
	if cfg != nil && len(cfg.Tokens) > 0 {
		return nil
	}
	if !loopbackHost(host) {
		return &ListenError{Addr: addr}
	}
	return nil
}

// loopbackHost reports whether host (no port) names the loopback
// interface: "localhost" or a loopback IP, IPv4-mapped forms included.
func loopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.Unmap().IsLoopback()
}
