package natsembed_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/postbox-go/postbox/internal/natsembed"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestRestartKeepsStreams starts a server, stores a message, shuts the
// server down, starts another on the same directory and reads the message
// back: Shutdown must flush and close the store, and Start must find it.
func TestRestartKeepsStreams(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dir := t.TempDir()

	srv, url, err := natsembed.Start(dir)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(url, nats.MaxReconnects(0))
	if err != nil {
		natsembed.Shutdown(srv)
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "KEEP", Subjects: []string{"keep.>"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "keep.one", []byte("hello")); err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{})
	nc.SetClosedHandler(func(*nats.Conn) { close(closed) })
	natsembed.Shutdown(srv)
	select {
	case <-closed:
	case <-ctx.Done():
		t.Fatal("client connection not closed by Shutdown")
	}
	if srv.Running() {
		t.Fatal("server still running after Shutdown")
	}
	natsembed.Shutdown(srv) // a second call does nothing

	srv2, url2, err := natsembed.Start(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer natsembed.Shutdown(srv2)
	nc2, err := nats.Connect(url2)
	if err != nil {
		t.Fatal(err)
	}
	defer nc2.Close()
	js2, err := jetstream.New(nc2)
	if err != nil {
		t.Fatal(err)
	}
	s, err := js2.Stream(ctx, "KEEP")
	if err != nil {
		t.Fatal(err)
	}
	msg, err := s.GetMsg(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if string(msg.Data) != "hello" || msg.Subject != "keep.one" {
		t.Fatalf("got %q on %q, want hello on keep.one", msg.Data, msg.Subject)
	}
}

func TestListensOnLoopbackRandomPort(t *testing.T) {
	a, urlA, err := natsembed.Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer natsembed.Shutdown(a)
	b, urlB, err := natsembed.Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer natsembed.Shutdown(b)
	if urlA == urlB {
		t.Fatalf("two servers share %s", urlA)
	}
	for _, u := range []string{urlA, urlB} {
		if len(u) < 17 || u[:17] != "nats://127.0.0.1:" {
			t.Fatalf("URL %q is not on 127.0.0.1", u)
		}
	}
}

func TestStartNeedsDir(t *testing.T) {
	if _, _, err := natsembed.Start(""); err == nil {
		t.Fatal("Start with no directory succeeded")
	}
	natsembed.Shutdown(nil) // does nothing
}
