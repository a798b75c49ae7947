package relayd

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/postboxadmin"
	"github.com/postbox-go/postbox/postboxamqp"
	"github.com/postbox-go/postbox/postboxdriver"
	"github.com/postbox-go/postbox/postboxkafka"
	"github.com/postbox-go/postbox/postboxnats"
	"github.com/postbox-go/postbox/postboxpgx"
	"github.com/postbox-go/postbox/postboxprom"
	"github.com/postbox-go/postbox/postboxredis"
	"github.com/postbox-go/postbox/postboxwebhook"
)

// Daemon is a running relay daemon.
type Daemon struct {
	cfg     *Config
	log     *slog.Logger
	nc      *nats.Conn
	js      jetstream.JetStream
	pub     *postboxnats.Publisher
	amqp    *postboxamqp.Publisher
	kafka   *postboxkafka.Publisher
	kcl     *kgo.Client
	redis   *postboxredis.Publisher
	rcl     *redis.Client
	hooks   map[string]*postboxwebhook.Publisher
	routes  []route
	shards  []*shard
	reg     *prometheus.Registry
	srv     *http.Server
	ln      net.Listener
	serveWG sync.WaitGroup
	// stopStarting ends the shards' start loops (keepStarting), which
	// startWG waits for.
	stopStarting context.CancelFunc
	startWG      sync.WaitGroup
}

// shard is one database with its relay.
type shard struct {
	name   string
	client interface {
		Start(context.Context) error
		Stop(context.Context) error
		RelayState() postbox.RelayState
	}
	admin *postbox.Admin
	// consumers serves the consumers' dead messages of the database's
	// consumer prefix.
	consumers postboxadmin.ConsumerDead
	deadStats postboxprom.DeadStats
	// retention prunes the consumers' dead messages past
	// relay.consumer_dead_retention; nil when they are kept until handled.
	retention interface {
		Start(context.Context) error
		Stop(context.Context) error
		Prune(context.Context) (postbox.PruneResult, error)
	}
	close func()
	// ping asks the database for an answer.
	ping func(context.Context) error

	mu      sync.Mutex
	started bool  // the relay runs
	down    error // the last failed start, while not started
	since   time.Time
}

// Shard start retries: a database that is down at start (unreachable,
// not created, not migrated) is tried again after 1 s, doubling up to
// 30 s, on its own, while the other shards relay.
const (
	shardRetryBase    = time.Second
	shardRetryMax     = 30 * time.Second
	shardStartTimeout = 10 * time.Second
)

func (sh *shard) state() postboxadmin.ShardStatus {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	st := postboxadmin.ShardStatus{Shard: sh.name, Up: sh.started, Since: sh.since}
	if sh.down != nil {
		st.Error = sh.down.Error()
	}
	if sh.started {
		// A relay that runs but cannot reach its database is not
		// relaying: down, since its failures began, while it retries.
		if rs := sh.client.RelayState(); rs.Err != nil {
			st.Up, st.Error, st.Since = false, "the relay runs and retries: "+rs.Err.Error(), rs.Since
		}
	}
	return st
}

// Shards reports every shard's state, in the order of databases, as
// GET /v1/status lists them.
func (d *Daemon) Shards() []postboxadmin.ShardStatus {
	out := make([]postboxadmin.ShardStatus, 0, len(d.shards))
	for _, sh := range d.shards {
		out = append(out, sh.state())
	}
	return out
}

