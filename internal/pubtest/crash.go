package pubtest

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/internal/procfunc"
	"github.com/postbox-go/postbox/internal/testdb"
	"github.com/postbox-go/postbox/postboxdriver"
	"github.com/postbox-go/postbox/postboxmigrate"
	"github.com/postbox-go/postbox/postboxpgx"
)

// The crash-loop test: a consumer process that exits on a chosen payload,
// restarted until the message is a consumer dead message. The test binary
// runs itself again as the consumer (a child), told what to do by one
// environment variable.
const (
	crashEnv = "POSTBOX_TEST_CRASH_CHILD"
	// CrashExit is the exit code of a child that met the poison payload.
	CrashExit = 3
	// CrashLimit is the children's Config.MaxCrashes.
	CrashLimit = 2
	// CrashConsumer is the children's consumer name.
	CrashConsumer = "billing"
	// crashBound bounds one child's run: a child that is not done by then
	// fails, so that no test hangs.
	crashBound = 2 * time.Minute
)

// CrashCase is what a child consumes, and until when.
type CrashCase struct {
	DB     string // "postgres" or "sqlite"
	Prefix string // the tables' prefix
	Path   string // the SQLite file
	// Poison is the payload the child's handler exits on, PoisonID the
	// message's id; empty for a child that only consumes good messages.
	Poison, PoisonID string
	// Want is the effects (handler runs that committed) the child waits
	// for before it ends; with Poison, also Poison's dead message.
	Want int64
	// Batch runs the inbox's BatchProcessor instead of its Processor.
	Batch bool
	// Vars are the broker's: its address, the stream or queue.
	Vars map[string]string
}

// CrashChild returns the case this process is a child for, if it is one.
// A test that runs children calls it first, and when it reports a case,
// consumes it (RunCrashChild) instead of testing.
func CrashChild(t testing.TB) (CrashCase, bool) {
	v := os.Getenv(crashEnv)
	if v == "" {
		return CrashCase{}, false
	}
	var c CrashCase
	if err := json.Unmarshal([]byte(v), &c); err != nil {
		t.Fatalf("%s: %v", crashEnv, err)
	}
	return c, true
}

// CrashInbox is a child's consumer, or the test's view of its tables: an
// Inbox whose handler's effect is one outbox message per committed run.
type CrashInbox struct {
	processor func(poison string, batch bool) postbox.Processor
	effects   func() (int64, error)
	dead      func(id string) (postbox.DeadMessage, error)
	count     func(table string) (int, error)
}

// OpenCrashInbox opens c's database, on PostgreSQL or on SQLite (opened
// by sqlite, sqlitetest.DriverAt), with a fresh prefix or file in the
// test when c names none (which it then names), and returns its consumer.
func OpenCrashInbox[D postboxdriver.Driver[*sql.Tx]](t testing.TB, c *CrashCase, sqlite func(t testing.TB, path string) D) *CrashInbox {
	t.Helper()
	switch c.DB {
	case "postgres":
		pool := testdb.Pool(t)
		if c.Prefix == "" {
			c.Prefix = testdb.Prefix(t)
			testdb.DropPrefix(t, pool, c.Prefix)
		}
		return newCrashInbox(t, postboxpgx.New(pool), *c, func(ctx context.Context, table string) (n int, err error) {
			err = pool.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n)
			return n, err
		})
	case "sqlite":
		if c.Path == "" {
			c.Path = filepath.Join(t.TempDir(), "crash.db")
		}
		c.Prefix = postbox.DefaultPrefix
		d := sqlite(t, c.Path)
		db := any(d).(interface{ DB() *sql.DB }).DB()
		return newCrashInbox[*sql.Tx](t, d, *c, func(ctx context.Context, table string) (n int, err error) {
			err = db.QueryRowContext(ctx, "SELECT count(*) FROM "+table).Scan(&n)
			return n, err
		})
	}
	t.Fatalf("unknown database %q", c.DB)
	return nil
}

