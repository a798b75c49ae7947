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
	"strconv"
	"strings"
	"time"

	"github.com/goccy/go-yaml"

	"github.com/postbox-go/postbox"
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
	// Routes send topics to the publishers above, by name ("nats",
	// "amqp"); the first matching pattern wins. Without routes, every
	// topic goes to NATS. A relay reads only routed topics: rows of others
	// wait, spending no attempt, for a relay that knows them.
	Routes []RouteConfig `yaml:"routes"`
	Relay  Relay         `yaml:"relay"`
	Admin  Admin         `yaml:"admin"`
	Log    Log           `yaml:"log"`
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
	URL    string `yaml:"url"`    // postgres://... or sqlite:PATH
	Prefix string `yaml:"prefix"` // default postbox_
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

// RouteConfig sends the topics matching Topics to Publisher.
type RouteConfig struct {
	Topics    string `yaml:"topics"`
	Publisher string `yaml:"publisher"` // nats, amqp, kafka or redis
}

// Stream is a JetStream stream to ensure.
type Stream struct {
	Name       string   `yaml:"name"`
	Subjects   []string `yaml:"subjects"`
	Duplicates Duration `yaml:"duplicates"`
}

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
	PollInterval  Duration `yaml:"poll_interval"`
	BlockOnDead   bool     `yaml:"block_on_dead"`
	Retention     Duration `yaml:"retention"`
	Source        string   `yaml:"source"`
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
	DefaultAdminListen = "127.0.0.1:8089"
	DefaultNATSURL     = "nats://127.0.0.1:4222"
)

// Load reads the file at path (none when empty), then applies the
// environment (getenv, usually os.Getenv). Unknown keys in the file are
// errors, so that a typo is not silently ignored.
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
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return cfg, nil
}

// Parse reads a YAML configuration (empty for none), then applies the
// environment.
func Parse(b []byte, getenv func(string) string) (cfg *Config, err error) {
	cfg = &Config{}
	if len(bytes.TrimSpace(b)) > 0 {
		if err := decodeYAML(b, cfg); err != nil {
			return nil, err
		}
	}
	cfg.applyEnv(getenv)
	return cfg, nil
}

// ErrBadYAML is returned (wrapped) for a configuration the YAML decoder
// could not read.
var ErrBadYAML = errors.New("not a valid configuration file")

// decodeYAML decodes b into cfg, refusing unknown keys. The decoder panics
// on some malformed input (a !!binary tag where a list belongs, found by
// FuzzRelayConfig); that is bad input too, and gets an error like any.
func decodeYAML(b []byte, cfg *Config) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%w: the YAML decoder failed on it (%v)", ErrBadYAML, p)
		}
	}()
	if err := yaml.NewDecoder(bytes.NewReader(b), yaml.DisallowUnknownField()).Decode(cfg); err != nil {
		return fmt.Errorf("%w: %s", ErrBadYAML, yaml.FormatError(err, false, true))
	}
	return nil
}

// applyEnv overrides the file with POSTBOX_* variables. Values are taken
// as given; Validate reports the ones that are wrong.
func (c *Config) applyEnv(getenv func(string) string) {
	if v := getenv("POSTBOX_DATABASE_URL"); v != "" {
		prefix := getenv("POSTBOX_PREFIX")
		c.Databases = []Database{{URL: v, Prefix: prefix}}
	} else if v := getenv("POSTBOX_PREFIX"); v != "" {
		for i := range c.Databases {
			c.Databases[i].Prefix = v
		}
	}
	if v := getenv("POSTBOX_RELAY_ID"); v != "" {
		c.Relay.ID = v
	}
	if v := getenv("POSTBOX_NATS_URL"); v != "" {
		c.NATS.URL = v
	}
	if v := getenv("POSTBOX_NATS_SUBJECT_PREFIX"); v != "" {
		c.NATS.SubjectPrefix = v
	}
	if v := getenv("POSTBOX_AMQP_URL"); v != "" {
		c.AMQP.URL = v
	}
	if v := getenv("POSTBOX_KAFKA_SEEDS"); v != "" {
		c.Kafka.Seeds = strings.Split(v, ",")
	}
	if v := getenv("POSTBOX_REDIS_URL"); v != "" {
		c.Redis.URL = v
	}
	if v := getenv("POSTBOX_ADMIN_LISTEN"); v != "" {
		c.Admin.Listen = v
	}
	if v := getenv("POSTBOX_ADMIN_TOKEN"); v != "" {
		c.Admin.Tokens = append(c.Admin.Tokens, Token{Name: "env", Value: v, Scope: "admin"})
	}
	if v := getenv("POSTBOX_READ_TOKEN"); v != "" {
		c.Admin.Tokens = append(c.Admin.Tokens, Token{Name: "env-read", Value: v, Scope: "read"})
	}
	if v := getenv("POSTBOX_LOG_LEVEL"); v != "" {
		c.Log.Level = v
	}
	if v := getenv("POSTBOX_LOG_FORMAT"); v != "" {
		c.Log.Format = v
	}
}

// withDefaults fills the daemon's own defaults; the relay's come from
// postbox.Config.WithDefaults.
func (c *Config) withDefaults() {
	for i := range c.Databases {
		if c.Databases[i].Prefix == "" {
			c.Databases[i].Prefix = postbox.DefaultPrefix
		}
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
		MaxAttempts: r.MaxAttempts, PollInterval: time.Duration(r.PollInterval), BlockOnDead: r.BlockOnDead,
		Retention: time.Duration(r.Retention),
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
		switch {
		case strings.HasPrefix(db.URL, "postgres://"), strings.HasPrefix(db.URL, "postgresql://"):
		case strings.HasPrefix(db.URL, "sqlite:") && len(db.URL) > len("sqlite:"):
		default:
			bad(fmt.Sprintf("databases[%d].url", i), Redact(db.URL), "want postgres://... or sqlite:PATH")
		}
		if err := postbox.ValidatePrefix(db.Prefix); err != nil {
			bad(fmt.Sprintf("databases[%d].prefix", i), db.Prefix, "%s", err.(*postbox.ValidationError).Reason) //nolint:errorlint // always this type
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
	}
	if len(c.Databases) > 0 {
		var ce *postbox.ConfigError
		if err := c.clientConfig(Database{Prefix: postbox.DefaultPrefix}).Validate(); err != nil && asConfigError(err, &ce) {
			for _, p := range ce.Problems {
				p.Field = "relay." + snake(p.Field)
				ps = append(ps, p)
			}
		}
	}
	uses := map[string]bool{}
	for i, r := range c.Routes {
		if err := postbox.ValidateTopicPattern(r.Topics); err != nil {
			bad(fmt.Sprintf("routes[%d].topics", i), r.Topics, "%s", err.(*postbox.ValidationError).Reason) //nolint:errorlint // always this type
		}
		switch r.Publisher {
		case "nats", "amqp", "kafka", "redis":
			uses[r.Publisher] = true
		default:
			bad(fmt.Sprintf("routes[%d].publisher", i), r.Publisher, "want nats, amqp, kafka or redis")
		}
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
		if len(t.Value) < 16 {
			bad(fmt.Sprintf("admin.tokens[%d].value", i), "", "must be at least 16 characters")
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
