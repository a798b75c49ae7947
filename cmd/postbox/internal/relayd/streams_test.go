package relayd

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"net"
	"net/url"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/postbox-go/postbox"
)

// realJetStream connects to the machine's NATS server (POSTBOX_TEST_NATS_URL
// overrides nats://127.0.0.1:4222), skipping the test when it does not
// answer.
func realJetStream(t *testing.T) jetstream.JetStream {
	t.Helper()
	u := os.Getenv("POSTBOX_TEST_NATS_URL")
	if u == "" {
		u = "nats://127.0.0.1:4222"
	}
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.DialTimeout("tcp", pu.Host, time.Second)
	if err != nil {
		t.Skipf("the machine's NATS server at %s is unreachable (%v); set POSTBOX_TEST_NATS_URL to run against another", u, err)
	}
	_ = conn.Close()
	nc, err := nats.Connect(u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// uniqueStream names a stream and its subject root for this test alone,
// and deletes the stream when the test ends.
func uniqueStream(t *testing.T, js jetstream.JetStream) (name, root string) {
	t.Helper()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	id := strings.ToUpper(hex.EncodeToString(b))
	name, root = "RELAYD_ENSURE_"+id, "relayd_ensure_"+id
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := js.DeleteStream(ctx, name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Errorf("delete stream %s: %v", name, err)
		}
	})
	return name, root
}

func streamConfig(t *testing.T, js jetstream.JetStream, name string) jetstream.StreamConfig {
	t.Helper()
	st, err := js.Stream(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	return st.CachedInfo().Config
}

// sameExcept reports whether an existing stream's configuration after the
// ensure step equals the one before it, but for what want changes; the
// server's own metadata is left out.
func sameExcept(before, after jetstream.StreamConfig, want func(*jetstream.StreamConfig)) bool {
	want(&before)
	before.Metadata, after.Metadata = nil, nil
	return reflect.DeepEqual(before, after)
}

// A stream that exists keeps every setting the daemon's config does not
// name: its limits, and its duplicate window while duplicates is unset.
// Its subjects are replaced by the configured ones. A second start, with
// nothing to change, changes and logs nothing.
func TestEnsureStreamKeepsUnsetSettings(t *testing.T) {
	ctx := context.Background()
	js := realJetStream(t)
	name, root := uniqueStream(t, js)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: name, Subjects: []string{root + ".orders.>"}, MaxAge: time.Hour, MaxMsgs: 1000, Duplicates: 30 * time.Second,
	}); err != nil {
		t.Fatal(err)
	}
	before := streamConfig(t, js, name)

	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	subjects := []string{root + ".orders.>", root + ".audit.>"}
	if err := ensureStream(ctx, js, Stream{Name: name, Subjects: subjects}, log); err != nil {
		t.Fatal(err)
	}
	after := streamConfig(t, js, name)
	if after.MaxAge != time.Hour || after.MaxMsgs != 1000 || after.Duplicates != 30*time.Second {
		t.Fatalf("max age %s, max msgs %d, duplicates %s; want 1h0m0s, 1000, 30s kept", after.MaxAge, after.MaxMsgs, after.Duplicates)
	}
	if !sameExcept(before, after, func(c *jetstream.StreamConfig) { c.Subjects = subjects }) {
		t.Fatalf("the stream changed beyond its subjects:\nbefore %+v\nafter  %+v", before, after)
	}
	if !strings.Contains(logs.String(), "stream updated") || !strings.Contains(logs.String(), "subjects") {
		t.Fatalf("the change is not logged: %q", logs.String())
	}

	logs.Reset()
	if err := ensureStream(ctx, js, Stream{Name: name, Subjects: []string{root + ".audit.>", root + ".orders.>"}}, log); err != nil {
		t.Fatal(err)
	}
	if again := streamConfig(t, js, name); !sameExcept(after, again, func(*jetstream.StreamConfig) {}) {
		t.Fatalf("nothing to change, yet the stream changed:\nbefore %+v\nafter  %+v", after, again)
	}
	if logs.Len() != 0 {
		t.Fatalf("nothing changed, yet logged: %q", logs.String())
	}
}

// A config that sets duplicates changes the window and nothing else.
func TestEnsureStreamChangesOnlyDuplicates(t *testing.T) {
	ctx := context.Background()
	js := realJetStream(t)
	name, root := uniqueStream(t, js)
	subjects := []string{root + ".>"}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: name, Subjects: subjects, MaxAge: time.Hour, MaxMsgs: 1000, Duplicates: 30 * time.Second,
	}); err != nil {
		t.Fatal(err)
	}
	before := streamConfig(t, js, name)
	var logs bytes.Buffer
	if err := ensureStream(ctx, js, Stream{Name: name, Subjects: subjects, Duplicates: Duration(5 * time.Minute)}, slog.New(slog.NewTextHandler(&logs, nil))); err != nil {
		t.Fatal(err)
	}
	after := streamConfig(t, js, name)
	if !sameExcept(before, after, func(c *jetstream.StreamConfig) { c.Duplicates = 5 * time.Minute }) {
		t.Fatalf("want only duplicates changed to 5m:\nbefore %+v\nafter  %+v", before, after)
	}
	if got := logs.String(); !strings.Contains(got, "duplicates 30s → 5m0s") || strings.Contains(got, "subjects") {
		t.Fatalf("log %q, want the duplicates change alone", got)
	}
}