// newCrashInbox migrates d's tables under c.Prefix (again, in a child: a
// no-op) and returns the consumer. count returns how many rows a table
// has; the test checks with it that first deliveries wrote nothing but
// their inbox records.
func newCrashInbox[TTx any](t testing.TB, d postboxdriver.Driver[TTx], c CrashCase, count func(ctx context.Context, table string) (int, error)) *CrashInbox {
	t.Helper()
	m, err := postboxmigrate.New(d, &postboxmigrate.Config{Prefix: c.Prefix})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Up(context.Background()); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	client, err := postbox.NewClient(d, &postbox.Config{Prefix: c.Prefix, MaxCrashes: CrashLimit, BackoffBase: 5 * time.Millisecond, BackoffMax: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	in := client.Inbox()
	h := func(poison string) postbox.Handler[TTx] {
		return func(ctx context.Context, tx TTx, d *postbox.Delivery) error {
			if err := client.WriteTx(ctx, tx, postbox.Message{Topic: "effect", Payload: d.Payload}); err != nil {
				return err
			}
			if poison != "" && string(d.Payload) == poison {
				// The process ends with the handler's transaction open, as
				// after an out-of-memory kill or a panic in another
				// goroutine.
				os.Exit(CrashExit)
			}
			return nil
		}
	}
	return &CrashInbox{
		processor: func(poison string, batch bool) postbox.Processor {
			if !batch {
				return in.Processor(CrashConsumer, h(poison))
			}
			p, err := in.BatchProcessor(CrashConsumer, h(poison), &postbox.BatchConfig{MaxBatch: 8})
			if err != nil {
				t.Fatal(err)
			}
			return p
		},
		effects: func() (int64, error) {
			st, err := client.Stats(context.Background())
			return st.Pending, err
		},
		dead: func(id string) (postbox.DeadMessage, error) {
			return in.GetDead(context.Background(), CrashConsumer, id)
		},
		count: func(table string) (int, error) { return count(context.Background(), c.Prefix+table) },
	}
}

// done reports whether a child has consumed what c asks for.
func (ci *CrashInbox) done(c CrashCase) (bool, error) {
	n, err := ci.effects()
	if err != nil || n < c.Want {
		return false, err
	}
	if c.Poison == "" {
		return true, nil
	}
	_, err = ci.dead(c.PoisonID)
	if errors.Is(err, postboxdriver.ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}

// RunCrashChild consumes with sub through ci until c is done, when it
// returns; the poison payload ends the process with CrashExit.
func RunCrashChild(t testing.TB, ci *CrashInbox, c CrashCase, sub postbox.Subscriber) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), crashBound)
	defer cancel()
	if ok, err := ci.done(c); err != nil || ok {
		if err != nil {
			t.Fatal(err)
		}
		return
	}
	inner := ci.processor(c.Poison, c.Batch)
	p := procfunc.Wrapping(inner, procfunc.Func(func(ctx context.Context, d *postbox.Delivery) postbox.Verdict {
		v := inner.Process(ctx, d)
		if ok, err := ci.done(c); ok || err != nil {
			cancel()
		}
		return v
	}))
	err := sub.Run(ctx, p)
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatalf("child: not done within %s", crashBound)
	}
	if err != nil {
		t.Fatalf("child: Run: %v", err)
	}
	if ok, err := ci.done(c); !ok || err != nil {
		t.Fatalf("child: Run ended before the case was done (%v)", err)
	}
}

// RunCrashChildren runs children of this test binary for c, one after the
// other, until one ends done, and returns how many ended with CrashExit.
// A child that fails otherwise, or more than maxStarts of them, fails the
// test.
func RunCrashChildren(t testing.TB, c CrashCase, maxStarts int) int {
	t.Helper()
	env, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	top, _, _ := strings.Cut(t.Name(), "/")
	crashes := 0
	for start := 1; start <= maxStarts; start++ {
		ctx, cancel := context.WithTimeout(context.Background(), crashBound+time.Minute)
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^"+regexp.QuoteMeta(top)+"$", "-test.count=1", "-test.v") //nolint:gosec // this test binary, run again
		cmd.Env = append(os.Environ(), crashEnv+"="+string(env))
		out, err := cmd.CombinedOutput()
		cancel()
		var ee *exec.ExitError
		switch {
		case err == nil:
			return crashes
		case errors.As(err, &ee) && ee.ExitCode() == CrashExit:
			crashes++
		default:
			t.Fatalf("child %d: %v\n%s", start, err, out)
		}
	}
	t.Fatalf("the case is not done after %d children (%d crashed)", maxStarts, crashes)
	return crashes
}

