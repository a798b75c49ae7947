package postbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/testdb"
	"github.com/postbox-go/postbox/postboxpgx"
	"github.com/postbox-go/postbox/postboxtest"
)

// statementTally counts a pool's statements by what they do.
type statementTally struct {
	prefix string
	mu     sync.Mutex
	counts map[string]int
}

func (s *statementTally) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	sql := data.SQL
	kind := ""
	switch {
	case strings.Contains(sql, "ORDER BY o.seq") && strings.Contains(sql, "DELETE FROM "+s.prefix+"outbox"):
		kind = "mark and fetch"
	case strings.Contains(sql, "ORDER BY o.seq"):
		kind = "fetch"
	case strings.Contains(sql, "INSERT INTO "+s.prefix+"published"):
		kind = "mark"
	case strings.Contains(sql, "pg_notify") && !strings.Contains(sql, "WITH beat"):
		kind = "signal"
		if len(data.Args) == 2 {
			if p, ok := data.Args[1].(string); ok && strings.HasPrefix(p, "probe ") {
				kind = "the listener's probe"
			}
		}
	}
	s.mu.Lock()
	s.counts[kind]++
	s.mu.Unlock()
	return ctx
}

func (s *statementTally) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (s *statementTally) count(kind string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counts[kind]
}

// A relay kept busy by single writes records each small batch with its
// next read, in one statement (postboxdriver.SettleFetcher): every
// message is published once and in its key's order, and every mark lands,
// the last ones alone once no read follows them. Its Client, whose relay
// holds every partition with no other relay live, sends no change signal;
// once the relay stops, it signals again.
func TestSmallBatchesMarkWithTheNextRead(t *testing.T) {
	_, prefix := testdb.Migrated(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(testdb.PostgresURL())
	if err != nil {
		t.Fatal(err)
	}
	tally := &statementTally{prefix: prefix, counts: map[string]int{}}
	cfg.ConnConfig.Tracer = tally
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	broker := postboxtest.NewBroker(nil)
	c, err := postbox.NewClient(postboxpgx.New(pool), &postbox.Config{Prefix: prefix, Publisher: broker})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = c.Stop(ctx)
		}
	}()
	waitFor(t, ctx, func() bool { _, _, held, n, _ := postbox.RelayLanes(c); return held == n })

	// Each write once the one before is published: written all at once,
	// they may all be read by one batch too large to wait for a read,
	// as one lane reading every partition reads them when it is slower
	// than the writer.
	const n = 60
	for i := range n {
		m := postbox.Message{Topic: "orders.paid", Key: fmt.Sprint("k", i%2), Payload: fmt.Append(nil, i)}
		if err := c.Write(ctx, m); err != nil {
			t.Fatal(err)
		}
		waitFor(t, ctx, func() bool { return len(broker.Messages()) > i })
	}
	waitFor(t, ctx, func() bool { return len(broker.Messages()) >= n })
	waitFor(t, ctx, func() bool {
		st, err := c.Admin().Status(ctx)
		return err == nil && st.Pending == 0 && st.Published == n
	})
	if got := len(broker.Messages()); got != n {
		t.Fatalf("%d messages published, want %d", got, n)
	}
	for _, key := range []string{"k0", "k1"} {
		got := payloadsOf(broker, key)
		for i := 1; i < len(got); i++ {
			var a, b int
			fmt.Sscan(got[i-1], &a)
			fmt.Sscan(got[i], &b)
			if a >= b {
				t.Fatalf("key %s published in the order %v", key, got)
			}
		}
	}
	if tally.count("mark and fetch") == 0 {
		t.Fatalf("no batch was recorded with the next read: %v", tally.counts)
	}
	if s := tally.count("signal"); s != 0 {
		t.Fatalf("the Client sent %d change signals while its relay held every partition alone", s)
	}

	if err := c.Stop(ctx); err != nil && !errors.Is(err, postbox.ErrNotStarted) {
		t.Fatal(err)
	}
	stopped = true
	if err := c.Write(ctx, postbox.Message{Topic: "orders.paid", Key: "k0", Payload: []byte("after")}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, func() bool { return tally.count("signal") > 0 })
}
