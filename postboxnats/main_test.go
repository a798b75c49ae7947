package postboxnats_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/natsembed"
	"github.com/postbox-go/postbox/internal/pubtest"
	"github.com/postbox-go/postbox/postboxnats"
)

// RealNATSURL is the machine's NATS server; POSTBOX_TEST_NATS_URL
// overrides it.
func realNATSURL() string {
	if u := os.Getenv("POSTBOX_TEST_NATS_URL"); u != "" {
		return u
	}
	return "nats://127.0.0.1:4222"
}

// The embedded server shared by the tests that do not stop it; tests that
// shut a server down start their own.
var shared struct {
	once sync.Once
	dir  string
	srv  *server.Server
	url  string
	err  error
}

func sharedEmbedded(t testing.TB) string {
	t.Helper()
	shared.once.Do(func() {
		shared.dir, shared.err = os.MkdirTemp("", "postboxnats-test-")
		if shared.err != nil {
			return
		}
		shared.srv, shared.url, shared.err = natsembed.Start(shared.dir)
		if shared.err == nil {
			// The server's warnings and errors say why a request failed
			// (a stream whose store could not be made), which its API
			// answers only in general terms.
			shared.srv.SetLogger(stderrLogger{}, false, false)
			shared.err = anchorStream(shared.url)
		}
	})
	if shared.err != nil {
		t.Fatalf("embedded NATS: %v", shared.err)
	}
	return shared.url
}

// anchorStream gives the shared server's account a stream that no test
// deletes. nats-server removes an account's store directory, in a
// goroutine of its own, when a deleted stream was the account's last one;
// a stream another test creates meanwhile then fails with "error creating
// store for stream" (mkdir of the account's streams directory: no such
// file or directory). The tests create and delete streams in parallel, so
// the account must never be left without one.
func anchorStream(url string) error {
	nc, err := nats.Connect(url)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "ANCHOR", Subjects: []string{"postbox-test-anchor.>"}, Storage: jetstream.FileStorage})
	return err
}

// stderrLogger writes the embedded server's warnings and errors to the
// test's output.
type stderrLogger struct{}

func (stderrLogger) Noticef(string, ...any) {}
func (stderrLogger) Warnf(format string, v ...any) {
	fmt.Fprintf(os.Stderr, "embedded nats-server: warning: "+format+"\n", v...)
}
func (stderrLogger) Fatalf(format string, v ...any) {
	fmt.Fprintf(os.Stderr, "embedded nats-server: fatal: "+format+"\n", v...)
}
func (stderrLogger) Errorf(format string, v ...any) {
	fmt.Fprintf(os.Stderr, "embedded nats-server: error: "+format+"\n", v...)
}
func (stderrLogger) Debugf(string, ...any) {}
func (stderrLogger) Tracef(string, ...any) {}

func TestMain(m *testing.M) {
	code := m.Run()
	natsembed.Shutdown(shared.srv)
	if shared.dir != "" {
		_ = os.RemoveAll(shared.dir)
	}
	if code == 0 {
		// No ignores: the client's goroutines end with nc.Close, the
		// embedded server's with Shutdown, the Publisher's with Close.
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// target is a NATS server the tests run against.
type target struct {
	name string
	url  func(t testing.TB) string
}

var targets = []target{
	{"embedded", sharedEmbedded},
	{"real", func(t testing.TB) string {
		t.Helper()
		u := realNATSURL()
		if err := reachable(u); err != nil {
			t.Skipf("the machine's NATS server at %s is unreachable (%v); set POSTBOX_TEST_NATS_URL to run against another", u, err)
		}
		return u
	}},
}

func reachable(url string) error {
	nc, err := nats.Connect(url, nats.Timeout(2*time.Second), nats.MaxReconnects(0))
	if err != nil {
		return err
	}
	nc.Close()
	return nil
}

// eachTarget runs fn as a subtest against every target.
func eachTarget(t *testing.T, fn func(t *testing.T, url string)) {
	for _, tg := range targets {
		t.Run(tg.name, func(t *testing.T) { fn(t, tg.url(t)) })
	}
}

func connect(t testing.TB, url string, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

var nameSeq atomic.Int64

// uniqueName returns a name no other test, process or run uses, valid as
// a stream name and as a subject token.
func uniqueName() string {
	return fmt.Sprintf("PBXT_%d_%d_%d", os.Getpid(), time.Now().UnixNano()%1_000_000_000, nameSeq.Add(1))
}

// stream creates a stream capturing "<name>.>" and deletes it when t
// ends. It returns the stream and the subject base.
func stream(t testing.TB, js jetstream.JetStream, mod func(*jetstream.StreamConfig)) (jetstream.Stream, string) {
	t.Helper()
	name := uniqueName()
	cfg := jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, Storage: jetstream.FileStorage}
	if mod != nil {
		mod(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := postboxnats.EnsureStream(ctx, js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteStream(t, js, name) })
	return s, name
}

func deleteStream(t testing.TB, js jetstream.JetStream, name string) {
	if js.Conn().Status() != nats.CONNECTED {
		return // a test stopped this server; its storage goes with its directory
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := js.DeleteStream(ctx, name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) && !errors.Is(err, nats.ErrConnectionClosed) {
		t.Logf("delete stream %s: %v", name, err)
	}
}

func publisher(t testing.TB, js jetstream.JetStream, cfg *postboxnats.Config) *postboxnats.Publisher {
	t.Helper()
	p, err := postboxnats.New(js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := p.Close(ctx); err != nil {
			t.Errorf("close publisher: %v", err)
		}
	})
	return p
}

// result is one publish's outcome.
type result = pubtest.Result

// publish publishes env and returns its outcome.
func publish(t testing.TB, p *postboxnats.Publisher, ctx context.Context, env *postbox.Envelope) error {
	t.Helper()
	return pubtest.Publish(t, ctx, p, env, 15*time.Second)
}

func envelope(topic string, payload string) *postbox.Envelope {
	return &postbox.Envelope{
		ID:      postbox.NewID(),
		Topic:   topic,
		Payload: []byte(payload),
		Headers: map[string]string{
			postbox.HeaderSpecVersion: "1.0",
			postbox.HeaderType:        topic,
			postbox.HeaderSource:      "postboxnats-test",
		},
		CreatedAt: time.Now(),
		Attempt:   1,
	}
}

func mustMessage(t testing.TB, err error, target error) {
	t.Helper()
	pubtest.MustMessage(t, err, target)
}

func mustPermanent(t testing.TB, err error, target error) {
	t.Helper()
	pubtest.MustPermanent(t, err, target)
}

func mustInfra(t testing.TB, err error) {
	t.Helper()
	pubtest.MustInfra(t, err, nil)
}
