package postboxredis_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/pubtest"
	"github.com/postbox-go/postbox/postboxredis"
)

// TestPublishClassifiedOnRedis publishes what the machine's Redis refuses,
// and what the Publisher refuses before sending, and checks each
// failure's class.
func TestPublishClassifiedOnRedis(t *testing.T) {
	c := client(t, nil)
	name := stream(t, c, "g")
	ctx := context.Background()

	t.Run("NoStream", func(t *testing.T) {
		p := publisher(t, c, &postboxredis.Config{StreamPrefix: uniqueName() + ":"})
		err := publish(t, p, ctx, envelope("missing", "", "x"))
		mustMessage(t, err, postboxredis.ErrNoStream)
	})
	t.Run("WrongType", func(t *testing.T) {
		key := uniqueName()
		cleanup(t, key)
		if err := c.Set(ctx, key, "a string", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		p := publisher(t, c, &postboxredis.Config{Stream: key})
		mustMessage(t, publish(t, p, ctx, envelope("t", "", "x")), postboxredis.ErrWrongType)
		if err := postboxredis.EnsureGroup(ctx, c, key, "g", "0"); !errors.Is(err, postboxredis.ErrWrongType) {
			t.Fatalf("EnsureGroup on a string: %v, want ErrWrongType", err)
		}
	})
	t.Run("InvalidStreamName", func(t *testing.T) {
		p := publisher(t, c, &postboxredis.Config{StreamPrefix: "pbxt:"})
		for _, topic := range []string{"has space", "has}brace", strings.Repeat("x", postboxredis.MaxStreamNameBytes)} {
			mustPermanent(t, publish(t, p, ctx, envelope(topic, "", "x")), postboxredis.ErrInvalidStream)
		}
	})
	t.Run("TooLarge", func(t *testing.T) {
		p := publisher(t, c, &postboxredis.Config{Stream: name, MaxEntryBytes: 4 << 10})
		mustPermanent(t, publish(t, p, ctx, envelope("t", "", strings.Repeat("x", 5<<10))), postboxredis.ErrTooLarge)
		if err := publish(t, p, ctx, envelope("t", "", strings.Repeat("x", 3<<10))); err != nil {
			t.Fatalf("an entry under the cap: %v", err)
		}
	})
	t.Run("RefusedAtWrite", func(t *testing.T) {
		// What Publish could never send is refused when written, with a
		// *ValidationError, and nothing is written.
		p := publisher(t, c, &postboxredis.Config{StreamPrefix: "pbxt:", MaxEntryBytes: 4 << 10})
		_, prefix, d := pubtest.Tables(t)
		client, err := postbox.NewClient(d, &postbox.Config{Prefix: prefix, Publisher: p})
		if err != nil {
			t.Fatal(err)
		}
		for i, m := range []postbox.Message{{Topic: "t", Payload: make([]byte, 5<<10)}, {Topic: "t", Key: "k", Payload: make([]byte, 4<<10)}} {
			var ve *postbox.ValidationError
			if err := client.Write(ctx, postbox.Message{Topic: "fine"}, m); !errors.As(err, &ve) || ve.Field != "messages[1]" {
				t.Errorf("case %d: err = %v, want a *ValidationError on messages[1]", i, err)
			}
		}
		if st, err := client.Stats(ctx); err != nil || st.Pending != 0 {
			t.Fatalf("stats = %+v, %v", st, err)
		}
	})
	t.Run("NoID", func(t *testing.T) {
		p := publisher(t, c, &postboxredis.Config{Stream: name})
		for _, id := range []string{"", "a\nb", strings.Repeat("x", postboxredis.MaxIDBytes+1)} {
			env := envelope("t", "", "x")
			env.ID = id
			mustPermanent(t, publish(t, p, ctx, env), postboxredis.ErrNoID)
		}
	})
	t.Run("InvalidHeader", func(t *testing.T) {
		p := publisher(t, c, &postboxredis.Config{Stream: name})
		env := envelope("t", "", "x")
		env.Headers["bad"] = "\xff\xfe"
		mustPermanent(t, publish(t, p, ctx, env), postboxredis.ErrInvalidHeader)
	})
	t.Run("CanceledContext", func(t *testing.T) {
		p := publisher(t, c, &postboxredis.Config{Stream: name})
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		mustInfra(t, publish(t, p, cctx, envelope("t", "", "x")), context.Canceled)
	})
	t.Run("ClosedPublisher", func(t *testing.T) {
		p := publisher(t, c, &postboxredis.Config{Stream: name})
		if err := p.Close(ctx); err != nil {
			t.Fatal(err)
		}
		mustInfra(t, publish(t, p, ctx, envelope("t", "", "x")), postboxredis.ErrClosed)
		if err := p.Close(ctx); err != nil {
			t.Fatalf("second Close: %v", err)
		}
	})
	t.Run("ClosedClient", func(t *testing.T) {
		cl := redis.NewClient(&redis.Options{Addr: redisAddr()})
		_ = cl.Close()
		p := publisher(t, cl, &postboxredis.Config{Stream: name})
		mustInfra(t, publish(t, p, ctx, envelope("t", "", "x")), redis.ErrClosed)
	})
	t.Run("ScriptCacheFlushed", func(t *testing.T) {
		// After a restart or a failover the server has no scripts cached;
		// the publish is sent again with the script's source.
		p := publisher(t, c, &postboxredis.Config{Stream: name})
		if err := publish(t, p, ctx, envelope("t", "", "x")); err != nil {
			t.Fatal(err)
		}
		if err := c.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		if err := publish(t, p, ctx, envelope("t", "", "y")); err != nil {
			t.Fatalf("publish after SCRIPT FLUSH: %v", err)
		}
	})
}

// TestPublishClassifiedUnreachable checks the failures of a Redis that
// cannot be reached or does not answer.
func TestPublishClassifiedUnreachable(t *testing.T) {
	ctx := context.Background()
	t.Run("ConnectionRefused", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		_ = ln.Close() // nothing listens there now
		cl := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
		t.Cleanup(func() { _ = cl.Close() })
		p := publisher(t, cl, &postboxredis.Config{Stream: "s"})
		err = publish(t, p, ctx, envelope("t", "", "x"))
		mustInfra(t, err, nil)
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("got %v, want connection refused", err)
		}
	})
	t.Run("NoAnswer", func(t *testing.T) {
		srv := newFakeRedis(t, "") // accepts, reads, never answers
		cl := redis.NewClient(&redis.Options{Addr: srv.addr(), MaxRetries: -1, ReadTimeout: 5 * time.Second, DialTimeout: 5 * time.Second})
		t.Cleanup(func() { _ = cl.Close() })
		p := publisher(t, cl, &postboxredis.Config{Stream: "s", PublishTimeout: 200 * time.Millisecond})
		start := time.Now()
		mustInfra(t, publish(t, p, ctx, envelope("t", "", "x")), postboxredis.ErrPublishTimeout)
		if d := time.Since(start); d > 3*time.Second {
			t.Fatalf("timed out after %s, want about the 200ms PublishTimeout", d)
		}
		srv.close() // lets the client's read fail, so Close finds the pipeline done
	})
}

