package postboxdrivertest

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/postboxdriver"
	"github.com/postbox-go/postbox/postboxmigrate"
)

// RunExcept runs the suite against h but for the subtests named in
// unbuilt, each skipped with the reason given: for a Store being built up
// to the contract, so that what it passes is held and what it lacks is
// listed where every run shows it. A name is a subtest's path under the
// suite ("Admin/Replay"), and takes the subtests under it along. A name
// that matches no subtest fails the test, so the list cannot outlive what
// it names. A Store is only done once Run passes whole.
func RunExcept[TTx any](t *testing.T, h Harness[TTx], unbuilt map[string]string) {
	var mu sync.Mutex
	seen := map[string]bool{}
	top := t.Name() + "/"
	newDriver := h.New
	h.New = func(t *testing.T) (postboxdriver.Driver[TTx], string) {
		name := strings.TrimPrefix(t.Name(), top)
		for key, why := range unbuilt {
			if name == key || strings.HasPrefix(name, key+"/") {
				mu.Lock()
				seen[key] = true
				mu.Unlock()
				t.Skipf("not built yet: %s", why)
			}
		}
		return newDriver(t)
	}
	Run(t, h)
	if filtered() {
		return // a -run or -skip pattern may have left the names out
	}
	for key := range unbuilt {
		if !seen[key] {
			t.Errorf("RunExcept: %q names no subtest of the suite", key)
		}
	}
}

// filtered reports whether the go test flags select among the tests.
func filtered() bool {
	for _, name := range []string{"test.run", "test.skip"} {
		if f := flag.Lookup(name); f != nil && f.Value.String() != "" {
			return true
		}
	}
	return false
}

// Run runs the whole storage conformance suite against h.
func Run[TTx any](t *testing.T, h Harness[TTx]) {
	s := &suite[TTx]{h: h}
	t.Run("MigrateIdempotent", s.migrateIdempotent)
	t.Run("RollbackWritesNothing", s.rollbackWritesNothing)
	t.Run("BadInputWritesNothing", s.badInputWritesNothing)
	t.Run("TableContractRules", s.tableContractRules)
	t.Run("SQLInjection", s.sqlInjection)
	t.Run("PartitionMatchesGo", s.partitionMatchesGo)
	t.Run("LeasesExclusive", s.leasesExclusive)
	t.Run("ConcurrentClaimersNeverShare", s.concurrentClaimersNeverShare)
	t.Run("LeaseExpiryAndReclaim", s.leaseExpiryAndReclaim)
	t.Run("StaleMarkChangesNothing", s.staleMarkChangesNothing)
	t.Run("FetchHoldsBackRetriedKey", s.fetchHoldsBackRetriedKey)
	t.Run("FetchRoutedTopics", s.fetchRoutedTopics)
	t.Run("PerKeyOrder", s.perKeyOrder)
	t.Run("ReplicasKeepKeyOrder", s.replicasKeepKeyOrder)
	t.Run("RollingRestartSendsNothingTwice", s.rollingRestart)
	t.Run("OutOfOrderCommitNotSkipped", s.outOfOrderCommit)
	t.Run("BackoffThenDead", s.backoffThenDead)
	t.Run("LongPublishErrorStored", s.longPublishError)
	t.Run("BlockOnDead", s.blockOnDead)
	t.Run("BlockOnDeadHoldsLaterWrites", s.blockOnDeadHoldsLaterWrites)
	t.Run("InfrastructureErrorSpendsNoAttempt", s.infraSpendsNoAttempt)
	t.Run("StopReleasesLeases", s.stopReleases)
	t.Run("CrashedRelayRecovered", s.crashedRelayRecovered)
	t.Run("CrashLoopBounded", s.crashLoopBounded)
	t.Run("UnrelatedKillsBuryNothing", s.unrelatedKillsBuryNothing)
	t.Run("Failures", s.runFailures)
	t.Run("Executor", s.runExecutor)
	t.Run("Admin", s.runAdmin)
	t.Run("Inbox", s.runInbox)
}

type suite[TTx any] struct {
	h Harness[TTx]
}

type env[TTx any] struct {
	d      postboxdriver.Driver[TTx]
	prefix string
	store  postboxdriver.Store[TTx]
}

