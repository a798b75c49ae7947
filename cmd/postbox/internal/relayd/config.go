// Package relayd is `postbox relay`: the relay as a daemon, for services
// in any language that write rows into the outbox table themselves.
package relayd

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/printable"
	"github.com/postbox-go/postbox/postboxwebhook"
)

// Config is the daemon's configuration: a YAML file, then POSTBOX_*
// environment variables, then flags, each overriding the one before.
type Config struct {
	// Databases lists the databases (shards) to relay from; each gets a
	// relay of its own, all feeding the same publisher.
	Databases []Database `yaml:"databases"`
	NATS      NATS       `yaml:"nats"`
	AMQP      AMQP       `yaml:"amqp"`
	Kafka     Kafka      `yaml:"kafka"`
	Redis     Redis      `yaml:"redis"`
	// Webhooks are HTTP destinations, each a publisher of its own that a
	// route names as "webhook:NAME".
	Webhooks []Webhook `yaml:"webhooks"`
	// Routes send topics to the publishers above, by name ("nats",
	// "amqp", "kafka", "redis", "webhook:NAME"); the first matching
	// pattern wins. Without routes, every topic goes to NATS. A relay
	// reads only routed topics: rows of others wait, spending no attempt,
	// for a relay that knows them.
	Routes []RouteConfig `yaml:"routes"`
	Relay  Relay         `yaml:"relay"`
	// Ready holds the readiness limits of every route that sets none of
	// its own.
	Ready Ready `yaml:"ready"`
	Admin Admin `yaml:"admin"`
	Log   Log   `yaml:"log"`
}

// UsesNATS reports whether the daemon needs NATS: no routes (every topic
// goes to NATS), a route naming it, or streams to ensure. A daemon that
// routes only to other brokers never connects to NATS.
func (c *Config) UsesNATS() bool {
	if len(c.Routes) == 0 || len(c.NATS.Streams) > 0 {
		return true
	}
	for _, r := range c.Routes {
		if r.Publisher == "nats" {
			return true
		}
	}
	return false
}

// Database is one database to relay from.
type Database struct {
	URL    string `yaml:"url"`    // postgres://..., mysql://... or sqlite:PATH
	Prefix string `yaml:"prefix"` // default postbox_
	// ConsumerPrefix names the tables of the consumers' inbox in this
	// database whose dead messages the admin API serves
	// (/v1/consumers/...). Default: Prefix, whose migrations made them.
	ConsumerPrefix string `yaml:"consumer_prefix"`
	// Storage is what the relay reads: StorageTable (the default), the
	// outbox, or StorageLog, the log of design §3 and the outbox beside
	// it (PostgreSQL only, as postboxpgx.WithLog). A relay over the log
	// publishes the outbox's rows too, so writers may keep the outbox, and
	// runs under either setting of the database (`postbox storage`); a
	// relay over the table never reads the log, and is refused while the
	// database says log.
	Storage string `yaml:"storage"`
}

// The storages a relay reads (Database.Storage).
const (
	StorageTable = "table"
	StorageLog   = "log"
)

// StorageProblem says what is wrong with storage for a database at url,
// or "": it is table or log, and log only on PostgreSQL (a URL of no
// known kind is the URL's problem, not the storage's).
func StorageProblem(url, storage string) string {
	switch kind := URLKind(url); {
	case storage != StorageTable && storage != StorageLog:
		return fmt.Sprintf("want %s or %s", StorageTable, StorageLog)
	case storage == StorageLog && kind != KindPostgres && kind != "":
		return fmt.Sprintf("the log is PostgreSQL's; a %s database keeps the table", kind)
	}
	return ""
}

// NATS configures the JetStream publisher.
type NATS struct {
	URL           string `yaml:"url"`
	SubjectPrefix string `yaml:"subject_prefix"`
	// Streams lists JetStream streams to create or update at start-up
	// (explicit topology; nothing is created while publishing).
	Streams []Stream `yaml:"streams"`
}

// AMQP configures the RabbitMQ publisher, used when a route names it.
// Exchanges and queues are declared by the operator (or by
// postboxamqp.EnsureTopology), never by the daemon while publishing.
type AMQP struct {
	URL              string   `yaml:"url"`
	Exchange         string   `yaml:"exchange"`
	AcceptUnroutable []string `yaml:"accept_unroutable"`
}

