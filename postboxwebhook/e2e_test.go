package postboxwebhook_test

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/testdb"
	"github.com/postbox-go/postbox/postboxmigrate"
	"github.com/postbox-go/postbox/postboxpgx"
	"github.com/postbox-go/postbox/postboxwebhook"
)

// e2e is one end-to-end setup: PostgreSQL tables under a fresh prefix, a
// relay Client whose only route is a webhook Publisher, and a Receiver
// feeding an Inbox whose handler records each effect in a table, in the
// handler's transaction.
type e2e struct {
	t        *testing.T
	ctx      context.Context
	prefix   string
	pool     *pgxpool.Pool
	client   *postbox.Client[pgx.Tx]
	mu       sync.Mutex
	verdicts map[string][]postbox.Verdict // by message id, as the inbox gave them
}

// newE2E builds the setup. front wraps the Receiver (to fake an outage or
// a rejection); wrap wraps the inbox's Processor.
func newE2E(t *testing.T, cfg postbox.Config, front func(rc http.Handler) http.Handler, wrap func(p postbox.Processor) postbox.Processor) *e2e {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end test skipped in -short mode")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	relayPool, consumerPool := testdb.Pool(t), testdb.Pool(t)
	prefix := testdb.Prefix(t)
	testdb.DropPrefix(t, relayPool, prefix)
	m, err := postboxmigrate.New(postboxpgx.New(relayPool), &postboxmigrate.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := relayPool.Exec(ctx, `CREATE TABLE `+prefix+`effects (n bigserial PRIMARY KEY, id text NOT NULL, key text NOT NULL, i integer NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	e := &e2e{t: t, ctx: ctx, prefix: prefix, pool: relayPool, verdicts: map[string][]postbox.Verdict{}}

	inboxClient, err := postbox.NewClient(postboxpgx.New(consumerPool), &postbox.Config{Prefix: prefix, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	inbox := inboxClient.Inbox()
	var proc postbox.Processor = recording{e, inbox.Processor("webhook-e2e", func(ctx context.Context, tx pgx.Tx, d *postbox.Delivery) error {
		key, n, _ := strings.Cut(string(d.Payload), ":")
		i, err := strconv.Atoi(n)
		if err != nil || key != d.Key {
			return fmt.Errorf("payload %q does not match key %q", d.Payload, d.Key)
		}
		_, err = tx.Exec(ctx, `INSERT INTO `+prefix+`effects (id, key, i) VALUES ($1, $2, $3)`, d.ID, d.Key, i)
		return err
	})}
	if wrap != nil {
		proc = wrap(proc)
	}
	secret := newSecret(t)
	v, err := postboxwebhook.NewVerifier(secret)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := postboxwebhook.NewReceiver(v, proc, &postboxwebhook.ReceiverConfig{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	var h http.Handler = rc
	if front != nil {
		h = front(rc)
	}
	srv := server(t, h)
	pcfg := one(srv.URL+"/webhooks", secret)
	pcfg.Destinations[0].Topics = "orders.*"
	pcfg.Destinations[0].MaxInFlight = 16
	pub := publisher(t, pcfg)

	cfg.Prefix = prefix
	cfg.Routes = []postbox.Route{{Topics: "orders.*", Publisher: pub}}
	cfg.Logger = quiet
	e.client, err = postbox.NewClient(postboxpgx.New(relayPool), &cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// recording notes every verdict the inbox gives.
type recording struct {
	e *e2e
	p postbox.Processor
}

func (r recording) Process(ctx context.Context, d *postbox.Delivery) postbox.Verdict {
	v := r.p.Process(ctx, d)
	r.e.mu.Lock()
	r.e.verdicts[d.ID] = append(r.e.verdicts[d.ID], v)
	r.e.mu.Unlock()
	return v
}

// write writes perKey messages for each of keys keys, key by key
// interleaved over perKey transactions, and returns their ids by key and
// index.
func (e *e2e) write(keys, perKey int) map[string][]string {
	e.t.Helper()
	ids := map[string][]string{}
	for i := range perKey {
		msgs := make([]postbox.Message, 0, keys)
		for k := range keys {
			key := fmt.Sprintf("order-%02d", k)
			id := postbox.NewID()
			ids[key] = append(ids[key], id)
			msgs = append(msgs, postbox.Message{ID: id, Topic: "orders.changed", Key: key, Payload: fmt.Appendf(nil, "%s:%d", key, i), ContentType: "text/plain"})
		}
		if err := e.client.Write(e.ctx, msgs...); err != nil {
			e.t.Fatal(err)
		}
	}
	return ids
}

// run starts the relay and waits, polling the tables with a bound, until
// cond holds; then it stops the relay.
func (e *e2e) run(what string, cond func() bool) {
	e.t.Helper()
	if err := e.client.Start(e.ctx); err != nil {
		e.t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := e.client.Stop(ctx); err != nil {
			e.t.Errorf("stop: %v", err)
		}
	}()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-tick.C:
		case <-e.ctx.Done():
			e.t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func (e *e2e) count(query string, args ...any) int {
	e.t.Helper()
	var n int
	if err := e.pool.QueryRow(e.ctx, strings.ReplaceAll(query, "{p}", e.prefix), args...).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// checkEffects checks that the handler ran once for every id in want and
// for nothing else, each key's messages in write order. want[key][i] is
// the id of the key's message i, or "" for one that must have no effect.
func (e *e2e) checkEffects(want map[string][]string) {
	e.t.Helper()
	rows, err := e.pool.Query(e.ctx, `SELECT id, key, i FROM `+e.prefix+`effects ORDER BY n`)
	if err != nil {
		e.t.Fatal(err)
	}
	defer rows.Close()
	seen := map[string]bool{}
	last := map[string]int{}
	total := 0
	for rows.Next() {
		var id, key string
		var i int
		if err := rows.Scan(&id, &key, &i); err != nil {
			e.t.Fatal(err)
		}
		total++
		if seen[id] {
			e.t.Fatalf("message %s handled twice", id)
		}
		seen[id] = true
		if p, ok := last[key]; ok && i <= p {
			e.t.Fatalf("key %s: message %d handled after %d (order broken)", key, i, p)
		}
		last[key] = i
		if ids := want[key]; i >= len(ids) || ids[i] == "" || ids[i] != id {
			e.t.Fatalf("effect of an unexpected message %s (key %s, index %d)", id, key, i)
		}
	}
	if err := rows.Err(); err != nil {
		e.t.Fatal(err)
	}
	n := 0
	for _, ids := range want {
		for _, id := range ids {
			if id != "" {
				n++
			}
		}
	}
	if total != n {
		e.t.Fatalf("%d effects, want %d", total, n)
	}
}

// TestEndToEnd: 500 messages over 20 keys go from PostgreSQL through the
// relay and this Publisher to a Receiver and an Inbox on PostgreSQL. The
// receiver is down (503) for its first requests, and for some messages it
// commits the effect but loses the answer (503 after the commit), so the
// relay sends them again. Every message takes effect once, each key in
// write order, and none spends an attempt.
func TestEndToEnd(t *testing.T) {
	const keys, perKey, outage = 20, 25, 40
	var refused atomic.Int32
	var lost sync.Map
	var lostN atomic.Int32
	e := newE2E(t, postbox.Config{},
		func(rc http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if refused.Add(1) <= outage {
					w.Header().Set("Retry-After", "1")
					http.Error(w, "down for maintenance", http.StatusServiceUnavailable)
					return
				}
				rc.ServeHTTP(w, r)
			})
		},
		func(p postbox.Processor) postbox.Processor {
			return processorFunc(func(ctx context.Context, d *postbox.Delivery) postbox.Verdict {
				v := p.Process(ctx, d)
				// The messages whose index ends in 0 lose the answer to
				// their first (committed) run: the relay hears 503 and
				// sends them again.
				if v.Action == postbox.Ack && !v.Duplicate && d.Payload[len(d.Payload)-1] == '0' {
					if _, dup := lost.LoadOrStore(d.ID, true); !dup {
						lostN.Add(1)
						return postbox.Verdict{Action: postbox.Retry}
					}
				}
				return v
			})
		})
	ids := e.write(keys, perKey)
	e.run("every message handled", func() bool {
		return e.count(`SELECT count(*) FROM {p}effects`) == keys*perKey && e.count(`SELECT count(*) FROM {p}outbox`) == 0
	})
	e.checkEffects(ids)
	if n := e.count(`SELECT count(*) FROM {p}published`); n != keys*perKey {
		t.Fatalf("%d published rows, want %d", n, keys*perKey)
	}
	if n := e.count(`SELECT count(*) FROM {p}published WHERE attempts <> 0`); n != 0 {
		t.Fatalf("%d messages spent attempts; a 503 is an infrastructure failure and must spend none", n)
	}
	if n := e.count(`SELECT count(*) FROM {p}dead`); n != 0 {
		t.Fatalf("%d dead messages", n)
	}
	if refused.Load() <= outage {
		t.Fatalf("the outage refused only %d requests", refused.Load())
	}
	if lostN.Load() == 0 {
		t.Fatal("no answer was lost; the test proves nothing about copies")
	}
	// Every lost answer made a copy, and the inbox ran no handler for it.
	copies := 0
	e.mu.Lock()
	defer e.mu.Unlock()
	lost.Range(func(id, _ any) bool {
		vs := e.verdicts[id.(string)]
		if len(vs) < 2 || vs[0].Duplicate || !vs[len(vs)-1].Duplicate {
			t.Errorf("message %s with a lost answer: verdicts %+v, want a first run then a duplicate", id, vs)
		}
		copies++
		return true
	})
	t.Logf("%d requests refused by the outage, %d answers lost and their copies absorbed", outage, copies)
}

// TestEndToEndRejectedGoesDead: a receiver that answers 422 for one
// message makes the relay spend that message's attempts and move it to
// the dead table after the budget, while every other message, later ones
// of its key included, takes effect.
func TestEndToEndRejectedGoesDead(t *testing.T) {
	const keys, perKey, budget = 5, 10, 3
	var poison atomic.Value
	var rejections atomic.Int32
	e := newE2E(t, postbox.Config{MaxAttempts: budget, BackoffBase: time.Millisecond, BackoffMax: 5 * time.Millisecond},
		func(rc http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if id, _ := poison.Load().(string); id != "" && r.Header.Get("webhook-id") == id {
					rejections.Add(1)
					http.Error(w, "order 3 is malformed", http.StatusUnprocessableEntity)
					return
				}
				rc.ServeHTTP(w, r)
			})
		}, nil)
	ids := e.write(keys, perKey)
	bad := ids["order-02"][3]
	poison.Store(bad)
	e.run("the rejected message dead and the rest handled", func() bool {
		return e.count(`SELECT count(*) FROM {p}dead`) == 1 && e.count(`SELECT count(*) FROM {p}outbox`) == 0
	})
	var attempts int
	var lastError string
	if err := e.pool.QueryRow(e.ctx, `SELECT attempts, last_error FROM `+e.prefix+`dead WHERE id = $1`, bad).Scan(&attempts, &lastError); err != nil {
		t.Fatalf("the rejected message is not in the dead table: %v", err)
	}
	if attempts != budget || int(rejections.Load()) != budget {
		t.Fatalf("dead after %d attempts and %d rejections, want %d", attempts, rejections.Load(), budget)
	}
	if !strings.Contains(lastError, "422") || !strings.Contains(lastError, "order 3 is malformed") {
		t.Fatalf("last_error %q does not tell the receiver's answer", lastError)
	}
	ids["order-02"][3] = "" // dead: no effect
	e.checkEffects(ids)
	if n := e.count(`SELECT count(*) FROM {p}published WHERE attempts <> 0`); n != 0 {
		t.Fatalf("%d published messages spent attempts", n)
	}
}

type processorFunc func(ctx context.Context, d *postbox.Delivery) postbox.Verdict

func (f processorFunc) Process(ctx context.Context, d *postbox.Delivery) postbox.Verdict {
	return f(ctx, d)
}
