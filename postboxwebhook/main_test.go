package postboxwebhook_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/pubtest"
	"github.com/postbox-go/postbox/postboxwebhook"
)

// No ignores: every test server is closed by its cleanup, and every
// Publisher's Close ends its requests and its client's idle connections.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var quiet = slog.New(slog.DiscardHandler)

// newSecret returns a fresh random secret.
func newSecret(t testing.TB) string {
	t.Helper()
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return postboxwebhook.SecretPrefix + base64.StdEncoding.EncodeToString(b)
}

// server starts a loopback test server, closed when t ends.
func server(t testing.TB, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// refusedURL returns a loopback URL where nothing listens.
func refusedURL(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return "http://" + addr + "/hook"
}

// publisher makes a Publisher, closed when t ends.
func publisher(t testing.TB, cfg *postboxwebhook.Config) *postboxwebhook.Publisher {
	t.Helper()
	p, err := postboxwebhook.New(cfg)
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

// one returns a config with one destination for every topic.
func one(url string, secrets ...string) *postboxwebhook.Config {
	ss := make([]postboxwebhook.Secret, len(secrets))
	for i, s := range secrets {
		ss[i] = postboxwebhook.Secret(s)
	}
	return &postboxwebhook.Config{Destinations: []postboxwebhook.Destination{{Topics: "*", URL: url, Secrets: ss}}}
}

// publish publishes env and returns its outcome.
func publish(t testing.TB, p postbox.Publisher, ctx context.Context, env *postbox.Envelope) error {
	t.Helper()
	return pubtest.Publish(t, ctx, p, env, 15*time.Second)
}

func envelope(topic, key, payload string) *postbox.Envelope {
	id := postbox.NewID()
	h := map[string]string{
		postbox.HeaderSpecVersion: "1.0",
		postbox.HeaderID:          id,
		postbox.HeaderType:        topic,
		postbox.HeaderSource:      "postboxwebhook-test",
		postbox.HeaderTime:        time.Now().UTC().Format(time.RFC3339Nano),
	}
	if key != "" {
		h[postbox.HeaderPartitionKey] = key
	}
	return &postbox.Envelope{ID: id, Topic: topic, Key: key, Payload: []byte(payload), Headers: h, CreatedAt: time.Now(), Attempt: 1}
}

func mustPermanent(t testing.TB, err error, target error) {
	t.Helper()
	pubtest.MustPermanent(t, err, target)
}

func mustMessage(t testing.TB, err error, target error) {
	t.Helper()
	pubtest.MustMessage(t, err, target)
}

func mustInfra(t testing.TB, err error) {
	t.Helper()
	pubtest.MustInfra(t, err, nil)
}

// status answers every request with code.
func status(code int) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if code >= 300 && code < 400 {
			w.Header().Set("Location", "https://elsewhere.example/hook?token=s3cret")
		}
		w.WriteHeader(code)
	})
}

// hang reads the whole request body, so that the server watches the
// connection and ends r's context when the client goes away; a handler
// that then waits on r.Context() ends with the request.
func hang(r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
}
