package relayd

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/configcheck"
)

// EnvVar is one POSTBOX_* variable: the setting it sets, and how.
type EnvVar struct {
	Name    string // POSTBOX_...
	Setting string // the file's key it overrides
	Help    string
	set     func(c *Config, v string) error
}

// Settings that only the file holds: lists of records, which a variable
// would flatten badly. Everything else has a variable (EnvVars).
var FileOnly = []string{
	"databases (beyond one: POSTBOX_DATABASE_URL sets a single database)",
	"nats.streams", "webhooks",
	"routes[].max_pending_age and routes[].max_pending (POSTBOX_ROUTES sets topics and publishers)",
	"admin.tokens (beyond one admin and one read token: POSTBOX_ADMIN_TOKEN, POSTBOX_READ_TOKEN)",
}

func str(dst func(c *Config) *string) func(*Config, string) error {
	return func(c *Config, v string) error { *dst(c) = v; return nil }
}

func list(dst func(c *Config) *[]string) func(*Config, string) error {
	return func(c *Config, v string) error {
		var out []string
		for _, s := range strings.Split(v, ",") {
			if s = strings.TrimSpace(s); s != "" {
				out = append(out, s)
			}
		}
		*dst(c) = out
		return nil
	}
}

func boolean(dst func(c *Config) *bool) func(*Config, string) error {
	return func(c *Config, v string) error {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("want true or false")
		}
		*dst(c) = b
		return nil
	}
}

func integer(dst func(c *Config) *int) func(*Config, string) error {
	return func(c *Config, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil {
			return fmt.Errorf("want a whole number")
		}
		*dst(c) = n
		return nil
	}
}

func integer64(dst func(c *Config) *int64) func(*Config, string) error {
	return func(c *Config, v string) error {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return fmt.Errorf("want a whole number")
		}
		*dst(c) = n
		return nil
	}
}

func duration(dst func(c *Config) *Duration) func(*Config, string) error {
	return func(c *Config, v string) error { return dst(c).UnmarshalText([]byte(v)) }
}