// Kafka configures the Kafka publisher, used when a route names it. The
// client is built with acks=all and idempotence; topics are created by the
// operator (or postboxkafka.EnsureTopic), never while publishing.
type Kafka struct {
	Seeds       []string `yaml:"seeds"`
	TopicPrefix string   `yaml:"topic_prefix"`
}

// Redis configures the Redis Streams publisher, used when a route names it.
// Streams must exist (postboxredis.EnsureGroup creates one with its group).
type Redis struct {
	URL          string `yaml:"url"` // redis://host:port/db
	StreamPrefix string `yaml:"stream_prefix"`
}

// Webhook is an HTTP destination (postboxwebhook): messages are POSTed
// to URL, signed with Secrets (Standard Webhooks).
type Webhook struct {
	Name string `yaml:"name"` // routes name it as webhook:NAME
	URL  string `yaml:"url"`
	// Secrets sign every request: whsec_ and the base64 of 24 or more
	// random bytes; list two while rotating.
	Secrets []string `yaml:"secrets"`
	// Timeout bounds one request; default 5s, below relay.batch_deadline.
	Timeout Duration `yaml:"timeout"`
	// Headers are sent with every request (e.g. Authorization).
	Headers map[string]string `yaml:"headers"`
	// MaxInFlight bounds the requests open at once; default 64.
	MaxInFlight int `yaml:"max_in_flight"`
}

// RouteConfig sends the topics matching Topics to Publisher.
type RouteConfig struct {
	Topics    string `yaml:"topics"`
	Publisher string `yaml:"publisher"` // nats, amqp, kafka, redis or webhook:NAME
	// MaxPendingAge and MaxPending override the top-level ready limits
	// for this route's topics.
	MaxPendingAge Duration `yaml:"max_pending_age"`
	MaxPending    int64    `yaml:"max_pending"`
}

// Ready holds readiness limits: /readyz fails while a routed topic's
// oldest pending message is older than MaxPendingAge, or while more than
// MaxPending of its messages are pending.
type Ready struct {
	// MaxPendingAge: default 5m; negative for no limit.
	MaxPendingAge Duration `yaml:"max_pending_age"`
	// MaxPending: default 0, no limit.
	MaxPending int64 `yaml:"max_pending"`
}

// Stream is a JetStream stream to ensure at start-up. A stream that does
// not exist is created with these settings and the server's defaults for
// the rest; one that exists keeps every setting these do not name (its
// limits, retention, storage, placement), and takes Subjects, and
// Duplicates and Replicas when they are set.
type Stream struct {
	Name string `yaml:"name"`
	// Subjects replace the stream's subjects.
	Subjects []string `yaml:"subjects"`
	// Duplicates is the duplicate window; 0 keeps an existing stream's,
	// and gives a new one the server's default (2m, or its max age when
	// that is shorter).
	Duplicates Duration `yaml:"duplicates"`
	// Replicas is the number of copies of the stream on a JetStream
	// cluster, 1 to 5; 0 keeps an existing stream's, and gives a new one 1.
	Replicas int `yaml:"replicas"`
}

// maxStreamReplicas is JetStream's limit on a stream's replicas.
const maxStreamReplicas = 5

