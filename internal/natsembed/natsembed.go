// Package natsembed runs a NATS server with JetStream inside the process,
// for the demo and for tests that must not depend on a server installed on
// the machine.
//
// The server listens on 127.0.0.1 on a random free port, keeps its
// JetStream storage in the directory it is given, and logs nothing. Stop it
// with Shutdown, which closes every client connection and waits until the
// server's goroutines have exited and its storage is flushed and closed:
//
//	srv, url, err := natsembed.Start(dir)
//	if err != nil { ... }
//	defer natsembed.Shutdown(srv)
//	nc, err := nats.Connect(url)
//
// Durability: like any nats-server, the embedded one acknowledges a publish
// once the message is written to the operating system, and fsyncs on an
// interval (two minutes by default). A machine crash can lose the last
// interval's acknowledged messages; a process crash cannot. Set
// Options.SyncAlways through StartOptions when the demo must survive power
// loss too (see postboxnats, "What an ack is worth").
package natsembed

import (
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// readyTimeout bounds the wait for the listener and JetStream to come up.
// Recovering a large store takes longer than a fresh start; ten seconds
// leaves room for both on a slow machine.
const readyTimeout = 10 * time.Second

// DefaultOptions returns the options Start uses: loopback, a random port,
// JetStream with its storage in dir, no logging, no signal handlers (the
// host process owns SIGINT/SIGTERM).
func DefaultOptions(dir string) *server.Options {
	return &server.Options{
		ServerName: "postbox-embedded",
		Host:       "127.0.0.1",
		Port:       server.RANDOM_PORT,
		JetStream:  true,
		StoreDir:   dir,
		NoLog:      true,
		NoSigs:     true,
		// No HTTP monitoring, cluster or leaf listeners: nothing else to
		// bind, nothing else to leak.
	}
}

// Start runs a server with DefaultOptions(dir) and returns it with the URL
// clients connect to. The server is ready for connections, JetStream
// included, when Start returns.
func Start(dir string) (*server.Server, string, error) {
	if dir == "" {
		return nil, "", errors.New("natsembed: a storage directory is required")
	}
	return StartOptions(DefaultOptions(dir))
}

// StartOptions runs a server with opts, for callers that need to change a
// default (a smaller max_payload, sync_interval always). NoLog and NoSigs
// are forced on: an embedded server must neither write to the host's
// output nor take its signals.
func StartOptions(opts *server.Options) (*server.Server, string, error) {
	o := *opts
	o.NoLog = true
	o.NoSigs = true
	srv, err := server.NewServer(&o)
	if err != nil {
		return nil, "", fmt.Errorf("natsembed: configure server: %w", err)
	}
	srv.Start()
	if !srv.ReadyForConnections(readyTimeout) {
		Shutdown(srv)
		return nil, "", fmt.Errorf("natsembed: server not ready for connections after %s", readyTimeout)
	}
	if o.JetStream && !srv.JetStreamEnabled() {
		Shutdown(srv)
		return nil, "", errors.New("natsembed: JetStream did not start (is the storage directory writable?)")
	}
	return srv, srv.ClientURL(), nil
}

// Shutdown stops srv and waits for it to finish: client connections are
// closed (clients see a disconnect), JetStream flushes and closes its
// store, and the server's goroutines exit. The storage directory is left
// as it is, so a server started again on it finds its streams. Calling it
// on nil or on a server already stopped does nothing.
func Shutdown(srv *server.Server) {
	if srv == nil {
		return
	}
	srv.Shutdown()
	srv.WaitForShutdown()
}