// Effects returns the effects committed so far.
func (ci *CrashInbox) Effects(t testing.TB) int64 {
	t.Helper()
	n, err := ci.effects()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// Rows returns how many rows table (without the prefix) has.
func (ci *CrashInbox) Rows(t testing.TB, table string) int {
	t.Helper()
	n, err := ci.count(table)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// Dead returns the consumer dead message of id, failing the test when
// there is none.
func (ci *CrashInbox) Dead(t testing.TB, id string) postbox.DeadMessage {
	t.Helper()
	d, err := ci.dead(id)
	if err != nil {
		t.Fatalf("the dead message of %s: %v", id, err)
	}
	return d
}

// CheckCrashLoop runs the whole case against a broker: pub publishes the
// envelopes envelope makes of messages (topic, key, payload; the key also
// in ce-partitionkey); setAckWait, when the broker redelivers after a
// wait, sets it (long while first deliveries are counted, short while the
// poison is redelivered).
//
// First, good messages of three keys are consumed by one child, and the
// inbox's attempt table must stay empty: a first delivery writes nothing
// but its inbox record. Then a poison message is published between two
// messages of its key, with more messages of the other keys; children run
// until the poison is a consumer dead message, which takes exactly
// CrashLimit+1 crashes (the first delivery's crash is not counted, as it
// wrote nothing), and every other message is applied once.
func CheckCrashLoop(t *testing.T, ci *CrashInbox, c CrashCase, pub postbox.Publisher, envelope func(m postbox.Message) *postbox.Envelope, setAckWait func(long bool)) {
	publish := func(msgs []postbox.Message) []string {
		ids := make([]string, len(msgs))
		for i, m := range msgs {
			env := envelope(m)
			env.Key = m.Key
			env.Headers[postbox.HeaderPartitionKey] = m.Key
			if err := Publish(t, context.Background(), pub, env, 20*time.Second); err != nil {
				t.Fatal(err)
			}
			ids[i] = env.ID
		}
		return ids
	}
	t.Helper()
	keys := []string{"k1", "k2", "k3"}
	var first []postbox.Message
	for i := range 6 {
		first = append(first, postbox.Message{Topic: "orders.paid", Key: keys[i%3], Payload: []byte("good-1-" + string(rune('a'+i)))})
	}
	if setAckWait != nil {
		setAckWait(true)
	}
	publish(first)
	c.Want = int64(len(first))
	if n := RunCrashChildren(t, c, 1); n != 0 {
		t.Fatalf("%d crashes with no poison", n)
	}
	if n := ci.Rows(t, "inbox_attempts"); n != 0 {
		t.Fatalf("first deliveries wrote %d rows of inbox_attempts, want none", n)
	}

	second := []postbox.Message{
		{Topic: "orders.paid", Key: "k1", Payload: []byte("good-2-a")},
		{Topic: "orders.paid", Key: "k1", Payload: []byte("poison")},
		{Topic: "orders.paid", Key: "k1", Payload: []byte("good-2-b")},
		{Topic: "orders.paid", Key: "k2", Payload: []byte("good-2-c")},
		{Topic: "orders.paid", Key: "k3", Payload: []byte("good-2-d")},
	}
	if setAckWait != nil {
		setAckWait(false)
	}
	ids := publish(second)
	c.Poison, c.PoisonID = "poison", ids[1]
	c.Want += int64(len(second) - 1)
	crashes := RunCrashChildren(t, c, CrashLimit+4)
	if crashes != CrashLimit+1 {
		t.Errorf("%d crashes before the poison was dead, want %d (MaxCrashes %d, and the uncounted first delivery)", crashes, CrashLimit+1, CrashLimit)
	}
	d := ci.Dead(t, c.PoisonID)
	if string(d.Payload) != "poison" || d.Key != "k1" || !strings.Contains(d.Error, "never returned") || !strings.Contains(d.Error, fmt.Sprintf("%d redeliveries", CrashLimit)) {
		t.Errorf("dead message: key %q payload %q error %q", d.Key, d.Payload, d.Error)
	}
	if n := ci.Effects(t); n != c.Want {
		t.Errorf("%d effects, want %d: every other message applied once", n, c.Want)
	}
}