// Relay holds the relay's tuning; zero values take the library defaults.
type Relay struct {
	// ID names this process in leases, logs and metrics (the pod's name,
	// say), followed by a random suffix per start; default a new UUID.
	ID            string   `yaml:"id"`
	BatchSize     int      `yaml:"batch_size"`
	PublishWindow int      `yaml:"publish_window"`
	Lanes         int      `yaml:"lanes"`
	Lease         Duration `yaml:"lease"`
	BatchDeadline Duration `yaml:"batch_deadline"`
	BackoffBase   Duration `yaml:"backoff_base"`
	BackoffMax    Duration `yaml:"backoff_max"`
	MaxAttempts   int      `yaml:"max_attempts"`
	MaxCrashes    int      `yaml:"max_crashes"`
	PollInterval  Duration `yaml:"poll_interval"`
	BlockOnDead   bool     `yaml:"block_on_dead"`
	// NoSignals turns off the change signals between processes
	// (postbox.Config.NoSignals): the relay listens for none and finds
	// rows written elsewhere by polling.
	NoSignals bool     `yaml:"no_signals"`
	Retention Duration `yaml:"retention"`
	// ConsumerDeadRetention keeps the consumers' dead messages of the
	// tables the daemon serves (databases[].consumer_prefix) this long:
	// the daemon deletes older ones, one process at a time with the
	// consumers' own Inbox passes. Negative keeps them until they are
	// handled (requeued or deleted). Default 30 days, the library's.
	ConsumerDeadRetention Duration `yaml:"consumer_dead_retention"`
	Source                string   `yaml:"source"`
	// MaxPayloadBytes caps a message's payload at write time; the daemon
	// writes nothing, so it only matters for what the library checks.
	MaxPayloadBytes int `yaml:"max_payload_bytes"`
}

// Admin configures the HTTP listener: the admin API and dashboard
// (postboxadmin), health, readiness and metrics. Without tokens it only
// listens on a loopback address.
type Admin struct {
	Listen string  `yaml:"listen"` // default 127.0.0.1:8089; "" in the file keeps the default, "off" disables
	Tokens []Token `yaml:"tokens"`
}

// Token is a bearer token for the admin API.
type Token struct {
	Name  string `yaml:"name"`
	Value string `yaml:"value"`
	Scope string `yaml:"scope"` // read or admin
}

// Log configures logging.
type Log struct {
	Level  string `yaml:"level"`  // debug, info, warn, error; default info
	Format string `yaml:"format"` // text or json; default text
}

// Duration is a time.Duration written as "30s", "5m", or a number of days
// as "7d".
type Duration time.Duration

// UnmarshalText implements encoding.TextUnmarshaler.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := ParseDuration(string(b))
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// maxDays keeps a number of days well inside time.Duration's range.
const maxDays = 36_500

// ParseDuration reads a Go duration ("30s", "5m") or a whole number of
// days ("7d"), at most 100 years.
func ParseDuration(s string) (time.Duration, error) {
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(days)
		if err != nil || n < 0 || n > maxDays {
			return 0, fmt.Errorf("%q is not a duration of 0 to %d days", s, maxDays)
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not a duration (e.g. 30s, 5m, 7d)", s)
	}
	return v, nil
}

// Defaults for the daemon's own settings.
const (
	// DefaultReadyMaxPendingAge is the oldest pending age past which
	// /readyz fails, for a route that sets no limit of its own.
	DefaultReadyMaxPendingAge = 5 * time.Minute
	DefaultAdminListen        = "127.0.0.1:8089"
	DefaultNATSURL            = "nats://127.0.0.1:4222"
)

// Load reads the file at path (none when empty), then applies the
// environment (getenv, usually os.Getenv), as Parse does, and returns
// what Parse returns. Unknown keys in the file are errors, so that a typo
// is not silently ignored.
func Load(path string, getenv func(string) string) (*Config, error) {
	var b []byte
	if path != "" {
		var err error
		if b, err = os.ReadFile(path); err != nil { //nolint:gosec // the operator names the config file
			return nil, fmt.Errorf("read config: %w", err)
		}
	}
	cfg, err := Parse(b, getenv)
	if err != nil {
		return cfg, fmt.Errorf("config %s: %w", path, err)
	}
	return cfg, nil
}

// Parse reads a YAML configuration (empty for none), expanding ${VAR}
// references in its values with getenv, then applies the POSTBOX_*
// variables. A file that is not YAML is an error wrapping ErrBadYAML, with
// no configuration. Keys and values that do not fit the configuration,
// and variables that cannot be read, are listed together in a
// *postbox.ConfigError (wrapping ErrBadYAML when the file has some); the
// configuration is then returned too, every bad value left at its
// default, so that Check can add what Validate finds.
func Parse(b []byte, getenv func(string) string) (*Config, error) {
	cfg := &Config{}
	var ps []*postbox.ValidationError
	if len(bytes.TrimSpace(b)) > 0 {
		var err error
		if ps, err = decodeYAML(b, cfg, getenv); err != nil {
			return nil, err
		}
	}
	inFile := len(ps) > 0
	var ce *postbox.ConfigError
	if err := cfg.applyEnv(getenv); err != nil && asConfigError(err, &ce) {
		ps = append(ps, ce.Problems...)
	}
	switch {
	case inFile:
		return cfg, fmt.Errorf("%w: %w", ErrBadYAML, &postbox.ConfigError{Problems: ps})
	case len(ps) > 0:
		return cfg, &postbox.ConfigError{Problems: ps}
	}
	return cfg, nil
}