// A stream that does not exist is created with what the config sets and
// the server's defaults for the rest.
func TestEnsureStreamCreates(t *testing.T) {
	ctx := context.Background()
	js := realJetStream(t)
	name, root := uniqueStream(t, js)
	if err := ensureStream(ctx, js, Stream{Name: name, Subjects: []string{root + ".>"}}, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	cfg := streamConfig(t, js, name)
	if !slices.Equal(cfg.Subjects, []string{root + ".>"}) || cfg.Replicas != 1 || cfg.Duplicates != 2*time.Minute || cfg.MaxAge != 0 || cfg.Storage != jetstream.FileStorage {
		t.Fatalf("created %+v", cfg)
	}
}

// notFoundOnce answers its first Stream with ErrStreamNotFound, as when
// another daemon creates the stream between this one's look-up and its
// create.
type notFoundOnce struct {
	jetstream.JetStream
	missed bool
}

func (j *notFoundOnce) Stream(ctx context.Context, name string) (jetstream.Stream, error) {
	if !j.missed {
		j.missed = true
		return nil, jetstream.ErrStreamNotFound
	}
	return j.JetStream.Stream(ctx, name)
}

// Two daemons creating the stream at once: the one whose create finds
// the name taken changes the stream as an existing one, keeping what its
// config does not set (here a memory storage, which a config sent as a
// whole could not even update).
func TestEnsureStreamCreatedMeanwhile(t *testing.T) {
	ctx := context.Background()
	js := realJetStream(t)
	name, root := uniqueStream(t, js)
	subjects := []string{root + ".>"}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: name, Subjects: subjects, Storage: jetstream.MemoryStorage, MaxAge: time.Hour, Duplicates: 30 * time.Second,
	}); err != nil {
		t.Fatal(err)
	}
	before := streamConfig(t, js, name)
	racing := &notFoundOnce{JetStream: js}
	if err := ensureStream(ctx, racing, Stream{Name: name, Subjects: subjects, Duplicates: Duration(time.Minute)}, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	if !racing.missed {
		t.Fatal("the stream was never looked up")
	}
	after := streamConfig(t, js, name)
	if !sameExcept(before, after, func(c *jetstream.StreamConfig) { c.Duplicates = time.Minute }) {
		t.Fatalf("want only duplicates changed to 1m:\nbefore %+v\nafter  %+v", before, after)
	}
}

// Replicas, when set, is the stream's count; unset, the existing count is
// kept. (A single server takes only 1, so this is checked on the
// configuration sent.)
func TestApplyStreamReplicas(t *testing.T) {
	cfg := jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}, Replicas: 3, Duplicates: time.Minute}
	if changes := applyStream(&cfg, Stream{Name: "S", Subjects: []string{"s.>"}}); len(changes) != 0 || cfg.Replicas != 3 {
		t.Fatalf("replicas unset: changes %q, replicas %d; want none, 3", changes, cfg.Replicas)
	}
	changes := applyStream(&cfg, Stream{Name: "S", Subjects: []string{"s.>"}, Replicas: 5})
	if !slices.Equal(changes, []string{"replicas 3 → 5"}) || cfg.Replicas != 5 || cfg.Duplicates != time.Minute {
		t.Fatalf("replicas 5: changes %q, config %+v", changes, cfg)
	}
}

// nats.streams[].replicas is 0 (keep) or 1 to 5.
func TestConfigStreamReplicas(t *testing.T) {
	for _, tc := range []struct {
		replicas string
		ok       bool
	}{{"0", true}, {"1", true}, {"3", true}, {"5", true}, {"7", false}, {"-1", false}} {
		checkStreamField(t, "replicas", tc.replicas, tc.ok)
	}
}

// nats.streams[].duplicates is 0 (keep) or a positive window.
func TestConfigStreamDuplicates(t *testing.T) {
	for _, tc := range []struct {
		duplicates string
		ok         bool
	}{{"0s", true}, {"2m", true}, {"-1m", false}} {
		checkStreamField(t, "duplicates", tc.duplicates, tc.ok)
	}
}

// checkStreamField validates a configuration whose one stream sets field
// to value: it passes when ok, else fails naming the field.
func checkStreamField(t *testing.T, field, value string, ok bool) {
	t.Helper()
	cfg, err := Parse([]byte(`
databases: [{url: "postgres://h/db"}]
nats:
  streams: [{name: S, subjects: ["s.>"], `+field+`: `+value+`}]
`), func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	err = cfg.Validate()
	var ce *postbox.ConfigError
	named := errors.As(err, &ce) && slices.ContainsFunc(ce.Problems, func(p *postbox.ValidationError) bool {
		return p.Field == "nats.streams[0]."+field
	})
	if ok && err != nil {
		t.Fatalf("%s %s: %v", field, value, err)
	}
	if !ok && !named {
		t.Fatalf("%s %s: want a problem naming nats.streams[0].%s, got %v", field, value, field, err)
	}
}
