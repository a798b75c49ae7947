package relayd_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/cmd/postbox/internal/relayd"
	"github.com/postbox-go/postbox/internal/natsembed"
	"github.com/postbox-go/postbox/internal/testdb"
	"github.com/postbox-go/postbox/postboxamqp"
	"github.com/postbox-go/postbox/postboxkafka"
	"github.com/postbox-go/postbox/postboxredis"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func env(vars map[string]string) func(string) string {
	return func(k string) string { return vars[k] }
}

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "relay.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestConfigLayers(t *testing.T) {
	p := writeFile(t, `
databases:
  - url: postgres://file/db
    prefix: file_
nats:
  url: nats://file:4222
relay:
  lease: 45s
  retention: 14d
`)
	cfg, err := relayd.Load(p, env(map[string]string{"POSTBOX_NATS_URL": "nats://env:4222", "POSTBOX_PREFIX": "env_"}))
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if cfg.NATS.URL != "nats://env:4222" || cfg.Databases[0].Prefix != "env_" || cfg.Databases[0].URL != "postgres://file/db" ||
		time.Duration(cfg.Relay.Lease) != 45*time.Second || time.Duration(cfg.Relay.Retention) != 14*24*time.Hour {
		t.Fatalf("config %+v", cfg)
	}
	cfg, err = relayd.Load(p, env(map[string]string{"POSTBOX_DATABASE_URL": "sqlite:/tmp/x.db"}))
	if err != nil || len(cfg.Databases) != 1 || cfg.Databases[0].URL != "sqlite:/tmp/x.db" {
		t.Fatalf("POSTBOX_DATABASE_URL: %+v %v", cfg, err)
	}
}

func TestConfigErrors(t *testing.T) {
	if _, err := relayd.Load(writeFile(t, "relay:\n  leese: 30s\n"), env(nil)); err == nil || !strings.Contains(err.Error(), "leese") {
		t.Fatalf("unknown key: %v", err)
	}
	if _, err := relayd.Load(writeFile(t, "relay:\n  lease: soon\n"), env(nil)); err == nil || !strings.Contains(err.Error(), "soon") {
		t.Fatalf("bad duration: %v", err)
	}
	cfg, err := relayd.Load(writeFile(t, `
databases:
  - url: oracle://x
    prefix: Bad
nats:
  url: http://x
  streams: [{name: "a.b"}]
relay:
  lease: 1s
  batch_deadline: 2s
  batch_size: -5
admin:
  listen: nowhere
  tokens: [{name: t, value: short, scope: root}]
log: {level: loud, format: xml}
`), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	err = cfg.Validate()
	var ce *postbox.ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("err = %v", err)
	}
	var fields []string
	for _, p := range ce.Problems {
		fields = append(fields, p.Field)
	}
	want := "databases[0].url databases[0].prefix nats.url nats.streams[0].name nats.streams[0].subjects relay.batch_size relay.batch_deadline admin.listen admin.tokens[0].value admin.tokens[0].scope log.level log.format"
	if strings.Join(fields, " ") != want {
		t.Fatalf("fields\n got %s\nwant %s", strings.Join(fields, " "), want)
	}
	if cfg, _ := relayd.Load("", env(nil)); cfg.Validate() == nil {
		t.Fatal("a config without databases validated")
	}
}