// Check validates cfg (Validate) and returns every problem at once: the
// ones loadErr, the error of Load or Parse that returned cfg, lists, and
// the ones Validate finds in the fields they did not name already. cfg
// nil (a file that is not YAML at all) returns loadErr.
func Check(cfg *Config, loadErr error) error {
	if cfg == nil {
		return loadErr
	}
	var ce *postbox.ConfigError
	if loadErr != nil && !errors.As(loadErr, &ce) {
		return loadErr
	}
	var ps []*postbox.ValidationError
	named := map[string]bool{}
	if ce != nil {
		ps = append(ps, ce.Problems...)
		for _, p := range ce.Problems {
			named[p.Field] = true
		}
	}
	var ve *postbox.ConfigError
	if err := cfg.Validate(); err != nil {
		if !asConfigError(err, &ve) {
			return err
		}
		for _, p := range ve.Problems {
			if !named[p.Field] {
				ps = append(ps, p)
			}
		}
	}
	if len(ps) == 0 {
		return nil
	}
	out := &postbox.ConfigError{Problems: ps}
	if errors.Is(loadErr, ErrBadYAML) {
		return fmt.Errorf("%w: %w", ErrBadYAML, out)
	}
	return out
}

// withDefaults fills the daemon's own defaults; the relay's come from
// postbox.Config.WithDefaults.
func (c *Config) withDefaults() {
	for i := range c.Databases {
		if c.Databases[i].Prefix == "" {
			c.Databases[i].Prefix = postbox.DefaultPrefix
		}
		if c.Databases[i].ConsumerPrefix == "" {
			c.Databases[i].ConsumerPrefix = c.Databases[i].Prefix
		}
		if c.Databases[i].Storage == "" {
			c.Databases[i].Storage = StorageTable
		}
	}
	if c.Ready.MaxPendingAge == 0 {
		c.Ready.MaxPendingAge = Duration(DefaultReadyMaxPendingAge)
	}
	if c.NATS.URL == "" {
		c.NATS.URL = DefaultNATSURL
	}
	if c.Admin.Listen == "" {
		c.Admin.Listen = DefaultAdminListen
	}
	if c.Log.Level == "" {
		c.Log.Level = "info"
	}
	if c.Log.Format == "" {
		c.Log.Format = "text"
	}
}

// clientConfig maps the relay settings onto the library's Config.
func (c *Config) clientConfig(db Database) *postbox.Config {
	r := c.Relay
	return (&postbox.Config{
		Prefix: db.Prefix, Source: r.Source, RelayID: r.ID,
		BatchSize: r.BatchSize, PublishWindow: r.PublishWindow, Lanes: r.Lanes,
		LeaseDuration: time.Duration(r.Lease), BatchDeadline: time.Duration(r.BatchDeadline),
		BackoffBase: time.Duration(r.BackoffBase), BackoffMax: time.Duration(r.BackoffMax),
		MaxAttempts: r.MaxAttempts, MaxCrashes: r.MaxCrashes, PollInterval: time.Duration(r.PollInterval), BlockOnDead: r.BlockOnDead, NoSignals: r.NoSignals,
		Retention: time.Duration(r.Retention), DeadRetention: time.Duration(r.ConsumerDeadRetention), MaxPayloadBytes: r.MaxPayloadBytes,
	}).WithDefaults()
}