// TestPublishClassifiedReplies publishes to a fake server answering every
// command with one error reply, as a loading, read-only, full or
// misconfigured Redis would.
func TestPublishClassifiedReplies(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		reply   string
		message bool
	}{
		{"LOADING Redis is loading the dataset in memory", false},
		{"READONLY You can't write against a read only replica.", false},
		{"MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.", false},
		{"CLUSTERDOWN The cluster is down", false},
		{"TRYAGAIN Multiple keys request during rehashing of slot", false},
		{"NOREPLICAS Not enough good replicas to write.", false},
		{"BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSCRIPT.", false},
		{"OOM command not allowed when used memory > 'maxmemory'.", false},
		{"NOPERM this user has no permissions to run the 'evalsha' command", false},
		{"ERR max number of clients reached", false},
		{"ERR unknown command 'evalsha'", false},
		{"WRONGTYPE Operation against a key holding the wrong kind of value", true},
		{"CROSSSLOT Keys in request don't hash to the same slot", true},
	}
	for _, tc := range cases {
		name, _, _ := strings.Cut(tc.reply, " ")
		t.Run(name, func(t *testing.T) {
			srv := newFakeRedis(t, tc.reply)
			cl := redis.NewClient(&redis.Options{Addr: srv.addr(), MaxRetries: -1})
			t.Cleanup(func() { _ = cl.Close() })
			p := publisher(t, cl, &postboxredis.Config{Stream: "s"})
			err := publish(t, p, ctx, envelope("t", "", "x"))
			if tc.message {
				mustMessage(t, err, nil)
			} else {
				mustInfra(t, err, nil)
			}
			if !strings.Contains(err.Error(), tc.reply) {
				t.Fatalf("error %q does not carry the reply %q", err, tc.reply)
			}
		})
	}
}

// fakeRedis speaks just enough RESP for a client to connect, and answers
// every other command with one error reply; with an empty reply it reads
// and never answers.
type fakeRedis struct {
	ln    net.Listener
	reply string
	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

func newFakeRedis(t testing.TB, reply string) *fakeRedis {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeRedis{ln: ln, reply: reply}
	f.wg.Add(1)
	go f.accept()
	t.Cleanup(f.close)
	return f
}

func (f *fakeRedis) addr() string { return f.ln.Addr().String() }

func (f *fakeRedis) accept() {
	defer f.wg.Done()
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		f.mu.Lock()
		f.conns = append(f.conns, c)
		f.mu.Unlock()
		f.wg.Add(1)
		go f.serve(c)
	}
}

func (f *fakeRedis) serve(c net.Conn) {
	defer f.wg.Done()
	defer c.Close()
	rd := bufio.NewReader(c)
	for {
		args, err := readCommand(rd)
		if err != nil {
			return
		}
		if f.reply == "" {
			continue
		}
		var out string
		switch strings.ToUpper(args[0]) {
		case "HELLO":
			out = "-ERR unknown command 'HELLO'\r\n"
		case "CLIENT", "SELECT":
			out = "+OK\r\n"
		case "PING":
			out = "+PONG\r\n"
		default:
			out = "-" + f.reply + "\r\n"
		}
		if _, err := io.WriteString(c, out); err != nil {
			return
		}
	}
}

// readCommand reads one command: an array of bulk strings.
func readCommand(rd *bufio.Reader) ([]string, error) {
	line, err := rd.ReadString('\n')
	if err != nil {
		return nil, err
	}
	if !strings.HasPrefix(line, "*") {
		return nil, fmt.Errorf("not an array: %q", line)
	}
	n, err := strconv.Atoi(strings.TrimSpace(line[1:]))
	if err != nil || n < 1 {
		return nil, fmt.Errorf("bad array length %q", line)
	}
	args := make([]string, n)
	for i := range args {
		h, err := rd.ReadString('\n')
		if err != nil {
			return nil, err
		}
		size, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(h, "$")))
		if err != nil {
			return nil, fmt.Errorf("bad bulk length %q", h)
		}
		buf := make([]byte, size+2)
		if _, err := io.ReadFull(rd, buf); err != nil {
			return nil, err
		}
		args[i] = string(buf[:size])
	}
	return args, nil
}

func (f *fakeRedis) close() {
	_ = f.ln.Close()
	f.mu.Lock()
	for _, c := range f.conns {
		_ = c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}