// EnvVars lists every POSTBOX_* variable the daemon reads, in the order
// they are applied. POSTBOX_CONFIG, the file's path, is read by the
// command before the file.
var EnvVars = []EnvVar{
	{Name: "POSTBOX_CONFIG", Setting: "(the file)", Help: "YAML configuration file"},
	{Name: "POSTBOX_DATABASE_URL", Setting: "databases", Help: "one database to relay from, replacing the file's list: postgres://..., mysql://... or sqlite:PATH",
		set: func(c *Config, v string) error { c.Databases = []Database{{URL: v}}; return nil }},
	{Name: "POSTBOX_PREFIX", Setting: "databases[].prefix", Help: "table prefix of every database",
		set: func(c *Config, v string) error {
			for i := range c.Databases {
				c.Databases[i].Prefix = v
			}
			return nil
		}},
	{Name: "POSTBOX_CONSUMER_PREFIX", Setting: "databases[].consumer_prefix", Help: "prefix of the consumers' tables served by the admin API, of every database",
		set: func(c *Config, v string) error {
			for i := range c.Databases {
				c.Databases[i].ConsumerPrefix = v
			}
			return nil
		}},
	{Name: "POSTBOX_STORAGE", Setting: "databases[].storage", Help: "what the relay reads, of every database: table (the outbox) or log (PostgreSQL: the log and the outbox, as postboxpgx.WithLog)",
		set: func(c *Config, v string) error {
			for i := range c.Databases {
				c.Databases[i].Storage = v
			}
			return nil
		}},
	{Name: "POSTBOX_NATS_URL", Setting: "nats.url", Help: "NATS server", set: str(func(c *Config) *string { return &c.NATS.URL })},
	{Name: "POSTBOX_NATS_SUBJECT_PREFIX", Setting: "nats.subject_prefix", set: str(func(c *Config) *string { return &c.NATS.SubjectPrefix })},
	{Name: "POSTBOX_AMQP_URL", Setting: "amqp.url", set: str(func(c *Config) *string { return &c.AMQP.URL })},
	{Name: "POSTBOX_AMQP_EXCHANGE", Setting: "amqp.exchange", set: str(func(c *Config) *string { return &c.AMQP.Exchange })},
	{Name: "POSTBOX_AMQP_ACCEPT_UNROUTABLE", Setting: "amqp.accept_unroutable", Help: "comma-separated topics",
		set: list(func(c *Config) *[]string { return &c.AMQP.AcceptUnroutable })},
	{Name: "POSTBOX_KAFKA_SEEDS", Setting: "kafka.seeds", Help: "comma-separated host:port", set: list(func(c *Config) *[]string { return &c.Kafka.Seeds })},
	{Name: "POSTBOX_KAFKA_TOPIC_PREFIX", Setting: "kafka.topic_prefix", set: str(func(c *Config) *string { return &c.Kafka.TopicPrefix })},
	{Name: "POSTBOX_REDIS_URL", Setting: "redis.url", set: str(func(c *Config) *string { return &c.Redis.URL })},
	{Name: "POSTBOX_REDIS_STREAM_PREFIX", Setting: "redis.stream_prefix", set: str(func(c *Config) *string { return &c.Redis.StreamPrefix })},
	{Name: "POSTBOX_ROUTES", Setting: "routes", Help: "PATTERN=PUBLISHER,... e.g. orders.*=nats,audit.*=amqp, replacing the file's routes",
		set: func(c *Config, v string) error {
			var rs []RouteConfig
			for _, part := range strings.Split(v, ",") {
				topics, pub, ok := strings.Cut(strings.TrimSpace(part), "=")
				if !ok {
					return fmt.Errorf("want PATTERN=PUBLISHER,... (e.g. orders.*=nats)")
				}
				rs = append(rs, RouteConfig{Topics: topics, Publisher: pub})
			}
			c.Routes = rs
			return nil
		}},
	{Name: "POSTBOX_RELAY_ID", Setting: "relay.id", Help: "this relay's name in leases, logs and metrics (a suffix is added per start)", set: str(func(c *Config) *string { return &c.Relay.ID })},
	{Name: "POSTBOX_BATCH_SIZE", Setting: "relay.batch_size", set: integer(func(c *Config) *int { return &c.Relay.BatchSize })},
	{Name: "POSTBOX_PUBLISH_WINDOW", Setting: "relay.publish_window", set: integer(func(c *Config) *int { return &c.Relay.PublishWindow })},
	{Name: "POSTBOX_LANES", Setting: "relay.lanes", set: integer(func(c *Config) *int { return &c.Relay.Lanes })},
	{Name: "POSTBOX_LEASE", Setting: "relay.lease", set: duration(func(c *Config) *Duration { return &c.Relay.Lease })},
	{Name: "POSTBOX_BATCH_DEADLINE", Setting: "relay.batch_deadline", set: duration(func(c *Config) *Duration { return &c.Relay.BatchDeadline })},
	{Name: "POSTBOX_BACKOFF_BASE", Setting: "relay.backoff_base", set: duration(func(c *Config) *Duration { return &c.Relay.BackoffBase })},
	{Name: "POSTBOX_BACKOFF_MAX", Setting: "relay.backoff_max", set: duration(func(c *Config) *Duration { return &c.Relay.BackoffMax })},
	{Name: "POSTBOX_MAX_ATTEMPTS", Setting: "relay.max_attempts", set: integer(func(c *Config) *int { return &c.Relay.MaxAttempts })},
	{Name: "POSTBOX_MAX_CRASHES", Setting: "relay.max_crashes", Help: "relays that may die publishing one message before it is dead", set: integer(func(c *Config) *int { return &c.Relay.MaxCrashes })},
	{Name: "POSTBOX_POLL_INTERVAL", Setting: "relay.poll_interval", set: duration(func(c *Config) *Duration { return &c.Relay.PollInterval })},
	{Name: "POSTBOX_BLOCK_ON_DEAD", Setting: "relay.block_on_dead", Help: "true or false", set: boolean(func(c *Config) *bool { return &c.Relay.BlockOnDead })},
	{Name: "POSTBOX_NO_SIGNALS", Setting: "relay.no_signals", Help: "true or false: no change signals between processes, the relay polls",
		set: boolean(func(c *Config) *bool { return &c.Relay.NoSignals })},
	{Name: "POSTBOX_RETENTION", Setting: "relay.retention", Help: "published history kept for replay, e.g. 7d; negative keeps everything",
		set: duration(func(c *Config) *Duration { return &c.Relay.Retention })},
	{Name: "POSTBOX_CONSUMER_DEAD_RETENTION", Setting: "relay.consumer_dead_retention", Help: "consumers' dead messages kept, e.g. 30d; negative keeps them until handled",
		set: duration(func(c *Config) *Duration { return &c.Relay.ConsumerDeadRetention })},
	{Name: "POSTBOX_SOURCE", Setting: "relay.source", set: str(func(c *Config) *string { return &c.Relay.Source })},
	{Name: "POSTBOX_MAX_PAYLOAD_BYTES", Setting: "relay.max_payload_bytes", set: integer(func(c *Config) *int { return &c.Relay.MaxPayloadBytes })},
	{Name: "POSTBOX_READY_MAX_PENDING_AGE", Setting: "ready.max_pending_age", Help: "default 5m; negative for no limit",
		set: duration(func(c *Config) *Duration { return &c.Ready.MaxPendingAge })},
	{Name: "POSTBOX_READY_MAX_PENDING", Setting: "ready.max_pending", Help: "default 0, no limit", set: integer64(func(c *Config) *int64 { return &c.Ready.MaxPending })},
	{Name: "POSTBOX_ADMIN_LISTEN", Setting: "admin.listen", Help: "host:port, or off", set: str(func(c *Config) *string { return &c.Admin.Listen })},
	{Name: "POSTBOX_ADMIN_TOKEN", Setting: "admin.tokens", Help: "adds an admin-scope token named env",
		set: func(c *Config, v string) error {
			c.Admin.Tokens = append(c.Admin.Tokens, Token{Name: "env", Value: v, Scope: "admin"})
			return nil
		}},
	{Name: "POSTBOX_READ_TOKEN", Setting: "admin.tokens", Help: "adds a read-scope token named env-read",
		set: func(c *Config, v string) error {
			c.Admin.Tokens = append(c.Admin.Tokens, Token{Name: "env-read", Value: v, Scope: "read"})
			return nil
		}},
	{Name: "POSTBOX_LOG_LEVEL", Setting: "log.level", set: str(func(c *Config) *string { return &c.Log.Level })},
	{Name: "POSTBOX_LOG_FORMAT", Setting: "log.format", set: str(func(c *Config) *string { return &c.Log.Format })},
}