// Validate checks the whole configuration and returns a
// *postbox.ConfigError listing every problem, fields named by their path
// in the file (databases[0].url, relay.lease).
func (c *Config) Validate() error {
	c.withDefaults()
	var ps []*postbox.ValidationError
	bad := func(field string, value any, format string, args ...any) {
		v := fmt.Sprint(value)
		ps = append(ps, &postbox.ValidationError{Field: field, Value: v, Reason: fmt.Sprintf(format, args...)})
	}
	if len(c.Databases) == 0 {
		bad("databases", "", "at least one database is required (a file entry, or POSTBOX_DATABASE_URL)")
	}
	for i, db := range c.Databases {
		if URLKind(db.URL) == "" {
			bad(fmt.Sprintf("databases[%d].url", i), Redact(db.URL), "want "+URLForms)
		}
		if err := postbox.ValidatePrefix(db.Prefix); err != nil {
			bad(fmt.Sprintf("databases[%d].prefix", i), db.Prefix, "%s", err.(*postbox.ValidationError).Reason) //nolint:errorlint // always this type
		}
		if why := StorageProblem(db.URL, db.Storage); why != "" {
			bad(fmt.Sprintf("databases[%d].storage", i), db.Storage, "%s", why)
		}
		if db.ConsumerPrefix == db.Prefix {
			continue
		}
		if err := postbox.ValidatePrefix(db.ConsumerPrefix); err != nil {
			bad(fmt.Sprintf("databases[%d].consumer_prefix", i), db.ConsumerPrefix, "%s", err.(*postbox.ValidationError).Reason) //nolint:errorlint // always this type
		}
	}
	if !strings.HasPrefix(c.NATS.URL, "nats://") && !strings.HasPrefix(c.NATS.URL, "tls://") {
		bad("nats.url", Redact(c.NATS.URL), "want nats://host:port or tls://host:port")
	}
	for i, s := range c.NATS.Streams {
		if s.Name == "" || strings.ContainsAny(s.Name, " .*>") {
			bad(fmt.Sprintf("nats.streams[%d].name", i), s.Name, "must be a non-empty name without spaces, dots or wildcards")
		}
		if len(s.Subjects) == 0 {
			bad(fmt.Sprintf("nats.streams[%d].subjects", i), "", "at least one subject is required")
		}
		if s.Duplicates < 0 {
			bad(fmt.Sprintf("nats.streams[%d].duplicates", i), time.Duration(s.Duplicates).String(), "want a positive window, or 0 to keep an existing stream's (the server's default for a new one)")
		}
		if s.Replicas < 0 || s.Replicas > maxStreamReplicas {
			bad(fmt.Sprintf("nats.streams[%d].replicas", i), s.Replicas, "want 1 to %d, or 0 to keep an existing stream's count (1 for a new one)", maxStreamReplicas)
		}
	}
	if len(c.Databases) > 0 {
		var ce *postbox.ConfigError
		if err := c.clientConfig(Database{Prefix: postbox.DefaultPrefix}).Validate(); err != nil && asConfigError(err, &ce) {
			for _, p := range ce.Problems {
				if p.Field == "DeadRetention" {
					p.Field = "ConsumerDeadRetention"
				}
				p.Field = "relay." + snake(p.Field)
				ps = append(ps, p)
			}
		}
	}
	webhooks := map[string]int{}
	for i, w := range c.Webhooks {
		field := func(f string) string { return fmt.Sprintf("webhooks[%d].%s", i, f) }
		if !webhookName.MatchString(w.Name) {
			bad(field("name"), w.Name, "want 1 to 64 letters, digits, _ or -: routes name it as webhook:NAME")
		} else if j, dup := webhooks[w.Name]; dup {
			bad(field("name"), w.Name, "is the name of webhooks[%d] too", j)
		} else {
			webhooks[w.Name] = i
		}
		reported := map[string]bool{}
		for j, sec := range w.Secrets {
			if looksLikePlaceholder(sec) {
				reported[fmt.Sprintf("webhooks[%d].secrets[%d]", i, j)] = true
				bad(fmt.Sprintf("webhooks[%d].secrets[%d]", i, j), "", "looks like a placeholder, not a secret; set the real one (e.g. \"${PARTNER_WEBHOOK_SECRET}\")")
			}
		}
		for name, v := range w.Headers {
			if looksLikePlaceholder(v) && (strings.EqualFold(name, "Authorization") || strings.Contains(strings.ToLower(name), "token")) {
				bad(fmt.Sprintf("webhooks[%d].headers.%s", i, name), "", "looks like a placeholder, not a credential")
			}
		}
		// The adapter checks the rest (URL, secrets' form, timeout),
		// every problem under this entry's name.
		if _, err := postboxwebhook.New(w.config()); err != nil {
			var ce *postbox.ConfigError
			if errors.As(err, &ce) {
				for _, p := range ce.Problems {
					p.Field = fmt.Sprintf("webhooks[%d].%s", i, webhookField(p.Field))
					if !reported[p.Field] {
						ps = append(ps, p)
					}
				}
			} else {
				bad(fmt.Sprintf("webhooks[%d]", i), "", "%v", err)
			}
		}
	}
	uses := map[string]bool{}
	for i, r := range c.Routes {
		if err := postbox.ValidateTopicPattern(r.Topics); err != nil {
			bad(fmt.Sprintf("routes[%d].topics", i), r.Topics, "%s", err.(*postbox.ValidationError).Reason) //nolint:errorlint // always this type
		}
		switch name, isHook := strings.CutPrefix(r.Publisher, "webhook:"); {
		case r.Publisher == "nats", r.Publisher == "amqp", r.Publisher == "kafka", r.Publisher == "redis":
			uses[r.Publisher] = true
		case isHook:
			if _, ok := webhooks[name]; !ok {
				bad(fmt.Sprintf("routes[%d].publisher", i), r.Publisher, "no webhook is named %q (webhooks[].name)", name)
			}
		default:
			bad(fmt.Sprintf("routes[%d].publisher", i), r.Publisher, "want nats, amqp, kafka, redis or webhook:NAME")
		}
		if r.MaxPending < 0 {
			bad(fmt.Sprintf("routes[%d].max_pending", i), r.MaxPending, "must not be negative (0 takes ready.max_pending)")
		}
	}
	if c.Ready.MaxPending < 0 {
		bad("ready.max_pending", c.Ready.MaxPending, "must not be negative (0 is no limit)")
	}
	if uses["amqp"] && !strings.HasPrefix(c.AMQP.URL, "amqp://") && !strings.HasPrefix(c.AMQP.URL, "amqps://") {
		bad("amqp.url", Redact(c.AMQP.URL), "a route names amqp: want amqp://user:pass@host:port/vhost or amqps://...")
	}
	if uses["kafka"] && len(c.Kafka.Seeds) == 0 {
		bad("kafka.seeds", "", "a route names kafka: at least one host:port is required")
	}
	for i, seed := range c.Kafka.Seeds {
		if _, _, err := net.SplitHostPort(seed); err != nil {
			bad(fmt.Sprintf("kafka.seeds[%d]", i), seed, "want host:port")
		}
	}
	if uses["redis"] && !strings.HasPrefix(c.Redis.URL, "redis://") && !strings.HasPrefix(c.Redis.URL, "rediss://") {
		bad("redis.url", Redact(c.Redis.URL), "a route names redis: want redis://host:port/db or rediss://...")
	}
	if c.Admin.Listen != "off" && !strings.Contains(c.Admin.Listen, ":") {
		bad("admin.listen", c.Admin.Listen, "want host:port, or off")
	}
	for i, t := range c.Admin.Tokens {
		switch {
		case len(t.Value) < 16:
			bad(fmt.Sprintf("admin.tokens[%d].value", i), "", "must be at least 16 characters")
		case looksLikePlaceholder(t.Value):
			bad(fmt.Sprintf("admin.tokens[%d].value", i), "", "looks like a placeholder, not a secret: generate one (openssl rand -base64 32) and pass it as \"${OPS_TOKEN}\" or in POSTBOX_ADMIN_TOKEN")
		case !printable.VisibleASCII(t.Value):
			bad(fmt.Sprintf("admin.tokens[%d].value", i), "", "must be visible ASCII without spaces, as a bearer token is sent")
		}
		if t.Name == "" || !printable.Text(t.Name) || len(t.Name) > 200 {
			bad(fmt.Sprintf("admin.tokens[%d].name", i), t.Name, "must be printable text of 1 to 200 bytes: it is the actor in the replay audit")
		}
		if t.Scope != "read" && t.Scope != "admin" {
			bad(fmt.Sprintf("admin.tokens[%d].scope", i), t.Scope, "want read or admin")
		}
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(c.Log.Level)); err != nil {
		bad("log.level", c.Log.Level, "want debug, info, warn or error")
	}
	if c.Log.Format != "text" && c.Log.Format != "json" {
		bad("log.format", c.Log.Format, "want text or json")
	}
	if len(ps) > 0 {
		return &postbox.ConfigError{Problems: ps}
	}
	return nil
}

