package relayd_test

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/testdb"
	"github.com/postbox-go/postbox/postboxmigrate"
	"github.com/postbox-go/postbox/postboxpgx"
)

// Shards fail alone: a daemon with two databases, one of which does not
// exist yet at start, relays the other throughout; the missing one is
// reported down (readiness, status, postbox_shard_up) and tried again, and
// relays once it has been created and migrated.
func TestShardsFailAlone(t *testing.T) {
	ctx := context.Background()
	poolA, prefixA := testdb.Migrated(t)
	_, natsURL := embeddedNATS(t)

	// The second shard: a database of its own, created only later.
	name := "postbox_shard_" + strings.ReplaceAll(postbox.NewID(), "-", "")[20:]
	u, err := url.Parse(testdb.PostgresURL())
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	urlB := u.String()
	admin := testdb.Pool(t)
	t.Cleanup(func() {
		if _, err := admin.Exec(context.Background(), `DROP DATABASE IF EXISTS `+name+` WITH (FORCE)`); err != nil {
			t.Error(err)
		}
	})

	d := startDaemon(t, `
databases:
  - {url: "`+testdb.PostgresURL()+`", prefix: `+prefixA+`}
  - {url: "`+urlB+`", prefix: shard_b_}
nats:
  subject_prefix: "shards."
  streams: [{name: SHARDS, subjects: ["shards.>"]}]
relay: {lease: 3s, poll_interval: 20ms}
admin: {listen: "127.0.0.1:0"}
`, map[string]string{"POSTBOX_NATS_URL": natsURL})

	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	waitFor := shardsWait(t, d, time.Minute, "")
	streamHolds := func(n uint64) func() bool {
		return func() bool {
			s, err := js.Stream(ctx, "SHARDS")
			if err != nil {
				t.Fatal(err)
			}
			info, err := s.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			return info.State.Msgs == n
		}
	}
	insert := func(pool *pgxpool.Pool, prefix string, n int) {
		t.Helper()
		if _, err := pool.Exec(ctx, `INSERT INTO `+prefix+`outbox (id, topic, payload)
SELECT gen_random_uuid(), 'orders.created', '\x7b7d' FROM generate_series(1, $1)`, n); err != nil {
			t.Fatal(err)
		}
	}
	metrics := func() string {
		resp, err := http.Get("http://" + d.Addr() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}

	// Shard 0 relays while shard 1 is down.
	insert(poolA, prefixA, 10)
	waitFor("shard 0 publishes while shard 1 is down", streamHolds(10))
	waitFor("shard 1 reported down", func() bool {
		st := d.Shards()
		return st[0].Up && !st[1].Up && strings.Contains(st[1].Error, "does not exist")
	})
	if err := d.Ready(ctx); err == nil || !strings.Contains(err.Error(), "shard 1: down") || strings.Contains(err.Error(), "shard 0") {
		t.Fatalf("readiness with shard 1 down: %v", err)
	}
	if m := metrics(); !strings.Contains(m, `postbox_shard_up{shard="0"} 1`) || !strings.Contains(m, `postbox_shard_up{shard="1"} 0`) {
		t.Fatalf("metrics:\n%s", m)
	}
	// The status of a shard that is up lists every shard.
	var status shardsStatus
	if code := post(t, d, "GET", "/shards/0/v1/status", "", &status); code != 200 || len(status.Shards) != 2 ||
		!status.Shards[0].Up || status.Shards[1].Up || !strings.Contains(status.Shards[1].Error, "does not exist") {
		t.Fatalf("status: %d %+v", code, status)
	}

	// The database comes: created and migrated while the daemon runs.
	if _, err := admin.Exec(ctx, `CREATE DATABASE `+name); err != nil {
		t.Fatal(err)
	}
	poolB, err := pgxpool.New(ctx, urlB)
	if err != nil {
		t.Fatal(err)
	}
	defer poolB.Close()
	m, err := postboxmigrate.New(postboxpgx.New(poolB), &postboxmigrate.Config{Prefix: "shard_b_"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	insert(poolB, "shard_b_", 5)
	insert(poolA, prefixA, 10)
	waitFor("both shards publish once shard 1 is up", streamHolds(25))
	waitFor("shard 1 reported up", func() bool { return d.Shards()[1].Up })
	if m := metrics(); !strings.Contains(m, `postbox_shard_up{shard="1"} 1`) {
		t.Fatalf("metrics:\n%s", m)
	}
	waitFor("ready with both shards up", func() bool { return d.Ready(ctx) == nil })
	if err := d.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	poolB.Close()
}

// shardsStatus is the shard list of GET /shards/N/v1/status.
type shardsStatus struct {
	Shards []struct {
		Shard string `json:"shard"`
		Up    bool   `json:"up"`
		Error string `json:"error"`
	} `json:"shards"`
}

// A shard whose relay runs but loses its database is reported down, with
// the relay's failure and since when, until the database answers again.
func TestShardDownWhileItsRelayRuns(t *testing.T) {
	_, prefix := testdb.Migrated(t)
	_, natsURL := embeddedNATS(t)
	proxied, proxy := testdb.Proxied(t, testdb.PostgresURL())
	d := startDaemon(t, `
databases:
  - {url: "`+proxied+`", prefix: `+prefix+`}
nats:
  subject_prefix: "down."
  streams: [{name: DOWN, subjects: ["down.>"]}]
relay: {lease: 1s, poll_interval: 20ms}
`, map[string]string{"POSTBOX_NATS_URL": natsURL})
	waitFor := shardsWait(t, d, time.Minute, "")
	waitFor("the shard up", func() bool { return d.Shards()[0].Up })

	cut := time.Now()
	proxy.Refuse(true)
	proxy.Reset()
	waitFor("the shard down while its relay runs", func() bool {
		st := d.Shards()[0]
		return !st.Up && strings.Contains(st.Error, "the relay runs and retries")
	})
	if st := d.Shards()[0]; st.Since.Before(cut) {
		t.Fatalf("down since %v, before the database went away at %v", st.Since, cut)
	}
	if err := d.Ready(context.Background()); err == nil || !strings.Contains(err.Error(), "shard 0: down") {
		t.Fatalf("readiness with the shard's database gone: %v", err)
	}

	proxy.Refuse(false)
	waitFor("the shard up again", func() bool { st := d.Shards()[0]; return st.Up && st.Error == "" })
}