// The daemon relays rows that another program inserted with plain SQL,
// serves health, readiness and metrics, and stops cleanly.
func TestDaemon(t *testing.T) {
	ctx := context.Background()
	pool, prefix := testdb.Migrated(t)
	srv, url := embeddedNATS(t)

	cfg, err := relayd.Load(writeFile(t, `
nats:
  subject_prefix: "svc."
  streams: [{name: SVC, subjects: ["svc.>"]}]
relay: {lease: 3s, poll_interval: 20ms}
admin: {listen: "127.0.0.1:0"}
`), env(map[string]string{"POSTBOX_DATABASE_URL": testdb.PostgresURL(), "POSTBOX_PREFIX": prefix, "POSTBOX_NATS_URL": url}))
	if err != nil {
		t.Fatal(err)
	}
	d, err := relayd.Start(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = d.Stop(ctx)
		}
	}()
	// The table contract: what a service in another language inserts.
	if _, err := pool.Exec(ctx, `INSERT INTO `+prefix+`outbox (id, topic, key, payload, headers)
SELECT gen_random_uuid(), 'orders.created', 'order-' || (g % 5), convert_to('{"n":' || g || '}', 'UTF8'), '{"content-type":"application/json"}'
FROM generate_series(1, 200) g`); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	deadline := time.Now().Add(20 * time.Second)
	for {
		s, err := js.Stream(ctx, "SVC")
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Msgs == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stream holds %d messages, want 200", info.State.Msgs)
		}
		time.Sleep(20 * time.Millisecond)
	}
	get := func(path string) (int, string) { return getPath(t, d, path) }
	if code, body := get("/healthz"); code != 200 {
		t.Fatalf("healthz %d %s", code, body)
	}
	if code, body := get("/readyz"); code != 200 {
		t.Fatalf("readyz %d %s", code, body)
	}
	// The stream holds every message once the broker acknowledged it; the
	// relay marks them published just after: wait for the marks.
	for deadline := time.Now().Add(20 * time.Second); ; {
		code, body := get("/metrics")
		if code == 200 && strings.Contains(body, `postbox_published_total{topic="orders.created"} 200`) && strings.Contains(body, `postbox_pending{shard="0"} 0`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("metrics %d\n%s", code, body)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The admin API, for the first database at / and under /shards/0/.
	for _, path := range []string{"/v1/status", "/shards/0/v1/status"} {
		if code, body := get(path); code != 200 || !strings.Contains(body, `"published_kept": 200`) {
			t.Fatalf("%s: %d %s", path, code, body)
		}
	}
	// NATS down: not ready.
	natsembed.Shutdown(srv)
	for code, _ := get("/readyz"); code != http.StatusServiceUnavailable; code, _ = get("/readyz") {
		if time.Now().After(deadline) {
			t.Fatal("readyz stayed ready with NATS down")
		}
		time.Sleep(10 * time.Millisecond)
	}
	stopped = true
	stop, cancel := context.WithTimeout(ctx, cfg.StopTimeout())
	defer cancel()
	if err := d.Stop(stop); err != nil {
		t.Fatal(err)
	}
}

func TestAdminRefusesOpenListenWithoutTokens(t *testing.T) {
	ctx := context.Background()
	_, prefix := testdb.Migrated(t)
	_, url := embeddedNATS(t)
	cfg, _ := relayd.Load("", env(map[string]string{"POSTBOX_DATABASE_URL": testdb.PostgresURL(), "POSTBOX_PREFIX": prefix, "POSTBOX_NATS_URL": url, "POSTBOX_ADMIN_LISTEN": ":0"}))
	if _, err := relayd.Start(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil))); err == nil || !strings.Contains(err.Error(), "admin.listen") {
		t.Fatalf("an all-interfaces admin listener without tokens started: %v", err)
	}
}