// keepStarting starts sh's relay, and its consumers' retention, retrying
// with backoff until it starts or the daemon stops; tried is closed once
// its first attempt is over. Each shard has its own: one database that is
// down never holds up the others.
func (d *Daemon) keepStarting(ctx context.Context, sh *shard, log *slog.Logger, tried chan<- struct{}) {
	defer d.startWG.Done()
	once := sync.OnceFunc(func() { close(tried) })
	defer once()
	wait := shardRetryBase
	for {
		sctx, cancel := context.WithTimeout(ctx, shardStartTimeout)
		err := sh.client.Start(sctx)
		cancel()
		if err == nil {
			if sh.retention != nil {
				if err := sh.retention.Start(context.WithoutCancel(ctx)); err != nil {
					log.Warn("postbox relay: the consumers' retention did not start", slog.Any("error", err))
				}
			}
			sh.mu.Lock()
			wasDown := sh.down != nil
			sh.started, sh.down, sh.since = true, nil, time.Now()
			sh.mu.Unlock()
			if wasDown {
				log.Info("postbox relay: shard up, relaying")
			}
			return
		}
		if ctx.Err() != nil {
			return
		}
		sh.mu.Lock()
		if sh.down == nil {
			sh.since = time.Now()
		}
		sh.down = err
		sh.mu.Unlock()
		once()
		log.Warn("postbox relay: shard down; the other shards relay, and this one is tried again",
			slog.Any("error", err), slog.Duration("retry_in", wait))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		wait = min(2*wait, shardRetryMax)
	}
}

// route is a configured route with its readiness limits resolved.
type route struct {
	topics, publisher string
	maxAge            time.Duration // <0: no limit
	maxPending        int64         // 0: no limit
}

// routeFor returns the route that takes topic, the first that matches,
// or nil when none does: such rows wait for a relay that routes them.
func (d *Daemon) routeFor(topic string) *route {
	for i := range d.routes {
		if matchTopic(d.routes[i].topics, topic) {
			return &d.routes[i]
		}
	}
	return nil
}

// Routed reports whether a route of the daemon takes topic.
func (d *Daemon) Routed(topic string) bool { return d.routeFor(topic) != nil }

// DedupeWindow tells the duplicate window of the broker topic goes to:
// the Duplicates of the JetStream stream that captures its subject (read
// from the server), the Redis publisher's DedupeWindow; none for the
// other brokers, and for a topic no route takes.
func (d *Daemon) DedupeWindow(ctx context.Context, topic string) (time.Duration, string, error) {
	r := d.routeFor(topic)
	if r == nil {
		return 0, "", nil
	}
	switch r.publisher {
	case "nats":
		subject, err := d.pub.Subject(topic)
		if err != nil {
			return 0, "", nil //nolint:nilerr // a topic that makes no subject is never published: nothing to drop
		}
		name, err := d.js.StreamNameBySubject(ctx, subject)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return 0, "", nil
		}
		if err != nil {
			return 0, "", fmt.Errorf("find the stream of %s: %w", subject, err)
		}
		st, err := d.js.Stream(ctx, name)
		if err != nil {
			return 0, "", fmt.Errorf("read stream %s: %w", name, err)
		}
		info, err := st.Info(ctx)
		if err != nil {
			return 0, "", fmt.Errorf("read stream %s: %w", name, err)
		}
		return info.Config.Duplicates, "JetStream stream " + name, nil
	case "redis":
		if c := d.redis.Config(); !c.DisableDedupe {
			return c.DedupeWindow, "the Redis publisher's dedupe key", nil
		}
	}
	return 0, "", nil
}

// matchTopic is postbox.Route's rule: an exact topic, a prefix ending in
// "*", or "*".
func matchTopic(pattern, topic string) bool {
	if lit, ok := strings.CutSuffix(pattern, "*"); ok {
		return strings.HasPrefix(topic, lit)
	}
	return pattern == topic
}

