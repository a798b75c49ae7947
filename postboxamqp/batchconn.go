package postboxamqp

import (
	"net"
	"sync"
)

// batchMax bounds the bytes a batchConn holds unwritten: a Write past it
// waits for the socket, as it would on a full socket buffer.
const batchMax = 256 << 10

// batchConn is a net.Conn whose writes one goroutine of its own sends to
// the socket: what is written while a send is under way goes out in the
// next one, together. amqp091 flushes its buffer after every publish, one
// system call per message; with this under it, a burst of publishes costs
// one per burst, on both ends of the socket. Nothing waits for a burst to
// fill: a lone write goes out at once.
//
// A Write returns once its bytes are queued; a failed send fails every
// later Write and closes the socket, which ends the connection's reader,
// as a failed write would.
type batchConn struct {
	net.Conn

	mu      sync.Mutex
	room    sync.Cond // signalled when pending shrinks or err is set
	pending []byte
	err     error

	kick   chan struct{} // a send is due; buffered 1
	closed chan struct{} // Close was called
	done   chan struct{} // the sender has returned
	once   sync.Once
}

func newBatchConn(conn net.Conn) *batchConn {
	c := &batchConn{Conn: conn, kick: make(chan struct{}, 1), closed: make(chan struct{}), done: make(chan struct{})}
	c.room.L = &c.mu
	go c.send()
	return c
}

func (c *batchConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	for c.err == nil && len(c.pending) >= batchMax {
		c.room.Wait()
	}
	if err := c.err; err != nil {
		c.mu.Unlock()
		return 0, err
	}
	c.pending = append(c.pending, p...)
	c.mu.Unlock()
	select {
	case c.kick <- struct{}{}:
	default: // a send is due already, and will take these bytes too
	}
	return len(p), nil
}

// send writes what is pending each time it is kicked, until Close or a
// failed write.
func (c *batchConn) send() {
	defer close(c.done)
	var out []byte
	for {
		select {
		case <-c.kick:
		case <-c.closed:
			return
		}
		c.mu.Lock()
		out, c.pending = c.pending, out[:0]
		c.mu.Unlock()
		c.room.Broadcast()
		if len(out) == 0 {
			continue
		}
		if _, err := c.Conn.Write(out); err != nil {
			c.mu.Lock()
			c.err = err
			c.mu.Unlock()
			c.room.Broadcast()
			_ = c.Conn.Close()
			return
		}
	}
}

// Close closes the socket and waits for the sender to return; bytes not
// yet sent are dropped, as a socket's are.
func (c *batchConn) Close() error {
	err := net.ErrClosed
	c.once.Do(func() {
		close(c.closed)
		err = c.Conn.Close()
		c.mu.Lock()
		if c.err == nil {
			c.err = net.ErrClosed
		}
		c.mu.Unlock()
		c.room.Broadcast()
	})
	<-c.done
	return err
}