// A database that is not migrated is a shard that is down: the daemon
// starts, says why it is not ready, and tries the shard again.
func TestUnmigratedDatabaseIsAShardDown(t *testing.T) {
	ctx := context.Background()
	_, url := embeddedNATS(t)
	cfg, _ := relayd.Load("", env(map[string]string{"POSTBOX_DATABASE_URL": testdb.PostgresURL(), "POSTBOX_PREFIX": "never_migrated_", "POSTBOX_NATS_URL": url, "POSTBOX_ADMIN_LISTEN": "off"}))
	d, err := relayd.Start(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = d.Stop(ctx) }()
	deadline := time.Now().Add(30 * time.Second)
	for st := d.Shards()[0]; !strings.Contains(st.Error, "not migrated"); st = d.Shards()[0] {
		if time.Now().After(deadline) {
			t.Fatalf("shard state %+v, want down, not migrated", st)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := d.Ready(ctx); err == nil || !strings.Contains(err.Error(), "shard 0: down") || !strings.Contains(err.Error(), "not migrated") {
		t.Fatalf("ready: %v", err)
	}
}

// Routes send topics to NATS and to RabbitMQ from one daemon.
func TestDaemonRoutes(t *testing.T) {
	testdb.SharedService(t, "rabbitmq")
	ctx := context.Background()
	pool, prefix := testdb.Migrated(t)
	_, url := embeddedNATS(t)
	const amqpURL = "amqp://guest:guest@127.0.0.1:5672/"
	conn, err := postboxamqp.URL(amqpURL)(ctx)
	if err != nil {
		t.Fatalf("RabbitMQ: %v", err)
	}
	defer conn.Close()
	exchange, queue := prefix+"audit", prefix+"audit_q"
	if err := postboxamqp.EnsureTopology(ctx, conn, postboxamqp.Topology{Exchange: exchange, Queue: queue, Bindings: []string{"audit.#"}}); err != nil {
		t.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		_, _ = ch.QueueDelete(queue, false, false, false)
		_ = ch.ExchangeDelete(exchange, false, false)
		_ = ch.Close()
	}()

	cfg, err := relayd.Load(writeFile(t, `
nats:
  streams: [{name: ORD, subjects: ["orders.>"]}]
amqp: {exchange: `+exchange+`}
routes:
  - {topics: "orders.*", publisher: nats}
  - {topics: "audit.*", publisher: amqp}
relay: {lease: 3s, poll_interval: 20ms}
admin: {listen: "off"}
`), env(map[string]string{"POSTBOX_DATABASE_URL": testdb.PostgresURL(), "POSTBOX_PREFIX": prefix, "POSTBOX_NATS_URL": url, "POSTBOX_AMQP_URL": amqpURL}))
	if err != nil {
		t.Fatal(err)
	}
	d, err := relayd.Start(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = d.Stop(ctx) }()
	if _, err := pool.Exec(ctx, `INSERT INTO `+prefix+`outbox (id, topic, payload)
SELECT gen_random_uuid(), CASE WHEN g % 2 = 0 THEN 'orders.created' ELSE 'audit.login' END, '\x00' FROM generate_series(1, 100) g`); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	deadline := time.Now().Add(20 * time.Second)
	for {
		s, err := js.Stream(ctx, "ORD")
		if err != nil {
			t.Fatal(err)
		}
		info, _ := s.Info(ctx)
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Msgs == 50 && q.Messages == 50 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("NATS holds %d, RabbitMQ %d; want 50 each", info.State.Msgs, q.Messages)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestRouteConfigErrors(t *testing.T) {
	cfg, _ := relayd.Load(writeFile(t, `
databases: [{url: "postgres://x/y"}]
routes:
  - {topics: "bad topic", publisher: nats}
  - {topics: "audit.*", publisher: kafka}
  - {topics: "x.*", publisher: amqp}
`), env(nil))
	var ce *postbox.ConfigError
	if err := cfg.Validate(); !errors.As(err, &ce) || len(ce.Problems) != 3 {
		t.Fatalf("err = %v", err)
	}
}

// Routes also reach Kafka (kfake) and Redis Streams.
// Routes that name only Kafka and Redis: the daemon never connects to
// NATS (nothing listens at the NATS URL given) and is ready without it.
func TestDaemonKafkaAndRedisRoutes(t *testing.T) {
	testdb.SharedService(t, "redis")
	ctx := context.Background()
	pool, prefix := testdb.Migrated(t)
	const url = "nats://127.0.0.1:1"
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	admin, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	ktopic := prefix + "orders.created"
	if err := postboxkafka.EnsureTopic(ctx, admin, ktopic, 1, 1, nil); err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	stream := prefix + "audit.login"
	if err := postboxredis.EnsureGroup(ctx, rdb, stream, "g", "0"); err != nil {
		t.Fatal(err)
	}
	defer rdb.Del(ctx, stream)

	cfg, err := relayd.Parse([]byte(`
kafka: {topic_prefix: "`+prefix+`"}
redis: {url: "redis://127.0.0.1:6379/0", stream_prefix: "`+prefix+`"}
routes:
  - {topics: "orders.*", publisher: kafka}
  - {topics: "audit.*", publisher: redis}
relay: {lease: 3s, poll_interval: 20ms}
admin: {listen: "off"}
`), env(map[string]string{"POSTBOX_DATABASE_URL": testdb.PostgresURL(), "POSTBOX_PREFIX": prefix, "POSTBOX_NATS_URL": url,
		"POSTBOX_KAFKA_SEEDS": strings.Join(cluster.ListenAddrs(), ",")}))
	if err != nil {
		t.Fatal(err)
	}
	d, err := relayd.Start(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = d.Stop(ctx) }()
	if err := d.Ready(ctx); err != nil {
		t.Fatalf("ready: %v", err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO `+prefix+`outbox (id, topic, key, payload)
SELECT gen_random_uuid(), CASE WHEN g % 2 = 0 THEN 'orders.created' ELSE 'audit.login' END, 'k' || (g % 3), '\x01' FROM generate_series(1, 40) g`); err != nil {
		t.Fatal(err)
	}
	consumer, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumeTopics(ktopic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	got := 0
	deadline := time.Now().Add(20 * time.Second)
	for got < 20 {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		fetches := consumer.PollFetches(pctx)
		cancel()
		got += fetches.NumRecords()
		if time.Now().After(deadline) {
			t.Fatalf("kafka holds %d records, want 20", got)
		}
	}
	for {
		n, err := rdb.XLen(ctx, stream).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n == 20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis stream holds %d entries, want 20", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// embeddedNATS starts an in-process NATS server with JetStream, stopped
// when t ends (stopping it earlier is fine).
func embeddedNATS(t *testing.T) (*server.Server, string) {
	t.Helper()
	srv, url, err := natsembed.Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { natsembed.Shutdown(srv) })
	return srv, url
}

// getPath GETs path from d's admin listener and returns the status and
// the body.
func getPath(t *testing.T, d *relayd.Daemon, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + d.Addr() + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
