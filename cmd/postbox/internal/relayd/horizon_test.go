package relayd_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/testdb"
)

// The daemon stamps every message with its replay horizon: its
// relay.retention in seconds, and "forever" for a retention that keeps
// the history forever, so that consumers never forget those ids (a
// bounded horizon there would let a replay run a handler twice).
func TestDaemonReplayHorizon(t *testing.T) {
	ctx := context.Background()
	_, url := embeddedNATS(t)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	for i, tc := range []struct{ retention, want string }{
		{"-1s", postbox.ReplayHorizonForever},
		{"14d", "1209600"},
	} {
		pool, prefix := testdb.Migrated(t)
		stream := []string{"HFOREVER", "HDAYS"}[i]
		d := startDaemon(t, `
nats:
  subject_prefix: "`+stream+`."
  streams: [{name: `+stream+`, subjects: ["`+stream+`.>"]}]
relay: {lease: 3s, poll_interval: 20ms, retention: "`+tc.retention+`"}
admin: {listen: "off"}
`, map[string]string{"POSTBOX_DATABASE_URL": testdb.PostgresURL(), "POSTBOX_PREFIX": prefix, "POSTBOX_NATS_URL": url})
		if _, err := pool.Exec(ctx, `INSERT INTO `+prefix+`outbox (id, topic, payload) VALUES (gen_random_uuid(), 'orders.created', '\x7b7d')`); err != nil {
			t.Fatal(err)
		}
		s, err := js.Stream(ctx, stream)
		if err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(20 * time.Second)
		var msg *jetstream.RawStreamMsg
		for msg, err = s.GetMsg(ctx, 1); err != nil; msg, err = s.GetMsg(ctx, 1) {
			if time.Now().After(deadline) {
				t.Fatalf("retention %s: nothing published: %v", tc.retention, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
		_ = d.Stop(ctx)
		if got := msg.Header.Get(postbox.HeaderReplayHorizon); got != tc.want {
			t.Fatalf("retention %s: %s = %q, want %q", tc.retention, postbox.HeaderReplayHorizon, got, tc.want)
		}
	}
}