func asConfigError(err error, target **postbox.ConfigError) bool {
	ce, ok := err.(*postbox.ConfigError) //nolint:errorlint // Validate returns it unwrapped
	if ok {
		*target = ce
	}
	return ok
}

// snake turns a Config field name (BatchDeadline) into the file's key
// (batch_deadline); LeaseDuration is spelled lease in the file.
func snake(field string) string {
	if field == "LeaseDuration" {
		return "lease"
	}
	var b strings.Builder
	for i, r := range field {
		if r >= 'A' && r <= 'Z' {
			if i > 0 {
				b.WriteByte('_')
			}
			r += 'a' - 'A'
		}
		b.WriteRune(r)
	}
	return b.String()
}

// Redact hides a password in a URL before it is shown.
func Redact(u string) string {
	if at := strings.Index(u, "@"); at > 0 {
		if scheme := strings.Index(u, "://"); scheme > 0 && scheme < at {
			creds := u[scheme+3 : at]
			if colon := strings.Index(creds, ":"); colon >= 0 {
				return u[:scheme+3] + creds[:colon] + ":***" + u[at:]
			}
		}
	}
	return u
}

// StopTimeout bounds a clean stop: the batch in flight gets its deadline,
// and a little more to record its outcome and release the partitions.
func (c *Config) StopTimeout() time.Duration {
	return c.clientConfig(Database{Prefix: postbox.DefaultPrefix}).BatchDeadline + 10*time.Second
}