// Start connects everything and starts the relays. It fails, having
// released what it opened, when anything is missing: a database that is
// unreachable or not migrated, a broker that cannot be reached.
func Start(ctx context.Context, cfg *Config, log *slog.Logger) (_ *Daemon, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	d := &Daemon{cfg: cfg, log: log, reg: prometheus.NewRegistry()}
	if cfg.Admin.Listen != "off" {
		// Before anything starts: an open listener without tokens is refused.
		if err := postboxadmin.CheckListen(cfg.Admin.Listen, &postboxadmin.Config{Tokens: d.tokens()}); err != nil {
			return nil, fmt.Errorf("admin.listen: %w", err)
		}
	}
	defer func() {
		if err != nil {
			_ = d.Stop(context.WithoutCancel(ctx))
		}
	}()
	if cfg.UsesNATS() {
		if err := d.connectNATS(ctx); err != nil {
			return nil, err
		}
	}
	var routes []postbox.Route
	configured := cfg.Routes
	if len(configured) == 0 {
		configured = []RouteConfig{{Topics: "*", Publisher: "nats"}}
	}
	for _, r := range configured {
		p, err := d.publisher(r.Publisher, log)
		if err != nil {
			return nil, err
		}
		routes = append(routes, postbox.Route{Topics: r.Topics, Publisher: p})
		rt := route{topics: r.Topics, publisher: r.Publisher, maxAge: time.Duration(cfg.Ready.MaxPendingAge), maxPending: cfg.Ready.MaxPending}
		if r.MaxPendingAge != 0 {
			rt.maxAge = time.Duration(r.MaxPendingAge)
		}
		if r.MaxPending != 0 {
			rt.maxPending = r.MaxPending
		}
		d.routes = append(d.routes, rt)
	}
	m, err := postboxprom.New(d.reg)
	if err != nil {
		return nil, err
	}
	for i, db := range cfg.Databases {
		shardLog := log.With(slog.Int("shard", i))
		sh, err := openShard(ctx, db, cfg, routes, &pauseLog{Metrics: m, log: shardLog}, shardLog)
		if err != nil {
			return nil, fmt.Errorf("databases[%d] (%s): %w", i, Redact(db.URL), err)
		}
		sh.name = fmt.Sprint(i)
		d.shards = append(d.shards, sh)
		wrapped := prometheus.WrapRegistererWith(prometheus.Labels{"shard": sh.name}, d.reg)
		if err := wrapped.Register(postboxprom.NewStatusCollector(sh.admin, 2*time.Second).WithRouted(d.Routed)); err != nil {
			return nil, err
		}
		if err := wrapped.Register(postboxprom.NewConsumerCollector(sh.deadStats, 2*time.Second)); err != nil {
			return nil, err
		}
		if err := wrapped.Register(postboxprom.NewShardUp(sh.up)); err != nil {
			return nil, err
		}
	}
	// Each shard starts on its own, and one that is down is retried while
	// the others relay (/readyz and postbox_shard_up name it meanwhile).
	runCtx, stopStarting := context.WithCancel(context.WithoutCancel(ctx))
	d.stopStarting = stopStarting
	// Start returns once every shard has had its first try, in parallel:
	// the shards that are up then relay, the others are being retried.
	tried := make([]chan struct{}, len(d.shards))
	for i, sh := range d.shards {
		tried[i] = make(chan struct{})
		d.startWG.Add(1)
		go d.keepStarting(runCtx, sh, log.With(slog.Int("shard", i)), tried[i])
	}
	for _, c := range tried {
		<-c
	}
	if cfg.Admin.Listen != "off" {
		if err := d.serve(); err != nil {
			return nil, err
		}
	}
	nurl := "unused"
	if d.nc != nil {
		nurl = Redact(cfg.NATS.URL)
	}
	log.Info("postbox relay daemon running", slog.Int("databases", len(d.shards)), slog.String("nats", nurl), slog.String("admin", d.Addr()))
	return d, nil
}

