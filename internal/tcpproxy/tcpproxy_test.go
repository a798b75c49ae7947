package tcpproxy_test

import (
	"io"
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/postbox-go/postbox/internal/tcpproxy"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echo serves one connection at a time, writing back what it reads.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { _ = ln.Close(); <-done })
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = io.Copy(c, c)
			_ = c.Close()
		}
	}()
	return ln.Addr().String()
}

func roundTrip(t *testing.T, c net.Conn, deadline time.Duration) error {
	t.Helper()
	if err := c.SetDeadline(time.Now().Add(deadline)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("x")); err != nil {
		return err
	}
	_, err := io.ReadFull(c, make([]byte, 1))
	return err
}

// Bytes held by a black hole (opened twice) flow once it is lifted, and
// Close ends every goroutine even with a hole open.
func TestBlackholeHoldsThenFlows(t *testing.T) {
	p, err := tcpproxy.New(echo(t))
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := roundTrip(t, c, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	lift := p.Blackhole()
	p.Blackhole() // the same hole
	if err := roundTrip(t, c, 100*time.Millisecond); err == nil {
		t.Fatal("a byte crossed the black hole")
	}
	lift()
	if err := c.SetDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
		t.Fatalf("the held byte did not flow after the lift: %v", err)
	}
	p.Blackhole()
	p.Close()
	if p.Accepts() != 1 {
		t.Fatalf("Accepts = %d, want 1", p.Accepts())
	}
}

// A refusing proxy closes new connections at once and counts them.
func TestRefuse(t *testing.T) {
	p, err := tcpproxy.New(echo(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	p.Refuse(true)
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := roundTrip(t, c, 5*time.Second); err == nil {
		t.Fatal("a refused connection carried a byte")
	}
	if p.Accepts() != 1 {
		t.Fatalf("Accepts = %d, want 1", p.Accepts())
	}
}

// A connection accepted before Refuse or Reset but still dialing the
// target when they ran is cut too, rather than outliving the outage they
// made (a relay once read through such a connection all through one).
func TestCutWhileDialing(t *testing.T) {
	target := echo(t)
	for name, fault := range map[string]func(*tcpproxy.Proxy){
		"Reset":  func(p *tcpproxy.Proxy) { p.Reset() },
		"Refuse": func(p *tcpproxy.Proxy) { p.Refuse(true) },
	} {
		t.Run(name, func(t *testing.T) {
			dialing, proceed := make(chan struct{}), make(chan struct{})
			first := true // read and written by the accept loop alone
			p, err := tcpproxy.StartDialed(target, func() {
				if first {
					first = false
					close(dialing)
					<-proceed
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			c, err := net.Dial("tcp", p.Addr())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			<-dialing // the proxy accepted c and dialed the target
			fault(p)
			close(proceed)
			if err := roundTrip(t, c, 5*time.Second); err == nil {
				t.Fatal("a connection dialing across the fault carried a byte")
			}
		})
	}
}

// An inspector sees what the client sends before it is forwarded, chunk
// by chunk, and one that refuses a chunk keeps it from the server and
// resets the connection; other connections, with inspectors of their
// own, go on.
func TestInspectDropsAndResets(t *testing.T) {
	p, err := tcpproxy.New(echo(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	p.Inspect(func() tcpproxy.Inspector {
		return func(b []byte) bool { return string(b) != "!" }
	})
	bad, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	if err := roundTrip(t, bad, 5*time.Second); err != nil {
		t.Fatalf("an inspected byte the inspector let through: %v", err)
	}
	if _, err := bad.Write([]byte("!")); err != nil {
		t.Fatal(err)
	}
	if err := bad.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if n, err := bad.Read(make([]byte, 1)); err == nil || n != 0 {
		t.Fatalf("after a refused chunk: read %d bytes, %v; want the connection reset", n, err)
	}
	good, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer good.Close()
	if err := roundTrip(t, good, 5*time.Second); err != nil {
		t.Fatalf("a second connection: %v", err)
	}
}
