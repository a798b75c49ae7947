package postboxdrivertest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/postboxdriver"
)

// The crash tests run relays in processes of their own: the suite starts
// the test binary again with these variables set, and the driver's
// TestMain hands the process to Child.
const (
	childDB      = "POSTBOXDRIVERTEST_CHILD_DB"
	childPrefix  = "POSTBOXDRIVERTEST_CHILD_PREFIX"
	childPoison  = "POSTBOXDRIVERTEST_CHILD_POISON"
	childLog     = "POSTBOXDRIVERTEST_CHILD_LOG"
	childDelay   = "POSTBOXDRIVERTEST_CHILD_DELAY" // each publish's, in milliseconds
	childHeld    = "POSTBOXDRIVERTEST_CHILD_HELD"  // above 0: BlockOnDead, and this many rows stay pending
	childCrashes = 3                               // the children's MaxCrashes
)

// Child runs a relay of the crash tests and exits when the process was
// started as one; otherwise it returns at once. Call it first in the
// driver's TestMain, with open reaching the database Harness.Locate named.
//
// The relay acknowledges every message, appending its key, payload and id
// to a log the test reads, except the poison payload, on which it exits
// with status 1 as a publisher killing the process would. Once nothing is
// pending (with BlockOnDead, no more than the rows the test says a dead
// message holds) it stops and exits with status 0.
func Child[TTx any](open func(locator string) (postboxdriver.Driver[TTx], error)) {
	locator := os.Getenv(childDB)
	if locator == "" {
		return
	}
	if err := runChild(open, locator); err != nil {
		fmt.Fprintln(os.Stderr, "crash child:", err)
		os.Exit(2)
	}
	os.Exit(0)
}

func runChild[TTx any](open func(string) (postboxdriver.Driver[TTx], error), locator string) error {
	d, err := open(locator)
	if err != nil {
		return err
	}
	log, err := os.OpenFile(os.Getenv(childLog), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600) //nolint:gosec // the test's own file
	if err != nil {
		return err
	}
	defer log.Close()
	delay, _ := strconv.Atoi(os.Getenv(childDelay))
	held, _ := strconv.Atoi(os.Getenv(childHeld))
	pub := &childPublisher{log: log, poison: os.Getenv(childPoison), delay: time.Duration(delay) * time.Millisecond}
	// A short lease: each relay after a crash waits out the lease of the
	// one before it, and only one child runs at a time. The batch deadline
	// stays that of a one-second lease: a quarter of it bounds a crash
	// mark, which a database slowed by the race detector must still take.
	c, err := postbox.NewClient(d, &postbox.Config{
		Prefix: os.Getenv(childPrefix), Publisher: pub,
		LeaseDuration: 500 * time.Millisecond, BatchDeadline: time.Second / 3,
		PollInterval: 10 * time.Millisecond, MaxCrashes: childCrashes, BlockOnDead: held > 0,
	})
	if err != nil {
		return err
	}
	ctx := context.Background()
	if err := c.Start(ctx); err != nil {
		return err
	}
	store, err := d.Open(os.Getenv(childPrefix))
	if err != nil {
		return err
	}
	for {
		time.Sleep(20 * time.Millisecond)
		st, err := store.Stats(ctx)
		if err != nil {
			return err
		}
		if st.Pending <= int64(held) {
			break
		}
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return c.Stop(sctx)
}

type childPublisher struct {
	mu     sync.Mutex
	log    *os.File
	poison string
	delay  time.Duration
}

func (p *childPublisher) Publish(_ context.Context, env *postbox.Envelope, done func(error)) {
	if p.poison != "" && string(env.Payload) == p.poison {
		os.Exit(1)
	}
	time.Sleep(p.delay)
	p.mu.Lock()
	_, err := fmt.Fprintf(p.log, "%s %s %s\n", env.Key, env.Payload, env.ID)
	p.mu.Unlock()
	done(err)
}

// crashRun is one crash test: its database, and the log its children
// append their acknowledgements to.
type crashRun[TTx any] struct {
	s    *suite[TTx]
	e    *env[TTx]
	log  string
	held int // above 0: the children run with BlockOnDead and leave this many rows pending
}

func (s *suite[TTx]) newCrashRun(t *testing.T) *crashRun[TTx] {
	if s.h.Locate == nil {
		t.Fatal("Harness.Locate is nil: the crash tests run relays in child processes")
	}
	return &crashRun[TTx]{s: s, e: s.setup(t), log: t.TempDir() + "/acks"}
}

// childProc is a relay process of a crash test.
type childProc struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once it exited and err is set
	err  error
}

// wait waits for the relay to exit and returns how it did.
func (c *childProc) wait() error {
	<-c.done
	return c.err
}