// connectNATS connects the JetStream publisher, ensuring the configured
// streams first.
func (d *Daemon) connectNATS(ctx context.Context) error {
	cfg := d.cfg
	// Reconnect for ever: while NATS is down, publishes fail as
	// infrastructure failures and the relay pauses; nothing is lost.
	// A short reconnect wait: while disconnected the relay publishes
	// nothing, and nats.go's default (2s) doubles a broker blip's stall.
	// A ping every 2 s, and the connection given up after 3 unanswered:
	// a server cut off by the network (no reset, packets dropped) is left
	// for another of the URL's servers within about 6 s, where nats.go's
	// defaults (2 min, 2) would hold publishing on it for 4 min.
	var err error
	d.nc, err = nats.Connect(cfg.NATS.URL, nats.Name("postbox relay"), nats.MaxReconnects(-1),
		nats.ReconnectWait(250*time.Millisecond), nats.ReconnectJitter(100*time.Millisecond, time.Second), nats.RetryOnFailedConnect(false),
		nats.PingInterval(2*time.Second), nats.MaxPingsOutstanding(3))
	if err != nil {
		return fmt.Errorf("connect to NATS at %s: %w", Redact(cfg.NATS.URL), err)
	}
	js, err := jetstream.New(d.nc)
	if err != nil {
		return err
	}
	d.js = js
	for _, s := range cfg.NATS.Streams {
		if err := ensureStream(ctx, js, s, d.log); err != nil {
			return fmt.Errorf("ensure stream %s: %w", s.Name, err)
		}
	}
	d.pub, err = postboxnats.New(js, &postboxnats.Config{SubjectPrefix: cfg.NATS.SubjectPrefix})
	return err
}

// ensureStream creates the stream s describes, with the server's defaults
// for what s does not set, or, when it exists, changes only what s sets:
// its subjects (replaced by s's), its duplicate window and its replicas
// when s sets them. Every other setting of an existing stream (limits,
// retention, storage, placement) is kept: a stream config sent as a whole
// (postboxnats.EnsureStream) would reset each one it leaves out to the
// server's default, scaling a three-replica stream down to one. An
// existing stream that already has what s sets is left alone; a change is
// logged at Info.
func ensureStream(ctx context.Context, js jetstream.JetStream, s Stream, log *slog.Logger) error {
	st, err := js.Stream(ctx, s.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		_, err = js.CreateStream(ctx, jetstream.StreamConfig{
			Name: s.Name, Subjects: slices.Clone(s.Subjects), Duplicates: time.Duration(s.Duplicates), Replicas: s.Replicas,
		})
		if err == nil {
			log.Info("postbox relay: stream created", slog.String("stream", s.Name))
			return nil
		}
		if !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return err
		}
		// Another daemon created it meanwhile, with other settings:
		// change it as any existing stream.
		st, err = js.Stream(ctx, s.Name)
	}
	if err != nil {
		return err
	}
	cfg := st.CachedInfo().Config
	changes := applyStream(&cfg, s)
	if len(changes) == 0 {
		return nil
	}
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		return err
	}
	log.Info("postbox relay: stream updated", slog.String("stream", s.Name), slog.String("changed", strings.Join(changes, "; ")))
	return nil
}

// applyStream sets in cfg, an existing stream's configuration, what s
// sets, and describes each change ("duplicates 2m0s → 5m0s").
func applyStream(cfg *jetstream.StreamConfig, s Stream) []string {
	var changes []string
	if !sameSubjects(cfg.Subjects, s.Subjects) {
		changes = append(changes, fmt.Sprintf("subjects %v → %v", cfg.Subjects, s.Subjects))
		cfg.Subjects = slices.Clone(s.Subjects)
	}
	if d := time.Duration(s.Duplicates); d != 0 && cfg.Duplicates != d {
		changes = append(changes, fmt.Sprintf("duplicates %s → %s", cfg.Duplicates, d))
		cfg.Duplicates = d
	}
	if s.Replicas != 0 && cfg.Replicas != s.Replicas {
		changes = append(changes, fmt.Sprintf("replicas %d → %d", cfg.Replicas, s.Replicas))
		cfg.Replicas = s.Replicas
	}
	return changes
}

