package postboxadmin_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/postboxadmin"
)

func TestConfigErrors(t *testing.T) {
	_, err := postboxadmin.New(nil)
	var ce *postbox.ConfigError
	if !errors.As(err, &ce) || len(ce.Problems) != 1 || ce.Problems[0].Field != "Admin" {
		t.Fatalf("New(nil): %v", err)
	}

	secrets := []string{"short-secret", "twin-secret-0123456789", "has a space 0123456789", "ok-secret-0123456789xyz"}
	_, err = postboxadmin.New(&postboxadmin.Config{
		Tokens: []postboxadmin.Token{
			{Name: "a", Value: "", Scope: postboxadmin.ScopeRead},
			{Name: "b", Value: secrets[0], Scope: postboxadmin.ScopeAdmin},
			{Name: "c", Value: secrets[1], Scope: postboxadmin.ScopeRead},
			{Name: "d", Value: secrets[1], Scope: postboxadmin.ScopeAdmin},
			{Name: "e", Value: secrets[2], Scope: postboxadmin.ScopeRead},
			{Name: "f", Value: secrets[3], Scope: "write"},
			{Name: "", Value: secrets[3] + "2", Scope: postboxadmin.ScopeRead},
			{Name: "g\nh", Value: secrets[3] + "3"},
		},
		MaxBodyBytes: -1, ReadyTimeout: -1, ShutdownTimeout: -1,
	})
	if !errors.As(err, &ce) {
		t.Fatalf("bad config: %v", err)
	}
	var got []string
	for _, p := range ce.Problems {
		got = append(got, p.Field)
	}
	want := []string{"Admin", "MaxBodyBytes", "ReadyTimeout", "ShutdownTimeout", "Tokens[0].Value", "Tokens[1].Value",
		"Tokens[3].Value", "Tokens[4].Value", "Tokens[5].Scope", "Tokens[6].Name", "Tokens[7].Name", "Tokens[7].Scope"}
	if !slices.Equal(got, want) {
		t.Fatalf("problems:\n got %v\nwant %v\n%v", got, want, err)
	}
	for _, s := range secrets {
		if strings.Contains(err.Error(), s) {
			t.Fatalf("the error shows a token value: %v", err)
		}
	}
	for _, w := range []string{"is empty", "at least 16", "same as Tokens[2].Value", "visible ASCII", `"read" or "admin"`} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error lacks %q: %v", w, err)
		}
	}
}

func TestCheckListen(t *testing.T) {
	var le *postboxadmin.ListenError
	for _, addr := range []string{":8080", "0.0.0.0:1", "[::]:1", "example.com:1", "10.0.0.1:80", "[fe80::1%eth0]:1", "localhost.evil.example:1"} {
		err := postboxadmin.CheckListen(addr, &postboxadmin.Config{})
		if !errors.As(err, &le) || le.Addr != addr || !strings.Contains(err.Error(), "no token") {
			t.Errorf("CheckListen(%q) without tokens: %v", addr, err)
		}
		if err := postboxadmin.CheckListen(addr, &postboxadmin.Config{Tokens: tokens()}); err != nil {
			t.Errorf("CheckListen(%q) with tokens: %v", addr, err)
		}
	}
	for _, addr := range []string{"127.0.0.1:0", "[::1]:0", "localhost:0", "LOCALHOST:1", "127.1.2.3:80", "[::ffff:127.0.0.1]:1"} {
		if err := postboxadmin.CheckListen(addr, nil); err != nil {
			t.Errorf("CheckListen(%q): %v", addr, err)
		}
	}
	var ve *postbox.ValidationError
	if err := postboxadmin.CheckListen("8080", nil); !errors.As(err, &ve) || ve.Field != "addr" {
		t.Errorf("CheckListen without a port: %v", err)
	}
}

func TestListenAndServe(t *testing.T) {
	f := postgresFixture(t)
	open, err := postboxadmin.New(&postboxadmin.Config{Admin: f.admin, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	var le *postboxadmin.ListenError
	if err := open.ListenAndServe(context.Background(), ":0"); !errors.As(err, &le) {
		t.Fatalf("ListenAndServe(:0) without tokens: %v", err)
	}
	ln, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := open.Serve(context.Background(), ln); !errors.As(err, &le) {
		t.Fatalf("Serve on 0.0.0.0 without tokens: %v", err)
	}

	// Serve on loopback until the context ends, then shut down.
	ln, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- open.Serve(ctx, ln) }()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+ln.Addr().String()+"/v1/status", nil)
	res, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("status through Serve: %d", res.StatusCode)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Serve after cancel: %v", err)
	}

	// With a token, any address; it returns nil once ctx ends.
	guarded, err := postboxadmin.New(&postboxadmin.Config{Admin: f.admin, Tokens: tokens(), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	if err := guarded.ListenAndServe(ctx, "127.0.0.1:0"); err != nil {
		t.Fatalf("ListenAndServe with an ended context: %v", err)
	}
}

// TestGracefulShutdown: a request in flight when the context ends is
// finished; one that outlasts ShutdownTimeout is cut off and reported.
func TestGracefulShutdown(t *testing.T) {
	f := postgresFixture(t)
	entered, release := make(chan struct{}, 1), make(chan struct{})
	srv, err := postboxadmin.New(&postboxadmin.Config{Admin: f.admin, Logger: quiet, ReadyTimeout: time.Minute, ShutdownTimeout: time.Minute,
		Ready: func(ctx context.Context) error {
			entered <- struct{}{}
			select {
			case <-release:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	status, done := startServe(t, srv)
	<-entered
	done.cancel()
	close(release)
	if code := <-status; code != 200 {
		t.Fatalf("request in flight during shutdown: %d", code)
	}
	if err := <-done.err; err != nil {
		t.Fatalf("Serve: %v", err)
	}

	// A request that never ends is cut off once ShutdownTimeout passes.
	entered = make(chan struct{}, 1)
	stuck, err := postboxadmin.New(&postboxadmin.Config{Admin: f.admin, Logger: quiet, ReadyTimeout: time.Minute, ShutdownTimeout: 50 * time.Millisecond,
		Ready: func(ctx context.Context) error {
			entered <- struct{}{}
			<-ctx.Done() // ends when the connection is closed
			return ctx.Err()
		}})
	if err != nil {
		t.Fatal(err)
	}
	status, done = startServe(t, stuck)
	<-entered
	done.cancel()
	if err := <-done.err; err == nil || !strings.Contains(err.Error(), "shutdown") {
		t.Fatalf("Serve with a stuck request: %v", err)
	}
	<-status
}

type serving struct {
	cancel context.CancelFunc
	err    chan error
}

// startServe runs srv.Serve on a loopback listener and sends one GET
// /readyz in the background, whose status (0 for a transport error)
// arrives on the returned channel.
func startServe(t *testing.T, srv *postboxadmin.Server) (chan int, serving) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := serving{cancel: cancel, err: make(chan error, 1)}
	go func() { s.err <- srv.Serve(ctx, ln) }()
	status := make(chan int, 1)
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	go func() {
		req, _ := http.NewRequestWithContext(context.Background(), "GET", "http://"+ln.Addr().String()+"/readyz", nil)
		res, err := (&http.Client{Transport: tr}).Do(req)
		if err != nil {
			status <- 0
			return
		}
		_ = res.Body.Close()
		status <- res.StatusCode
	}()
	return status, s
}