// applyEnv overrides the file with the POSTBOX_* variables, taken
// literally (no ${VAR} expansion). A value that cannot be read (a number,
// a duration) is a problem named by its variable; every one is listed.
func (c *Config) applyEnv(getenv func(string) string) error {
	var ps []*postbox.ValidationError
	for _, e := range EnvVars {
		v := getenv(e.Name)
		if v == "" || e.set == nil {
			continue
		}
		if err := e.set(c, v); err != nil {
			value := v
			if strings.HasSuffix(e.Name, "_TOKEN") || strings.HasSuffix(e.Name, "_URL") {
				value = Redact(v)
			}
			ps = append(ps, configcheck.Problem(e.Name, value, "%v", err))
		}
	}
	if len(ps) > 0 {
		return &postbox.ConfigError{Problems: ps}
	}
	return nil
}

// EnvHelp is the text `postbox relay --help` ends with: every variable,
// the setting it overrides, and the settings only the file has.
func EnvHelp() string {
	var b strings.Builder
	b.WriteString("Environment (each overrides the file's setting; flags override both):\n")
	for _, e := range EnvVars {
		line := fmt.Sprintf("  %-32s %s", e.Name, e.Setting)
		if e.Help != "" {
			line += ": " + e.Help
		}
		b.WriteString(line + "\n")
	}
	b.WriteString("\nOnly in the file: " + strings.Join(FileOnly, "; ") + ".\n")
	b.WriteString("\nIn the file, ${NAME} in a value is replaced by the environment variable NAME (an unset one is an error), and $$ is a literal $.\n")
	return b.String()
}