// sameSubjects reports whether a and b hold the same subjects, in any
// order.
func sameSubjects(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// publisher returns the publisher a route names, making it on first use.
// None of them needs its broker up to be made: the first publishes fail
// as infrastructure until it is.
func (d *Daemon) publisher(name string, log *slog.Logger) (postbox.Publisher, error) {
	var err error
	switch name {
	case "amqp":
		if d.amqp == nil {
			if d.amqp, err = postboxamqp.New(postboxamqp.URL(d.cfg.AMQP.URL), &postboxamqp.Config{
				Exchange: d.cfg.AMQP.Exchange, AcceptUnroutable: d.cfg.AMQP.AcceptUnroutable, Logger: log,
			}); err != nil {
				return nil, fmt.Errorf("amqp: %w", err)
			}
		}
		return d.amqp, nil
	case "kafka":
		if d.kafka == nil {
			if d.kcl, err = kgo.NewClient(kgo.SeedBrokers(d.cfg.Kafka.Seeds...), kgo.RequiredAcks(kgo.AllISRAcks())); err != nil {
				return nil, fmt.Errorf("kafka: %w", err)
			}
			if d.kafka, err = postboxkafka.New(d.kcl, &postboxkafka.Config{TopicPrefix: d.cfg.Kafka.TopicPrefix, Logger: log}); err != nil {
				return nil, fmt.Errorf("kafka: %w", err)
			}
		}
		return d.kafka, nil
	case "redis":
		if d.redis == nil {
			opts, err := redis.ParseURL(d.cfg.Redis.URL)
			if err != nil {
				return nil, fmt.Errorf("redis.url: %w", err)
			}
			d.rcl = redis.NewClient(opts)
			if d.redis, err = postboxredis.New(d.rcl, &postboxredis.Config{StreamPrefix: d.cfg.Redis.StreamPrefix}); err != nil {
				return nil, fmt.Errorf("redis: %w", err)
			}
		}
		return d.redis, nil
	}
	if hook, ok := strings.CutPrefix(name, "webhook:"); ok {
		if p := d.hooks[hook]; p != nil {
			return p, nil
		}
		for i := range d.cfg.Webhooks {
			w := &d.cfg.Webhooks[i]
			if w.Name != hook {
				continue
			}
			p, err := postboxwebhook.New(w.config())
			if err != nil {
				return nil, fmt.Errorf("webhooks[%d]: %w", i, err)
			}
			if d.hooks == nil {
				d.hooks = map[string]*postboxwebhook.Publisher{}
			}
			d.hooks[hook] = p
			return p, nil
		}
		return nil, fmt.Errorf("no webhook is named %q", hook)
	}
	return d.pub, nil
}

func openShard(ctx context.Context, db Database, cfg *Config, routes []postbox.Route, m postbox.Metrics, log *slog.Logger) (*shard, error) {
	ccfg := cfg.clientConfig(db)
	ccfg.Routes, ccfg.Metrics, ccfg.Logger = routes, m, log
	if URLKind(db.URL) != KindPostgres {
		drv, sdb, err := OpenSQL(db.URL)
		if err != nil {
			return nil, err
		}
		var c, inbox *postbox.Client[*sql.Tx]
		if c, err = postbox.NewClient(drv, ccfg); err == nil {
			if inbox, err = consumerClient(drv, c, db); err == nil {
				sh := newShard(c, c.Admin(), inbox.Inbox(), func() { _ = sdb.Close() })
				sh.ping = sdb.PingContext
				return sh, nil
			}
		}
		_ = sdb.Close()
		return nil, err
	}
	pcfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		return nil, err
	}
	// A connection for each lane, the coordinator, the idle probe, the
	// maintenance pass and the admin API's reads, unless the URL says
	// otherwise (pool_max_conns): with pgxpool's default of 4, the lanes
	// alone would keep the coordinator waiting for a connection to renew
	// the leases.
	if !strings.Contains(db.URL, "pool_max_conns") {
		pcfg.MaxConns = max(pcfg.MaxConns, int32(ccfg.Lanes)+4)
	}
	// The pool connects on first use: a database that is down is the
	// shard's start loop's to retry (keepStarting), not an error here.
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, err
	}
	var drv postboxdriver.Driver[pgx.Tx] = postboxpgx.New(pool)
	if db.Storage == StorageLog {
		drv = postboxpgx.New(pool, postboxpgx.WithLog())
	}
	c, err := postbox.NewClient(drv, ccfg)
	if err == nil {
		var inbox *postbox.Client[pgx.Tx]
		if inbox, err = consumerClient(drv, c, db); err == nil {
			sh := newShard(c, c.Admin(), inbox.Inbox(), pool.Close)
			sh.ping = pool.Ping
			return sh, nil
		}
	}
	pool.Close()
	return nil, err
}

