package relayd_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/cmd/postbox/internal/relayd"
	"github.com/postbox-go/postbox/internal/pglog"
	"github.com/postbox-go/postbox/internal/testdb"
	"github.com/postbox-go/postbox/postboxpgx"
)

// A daemon with storage: log publishes what postbox's writers put in the
// log and in the outbox and what another program inserted through the
// outbox (the table contract), each key in its writers' order.
func TestDaemonOverTheLog(t *testing.T) {
	ctx := context.Background()
	pool, prefix := testdb.Migrated(t)
	_, url := embeddedNATS(t)
	d := startDaemon(t, `
nats:
  streams: [{name: LOG, subjects: ["log.>"]}]
relay: {lease: 3s, poll_interval: 20ms}
admin: {listen: "127.0.0.1:0"}
`, map[string]string{"POSTBOX_DATABASE_URL": testdb.PostgresURL(), "POSTBOX_PREFIX": prefix, "POSTBOX_NATS_URL": url, "POSTBOX_STORAGE": "log"})

	if err := pglog.UseLog(ctx, pool, prefix); err != nil {
		t.Fatal(err)
	}
	writer, err := postbox.NewClient(postboxpgx.New(pool, postboxpgx.WithLog()), &postbox.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	plain, err := postbox.NewClient(postboxpgx.New(pool), &postbox.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	// Each key's messages go by turns to the log (postbox's writer made
	// WithLog), to the outbox (one without it) and to the log again (a
	// writer in another language, whose row the rules trigger moves).
	const keys, per = 5, 40
	logged := 0
	for i := range per {
		for k := range keys {
			payload := []byte(strconv.Itoa(i))
			key := fmt.Sprintf("k%d", k)
			switch i % 3 {
			case 0:
				err = writer.Write(ctx, postbox.Message{Topic: "log.written", Key: key, Payload: payload})
				logged++
			case 1:
				err = plain.Write(ctx, postbox.Message{Topic: "log.written", Key: key, Payload: payload})
			default:
				_, err = pool.Exec(ctx, `INSERT INTO `+prefix+`outbox (id, topic, key, payload, headers)
VALUES (gen_random_uuid(), 'log.written', $1, $2, '{}')`, key, payload)
				logged++
			}
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+prefix+`log`).Scan(&n); err != nil || n != logged {
		t.Fatalf("the log holds %d rows (%v), want %d", n, err, logged)
	}

	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	cons, err := js.OrderedConsumer(ctx, "LOG", jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	next := map[string]int{}
	for got := 0; got < keys*per; got++ {
		m, err := cons.Next(jetstream.FetchMaxWait(20 * time.Second))
		if err != nil {
			t.Fatalf("after %d messages: %v", got, err)
		}
		key := m.Headers().Get(postbox.HeaderPartitionKey)
		i, err := strconv.Atoi(string(m.Data()))
		if err != nil {
			t.Fatalf("payload %q", m.Data())
		}
		if key == "" {
			t.Fatalf("message %d carries no key: %v", i, m.Headers())
		}
		if i != next[key] {
			t.Fatalf("key %s: message %d after %d; want each key in its writers' order", key, i, next[key]-1)
		}
		next[key]++
	}
	// Published and recorded: the log's rows passed, the outbox's moved.
	wait := shardsWait(t, d, 20*time.Second, "the log drained")
	wait("every message recorded", func() bool {
		st, err := writer.Stats(ctx)
		return err == nil && st.Pending == 0
	})
}

// storage is table or log, and log only on PostgreSQL.
func TestStorageConfig(t *testing.T) {
	for _, c := range []struct{ url, storage, want string }{
		{"postgres://x/y", "sideways", "want table or log"},
		{"mysql://root@127.0.0.1:3306/test", "log", "the log is PostgreSQL's; a mysql database keeps the table"},
		{"sqlite:/tmp/x.db", "log", "the log is PostgreSQL's; a sqlite database keeps the table"},
	} {
		cfg, err := relayd.Parse([]byte("databases: [{url: \""+c.url+"\", storage: "+c.storage+"}]\n"), env(nil))
		if err != nil {
			t.Fatal(err)
		}
		var ce *postbox.ConfigError
		if err := cfg.Validate(); !errors.As(err, &ce) || len(ce.Problems) != 1 ||
			ce.Problems[0].Field != "databases[0].storage" || !strings.Contains(ce.Problems[0].Reason, c.want) {
			t.Errorf("%s with storage %s: %v, want databases[0].storage: %s", c.url, c.storage, err, c.want)
		}
	}
	cfg, err := relayd.Parse([]byte("databases: [{url: \"postgres://x/y\"}]\n"), env(map[string]string{"POSTBOX_STORAGE": "log"}))
	if err != nil || cfg.Validate() != nil || cfg.Databases[0].Storage != relayd.StorageLog {
		t.Fatalf("POSTBOX_STORAGE=log: %+v, %v", cfg, err)
	}
	if cfg, _ := relayd.Parse([]byte("databases: [{url: \"postgres://x/y\"}]\n"), env(nil)); cfg.Validate() != nil || cfg.Databases[0].Storage != relayd.StorageTable {
		t.Fatalf("the default storage is %q, want table", cfg.Databases[0].Storage)
	}
}