// child starts a relay process; poison is the payload it dies on, delay
// what each publish takes. It is killed when the test ends.
func (r *crashRun[TTx]) child(t *testing.T, poison string, delay time.Duration) *childProc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$") //nolint:gosec // the test binary itself
	cmd.Env = append(os.Environ(), childDB+"="+r.s.h.Locate(t, r.e.d), childPrefix+"="+r.e.prefix,
		childPoison+"="+poison, childLog+"="+r.log, childDelay+"="+strconv.Itoa(int(delay.Milliseconds())),
		childHeld+"="+strconv.Itoa(r.held))
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &childProc{cmd: cmd, done: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-c.done
	})
	return c
}

// acks reads the children's acknowledgements in the order they were made.
func (r *crashRun[TTx]) acks(t *testing.T) []*postbox.Envelope {
	t.Helper()
	f, err := os.Open(r.log)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []*postbox.Envelope
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		parts := strings.Fields(sc.Text())
		if len(parts) != 3 {
			t.Fatalf("ack line %q", sc.Text())
		}
		out = append(out, &postbox.Envelope{Key: parts[0], Payload: []byte(parts[1]), ID: parts[2]})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// checkFirstAcks asserts that, per key, the first acknowledgement of each
// message comes in write order, and that every message of want (per key,
// payloads "<key>:<n>" for n below the count) but those in skip was
// acknowledged.
func checkFirstAcks(t *testing.T, acked []*postbox.Envelope, want map[string]int, skip map[string]bool) {
	t.Helper()
	seen := map[string]bool{}
	last := map[string]int{}
	got := map[string]bool{}
	for _, env := range acked {
		if seen[env.ID] {
			continue
		}
		seen[env.ID] = true
		_, num, _ := strings.Cut(string(env.Payload), ":")
		n, err := strconv.Atoi(num)
		if err != nil {
			t.Fatalf("payload %q: %v", env.Payload, err)
		}
		if prev, ok := last[env.Key]; ok && n <= prev {
			t.Fatalf("key %s: message %d acknowledged first after message %d", env.Key, n, prev)
		}
		last[env.Key] = n
		got[string(env.Payload)] = true
	}
	for k, n := range want {
		for i := range n {
			p := fmt.Sprintf("%s:%d", k, i)
			if !got[p] && !skip[p] {
				t.Errorf("message %s never acknowledged", p)
			}
		}
	}
}

// writeCrashRows writes n messages on each of keys, payloads "<key>:<i>",
// in one transaction.
func (r *crashRun[TTx]) writeCrashRows(t *testing.T, keys []string, n int) map[string]int {
	t.Helper()
	c := r.e.client(t, nil, postbox.Config{})
	want := map[string]int{}
	var msgs []postbox.Message
	for i := range n {
		for _, k := range keys {
			msgs = append(msgs, postbox.Message{Topic: "test.crash", Key: k, Payload: fmt.Appendf(nil, "%s:%d", k, i)})
			want[k]++
		}
	}
	if err := c.Write(context.Background(), msgs...); err != nil {
		t.Fatal(err)
	}
	return want
}

// crashLoopBounded: a message on which the relay's publisher exits kills
// the relays that take it up, until the crashes counted against it reach
// MaxCrashes; then it is a dead message naming the count, and every other
// message, its key's later ones included, is published in key order.
//
// The first relay dies publishing its batch with no marks (it took free
// partitions); the next, taking them after the lease ran out, publishes
// them marked together and dies, which makes the rows in flight suspects;
// each relay after that publishes the message alone and dies, one crash
// counted each; the relay after MaxCrashes of those buries it. So
// MaxCrashes+2 relays die, and one more for each batch a database too busy
// to take its marks in time had published without them.
func (s *suite[TTx]) crashLoopBounded(t *testing.T) {
	r := s.newCrashRun(t)
	want := r.writeCrashRows(t, keys(6), 5)
	const poison = "key-3:2"
	deaths := r.untilBuried(t, poison)
	if deaths < childCrashes+2 {
		t.Errorf("%d relays died; at least %d must have (one unmarked, one marked with others, %d alone)", deaths, childCrashes+2, childCrashes)
	}
	t.Logf("%d relays died before the poison message was dead", deaths)
	dead, err := r.e.store.ListDeadMessages(context.Background(), postboxdriver.DeadFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(dead) != 1 || string(dead[0].Payload) != poison {
		t.Fatalf("dead messages %+v, want the poison message alone", dead)
	}
	if want := fmt.Sprintf("%d relays died", childCrashes); !strings.Contains(dead[0].Error, want) {
		t.Errorf("dead message's error %q does not say %q", dead[0].Error, want)
	}
	if st := r.e.stats(t); st.Pending != 0 {
		t.Errorf("%d messages still pending", st.Pending)
	}
	checkFirstAcks(t, r.acks(t), want, map[string]bool{poison: true})
	t.Run("BlockOnDeadHoldsItsKey", s.crashBuriedHoldsKey)
}

// untilBuried starts relay after relay, each dying on the poison payload,
// until one exits cleanly, and returns how many died.
func (r *crashRun[TTx]) untilBuried(t *testing.T, poison string) int {
	t.Helper()
	const most = 50 // a bound on the loop, far above what a loaded machine takes
	deaths := 0
	for {
		err := r.child(t, poison, 0).wait()
		var exit *exec.ExitError
		if err == nil {
			return deaths
		}
		if !errors.As(err, &exit) || exit.ExitCode() != 1 {
			t.Fatalf("relay process: %v", err)
		}
		deaths++
		if deaths > most {
			t.Fatalf("%d relays died on the poison message; it should be dead after %d", deaths, childCrashes+2)
		}
	}
}

// crashBuriedHoldsKey: with BlockOnDead, a message buried after MaxCrashes
// holds its key's later messages, as any dead message does, while every
// other message is published in key order; a relay without BlockOnDead
// then publishes the two it held, in order.
func (s *suite[TTx]) crashBuriedHoldsKey(t *testing.T) {
	ctx := context.Background()
	r := s.newCrashRun(t)
	r.held = 2 // key-3:3 and key-3:4
	want := r.writeCrashRows(t, keys(6), 5)
	const poison = "key-3:2"
	r.untilBuried(t, poison)
	dead, err := r.e.store.ListDeadMessages(ctx, postboxdriver.DeadFilter{})
	if err != nil || len(dead) != 1 || string(dead[0].Payload) != poison {
		t.Fatalf("dead messages %+v, %v; want the poison message alone", dead, err)
	}
	behind := map[string]bool{poison: true, "key-3:3": true, "key-3:4": true}
	acked := r.acks(t)
	for _, env := range acked {
		if behind[string(env.Payload)] {
			t.Fatalf("%s published behind the buried message with BlockOnDead", env.Payload)
		}
	}
	checkFirstAcks(t, acked, want, behind)
	rec := &recorder{}
	if res, err := r.e.client(t, rec, postbox.Config{BlockOnDead: true}).Drain(ctx); err != nil || res.Published != 0 || res.Waiting != 2 {
		t.Fatalf("Drain with BlockOnDead = %+v, %v; want nothing published, 2 waiting", res, err)
	}
	if res, err := r.e.client(t, rec, postbox.Config{}).Drain(ctx); err != nil || res.Published != 2 || res.Waiting != 0 {
		t.Fatalf("Drain without BlockOnDead = %+v, %v; want the 2 held published", res, err)
	}
	var got []string
	for _, env := range rec.snapshot() {
		got = append(got, string(env.Payload))
	}
	if fmt.Sprint(got) != "[key-3:3 key-3:4]" {
		t.Fatalf("published %v after the buried message, want [key-3:3 key-3:4]", got)
	}
}

// unrelatedKillsBuryNothing: relays killed with SIGKILL while they publish
// innocent messages, again and again, each after taking the partitions of
// the one killed before (so that they publish with crash marks), bury
// nothing and lose nothing. The kills come at times of their own, not
// chosen by the publishes, as a deploy's would.
func (s *suite[TTx]) unrelatedKillsBuryNothing(t *testing.T) {
	r := s.newCrashRun(t)
	want := r.writeCrashRows(t, keys(8), 300)
	const kills = 6
	for range kills {
		c := r.child(t, "", 2*time.Millisecond)
		before := len(r.acks(t))
		exited := false
		eventually(t, time.Minute, "a relay to publish", func() bool {
			select {
			case <-c.done:
				exited = true
				return true
			default:
				return len(r.acks(t)) > before
			}
		})
		if exited {
			if c.err != nil {
				t.Fatalf("relay process: %v", c.err)
			}
			break // it published everything before its kill
		}
		time.Sleep(time.Duration(rand.N(400)) * time.Millisecond) //nolint:gosec // kills at times of their own
		_ = c.cmd.Process.Kill()
		if c.wait() == nil {
			break // it finished before the kill
		}
	}
	if err := r.child(t, "", 0).wait(); err != nil {
		t.Fatalf("last relay: %v", err)
	}
	dead, err := r.e.store.ListDeadMessages(context.Background(), postboxdriver.DeadFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(dead) != 0 {
		t.Fatalf("%d innocent messages dead, first %s: %s", len(dead), dead[0].Payload, dead[0].Error)
	}
	if st := r.e.stats(t); st.Pending != 0 {
		t.Errorf("%d messages still pending", st.Pending)
	}
	checkFirstAcks(t, r.acks(t), want, nil)
}