// up is postbox_shard_up's reading: the relay runs and reaches its
// database (shard.state), and the database answers within a second.
func (sh *shard) up() bool {
	if !sh.state().Up {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return sh.ping(ctx) == nil
}

// newShard is a shard over a relay's Client and the Inbox of its
// consumers' tables.
func newShard[TTx any](c *postbox.Client[TTx], admin *postbox.Admin, in *postbox.Inbox[TTx], closeFn func()) *shard {
	sh := &shard{client: c, admin: admin, consumers: in, deadStats: in, close: closeFn}
	if c.Config().DeadRetention >= 0 {
		sh.retention = in
	}
	return sh
}

// consumerClient returns the Client whose Inbox serves the consumers' dead
// messages of db (the tables of its consumer prefix, by default its
// prefix) and prunes them past relay.consumer_dead_retention. It never
// starts a relay, and never prunes the inbox records themselves: how long
// those must be kept is the consumers' to say (their InboxRetention and
// the replay horizon their messages carry).
func consumerClient[TTx any](drv postboxdriver.Driver[TTx], relay *postbox.Client[TTx], db Database) (*postbox.Client[TTx], error) {
	cfg := relay.Config()
	if db.ConsumerPrefix != "" {
		cfg.Prefix = db.ConsumerPrefix
	}
	cfg.Routes, cfg.Publisher, cfg.InboxRetention = nil, nil, -1
	return postbox.NewClient(drv, &cfg)
}

// serve starts the admin listener: the admin API and dashboard of
// postboxadmin for the first database at /, and for the others under
// /shards/N/, with health, readiness and metrics. Start has already
// checked the address against the tokens (postboxadmin.CheckListen).
func (d *Daemon) serve() error {
	tokens := d.tokens()
	metrics := promhttp.HandlerFor(d.reg, promhttp.HandlerOpts{})
	mux := http.NewServeMux()
	// One sign-in serves the dashboards of every database.
	sessions := postboxadmin.NewSessions(0)
	for i, sh := range d.shards {
		var shards []postboxadmin.DashboardLink
		if len(d.shards) > 1 {
			for j := range d.shards {
				shards = append(shards, postboxadmin.DashboardLink{Name: fmt.Sprintf("database %d", j), Path: fmt.Sprintf("/shards/%d/", j), Current: i == j})
			}
		}
		srv, err := postboxadmin.New(&postboxadmin.Config{Admin: sh.admin, ConsumerDead: sh.consumers, Routed: d.Routed, DedupeWindow: d.DedupeWindow,
			Shards: d.Shards, Tokens: tokens, Ready: d.Ready, Metrics: metrics, Logger: d.log, Sessions: sessions, Dashboards: shards})
		if err != nil {
			return err
		}
		if i == 0 {
			mux.Handle("/", srv.Handler())
		}
		prefix := fmt.Sprintf("/shards/%d", i)
		mux.Handle(prefix+"/", http.StripPrefix(prefix, srv.Handler()))
	}
	ln, err := net.Listen("tcp", d.cfg.Admin.Listen)
	if err != nil {
		return fmt.Errorf("admin.listen %s: %w", d.cfg.Admin.Listen, err)
	}
	d.ln = ln
	d.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, WriteTimeout: 2 * time.Minute, IdleTimeout: 2 * time.Minute}
	d.serveWG.Add(1)
	go func() {
		defer d.serveWG.Done()
		if err := d.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			d.log.Error("postbox relay: admin listener failed", slog.Any("error", err))
		}
	}()
	return nil
}

func (d *Daemon) tokens() []postboxadmin.Token {
	var out []postboxadmin.Token
	for _, t := range d.cfg.Admin.Tokens {
		out = append(out, postboxadmin.Token{Name: t.Name, Value: t.Value, Scope: postboxadmin.Scope(t.Scope)})
	}
	return out
}

