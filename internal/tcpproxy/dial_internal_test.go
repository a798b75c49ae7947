package tcpproxy

import (
	"io"
	"net"
	"testing"
	"time"
)

// TestCutWhileDialing: a connection accepted before Refuse and Reset but
// still dialing the target when they ran is cut too, rather than
// outliving the outage they made (a relay read through such a connection
// all through one).
func TestCutWhileDialing(t *testing.T) {
	target, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	served := make(chan struct{})
	go func() {
		defer close(served)
		for {
			c, err := target.Accept()
			if err != nil {
				return
			}
			_, _ = io.Copy(c, c)
			_ = c.Close()
		}
	}()
	for _, tc := range []struct {
		name  string
		fault func(*Proxy)
	}{
		{"Reset", func(p *Proxy) { p.Reset() }},
		{"Refuse", func(p *Proxy) { p.Refuse(true) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dialing, proceed := make(chan struct{}), make(chan struct{})
			first := true
			p, err := start(target.Addr().String(), func() {
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
			tc.fault(p)
			close(proceed)
			if err := c.SetDeadline(time.Now().Add(5 * time.Second)); err != nil {
				t.Fatal(err)
			}
			_, _ = c.Write([]byte("x"))
			if _, err := io.ReadFull(c, make([]byte, 1)); err == nil {
				t.Fatal("a connection dialing across the fault carried a byte")
			}
		})
	}
	target.Close()
	<-served
}
