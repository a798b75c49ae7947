package relayd

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/postboxadmin"
	"github.com/postbox-go/postbox/postboxamqp"
	"github.com/postbox-go/postbox/postboxkafka"
	"github.com/postbox-go/postbox/postboxnats"
	"github.com/postbox-go/postbox/postboxpgx"
	"github.com/postbox-go/postbox/postboxprom"
	"github.com/postbox-go/postbox/postboxredis"
	"github.com/postbox-go/postbox/postboxsqlite"
)

// ReadyMaxPendingAge is the oldest pending age past which /readyz fails:
// the relay is running but not keeping up (or a key is stuck).
const ReadyMaxPendingAge = 5 * time.Minute

// Daemon is a running relay daemon.
type Daemon struct {
	cfg     *Config
	log     *slog.Logger
	nc      *nats.Conn
	pub     *postboxnats.Publisher
	amqp    *postboxamqp.Publisher
	kafka   *postboxkafka.Publisher
	kcl     *kgo.Client
	redis   *postboxredis.Publisher
	rcl     *redis.Client
	shards  []*shard
	reg     *prometheus.Registry
	srv     *http.Server
	ln      net.Listener
	serveWG sync.WaitGroup
}

// shard is one database with its relay.
type shard struct {
	name   string
	client interface {
		Start(context.Context) error
		Stop(context.Context) error
	}
	admin *postbox.Admin
	close func()
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
	if len(cfg.Routes) == 0 {
		routes = []postbox.Route{{Topics: "*", Publisher: d.pub}}
	} else {
		for _, r := range cfg.Routes {
			p, err := d.publisher(r.Publisher, log)
			if err != nil {
				return nil, err
			}
			routes = append(routes, postbox.Route{Topics: r.Topics, Publisher: p})
		}
	}
	metrics, err := postboxprom.New(d.reg)
	if err != nil {
		return nil, err
	}
	for i, db := range cfg.Databases {
		sh, err := openShard(ctx, db, cfg, routes, metrics, log.With(slog.Int("shard", i)))
		if err != nil {
			return nil, fmt.Errorf("databases[%d] (%s): %w", i, Redact(db.URL), err)
		}
		sh.name = fmt.Sprint(i)
		d.shards = append(d.shards, sh)
		wrapped := prometheus.WrapRegistererWith(prometheus.Labels{"shard": sh.name}, d.reg)
		if err := wrapped.Register(postboxprom.NewStatusCollector(sh.admin, 2*time.Second)); err != nil {
			return nil, err
		}
	}
	for _, sh := range d.shards {
		if err := sh.client.Start(ctx); err != nil {
			return nil, fmt.Errorf("start relay on shard %s: %w", sh.name, err)
		}
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
	var err error
	d.nc, err = nats.Connect(cfg.NATS.URL, nats.Name("postbox relay"), nats.MaxReconnects(-1),
		nats.ReconnectWait(250*time.Millisecond), nats.ReconnectJitter(100*time.Millisecond, time.Second), nats.RetryOnFailedConnect(false))
	if err != nil {
		return fmt.Errorf("connect to NATS at %s: %w", Redact(cfg.NATS.URL), err)
	}
	js, err := jetstream.New(d.nc)
	if err != nil {
		return err
	}
	for _, s := range cfg.NATS.Streams {
		if _, err := postboxnats.EnsureStream(ctx, js, jetstream.StreamConfig{Name: s.Name, Subjects: s.Subjects, Duplicates: time.Duration(s.Duplicates)}); err != nil {
			return fmt.Errorf("ensure stream %s: %w", s.Name, err)
		}
	}
	d.pub, err = postboxnats.New(js, &postboxnats.Config{SubjectPrefix: cfg.NATS.SubjectPrefix})
	return err
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
	return d.pub, nil
}

func openShard(ctx context.Context, db Database, cfg *Config, routes []postbox.Route, m postbox.Metrics, log *slog.Logger) (*shard, error) {
	ccfg := cfg.clientConfig(db)
	ccfg.Routes, ccfg.Metrics, ccfg.Logger = routes, m, log
	if strings.HasPrefix(db.URL, "sqlite:") {
		sdb, err := postboxsqlite.Open(strings.TrimPrefix(strings.TrimPrefix(db.URL, "sqlite:"), "//"))
		if err != nil {
			return nil, err
		}
		drv, err := postboxsqlite.New(sdb)
		if err == nil {
			var c *postbox.Client[*sql.Tx]
			if c, err = postbox.NewClient(drv, ccfg); err == nil {
				return &shard{client: c, admin: c.Admin(), close: func() { _ = sdb.Close() }}, nil
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
		pcfg.MaxConns = max(pcfg.MaxConns, int32(ccfg.Lanes)+4) //nolint:gosec // Lanes is at most 64
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, err
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	drv := postboxpgx.New(pool)
	c, err := postbox.NewClient(drv, ccfg)
	if err == nil {
		return &shard{client: c, admin: c.Admin(), close: pool.Close}, nil
	}
	pool.Close()
	return nil, err
}

// serve starts the admin listener: the admin API and dashboard of
// postboxadmin for the first database at /, and for the others under
// /shards/N/, with health, readiness and metrics. Start has already
// checked the address against the tokens (postboxadmin.CheckListen).
func (d *Daemon) serve() error {
	tokens := d.tokens()
	metrics := promhttp.HandlerFor(d.reg, promhttp.HandlerOpts{})
	mux := http.NewServeMux()
	for i, sh := range d.shards {
		srv, err := postboxadmin.New(&postboxadmin.Config{Admin: sh.admin, Tokens: tokens, Ready: d.Ready, Metrics: metrics, Logger: d.log})
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

// Ready reports whether the daemon can do its work: NATS connected, every
// database answering, and no message pending longer than
// ReadyMaxPendingAge.
func (d *Daemon) Ready(ctx context.Context) error {
	if d.nc != nil && !d.nc.IsConnected() {
		return fmt.Errorf("NATS is not connected (%s)", d.nc.Status())
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	for _, sh := range d.shards {
		st, err := sh.admin.Status(ctx)
		if err != nil {
			return fmt.Errorf("shard %s: %w", sh.name, err)
		}
		if st.OldestPendingAge > ReadyMaxPendingAge {
			return fmt.Errorf("shard %s: oldest pending message is %s old (limit %s)", sh.name, st.OldestPendingAge.Round(time.Second), ReadyMaxPendingAge)
		}
	}
	return nil
}

// Stop stops the relays (each finishes or abandons its batch within ctx),
// then the listener, the publisher and the connections.
func (d *Daemon) Stop(ctx context.Context) error {
	var errs []error
	for _, sh := range d.shards {
		if err := sh.client.Stop(ctx); err != nil && !errors.Is(err, postbox.ErrNotStarted) {
			errs = append(errs, fmt.Errorf("stop shard %s: %w", sh.name, err))
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
