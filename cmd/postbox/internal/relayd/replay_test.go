package relayd_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/postbox-go/postbox/cmd/postbox/internal/relayd"
	"github.com/postbox-go/postbox/internal/testdb"
)

// A replay through the daemon's API says, before doing anything, how many
// messages JetStream would drop as copies (it reads the stream's
// Duplicates window), refuses a real run while any would be dropped, and
// sends them as new messages on request, which the stream keeps.
func TestReplayKnowsTheDuplicateWindow(t *testing.T) {
	ctx := context.Background()
	pool, prefix := testdb.Migrated(t)
	_, url := embeddedNATS(t)
	d := startDaemon(t, `
nats:
  streams: [{name: RPL, subjects: ["orders.>"], duplicates: 10m}]
routes: [{topics: "orders.*", publisher: nats}]
relay: {lease: 3s, poll_interval: 20ms}
admin: {listen: "127.0.0.1:0"}
`, map[string]string{"POSTBOX_DATABASE_URL": testdb.PostgresURL(), "POSTBOX_PREFIX": prefix, "POSTBOX_NATS_URL": url})
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	stream, err := js.Stream(ctx, "RPL")
	if err != nil {
		t.Fatal(err)
	}
	msgs := func() uint64 {
		info, err := stream.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Msgs
	}
	pending := func() float64 {
		var st map[string]any
		post(t, d, "GET", "/v1/status", "", &st)
		return st["pending"].(float64)
	}
	settle := func(want uint64) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for pending() != 0 || msgs() != want {
			if time.Now().After(deadline) {
				t.Fatalf("stream holds %d messages with %v pending, want %d and none", msgs(), pending(), want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if _, err := pool.Exec(ctx, `INSERT INTO `+prefix+`outbox (id, topic, key, payload) VALUES
 (gen_random_uuid(), 'orders.paid', 'o1', '\x01'), (gen_random_uuid(), 'orders.paid', 'o2', '\x02')`); err != nil {
		t.Fatal(err)
	}
	settle(2)

	var dry map[string]any
	if code := post(t, d, "POST", "/v1/replay", `{"since": "1h", "dry_run": true}`, &dry); code != 200 || dry["dropped"] != 2.0 || dry["count"] != 2.0 {
		t.Fatalf("dry run: %d %v", code, dry)
	}
	topics := dry["topics"].([]any)
	if tp := topics[0].(map[string]any); tp["dedupe_by"] != "JetStream stream RPL" || tp["dedupe_window_seconds"] != 600.0 || tp["dropped"] != 2.0 {
		t.Fatalf("dry run topics: %v", topics)
	}
	if notes := dry["notes"].([]any); len(notes) != 1 || !strings.Contains(notes[0].(string), "the broker drops them as copies") {
		t.Fatalf("dry run notes: %v", notes)
	}
	var refused map[string]any
	if code := post(t, d, "POST", "/v1/replay", `{"since": "1h"}`, &refused); code != http.StatusConflict || refused["field"] != "as_new" ||
		!strings.Contains(refused["error"].(string), "2 of the 2") {
		t.Fatalf("a replay the broker would drop: %d %v", code, refused)
	}
	if p := pending(); p != 0 {
		t.Fatalf("a refused replay staged %v", p)
	}
	// As new messages: fresh ids, which the stream keeps.
	var asNew map[string]any
	if code := post(t, d, "POST", "/v1/replay", `{"since": "1h", "as_new": true}`, &asNew); code != 200 || asNew["count"] != 2.0 || asNew["as_new"] != true {
		t.Fatalf("as new: %d %v", code, asNew)
	}
	settle(4)
	last, err := stream.GetLastMsgForSubject(ctx, "orders.paid")
	if err != nil || last.Header.Get("postbox-replay-of") == "" || last.Header.Get("Nats-Msg-Id") == last.Header.Get("postbox-replay-of") {
		t.Fatalf("the last copy's headers: %v %v", last, err)
	}
	// Under their own ids, accepted: the relay publishes them and the
	// broker drops them, as the dry run said.
	var accepted map[string]any
	if code := post(t, d, "POST", "/v1/replay", `{"since": "1h", "accept_dropped": true, "topic": "orders.paid"}`, &accepted); code != 200 || accepted["dropped"] != 4.0 {
		t.Fatalf("accepted: %d %v", code, accepted)
	}
	settle(4)
}

// post sends a request to the daemon's API (no tokens: loopback) and
// decodes the answer into out.
func post(t *testing.T, d *relayd.Daemon, method, path, body string, out any) int {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), method, "http://"+d.Addr()+path, bytes.NewBufferString(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return resp.StatusCode
}