func (s *suite[TTx]) setup(t *testing.T) *env[TTx] {
	t.Helper()
	d, prefix := s.h.New(t)
	m, err := postboxmigrate.New(d, &postboxmigrate.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Up(context.Background()); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	if s.h.Migrated != nil {
		s.h.Migrated(t, d, prefix)
	}
	store, err := d.Open(prefix)
	if err != nil {
		t.Fatal(err)
	}
	return &env[TTx]{d: d, prefix: prefix, store: store}
}

// client makes a Client with fast test timings; cfg fields left zero get
// those timings rather than the production defaults.
func (e *env[TTx]) client(t *testing.T, pub postbox.Publisher, cfg postbox.Config) *postbox.Client[TTx] {
	t.Helper()
	cfg.Prefix = e.prefix
	cfg.Publisher = pub
	if cfg.LeaseDuration == 0 {
		cfg.LeaseDuration = 2 * time.Second
	}
	if cfg.BackoffBase == 0 {
		cfg.BackoffBase = 5 * time.Millisecond
		cfg.BackoffMax = 20 * time.Millisecond
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 10 * time.Millisecond
	}
	c, err := postbox.NewClient(e.d, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func start[TTx any](t *testing.T, c *postbox.Client[TTx]) {
	t.Helper()
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := c.Stop(ctx); err != nil && !errors.Is(err, postbox.ErrNotStarted) {
			t.Errorf("stop: %v", err)
		}
	})
}

// failStatement runs a statement that fails in tx: one on the tables of a
// prefix that was never migrated. On PostgreSQL it aborts tx until a
// rollback (to a savepoint).
func (e *env[TTx]) failStatement(t *testing.T, ctx context.Context, tx TTx) error {
	t.Helper()
	missing, err := e.d.Open(e.prefix + "missing_")
	if err != nil {
		t.Fatal(err)
	}
	_, err = missing.UnwrapExecutor(tx).Stats(ctx)
	if err == nil {
		return errors.New("a statement on missing tables succeeded")
	}
	return err
}

func (e *env[TTx]) stats(t *testing.T) postboxdriver.Stats {
	t.Helper()
	st, err := e.store.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// eventually polls cond until it holds, failing the test after limit.
func eventually(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", limit, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (e *env[TTx]) drained(t *testing.T) {
	t.Helper()
	eventually(t, 30*time.Second, "the outbox to drain", func() bool { return e.stats(t).Pending == 0 })
}

// recorder is a publisher that acknowledges after a random short delay,
// so that acks come back out of order, and records what it acknowledged.
type recorder struct {
	mu       sync.Mutex
	acked    []*postbox.Envelope
	maxDelay time.Duration
	fail     func(env *postbox.Envelope) error // nil: never fails
	wg       sync.WaitGroup
}

func (r *recorder) Publish(ctx context.Context, env *postbox.Envelope, done func(error)) {
	if r.fail != nil {
		if err := r.fail(env); err != nil {
			done(err)
			return
		}
	}
	if r.maxDelay == 0 {
		r.ack(env)
		done(nil)
		return
	}
	d := rand.N(r.maxDelay) //nolint:gosec // test jitter
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		select {
		case <-time.After(d):
			r.ack(env)
			done(nil)
		case <-ctx.Done():
			done(ctx.Err())
		}
	}()
}

func (r *recorder) ack(env *postbox.Envelope) {
	r.mu.Lock()
	r.acked = append(r.acked, env)
	r.mu.Unlock()
}

func (r *recorder) snapshot() []*postbox.Envelope {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*postbox.Envelope(nil), r.acked...)
}

// checkOrder asserts that, per key, the first acknowledgement of each
// message comes in write order (payloads carry the per-key sequence), and
// that every message in want was acknowledged at least once.
func checkOrder(t *testing.T, acked []*postbox.Envelope, want map[string]int) {
	t.Helper()
	seen := map[string]bool{}
	next := map[string]int{}
	for _, env := range acked {
		if seen[env.ID] {
			continue
		}
		seen[env.ID] = true
		var n int
		if _, err := fmt.Sscanf(string(env.Payload), "%d", &n); err != nil {
			t.Fatalf("payload %q: %v", env.Payload, err)
		}
		if env.Key != "" && n != next[env.Key] {
			t.Fatalf("key %s: message %d acknowledged first when %d was due", env.Key, n, next[env.Key])
		}
		next[env.Key] = n + 1
	}
	for k, n := range want {
		if next[k] != n {
			t.Errorf("key %q: %d messages acknowledged, want %d", k, next[k], n)
		}
	}
}

// writeKeyed writes n messages per key over keys, each in its own Write
// call, interleaving keys; payload is the message's index within its key.
func writeKeyed[TTx any](t *testing.T, c *postbox.Client[TTx], keys []string, n int) map[string]int {
	t.Helper()
	want := map[string]int{}
	var batch []postbox.Message
	for i := 0; i < n; i++ {
		for _, k := range keys {
			batch = append(batch, postbox.Message{Topic: "test.keyed", Key: k, Payload: fmt.Appendf(nil, "%d", i)})
			want[k]++
		}
		if len(batch) >= 50 {
			if err := c.Write(context.Background(), batch...); err != nil {
				t.Fatal(err)
			}
			batch = batch[:0]
		}
	}
	if len(batch) > 0 {
		if err := c.Write(context.Background(), batch...); err != nil {
			t.Fatal(err)
		}
	}
	return want
}

func keys(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("key-%d", i)
	}
	return out
}

