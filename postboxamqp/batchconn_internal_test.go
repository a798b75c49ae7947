package postboxamqp

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
)

// fakeConn records each write it is given; with release set, each write
// waits for release to be closed (or for Close) before it returns.
type fakeConn struct {
	net.Conn // unused; only Write and Close are called
	writes   chan string
	release  chan struct{}
	err      error // what every write returns once released
	closed   chan struct{}
	once     sync.Once
}

func newFakeConn() *fakeConn {
	return &fakeConn{writes: make(chan string, 64), closed: make(chan struct{})}
}

func (f *fakeConn) Write(p []byte) (int, error) {
	f.writes <- string(p)
	if f.release != nil {
		select {
		case <-f.release:
		case <-f.closed:
			return 0, net.ErrClosed
		}
	}
	if f.err != nil {
		return 0, f.err
	}
	return len(p), nil
}

func (f *fakeConn) Close() error {
	f.once.Do(func() { close(f.closed) })
	return nil
}

func write(t *testing.T, c net.Conn, s string) {
	t.Helper()
	if n, err := c.Write([]byte(s)); err != nil || n != len(s) {
		t.Fatalf("Write(%q) = %d, %v", s, n, err)
	}
}

// TestBatchConnCoalesces: what is written while a send is under way goes
// out in the next send, in one write to the socket, in order.
func TestBatchConnCoalesces(t *testing.T) {
	f := newFakeConn()
	f.release = make(chan struct{})
	c := newBatchConn(f)
	defer c.Close()
	write(t, c, "a")
	if got := <-f.writes; got != "a" {
		t.Fatalf("first send %q, want %q", got, "a")
	}
	// The sender is inside the socket write of "a".
	write(t, c, "b")
	write(t, c, "cc")
	write(t, c, "d")
	close(f.release)
	if got := <-f.writes; got != "bccd" {
		t.Fatalf("second send %q, want the three writes in one: %q", got, "bccd")
	}
}

// TestBatchConnFailedSend: once a send fails, the socket is closed and
// every later write fails with the send's error.
func TestBatchConnFailedSend(t *testing.T) {
	f := newFakeConn()
	boom := errors.New("connection reset by peer")
	f.err = boom
	c := newBatchConn(f)
	defer c.Close()
	write(t, c, "a") // queued: its send fails after it returned
	<-f.closed
	// The sender records the error before it closes the socket.
	if _, err := c.Write([]byte("b")); !errors.Is(err, boom) {
		t.Fatalf("write after a failed send: %v, want %v", err, boom)
	}
}

// TestBatchConnCloseWakesWriters: a write waiting for room (the socket
// takes nothing) fails once the connection is closed, and Close returns
// once the sender has.
func TestBatchConnCloseWakesWriters(t *testing.T) {
	f := newFakeConn()
	f.release = make(chan struct{}) // never released: the socket is stuck
	c := newBatchConn(f)
	write(t, c, "a")
	<-f.writes
	big := make([]byte, batchMax)
	if _, err := c.Write(big); err != nil { // fills the buffer
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := c.Write([]byte("waits"))
		errc <- err
	}()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err == nil {
		t.Fatal("a write waiting for room succeeded after Close")
	}
	if _, err := c.Write([]byte("late")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("write after Close: %v, want net.ErrClosed", err)
	}
}

// TestBatchConnConcurrentWrites: over a real socket, writes from many
// goroutines arrive whole, each writer's in its order, none lost.
func TestBatchConnConcurrentWrites(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	const writers, each = 8, 2000
	type result struct {
		n   int
		err error
	}
	got := make(chan result, 1)
	go func() {
		peer, err := ln.Accept()
		if err != nil {
			got <- result{err: err}
			return
		}
		defer peer.Close()
		r := bufio.NewReader(peer)
		next := make([]uint32, writers)
		n := 0
		for n < writers*each {
			// A frame: writer, sequence, length, then length bytes of
			// the writer's number.
			var hdr [12]byte
			if _, err := io.ReadFull(r, hdr[:]); err != nil {
				got <- result{n, err}
				return
			}
			w, seq, size := binary.BigEndian.Uint32(hdr[0:]), binary.BigEndian.Uint32(hdr[4:]), binary.BigEndian.Uint32(hdr[8:])
			body := make([]byte, size)
			if _, err := io.ReadFull(r, body); err != nil {
				got <- result{n, err}
				return
			}
			if w >= writers || seq != next[w] {
				got <- result{n, errors.New("a frame out of order")}
				return
			}
			for _, b := range body {
				if b != byte(w) {
					got <- result{n, errors.New("a frame torn")}
					return
				}
			}
			next[w]++
			n++
		}
		got <- result{n, nil}
	}()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c := newBatchConn(raw)
	defer c.Close()
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for seq := range each {
				size := (seq*37 + w*11) % 600
				frame := make([]byte, 12+size)
				binary.BigEndian.PutUint32(frame[0:], uint32(w))
				binary.BigEndian.PutUint32(frame[4:], uint32(seq))
				binary.BigEndian.PutUint32(frame[8:], uint32(size))
				for i := 12; i < len(frame); i++ {
					frame[i] = byte(w)
				}
				if _, err := c.Write(frame); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if r := <-got; r.err != nil || r.n != writers*each {
		t.Fatalf("the peer read %d frames of %d: %v", r.n, writers*each, r.err)
	}
}