// Addr is the admin listener's address, or "off".
func (d *Daemon) Addr() string {
	if d.ln == nil {
		return "off"
	}
	return d.ln.Addr().String()
}

// Ready reports whether the daemon can do its work: every broker a route
// uses answering (NATS connected; RabbitMQ, Kafka and Redis answering a
// connection or a ping; each webhook's host accepting a connection),
// every database answering, and every routed topic within its route's
// limits (oldest pending age, pending count). Rows of topics no route
// takes wait for another relay and do not count. Every failing check is
// in the error.
func (d *Daemon) Ready(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var problems []string
	for _, err := range d.checkBrokers(ctx) {
		problems = append(problems, err.Error())
	}
	for _, sh := range d.shards {
		if st := sh.state(); !st.Up {
			problems = append(problems, fmt.Sprintf("shard %s: down (%s); retried with backoff while the other shards relay", sh.name, st.Error))
			continue
		}
		st, err := sh.admin.Status(ctx)
		if err != nil {
			problems = append(problems, fmt.Sprintf("shard %s: the database did not answer: %v", sh.name, err))
			continue
		}
		for _, t := range st.Topics {
			r := d.routeFor(t.Topic)
			switch {
			case r == nil:
			case r.maxAge >= 0 && t.OldestPendingAge > r.maxAge:
				problems = append(problems, fmt.Sprintf("shard %s: topic %s: oldest pending message is %s old (limit %s, route %s)",
					sh.name, t.Topic, t.OldestPendingAge.Round(time.Second), r.maxAge, r.topics))
			case r.maxPending > 0 && t.Pending > r.maxPending:
				problems = append(problems, fmt.Sprintf("shard %s: topic %s: %d messages pending (limit %d, route %s)",
					sh.name, t.Topic, t.Pending, r.maxPending, r.topics))
			}
		}
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	return nil
}

// checkBrokers checks every broker a route uses, each within ctx.
func (d *Daemon) checkBrokers(ctx context.Context) []error {
	var errs []error
	if d.nc != nil && !d.nc.IsConnected() {
		errs = append(errs, fmt.Errorf("NATS is not connected (%s)", d.nc.Status()))
	}
	if d.amqp != nil {
		conn, err := amqp091.DialConfig(d.cfg.AMQP.URL, amqp091.Config{Dial: dialer(ctx), Properties: amqp091.Table{"connection_name": "postbox relay readiness"}})
		if err != nil {
			errs = append(errs, fmt.Errorf("RabbitMQ at %s is not answering: %w", Redact(d.cfg.AMQP.URL), err))
		} else {
			_ = conn.Close()
		}
	}
	if d.kcl != nil {
		if err := d.kcl.Ping(ctx); err != nil {
			errs = append(errs, fmt.Errorf("kafka is not answering: %w", err))
		}
	}
	if d.rcl != nil {
		if err := d.rcl.Ping(ctx).Err(); err != nil {
			errs = append(errs, fmt.Errorf("redis at %s is not answering: %w", Redact(d.cfg.Redis.URL), err))
		}
	}
	for _, w := range d.cfg.Webhooks {
		if d.hooks[w.Name] == nil {
			continue
		}
		if err := dialURL(ctx, w.URL); err != nil {
			errs = append(errs, fmt.Errorf("webhook %s: %w", w.Name, err))
		}
	}
	return errs
}

// dialer is a dial bounded by ctx, for amqp091.
func dialer(ctx context.Context) func(network, addr string) (net.Conn, error) {
	return func(network, addr string) (net.Conn, error) {
		var nd net.Dialer
		return nd.DialContext(ctx, network, addr)
	}
}

// dialURL opens and closes a TCP connection to an http(s) URL's host.
func dialURL(ctx context.Context, raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return err
	}
	host := u.Host
	if u.Port() == "" {
		port := "80"
		if u.Scheme == "https" {
			port = "443"
		}
		host = net.JoinHostPort(u.Hostname(), port)
	}
	var nd net.Dialer
	conn, err := nd.DialContext(ctx, "tcp", host)
	if err != nil {
		return fmt.Errorf("%s does not accept connections: %w", host, err)
	}
	return conn.Close()
}