func (s *suite[TTx]) migrateIdempotent(t *testing.T) {
	e := s.setup(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m, err := postboxmigrate.New(e.d, &postboxmigrate.Config{Prefix: e.prefix})
			if err == nil {
				var done []int
				done, err = m.Up(ctx)
				if err == nil && len(done) > 0 {
					err = fmt.Errorf("re-applied %v", done)
				}
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	m, _ := postboxmigrate.New(e.d, &postboxmigrate.Config{Prefix: e.prefix})
	st, err := m.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range st {
		if !x.Applied {
			t.Errorf("migration %d not applied", x.Version)
		}
	}
	if n, err := e.store.Partitions(ctx); err != nil || n != 64 {
		t.Fatalf("partitions = %d, %v; want 64", n, err)
	}
}

func (s *suite[TTx]) rollbackWritesNothing(t *testing.T) {
	e := s.setup(t)
	ctx := context.Background()
	c := e.client(t, nil, postbox.Config{})
	tx, _, rollback := s.h.Begin(t, ctx, e.d)
	if err := c.WriteTx(ctx, tx, postbox.Message{Topic: "t.rolled", Key: "k"}, postbox.Message{Topic: "t.rolled"}); err != nil {
		t.Fatal(err)
	}
	if err := rollback(); err != nil {
		t.Fatal(err)
	}
	if st := e.stats(t); st.Pending != 0 {
		t.Fatalf("pending = %d after rollback, want 0", st.Pending)
	}
	tx, commit, _ := s.h.Begin(t, ctx, e.d)
	if err := c.WriteTx(ctx, tx, postbox.Message{Topic: "t.kept"}, postbox.Message{Topic: "t.kept"}); err != nil {
		t.Fatal(err)
	}
	if err := commit(); err != nil {
		t.Fatal(err)
	}
	if st := e.stats(t); st.Pending != 2 {
		t.Fatalf("pending = %d after commit, want 2", st.Pending)
	}
}

func (s *suite[TTx]) badInputWritesNothing(t *testing.T) {
	e := s.setup(t)
	ctx := context.Background()
	c := e.client(t, nil, postbox.Config{MaxPayloadBytes: 1024})
	bad := []postbox.Message{
		{Topic: "bad topic"},
		{Topic: ""},
		{Topic: "ok", Payload: make([]byte, 1025)},
		{Topic: "ok", Headers: map[string]string{"ce-id": "x"}},
		{Topic: "ok", ID: "not-a-uuid"},
		{Topic: "t'; DROP TABLE x; --"},
	}
	id := postbox.NewID()
	batches := make([][]postbox.Message, 0, len(bad)+1)
	for _, m := range bad {
		batches = append(batches, []postbox.Message{{Topic: "fine.first"}, m})
	}
	// One id twice in one write: refused before any statement, so the
	// caller's transaction is not aborted by the unique id.
	batches = append(batches, []postbox.Message{{ID: id, Topic: "fine.first"}, {Topic: "fine.second"}, {ID: id, Topic: "fine.third"}})
	for i, batch := range batches {
		tx, commit, _ := s.h.Begin(t, ctx, e.d)
		err := c.WriteTx(ctx, tx, batch...)
		var ve *postbox.ValidationError
		if !errors.As(err, &ve) {
			t.Fatalf("case %d: err = %v, want *ValidationError", i, err)
		}
		// The caller's transaction is still usable.
		if err := c.WriteTx(ctx, tx, postbox.Message{Topic: "fine.after"}); err != nil {
			t.Fatalf("case %d: the transaction is unusable after the refusal: %v", i, err)
		}
		if err := commit(); err != nil {
			t.Fatal(err)
		}
		if err := c.Write(ctx, batch...); !errors.As(err, &ve) {
			t.Fatalf("case %d: Write err = %v, want *ValidationError", i, err)
		}
	}
	if st := e.stats(t); st.Pending != int64(len(batches)) {
		t.Fatalf("pending = %d, want %d: a batch with a bad message must write nothing", st.Pending, len(batches))
	}
	// A nil transaction is an error, not a panic.
	var none TTx
	var ve *postbox.ValidationError
	if err := c.WriteTx(ctx, none, postbox.Message{Topic: "fine"}); !errors.As(err, &ve) || ve.Field != "tx" {
		t.Fatalf("WriteTx with a nil transaction = %v, want a *ValidationError on tx", err)
	}
	if _, err := c.Inbox().ProcessTx(ctx, none, "c", "id", nil); !errors.As(err, &ve) || ve.Field != "tx" {
		t.Fatalf("ProcessTx with a nil transaction = %v, want a *ValidationError on tx", err)
	}
}

func (s *suite[TTx]) partitionMatchesGo(t *testing.T) {
	e := s.setup(t)
	ctx := context.Background()
	c := e.client(t, nil, postbox.Config{})
	var msgs []postbox.Message
	for i := range 200 {
		k := ""
		if i%2 == 0 {
			k = fmt.Sprintf("entity-%d", i)
		}
		msgs = append(msgs, postbox.Message{Topic: "t.part", Key: k})
	}
	if err := c.Write(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	recs := fetchAll(t, e.store, "reader")
	if len(recs) != 200 {
		t.Fatalf("fetched %d, want 200", len(recs))
	}
	for _, r := range recs {
		if want := postboxdriver.PartitionOf(r.Key, r.ID, 64); r.Partition != want {
			t.Fatalf("row %s key %q: partition %d, Go computes %d", r.ID, r.Key, r.Partition, want)
		}
	}
}

// owned counts the partitions m shows owner holding.
func owned(m postboxdriver.Membership, owner string) int {
	n := 0
	for _, l := range m.Leases {
		if l.Owner == owner && !l.Expired {
			n++
		}
	}
	return n
}

func allPartitions() []int {
	out := make([]int, 64)
	for i := range out {
		out[i] = i
	}
	return out
}

func fenceOf(owner string, ls []postboxdriver.Lease) postboxdriver.Fence {
	f := postboxdriver.Fence{Owner: owner, Generations: map[int]int64{}}
	for _, l := range ls {
		f.Generations[l.Partition] = l.Generation
	}
	return f
}

// markPublished settles a batch whose rows were all published.
func markPublished(ctx context.Context, ex postboxdriver.Executor, f postboxdriver.Fence, seqs []int64) (int, error) {
	s, err := ex.Settle(ctx, f, postboxdriver.Outcome{Read: seqs, Published: seqs}, 25)
	return s.Published, err
}

// markFailed settles a batch whose rows all failed.
func markFailed(ctx context.Context, ex postboxdriver.Executor, f postboxdriver.Fence, fails []postboxdriver.Failure, maxAttempts int) ([]postboxdriver.FailResult, error) {
	read := make([]int64, len(fails))
	for i, fl := range fails {
		read[i] = fl.Seq
	}
	s, err := ex.Settle(ctx, f, postboxdriver.Outcome{Read: read, Failed: fails}, maxAttempts)
	return s.Failed, err
}

// fetchAll takes every partition for owner and reads everything pending.
func fetchAll[TTx any](t *testing.T, st postboxdriver.Store[TTx], owner string) []postboxdriver.Record {
	t.Helper()
	ls, err := st.AcquireLeases(context.Background(), owner, allPartitions(), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := st.Fetch(context.Background(), postboxdriver.FetchParams{Fence: fenceOf(owner, ls), Limit: 100000})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.ReleaseLeases(context.Background(), owner, allPartitions()); err != nil {
		t.Fatal(err)
	}
	return recs
}

func (s *suite[TTx]) leasesExclusive(t *testing.T) {
	e := s.setup(t)
	ctx := context.Background()
	a, err := e.store.AcquireLeases(ctx, "a", []int{0, 1, 2}, time.Minute)
	if err != nil || len(a) != 3 {
		t.Fatalf("a acquired %v, %v", a, err)
	}
	b, err := e.store.AcquireLeases(ctx, "b", []int{1, 2, 3}, time.Minute)
	if err != nil || len(b) != 1 || b[0].Partition != 3 {
		t.Fatalf("b acquired %v, %v; want only partition 3", b, err)
	}
	// Renewal keeps the generation; release and re-acquisition by another
	// owner moves it on.
	again, err := e.store.AcquireLeases(ctx, "a", []int{0}, time.Minute)
	if err != nil || len(again) != 1 || again[0].Generation != a[0].Generation {
		t.Fatalf("renewal = %v, %v; want generation %d kept", again, err, a[0].Generation)
	}
	if err := e.store.ReleaseLeases(ctx, "a", []int{0}); err != nil {
		t.Fatal(err)
	}
	b2, err := e.store.AcquireLeases(ctx, "b", []int{0}, time.Minute)
	if err != nil || len(b2) != 1 || b2[0].Generation <= a[0].Generation {
		t.Fatalf("b after release = %v, %v; want a newer generation than %d", b2, err, a[0].Generation)
	}
	if _, err := e.store.Coordinate(ctx, "relay-b", time.Minute, nil, nil, nil); err != nil {
		t.Fatal(err)
	}
	m, err := e.store.Coordinate(ctx, "relay-a", time.Minute, nil, nil, nil)
	if err != nil || fmt.Sprint(m.Live) != "[relay-a relay-b]" {
		t.Fatalf("live = %v, %v", m.Live, err)
	}
	if err := e.store.Unregister(ctx, "relay-b"); err != nil {
		t.Fatal(err)
	}
	if m, _ = e.store.Coordinate(ctx, "relay-a", time.Minute, nil, nil, nil); fmt.Sprint(m.Live) != "[relay-a]" {
		t.Fatalf("live after unregister = %v", m.Live)
	}
}

// 16 claimers race for every partition and read what their leases give
// them: no row is read by two of them, and together they read every row.
func (s *suite[TTx]) concurrentClaimersNeverShare(t *testing.T) {
	e := s.setup(t)
	ctx := context.Background()
	c := e.client(t, nil, postbox.Config{})
	var msgs []postbox.Message
	for i := range 2000 {
		msgs = append(msgs, postbox.Message{Topic: "t.claim", Key: fmt.Sprintf("k%d", i%300)})
	}
	if err := c.Write(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	owner := map[int64]string{}
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			me := fmt.Sprintf("claimer-%d", i)
			parts := allPartitions()
			rand.Shuffle(len(parts), func(a, b int) { parts[a], parts[b] = parts[b], parts[a] }) //nolint:gosec // test order
			ls, err := e.store.AcquireLeases(ctx, me, parts, time.Minute)
			if err != nil {
				errs <- err
				return
			}
			recs, err := e.store.Fetch(ctx, postboxdriver.FetchParams{Fence: fenceOf(me, ls), Limit: 5000})
			if err != nil {
				errs <- err
				return
			}
			mu.Lock()
			defer mu.Unlock()
			for _, r := range recs {
				if prev, ok := owner[r.Seq]; ok {
					errs <- fmt.Errorf("row %d read by %s and %s", r.Seq, prev, me)
					return
				}
				owner[r.Seq] = me
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if len(owner) != 2000 {
		t.Fatalf("claimers read %d distinct rows, want 2000", len(owner))
	}
}

func (s *suite[TTx]) leaseExpiryAndReclaim(t *testing.T) {
	e := s.setup(t)
	ctx := context.Background()
	a, err := e.store.AcquireLeases(ctx, "a", allPartitions(), 300*time.Millisecond)
	if err != nil || len(a) != 64 {
		t.Fatalf("a: %d leases, %v", len(a), err)
	}
	b, err := e.store.AcquireLeases(ctx, "b", allPartitions(), time.Minute)
	if err != nil || len(b) != 0 {
		t.Fatalf("b took %d leases from a live owner, %v", len(b), err)
	}
	eventually(t, 10*time.Second, "a's leases to expire and pass to b", func() bool {
		b, err = e.store.AcquireLeases(ctx, "b", allPartitions(), time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		return len(b) == 64
	})
	for i := range b {
		if b[i].Generation <= a[i].Generation {
			t.Fatalf("partition %d: generation %d after reclaim, want more than %d", b[i].Partition, b[i].Generation, a[i].Generation)
		}
	}
}

// A relay whose lease passed to another writes nothing back: neither its
// marks of published rows nor its failures.
func (s *suite[TTx]) staleMarkChangesNothing(t *testing.T) {
	e := s.setup(t)
	ctx := context.Background()
	c := e.client(t, nil, postbox.Config{})
	var msgs []postbox.Message
	for i := range 20 {
		msgs = append(msgs, postbox.Message{Topic: "t.stale", Key: fmt.Sprintf("k%d", i)})
	}
	if err := c.Write(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	a, err := e.store.AcquireLeases(ctx, "stale", allPartitions(), 200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	fa := fenceOf("stale", a)
	recs, err := e.store.Fetch(ctx, postboxdriver.FetchParams{Fence: fa, Limit: 100})
	if err != nil || len(recs) != 20 {
		t.Fatalf("fetch: %d, %v", len(recs), err)
	}
	var b []postboxdriver.Lease
	eventually(t, 10*time.Second, "the lease to pass to a new owner", func() bool {
		b, err = e.store.AcquireLeases(ctx, "fresh", allPartitions(), time.Minute)
		return err == nil && len(b) == 64
	})
	seqs := make([]int64, len(recs))
	var fails []postboxdriver.Failure
	for i, r := range recs {
		seqs[i] = r.Seq
		fails = append(fails, postboxdriver.Failure{Seq: r.Seq, Error: "x", Backoff: time.Hour})
	}
	if n, err := markPublished(ctx, e.store, fa, seqs); err != nil || n != 0 {
		t.Fatalf("stale mark of published rows changed %d rows (%v), want 0", n, err)
	}
	if out, err := markFailed(ctx, e.store, fa, fails, 1); err != nil || len(out) != 0 {
		t.Fatalf("stale mark of failures changed %v (%v), want nothing", out, err)
	}
	if st := e.stats(t); st.Pending != 20 || st.Dead != 0 {
		t.Fatalf("after stale marks: %+v, want 20 pending and none dead", st)
	}
	// The same relay id re-taking the partition later is a new generation:
	// its old fence still matches nothing.
	fb := fenceOf("fresh", b)
	if n, err := markPublished(ctx, e.store, fb, seqs[:5]); err != nil || n != 5 {
		t.Fatalf("owner's mark of published rows = %d, %v; want 5", n, err)
	}
	if st := e.stats(t); st.Pending != 15 || st.Published != 5 {
		t.Fatalf("after owner marks: %+v", st)
	}
}

// A row waiting for a retry holds back the later rows of its key, not
// those of other keys nor keyless rows.
func (s *suite[TTx]) fetchHoldsBackRetriedKey(t *testing.T) {
	e := s.setup(t)
	ctx := context.Background()
	c := e.client(t, nil, postbox.Config{})
	if err := c.Write(ctx,
		postbox.Message{Topic: "t.h", Key: "a", Payload: []byte("0")},
		postbox.Message{Topic: "t.h", Key: "a", Payload: []byte("1")},
		postbox.Message{Topic: "t.h", Key: "b", Payload: []byte("0")},
		postbox.Message{Topic: "t.h", Payload: []byte("free")},
	); err != nil {
		t.Fatal(err)
	}
	ls, err := e.store.AcquireLeases(ctx, "o", allPartitions(), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	f := fenceOf("o", ls)
	recs, err := e.store.Fetch(ctx, postboxdriver.FetchParams{Fence: f, Limit: 10})
	if err != nil || len(recs) != 4 {
		t.Fatalf("fetch: %d, %v", len(recs), err)
	}
	out, err := markFailed(ctx, e.store, f, []postboxdriver.Failure{{Seq: recs[0].Seq, Error: "boom", Backoff: time.Hour}}, 10)
	if err != nil || len(out) != 1 || out[0].Dead || out[0].Attempts != 1 {
		t.Fatalf("mark of a failure = %v, %v", out, err)
	}
	recs, err = e.store.Fetch(ctx, postboxdriver.FetchParams{Fence: f, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range recs {
		got = append(got, r.Key+":"+string(r.Payload))
	}
	if fmt.Sprint(got) != "[b:0 :free]" {
		t.Fatalf("fetch while a:0 waits = %v, want [b:0 :free]", got)
	}
}

// A relay reads only the topics it has a route for; a row of a topic it
// does not know holds back the later rows of its key, and nothing else.
func (s *suite[TTx]) fetchRoutedTopics(t *testing.T) {
	e := s.setup(t)
	ctx := context.Background()
	c := e.client(t, nil, postbox.Config{})
	if err := c.Write(ctx,
		postbox.Message{Topic: "orders.created", Key: "k1", Payload: []byte("A")},
		postbox.Message{Topic: "audit.x", Key: "k1", Payload: []byte("B")},
		postbox.Message{Topic: "orders.paid", Key: "k1", Payload: []byte("C")},
		postbox.Message{Topic: "orders.paid", Key: "k2", Payload: []byte("D")},
		postbox.Message{Topic: "audit.y", Payload: []byte("E")},
		postbox.Message{Topic: "orders.z", Payload: []byte("F")},
		postbox.Message{Topic: "axb", Payload: []byte("G")},
		postbox.Message{Topic: "a_b", Payload: []byte("H")},
	); err != nil {
		t.Fatal(err)
	}
	ls, err := e.store.AcquireLeases(ctx, "router", allPartitions(), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	read := func(topics []string) string {
		t.Helper()
		recs, err := e.store.Fetch(ctx, postboxdriver.FetchParams{Fence: fenceOf("router", ls), Limit: 100, Topics: topics})
		if err != nil {
			t.Fatal(err)
		}
		var got string
		for _, r := range recs {
			got += string(r.Payload)
		}
		return got
	}
	for _, c := range []struct {
		topics []string
		want   string
	}{
		{nil, "ABCDEFGH"},
		{[]string{"*"}, "ABCDEFGH"},
		{[]string{"orders.*"}, "ADF"},
		{[]string{"orders.created", "orders.paid"}, "AD"},
		{[]string{"orders.*", "audit.*"}, "ABCDEF"},
		{[]string{"a_b"}, "H"},
		{[]string{"a_*"}, "H"},
		{[]string{}, ""},
	} {
		if got := read(c.topics); got != c.want {
			t.Errorf("topics %q: read %q, want %q", c.topics, got, c.want)
		}
	}
}

func (s *suite[TTx]) perKeyOrder(t *testing.T) {
	e := s.setup(t)
	rec := &recorder{maxDelay: 2 * time.Millisecond}
	c := e.client(t, rec, postbox.Config{PublishWindow: 64, BatchSize: 100})
	want := writeKeyed(t, c, keys(10), 50)
	start(t, c)
	e.drained(t)
	checkOrder(t, rec.snapshot(), want)
}

// Three relays drain one table together, writers still writing: every
// message is published, first publishes in key order.
func (s *suite[TTx]) replicasKeepKeyOrder(t *testing.T) {
	e := s.setup(t)
	rec := &recorder{maxDelay: time.Millisecond}
	var cs []*postbox.Client[TTx]
	for range 3 {
		c := e.client(t, rec, postbox.Config{PublishWindow: 32, BatchSize: 50})
		start(t, c)
		cs = append(cs, c)
	}
	want := writeKeyed(t, cs[0], keys(20), 40)
	e.drained(t)
	checkOrder(t, rec.snapshot(), want)
}

// Relays joining and leaving one at a time under steady writes, as in a
// rolling deploy, move partitions without sending anything twice: a
// partition leaves a relay only after its batches in flight are marked,
// and a stop releases what it holds once its last batch is marked. The
// lease is long, so no partition passes on by expiry here.
func (s *suite[TTx]) rollingRestart(t *testing.T) {
	e := s.setup(t)
	rec := &recorder{maxDelay: time.Millisecond}
	cfg := postbox.Config{LeaseDuration: 20 * time.Second, PublishWindow: 32, BatchSize: 50}
	writer := e.client(t, nil, postbox.Config{})
	// The writes are never cut short by a cancelled context: one that
	// committed but reported the cancellation would be missing from want.
	var stop atomic.Bool
	want := map[string]int{}
	written := make(chan error, 1)
	go func() {
		ks := keys(30)
		for i := 0; !stop.Load(); i++ {
			var batch []postbox.Message
			for _, k := range ks {
				batch = append(batch, postbox.Message{Topic: "test.keyed", Key: k, Payload: fmt.Appendf(nil, "%d", i)})
			}
			if err := writer.Write(context.Background(), batch...); err != nil {
				written <- err
				return
			}
			for _, k := range ks {
				want[k]++
			}
			time.Sleep(10 * time.Millisecond)
		}
		written <- nil
	}()
	stopped := func(c *postbox.Client[TTx]) {
		t.Helper()
		sctx, scancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer scancel()
		if err := c.Stop(sctx); err != nil {
			t.Fatal(err)
		}
	}
	running := []*postbox.Client[TTx]{}
	for range 2 {
		c := e.client(t, rec, cfg)
		start(t, c)
		running = append(running, c)
	}
	// Each step: a new relay starts, takes its share, and the oldest
	// stops, as a deploy replaces relays one by one.
	for range 4 {
		c := e.client(t, rec, cfg)
		start(t, c)
		eventually(t, 20*time.Second, "the new relay to publish", func() bool { return len(rec.snapshot()) > 0 })
		time.Sleep(300 * time.Millisecond) // a share's worth of batches under the new membership
		stopped(running[0])
		running = append(running[1:], c)
	}
	stop.Store(true)
	if err := <-written; err != nil {
		t.Fatal(err)
	}
	e.drained(t)
	acked := rec.snapshot()
	seen := map[string]int{}
	for _, env := range acked {
		seen[env.ID]++
	}
	for id, n := range seen {
		if n > 1 {
			t.Errorf("message %s published %d times during the rolling restart, want once", id, n)
		}
	}
	checkOrder(t, acked, want)
}

// Transaction A takes a lower seq but commits after B. The relay publishes
// B first; A must still be published when it commits.
func (s *suite[TTx]) outOfOrderCommit(t *testing.T) {
	if !s.h.Features.ConcurrentWriters {
		t.Skip("database serializes writers: commits cannot reorder seqs")
	}
	e := s.setup(t)
	ctx := context.Background()
	rec := &recorder{}
	c := e.client(t, rec, postbox.Config{})
	txA, commitA, _ := s.h.Begin(t, ctx, e.d)
	if err := c.WriteTx(ctx, txA, postbox.Message{Topic: "t.ooo", Payload: []byte("A")}); err != nil {
		t.Fatal(err)
	}
	if err := c.Write(ctx, postbox.Message{Topic: "t.ooo", Payload: []byte("B")}); err != nil {
		t.Fatal(err)
	}
	start(t, c)
	eventually(t, 10*time.Second, "B to be published", func() bool { return len(rec.snapshot()) == 1 })
	if err := commitA(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "A to be published after its late commit", func() bool { return len(rec.snapshot()) == 2 })
	got := rec.snapshot()
	if string(got[0].Payload) != "B" || string(got[1].Payload) != "A" {
		t.Fatalf("published %s then %s", got[0].Payload, got[1].Payload)
	}
}

// A message the broker keeps rejecting backs off, spends its budget and
// goes dead; the rest of its key and everything else go on.
// A publish error longer than what postbox stores is cut on a character
// boundary, so the failure is recorded (here: the message dies) instead of
// the record failing and the row being published again for ever.
func (s *suite[TTx]) longPublishError(t *testing.T) {
	e := s.setup(t)
	ctx := context.Background()
	rec := &recorder{fail: func(*postbox.Envelope) error { return postbox.NewMessageError(longError()) }}
	c := e.client(t, rec, postbox.Config{MaxAttempts: 1})
	if err := c.Write(ctx, postbox.Message{Topic: "t.long", Key: "k"}); err != nil {
		t.Fatal(err)
	}
	if res, err := c.Drain(ctx); err != nil || res.Dead != 1 {
		t.Fatalf("drain = %+v, %v; want the message dead", res, err)
	}
	ds, err := c.Admin().ListDead(ctx, postbox.DeadFilter{})
	if err != nil || len(ds) != 1 || !utf8.ValidString(ds[0].Error) || len(ds[0].Error) > 2000 {
		t.Fatalf("dead messages = %d (%v); the error must be valid UTF-8 of at most 2000 bytes", len(ds), err)
	}
}

func (s *suite[TTx]) backoffThenDead(t *testing.T) {
	e := s.setup(t)
	ctx := context.Background()
	var mu sync.Mutex
	attempts := map[int]int{}
	rec := &recorder{fail: func(env *postbox.Envelope) error {
		if string(env.Payload) == "poison" {
			mu.Lock()
			attempts[env.Attempt]++
			mu.Unlock()
			return postbox.NewMessageError(errors.New("rejected by the broker"))
		}
		return nil
	}}
	c := e.client(t, rec, postbox.Config{MaxAttempts: 4})
	if err := c.Write(ctx,
		postbox.Message{Topic: "t.dead", Key: "k", Payload: []byte("0")},
		postbox.Message{Topic: "t.dead", Key: "k", Payload: []byte("poison")},
		postbox.Message{Topic: "t.dead", Key: "k", Payload: []byte("2")},
		postbox.Message{Topic: "t.dead", Key: "other", Payload: []byte("0")},
	); err != nil {
		t.Fatal(err)
	}
	start(t, c)
	eventually(t, 20*time.Second, "the poison message to die and the rest to publish", func() bool {
		st := e.stats(t)
		return st.Dead == 1 && st.Pending == 0
	})
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(attempts) != "map[1:1 2:1 3:1 4:1]" {
		t.Fatalf("poison attempts = %v, want one each of 1..4", attempts)
	}
	var got []string
	for _, env := range rec.snapshot() {
		got = append(got, env.Key+":"+string(env.Payload))
	}
	sort.Strings(got)
	if fmt.Sprint(got) != "[k:0 k:2 other:0]" {
		t.Fatalf("published %v", got)
	}
}

func (s *suite[TTx]) blockOnDead(t *testing.T) {
	e := s.setup(t)
	ctx := context.Background()
	rec := &recorder{fail: func(env *postbox.Envelope) error {
		if string(env.Payload) == "poison" {
			return postbox.NewMessageError(errors.New("rejected"))
		}
		return nil
	}}
	c := e.client(t, rec, postbox.Config{MaxAttempts: 2, BlockOnDead: true})
	if err := c.Write(ctx,
		postbox.Message{Topic: "t.block", Key: "k", Payload: []byte("poison")},
		postbox.Message{Topic: "t.block", Key: "k", Payload: []byte("after")},
		postbox.Message{Topic: "t.block", Key: "other", Payload: []byte("free")},
	); err != nil {
		t.Fatal(err)
	}
	start(t, c)
	eventually(t, 20*time.Second, "the poison message to die and other keys to publish", func() bool {
		st := e.stats(t)
		return st.Dead == 1 && st.Published == 1
	})
	// The relay keeps polling; "after" stays pending behind the dead one.
	if st := e.stats(t); st.Pending != 1 {
		t.Fatalf("pending = %d, want the message behind the dead one", st.Pending)
	}
	for _, env := range rec.snapshot() {
		if string(env.Payload) == "after" {
			t.Fatal("a message behind a dead one was published with BlockOnDead")
		}
	}
}

// A message written after an older one of its key died is held by a
// strict read (BlockOnDead) and read by any other; other keys are not.
func (s *suite[TTx]) blockOnDeadHoldsLaterWrites(t *testing.T) {
	e := s.setup(t)
	ctx := context.Background()
	c := e.client(t, nil, postbox.Config{})
	if err := c.Write(ctx, postbox.Message{Topic: "t.block", Key: "k", Payload: []byte("poison")}); err != nil {
		t.Fatal(err)
	}
	ls, err := e.store.AcquireLeases(ctx, "strict", allPartitions(), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	f := fenceOf("strict", ls)
	recs, err := e.store.Fetch(ctx, postboxdriver.FetchParams{Fence: f, Limit: 10})
	if err != nil || len(recs) != 1 {
		t.Fatalf("fetch: %d, %v", len(recs), err)
	}
	if out, err := markFailed(ctx, e.store, f, []postboxdriver.Failure{{Seq: recs[0].Seq, Error: "rejected", Dead: true}}, 25); err != nil || len(out) != 1 || !out[0].Dead {
		t.Fatalf("the poison message's death = %+v, %v", out, err)
	}
	if err := c.Write(ctx,
		postbox.Message{Topic: "t.block", Key: "k", Payload: []byte("after")},
		postbox.Message{Topic: "t.block", Key: "other", Payload: []byte("free")},
	); err != nil {
		t.Fatal(err)
	}
	read := func(strict bool) string {
		t.Helper()
		recs, err := e.store.Fetch(ctx, postboxdriver.FetchParams{Fence: f, Limit: 10, BlockOnDead: strict})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, r := range recs {
			got = append(got, string(r.Payload))
		}
		return fmt.Sprint(got)
	}
	if got := read(true); got != "[free]" {
		t.Fatalf("strict read = %s, want [free]: a message behind a dead one is held", got)
	}
	if got := read(false); got != "[after free]" {
		t.Fatalf("read = %s, want [after free]", got)
	}
	if st := e.stats(t); st.Pending != 2 || st.Dead != 1 {
		t.Fatalf("stats = %+v, want 2 pending and 1 dead", st)
	}
}

// While the broker is down, nothing spends an attempt and nothing dies.
func (s *suite[TTx]) infraSpendsNoAttempt(t *testing.T) {
	e := s.setup(t)
	ctx := context.Background()
	var mu sync.Mutex
	down, calls := true, 0
	rec := &recorder{fail: func(*postbox.Envelope) error {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if down {
			return errors.New("broker unreachable")
		}
		return nil
	}}
	c := e.client(t, rec, postbox.Config{MaxAttempts: 1})
	if err := c.Write(ctx, postbox.Message{Topic: "t.infra", Key: "k"}, postbox.Message{Topic: "t.infra"}); err != nil {
		t.Fatal(err)
	}
	start(t, c)
	eventually(t, 10*time.Second, "several failed publishes", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return calls >= 4
	})
	if st := e.stats(t); st.Dead != 0 || st.Pending != 2 {
		t.Fatalf("while the broker is down: %+v, want 2 pending, none dead", st)
	}
	mu.Lock()
	down = false
	mu.Unlock()
	e.drained(t)
	if st := e.stats(t); st.Dead != 0 || st.Published != 2 {
		t.Fatalf("after recovery: %+v", st)
	}
	for _, env := range rec.snapshot() {
		if env.Attempt != 1 {
			t.Fatalf("published on attempt %d, want 1: infrastructure failures spend no attempt", env.Attempt)
		}
	}
}

func (s *suite[TTx]) stopReleases(t *testing.T) {
	e := s.setup(t)
	ctx := context.Background()
	c := e.client(t, &recorder{}, postbox.Config{LeaseDuration: time.Hour, BatchDeadline: time.Second})
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	// The relay takes all its partitions in one statement; once it has
	// published, it holds them all.
	if err := c.Write(ctx, postbox.Message{Topic: "t.stop"}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the relay to publish", func() bool { return e.stats(t).Published == 1 })
	if ls, err := e.store.AcquireLeases(ctx, "probe", allPartitions(), time.Minute); err != nil || len(ls) != 0 {
		t.Fatalf("probe took %d partitions from a running relay (%v)", len(ls), err)
	}
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	ls, err := e.store.AcquireLeases(ctx, "probe", allPartitions(), time.Minute)
	if err != nil || len(ls) != 64 {
		t.Fatalf("after Stop another relay got %d partitions (%v), want all 64 at once", len(ls), err)
	}
}

// A relay that died holding leases (nothing released) loses its
// partitions at lease expiry, and a new relay publishes everything.
func (s *suite[TTx]) crashedRelayRecovered(t *testing.T) {
	e := s.setup(t)
	ctx := context.Background()
	if _, err := e.store.Coordinate(ctx, "crashed", 500*time.Millisecond, allPartitions(), nil, nil); err != nil {
		t.Fatal(err)
	}
	if m, err := e.store.Coordinate(ctx, "crashed", 500*time.Millisecond, allPartitions(), nil, nil); err != nil || owned(m, "crashed") != 64 {
		t.Fatalf("crashed relay leases: %d, %v", owned(m, "crashed"), err)
	}
	rec := &recorder{}
	c := e.client(t, rec, postbox.Config{LeaseDuration: 600 * time.Millisecond})
	want := writeKeyed(t, c, keys(5), 20)
	start(t, c)
	e.drained(t)
	checkOrder(t, rec.snapshot(), want)
}