// Logger returns the configured logger, writing to w.
func Logger(c *Config, w io.Writer) *slog.Logger {
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(c.Log.Level))
	opts := &slog.HandlerOptions{Level: lvl}
	if c.Log.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

var webhookName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// config is the webhook's postboxwebhook configuration: one destination
// taking every topic its routes send it.
func (w *Webhook) config() *postboxwebhook.Config {
	secrets := make([]postboxwebhook.Secret, len(w.Secrets))
	for i, s := range w.Secrets {
		secrets[i] = postboxwebhook.Secret(s)
	}
	return &postboxwebhook.Config{Destinations: []postboxwebhook.Destination{{
		Topics: "*", URL: w.URL, Secrets: secrets, Timeout: time.Duration(w.Timeout), Headers: w.Headers, MaxInFlight: w.MaxInFlight,
	}}}
}

// webhookField turns postboxwebhook's field (Destinations[0].Timeout)
// into the file's key (timeout).
func webhookField(f string) string {
	f = strings.TrimPrefix(f, "Destinations[0].")
	switch f {
	case "MaxInFlight":
		return "max_in_flight"
	case "URL":
		return "url"
	}
	if name, idx, ok := strings.Cut(f, "["); ok {
		return snake(name) + "[" + idx
	}
	return snake(f)
}

// placeholderWords are what example values are made of.
var placeholderWords = []string{"changeme", "change-me", "change_me", "replace", "placeholder", "example", "your-", "your_", "secret-here",
	"token-here", "xxxx", "todo", "fixme", "redacted", "random secret", "<", ">", "${", "$(", " "}

// looksLikePlaceholder reports whether a secret is an example value rather
// than a generated one: a reference left unexpanded, angle brackets,
// spaces, a word examples use, or too few distinct characters.
func looksLikePlaceholder(s string) bool {
	l := strings.ToLower(s)
	for _, w := range placeholderWords {
		if strings.Contains(l, w) {
			return true
		}
	}
	distinct := map[rune]bool{}
	for _, r := range s {
		distinct[r] = true
	}
	return len(distinct) < 8
}
