// Package tcpproxy is a TCP proxy on loopback for tests that break the
// network between a client and a server: it can black-hole the traffic
// (the bytes are held, as a stalled network holds them, and flow again
// when the hole is lifted), reset every connection, refuse new ones (a
// server that is down), or show what clients send to an inspector before
// it is forwarded.
package tcpproxy

import (
	"net"
	"sync"
	"time"
)

// Proxy forwards every connection made to Addr to the target.
type Proxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	conns   map[net.Conn]struct{}
	hole    chan struct{} // non-nil while black-holed; closed to lift
	refuse  bool
	inspect func() Inspector
	closed  bool
	accepts int
	resets  int // Resets so far: a connection dialing across one is cut too

	dialed func() // a test's hook, run once the target is dialed
	wg     sync.WaitGroup
}

// New starts a proxy to target on a free loopback port.
func New(target string) (*Proxy, error) { return start(target, nil) }

// start is New with a hook run each time the target is dialed, before the
// connection is registered.
func start(target string, dialed func()) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}, dialed: dialed}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		p.accepts++
		refuse, resets := p.refuse, p.resets
		p.mu.Unlock()
		if refuse {
			_ = c.Close()
			continue
		}
		u, err := net.DialTimeout("tcp", p.target, 2*time.Second)
		if p.dialed != nil {
			p.dialed()
		}
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		if p.closed { // Close ran while this one was dialing
			p.mu.Unlock()
			_ = c.Close()
			_ = u.Close()
			return
		}
		p.conns[c], p.conns[u] = struct{}{}, struct{}{}
		if p.refuse || p.resets != resets {
			// Refused or reset while this one was dialing the target:
			// accepted before, it is cut as the others were, rather than
			// outliving the outage the test made.
			p.rst(c)
			p.rst(u)
			p.mu.Unlock()
			continue
		}
		var look Inspector
		if p.inspect != nil {
			look = p.inspect()
		}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(c, u, look)
		go p.pipe(u, c, nil)
	}
}

// pipe copies src to dst, holding each chunk while the hole is open and
// showing it to look, when set, before it is forwarded.
func (p *Proxy) pipe(src, dst net.Conn, look Inspector) {
	defer p.wg.Done()
	defer p.drop(src, dst)
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			hole := p.hole
			p.mu.Unlock()
			if hole != nil {
				<-hole
			}
			if look != nil && !look(buf[:n]) {
				p.cut(src, dst)
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // EOF or a reset: drop both sides
		}
	}
}

func (p *Proxy) drop(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		if _, ok := p.conns[c]; ok {
			delete(p.conns, c)
			_ = c.Close()
		}
	}
}

// Blackhole holds all traffic, both ways, until the returned func is
// called. New connections are accepted and held too. While a hole is
// open, another Blackhole returns a lift for the same hole.
func (p *Proxy) Blackhole() (lift func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	h := p.hole
	if h == nil {
		h = make(chan struct{})
		p.hole = h
	}
	return func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.hole == h { // Close may have lifted it already
			p.hole = nil
			close(h)
		}
	}
}

// Refuse makes the proxy close new connections at once, as a server that
// is down would, or accept them again. A connection still being set up
// when refusal begins is closed too.
func (p *Proxy) Refuse(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refuse = on
}

// Accepts counts the connections made to the proxy, refused ones too.
func (p *Proxy) Accepts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepts
}

// An Inspector sees the bytes one client sends, chunk by chunk in the
// order sent, each before it is forwarded; it may keep what it needs of
// earlier chunks (a message can span two). Returning false drops the
// chunk and resets the connection, both sides. It runs on the
// connection's copying goroutine: while it runs, nothing more of that
// client's is read.
type Inspector func(chunk []byte) (forward bool)

// Inspect has each connection accepted from now on shown to an Inspector
// of its own, made by newInspector; nil stops inspecting new ones.
func (p *Proxy) Inspect(newInspector func() Inspector) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inspect = newInspector
}

// cut closes both sides of one connection with an RST.
func (p *Proxy) cut(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		if _, ok := p.conns[c]; ok {
			p.rst(c)
		}
	}
}

// rst closes c with an RST; p.mu is held.
func (p *Proxy) rst(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
	delete(p.conns, c)
}

// Reset closes every connection with an RST and reports how many
// client connections it cut.
func (p *Proxy) Reset() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.resets++
	n := 0
	for c := range p.conns {
		p.rst(c)
		n++
	}
	return n / 2
}

// Close stops the proxy: it lifts a black hole, resets every connection
// and waits for its goroutines.
func (p *Proxy) Close() {
	_ = p.ln.Close()
	p.mu.Lock()
	p.closed = true
	if p.hole != nil {
		close(p.hole)
		p.hole = nil
	}
	p.mu.Unlock()
	p.Reset()
	p.wg.Wait()
}