// pauseLog logs when a relay pauses on an infrastructure failure and when
// publishing resumes after it, with how long the pause lasted, and passes
// every report on.
type pauseLog struct {
	postbox.Metrics
	log *slog.Logger

	mu     sync.Mutex
	paused map[string]pause // by relay
}

type pause struct {
	since time.Time
	err   string
}

// RelayBatch implements postbox.Metrics.
func (p *pauseLog) RelayBatch(r *postbox.BatchReport) {
	p.Metrics.RelayBatch(r)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.paused == nil {
		p.paused = map[string]pause{}
	}
	was, paused := p.paused[r.Relay]
	switch {
	case r.Infrastructure != nil && !paused:
		p.paused[r.Relay] = pause{since: time.Now(), err: r.Infrastructure.Error()}
		p.log.Warn("postbox relay: publishing paused by an infrastructure failure; nothing is lost, it resumes when the broker answers",
			slog.String("relay", r.Relay), slog.Any("error", r.Infrastructure))
	case r.Infrastructure == nil && paused && len(r.Published) > 0:
		delete(p.paused, r.Relay)
		n := 0
		for _, c := range r.Published {
			n += c
		}
		p.log.Info("postbox relay: publishing resumed", slog.String("relay", r.Relay),
			slog.Duration("paused_for", time.Since(was.since).Round(time.Millisecond)), slog.String("cause", was.err), slog.Int("published", n))
	}
}

// PruneConsumers runs one pass of the consumers' retention on every shard,
// as the daemon does every minute (the library's PruneInterval): it deletes the consumers'
// dead messages older than relay.consumer_dead_retention, none when that
// is negative, and returns how many it deleted.
func (d *Daemon) PruneConsumers(ctx context.Context) (int, error) {
	n := 0
	for _, sh := range d.shards {
		if sh.retention == nil {
			continue
		}
		res, err := sh.retention.Prune(ctx)
		n += res.Dead
		if err != nil {
			return n, fmt.Errorf("shard %s: %w", sh.name, err)
		}
	}
	return n, nil
}

// Stop stops the relays (each finishes or abandons its batch within ctx),
// then the listener, the publisher and the connections.
func (d *Daemon) Stop(ctx context.Context) error {
	if d.stopStarting != nil {
		d.stopStarting()
		d.startWG.Wait()
	}
	var errs []error
	for _, sh := range d.shards {
		if err := sh.client.Stop(ctx); err != nil && !errors.Is(err, postbox.ErrNotStarted) {
			errs = append(errs, fmt.Errorf("stop shard %s: %w", sh.name, err))
		}
		if sh.retention != nil {
			if err := sh.retention.Stop(ctx); err != nil && !errors.Is(err, postbox.ErrNotStarted) {
				errs = append(errs, fmt.Errorf("stop the consumers' retention on shard %s: %w", sh.name, err))
			}
		}
	}
	d.close(ctx)
	return errors.Join(errs...)
}

func (d *Daemon) close(ctx context.Context) {
	if d.srv != nil {
		_ = d.srv.Shutdown(ctx)
		d.serveWG.Wait()
	}
	if d.pub != nil {
		_ = d.pub.Close(ctx)
	}
	if d.amqp != nil {
		_ = d.amqp.Close(ctx)
	}
	if d.kafka != nil {
		_ = d.kafka.Close(ctx)
	}
	if d.kcl != nil {
		d.kcl.Close()
	}
	if d.redis != nil {
		_ = d.redis.Close(ctx)
	}
	for _, h := range d.hooks {
		_ = h.Close(ctx)
	}
	if d.rcl != nil {
		_ = d.rcl.Close()
	}
	for _, sh := range d.shards {
		sh.close()
	}
	if d.nc != nil {
		d.nc.Close()
	}
}
