//go:build faults

package faults

import (
	"net"
	"sync"
	"time"
)

// proxy is a TCP proxy on loopback between the relays and NATS. It can
// black-hole the traffic (bytes are held, as a stalled network holds
// them, and flow again when the hole closes) or reset every connection.
// The harness's own consumer and stream watcher bypass it.
type proxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	hole  chan struct{} // non-nil while black-holed; closed to lift
	wg    sync.WaitGroup
}

func newProxy(target string) (*proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		u, err := net.DialTimeout("tcp", p.target, 2*time.Second)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns[c], p.conns[u] = struct{}{}, struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(c, u)
		go p.pipe(u, c)
	}
}

// pipe copies src to dst, holding each chunk while the hole is open.
func (p *proxy) pipe(src, dst net.Conn) {
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
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // EOF or a reset: drop both sides
		}
	}
}

func (p *proxy) drop(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		if _, ok := p.conns[c]; ok {
			delete(p.conns, c)
			_ = c.Close()
		}
	}
}

// blackhole holds all traffic until the returned func is called.
func (p *proxy) blackhole() (lift func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	h := make(chan struct{})
	p.hole = h
	return func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.hole == h { // close may have lifted it already
			p.hole = nil
			close(h)
		}
	}
}

// reset closes every connection with an RST.
func (p *proxy) reset() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for c := range p.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		_ = c.Close()
		delete(p.conns, c)
		n++
	}
	return n / 2
}

func (p *proxy) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	if p.hole != nil {
		close(p.hole)
		p.hole = nil
	}
	p.mu.Unlock()
	p.reset()
	p.wg.Wait()
}
