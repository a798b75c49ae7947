package relayd_test

import (
	"context"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/testdb"
	"github.com/postbox-go/postbox/postboxmigrate"
	"github.com/postbox-go/postbox/postboxpgx"
)

// A shard's database fails while the daemon runs: a daemon serves two
// PostgreSQL databases, the second through a proxy the test controls;
// once both have published, the daemon's link to the second is cut (its
// connections reset and new ones refused, as a server that went down) or
// stalled (the bytes held, nothing reset), until its leases ran out
// unrenewed. Meanwhile the first shard publishes what is written to it;
// readiness (/readyz) and postbox_shard_up name the second shard, whose
// relay keeps running, so Daemon.Shards and the status's shard list still
// report it up (Up says the relay runs, and a running relay retries its
// own failures); and once the link is back the second shard publishes
// every message written to it during and after the outage, each once.
func TestShardDatabaseFailsWhileRunning(t *testing.T) {
	for _, mode := range []string{"cut", "stall"} {
		t.Run(mode, func(t *testing.T) { shardFailsWhileRunning(t, mode) })
	}
}

func shardFailsWhileRunning(t *testing.T, mode string) {
	ctx := context.Background()
	poolA, prefixA := testdb.Migrated(t)
	_, natsURL := embeddedNATS(t)

	// The second shard: a database of its own, which the daemon reaches
	// through the proxy and the test directly.
	name := "postbox_later_" + strings.ReplaceAll(postbox.NewID(), "-", "")[20:]
	admin := testdb.Pool(t)
	if _, err := admin.Exec(ctx, `CREATE DATABASE `+name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := admin.Exec(context.Background(), `DROP DATABASE IF EXISTS `+name+` WITH (FORCE)`); err != nil {
			t.Error(err)
		}
	})
	u, err := url.Parse(testdb.PostgresURL())
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	poolB := testdb.PoolAt(t, u.String())
	const prefixB = "shard_b_"
	m, err := postboxmigrate.New(postboxpgx.New(poolB), &postboxmigrate.Config{Prefix: prefixB})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	proxied, proxy := testdb.Proxied(t, u.String()) // closed after the daemon's Stop, registered later

	d := startDaemon(t, `
databases:
  - {url: "`+testdb.PostgresURL()+`", prefix: `+prefixA+`}
  - {url: "`+proxied+`", prefix: `+prefixB+`}
nats:
  subject_prefix: "later."
  streams: [{name: LATER, subjects: ["later.>"]}]
relay: {lease: 3s, poll_interval: 20ms, backoff_base: 100ms, backoff_max: 1s}
admin: {listen: "127.0.0.1:0"}
`, map[string]string{"POSTBOX_NATS_URL": natsURL})
	// Whatever happens, the link is back before the daemon stops.
	restore := func() {}
	t.Cleanup(func() { restore() })

	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(ctx, "LATER")
	if err != nil {
		t.Fatal(err)
	}
	waitFor := shardsWait(t, d, 90*time.Second, mode+": ")
	// held is how many messages the stream holds of each shard's topic.
	held := func() (a, b uint64) {
		info, err := stream.Info(ctx, jetstream.WithSubjectFilter("later.>"))
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Subjects["later.a.created"], info.State.Subjects["later.b.created"]
	}
	// insert writes n rows with plain SQL, as a service in another
	// language does, straight to the database, and returns their ids.
	insert := func(pool *pgxpool.Pool, prefix, topic string, n int) []string {
		t.Helper()
		rows, err := pool.Query(ctx, `INSERT INTO `+prefix+`outbox (id, topic, payload)
SELECT gen_random_uuid(), $2, '\x7b7d' FROM generate_series(1, $1) RETURNING id::text`, n, topic)
		if err != nil {
			t.Fatal(err)
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return ids
	}
	get := func(path string) (int, string) { return getPath(t, d, path) }
	shardUp := func(metrics, shard, v string) bool {
		return strings.Contains(metrics, `postbox_shard_up{shard="`+shard+`"} `+v)
	}

	// Both shards publish.
	insert(poolA, prefixA, "a.created", 10)
	idsB := insert(poolB, prefixB, "b.created", 10)
	waitFor("both shards publish", func() bool { a, b := held(); return a == 10 && b == 10 })
	waitFor("ready with both shards up", func() bool { return d.Ready(ctx) == nil })

	// The second shard's database fails while the daemon runs.
	switch mode {
	case "cut":
		proxy.Refuse(true)
		proxy.Reset()
		restore = func() { proxy.Refuse(false) }
	case "stall":
		restore = proxy.Blackhole()
	}
	t.Logf("%s: shard 1's database link failed", mode)
	// Written during the outage: to the second shard, which the daemon
	// cannot read now, and to the first.
	idsB = append(idsB, insert(poolB, prefixB, "b.created", 10)...)
	insert(poolA, prefixA, "a.created", 10)

	// (a) The first shard publishes what was written after the failure.
	waitFor("shard 0 publishes while shard 1's database is unreachable", func() bool { a, _ := held(); return a == 20 })

	// (b) Readiness names the failed shard, and only it; postbox_shard_up
	// reads 0 for it.
	// The relay of shard 1 runs, retrying its own failures, and says
	// so: the shard is down, with the relay's failure, in Shards and the
	// status's list.
	const down = "shard 1: down (the relay runs and retries: "
	waitFor("readiness names shard 1", func() bool {
		err := d.Ready(ctx)
		return err != nil && strings.Contains(err.Error(), down) && !strings.Contains(err.Error(), "shard 0")
	})
	waitFor("/readyz answers 503 naming shard 1", func() bool {
		code, body := get("/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, down)
	})
	waitFor("postbox_shard_up 0 for shard 1, 1 for shard 0", func() bool {
		_, body := get("/metrics")
		return shardUp(body, "0", "1") && shardUp(body, "1", "0")
	})
	if st := d.Shards(); !st[0].Up || st[1].Up || !strings.Contains(st[1].Error, "the relay runs and retries: ") {
		t.Fatalf("%s: Shards with shard 1's database unreachable: %+v", mode, st)
	}
	var status shardsStatus
	if code := post(t, d, "GET", "/shards/0/v1/status", "", &status); code != 200 || len(status.Shards) != 2 ||
		!status.Shards[0].Up || status.Shards[1].Up || !strings.Contains(status.Shards[1].Error, "the relay runs and retries: ") {
		t.Fatalf("%s: status: %d %+v", mode, code, status)
	}
	// The outage outlasts the lease: shard 1's relay could renew none of
	// its leases, and takes its partitions anew once the link is back.
	waitFor("shard 1's leases ran out", func() bool {
		var n int
		if err := poolB.QueryRow(ctx, `SELECT count(*) FROM `+prefixB+`leases WHERE expires_at > now()`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 0
	})
	// Nothing written to shard 1 since the failure was published: the
	// daemon could not read it.
	if _, b := held(); b != 10 {
		t.Fatalf("%s: shard 1 published %d messages while unreachable, want the 10 of before", mode, b)
	}

	// (c) The database is back: shard 1 publishes what was written to it
	// during and after the outage, nothing lost, each once.
	restore()
	restore = func() {}
	t.Logf("%s: shard 1's database link back", mode)
	idsB = append(idsB, insert(poolB, prefixB, "b.created", 10)...)
	insert(poolA, prefixA, "a.created", 10)
	waitFor("both shards publish everything once shard 1's database is back", func() bool { a, b := held(); return a == 30 && b == 30 })
	waitFor("shard 1's outbox drained", func() bool {
		var n int
		if err := poolB.QueryRow(ctx, `SELECT count(*) FROM `+prefixB+`outbox`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 0
	})
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var gotB []string
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		msg, err := stream.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		if msg.Subject == "later.b.created" {
			gotB = append(gotB, msg.Header.Get(jetstream.MsgIDHeader))
		}
	}
	slices.Sort(gotB)
	slices.Sort(idsB)
	if !slices.Equal(gotB, idsB) {
		t.Fatalf("%s: shard 1's messages in the stream\n got %v\nwant %v", mode, gotB, idsB)
	}
	waitFor("ready again", func() bool { return d.Ready(ctx) == nil })
	waitFor("postbox_shard_up 1 for shard 1", func() bool { _, body := get("/metrics"); return shardUp(body, "1", "1") })
	if err := d.Stop(ctx); err != nil {
		t.Fatal(err)
	}
}
