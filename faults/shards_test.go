//go:build faults

package faults

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/postbox-go/postbox/internal/tcpproxy"
)

// The shards profile (TestShards): one `postbox relay` daemon serving
// several databases (shards) at once, each a PostgreSQL cluster of the
// run's own, while the faults hit one shard only (the victim, drawn from
// the seed): its database link cut, stalled and its connections
// terminated, its outbox locked, its server restarted; and the daemon is
// SIGKILLed and started again once, which stops every shard. Each shard
// has its own writers (the harness's, on a topic of the shard's own), its
// own JetStream stream, its own consumer process applying it through that
// database's inbox, and its own watcher; the checker of TestFaults judges
// each shard on its own, and the daemon's exiting on its own is a
// violation too: a shard's faults must stop that shard's relay only,
// never the daemon.
//
// The figure that shows it is the healthy shards' longest
// commit-to-stored wait while a fault held the victim alone, beside the
// victim's own and the healthy shards' waits when no fault held, and the
// warnings the daemon logged for each shard. They are reported (the
// report's "isolation" section and each shard's relay_warnings), not
// asserted: they depend on the machine's load.

// Fault kinds of the shards profile.
const (
	faultShardCut       = "shard_cut"       // the daemon's connections to one shard reset, new ones refused, for Hold
	faultShardStall     = "shard_stall"     // the daemon's link to one shard forwards nothing for Hold (past the lease)
	faultShardTerminate = "shard_terminate" // pg_terminate_backend of the daemon's (and, drawn, the shard consumer's) backends on one shard, every 150ms for Hold
	faultShardLock      = "shard_lock"      // one shard's outbox locked ACCESS EXCLUSIVE by a transaction held for Hold
	faultShardRestart   = "shard_restart"   // one shard's PostgreSQL stopped (fast or immediate) and started again after Hold
	faultDaemonKill     = "daemon_kill"     // SIGKILL the daemon, serving every shard; start it again after Hold
)

func init() {
	guarantees[faultShardCut] = "G2 G3 G6, isolation: one shard's database is unreachable from the daemon (connections reset, new ones refused); its relay pauses and reconnects, loses nothing; the other shards' relays in the same process go on"
	guarantees[faultShardStall] = "G4 G2 G3, isolation: one shard's database link stalls past the lease; the shard's relay notices within its lease, its stalled statements change nothing once its partitions moved on; the other shards go on"
	guarantees[faultShardTerminate] = "G2 G5 G6, isolation: one shard's backends (the daemon's, and drawn its consumer's) are killed again and again; reconnect, lose nothing, apply once; the other shards go on"
	guarantees[faultShardLock] = "G2 G4, isolation: one shard's outbox is locked (ACCESS EXCLUSIVE): its relay's reads and marks and its writers wait, then drain in order; the other shards go on"
	guarantees[faultShardRestart] = "G1 G2 G5 G6, isolation: one shard's database stops or crashes and recovers; every committed row survives, no rolled-back one appears; the daemon does not exit and the other shards go on"
	guarantees[faultDaemonKill] = "G2 G3 G4 G6 G7: the daemon serving every shard is SIGKILLed and started again; each shard's partitions are taken again after the lease, and every shard recovers"
}

// shardProfile is a profile of TestShards: the harness's sizes, per
// shard (writers, keys), and how many shards one daemon serves.
type shardProfile struct {
	profile
	Shards int `json:"shards"`
}

// shardProfiles: POSTBOX_SHARDS_PROFILE picks one.
var shardProfiles = map[string]shardProfile{
	"shards": {
		profile: profile{
			Name: "shards", WriteFor: 60 * time.Second, Rounds: 1,
			Mix: map[string]int{
				faultShardCut: 1, faultShardStall: 1, faultShardTerminate: 1, faultShardLock: 1,
				faultShardRestart: 1, faultDaemonKill: 1,
			},
			Writers: 3, Keys: 40, Pace: 40 * time.Millisecond, Rollback: 0.15, Poison: 0.01,
			DrainLimit: 45 * time.Second, Lease: 3 * time.Second, BatchDeadline: time.Second,
			AckWait: 5 * time.Second, MinGap: 2 * time.Second, Relays: 1,
		},
		Shards: 2,
	},
}

// TestShards runs the shards profile (POSTBOX_SHARDS_PROFILE, default
// shards): one daemon, a database per shard, faults on one shard.
func TestShards(t *testing.T) {
	if v := os.Getenv("POSTBOX_FAULTS_DB"); v != "" && v != dbPostgres {
		t.Fatalf("POSTBOX_FAULTS_DB=%q: TestShards runs on PostgreSQL only (a cluster of the run's own per shard)", v)
	}
	if v := os.Getenv("POSTBOX_FAULTS_BROKER"); v != "" && v != "nats" {
		t.Fatalf("POSTBOX_FAULTS_BROKER=%q: TestShards runs on NATS only (a stream per shard)", v)
	}
	if pooler, err := poolerName(); err != nil || pooler != "" {
		t.Fatalf("POSTBOX_FAULTS_POOLER: TestShards connects to each shard directly")
	}
	if storage, err := storageName(); err != nil || storage != storageTable {
		t.Fatalf("POSTBOX_FAULTS_STORAGE: TestShards runs over the table")
	}
	plain := map[string]profile{}
	for name, p := range shardProfiles {
		plain[name] = p.profile
	}
	prof := shardProfiles[chosen(t, "POSTBOX_SHARDS_PROFILE", "shards", plain).Name]
	runShards(t, prof)
}

// shardSchedule draws the victim shard and the faults from rng: the
// profile's mix in a shuffled order, one at a time with a gap after each,
// every fault but the daemon's kill on the victim. The same seed draws
// the same schedule.
func shardSchedule(rng *rand.Rand, p shardProfile) (victim int, out []*fault) {
	victim = rng.IntN(p.Shards)
	kinds := make([]string, 0, len(p.Mix))
	for k := range p.Mix {
		kinds = append(kinds, k)
	}
	slices.Sort(kinds)
	var bag []string
	for _, k := range kinds {
		for range p.Mix[k] {
			bag = append(bag, k)
		}
	}
	rng.Shuffle(len(bag), func(i, j int) { bag[i], bag[j] = bag[j], bag[i] })
	at := 5 * time.Second
	for _, k := range bag {
		f := &fault{Kind: k, Relay: -1, Tests: guarantees[k], Target: fmt.Sprintf("shard %d", victim)}
		switch k {
		case faultShardCut:
			f.Hold = jitter(rng, 3*time.Second, 5*time.Second)
		case faultShardStall:
			f.Hold = p.lease() + jitter(rng, time.Second, 2*time.Second)
		case faultShardTerminate:
			f.Consumer = rng.IntN(2) == 0
			f.Hold = jitter(rng, 2*time.Second, 4*time.Second)
			if f.Consumer {
				f.Target += " (the daemon's and the consumer's backends)"
			}
		case faultShardLock:
			f.Hold = jitter(rng, 3*time.Second, 6*time.Second)
		case faultShardRestart:
			f.Mode = []string{"fast", "immediate"}[rng.IntN(2)]
			f.Hold = jitter(rng, 500*time.Millisecond, 3*time.Second)
		case faultDaemonKill:
			f.Target = "the daemon (every shard)"
			if n := p.relays(); n > 1 {
				f.Target = fmt.Sprintf("all %d daemons (every shard)", n)
			}
			f.Hold = jitter(rng, 500*time.Millisecond, 2500*time.Millisecond)
		}
		f.At = at
		out = append(out, f)
		at += f.Hold + jitter(rng, time.Second, 3*time.Second)
	}
	return victim, out
}

// shardRun is one TestShards run: the shards, each a harness of its own
// over a database and a stream of its own (writers, consumer, watcher,
// history, checker), and the daemons they share.
type shardRun struct {
	t      *testing.T
	prof   shardProfile
	seed   uint64
	dir    string
	victim int
	shards []*harness
	// links[k][i] carries daemon i's connections to shard k.
	links       [][]*tcpproxy.Proxy
	daemons     []*proc
	started     time.Time
	writersDone time.Time
	cleanStops  []bool
}

// shardSeed is shard k's writers' seed: each shard draws its own
// decisions, all from the run's seed.
func shardSeed(seed uint64, k int) uint64 {
	return seed + uint64(k)*0x9e3779b97f4a7c15
}

func runShards(t *testing.T, prof shardProfile) {
	loadBefore := loadAvg()
	seed, dir, reportPath := runSetup(t)
	t.Logf("shards: profile %s, %d shards, %d daemon(s), seed %d (rerun with POSTBOX_FAULTS_SEED=%d); load average %s",
		prof.Name, prof.Shards, prof.relays(), seed, seed, loadBefore)
	setup, cancelSetup := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancelSetup()

	// The schedule, then the dedupe mode, from the seed, as TestFaults
	// draws them.
	rng := seeded(seed)
	victim, sched := shardSchedule(rng, prof)
	for _, f := range sched {
		t.Logf("shards: scheduled %s", f)
	}
	dedupe := []string{"broker", "inbox"}[rng.IntN(2)]
	if v := os.Getenv("POSTBOX_FAULTS_DEDUPE"); v != "" {
		dedupe = v
	}
	window := map[string]time.Duration{"broker": 10 * time.Minute, "inbox": time.Second}[dedupe]
	if window == 0 {
		t.Fatalf("POSTBOX_FAULTS_DEDUPE=%q: want broker or inbox", dedupe)
	}
	t.Logf("shards: victim shard %d; dedupe by the %s (stream duplicate window %s)", victim, dedupe, window)

	s := newShardRun(t, setup, prof, seed, dir, window, victim)
	cancelSetup()
	budget := prof.WriteFor + time.Duration(prof.Shards)*prof.DrainLimit + 2*time.Minute
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	start := time.Now()
	s.run(ctx, sched)
	rep := s.check(ctx, sched)
	rep.Elapsed = time.Since(start).Round(time.Millisecond).String()
	rep.Dedupe = dedupe
	rep.LoadBefore, rep.LoadAfter = loadBefore, loadAvg()
	for _, sr := range rep.Shards {
		sr.Report.Elapsed, sr.Report.Dedupe = rep.Elapsed, dedupe
	}

	writeReport(t, reportPath, rep)
	t.Logf("shards: report written to %s", reportPath)
	for _, sr := range rep.Shards {
		t.Logf("shards: shard %d (%s): %s", sr.Shard, sr.Role, sr.Report.Summary())
	}
	for _, f := range rep.Isolation.Faults {
		t.Logf("shards: %s", f.line())
	}
	t.Logf("shards: %s", rep.Summary())
	for _, sr := range rep.Shards {
		shown := 0
		for _, v := range sr.Report.Violations {
			shown++
			t.Errorf("shard %d: violation %s (%s): %s", sr.Shard, v.Rule, v.Guarantee, v.Detail)
		}
		if more := sr.Report.ViolationCount - shown; more > 0 {
			t.Errorf("shard %d: ... and %d more violations (see the report)", sr.Shard, more)
		}
	}
	for _, v := range rep.Violations {
		t.Errorf("violation %s (%s): %s", v.Rule, v.Guarantee, v.Detail)
	}
	if !rep.Pass {
		t.Errorf("shards: FAIL with seed %d; files in %s", seed, dir)
	}
}

// newShardRun starts the run's nats-server, a PostgreSQL cluster, a
// stream, a history and a consumer per shard, and lays out the daemons:
// each serves every shard, reaching shard k's database through a proxy
// of its own (links[k]).
func newShardRun(t *testing.T, ctx context.Context, prof shardProfile, seed uint64, dir string, dupWindow time.Duration, victim int) *shardRun {
	t.Helper()
	run := fmt.Sprintf("%d%d", os.Getpid()%100000, time.Now().UnixNano()%1_000_000)
	s := &shardRun{t: t, prof: prof, seed: seed, dir: dir, victim: victim}
	bin := buildPostbox(t, dir)

	srv := startNATS(t, ctx, dir)
	nc, err := nats.Connect(srv.url(), nats.Name("postbox faults harness"), nats.MaxReconnects(-1), nats.PingInterval(2*time.Second), nats.MaxPingsOutstanding(3))
	if err != nil {
		t.Fatalf("NATS at %s: %v", srv.url(), err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	subj := "fx" + run + "."

	base := make([]string, 0, len(os.Environ()))
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "POSTBOX_") {
			base = append(base, e)
		}
	}
	for k := range prof.Shards {
		sdir := filepath.Join(dir, fmt.Sprintf("shard%d", k))
		if err := os.MkdirAll(sdir, 0o750); err != nil {
			t.Fatal(err)
		}
		h := &harness{t: t, prof: prof.profile, seed: shardSeed(seed, k), dir: sdir, runID: run, prefix: "fx" + run + "_",
			topic: fmt.Sprintf("fx.s%d.changed", k), storage: storageTable}
		h.db = newPGDatabase(ctx, h)
		b := &natsBroker{srv: srv, urls: srv.url(), nc: nc, js: js, stream: fmt.Sprintf("FX%sS%d", run, k), subj: subj}
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
			Name: b.stream, Subjects: []string{subj + h.topic}, Storage: jetstream.FileStorage,
			Duplicates: dupWindow, MaxAge: 2 * time.Hour,
		}); err != nil {
			t.Fatalf("create stream %s: %v", b.stream, err)
		}
		h.broker = b
		if h.hist, err = newHistory(filepath.Join(sdir, "history.jsonl")); err != nil {
			t.Fatal(err)
		}
		h.watch = &watcher{first: map[string]time.Time{}}
		h.consumer = newConsumerProc(t, consumerCase{
			DB: h.db.consumer(), Prefix: h.prefix, Broker: "nats", Vars: b.consumerVars(), AckWait: prof.ackWait(),
			CrashFile: filepath.Join(sdir, "consumer.crash"),
		}, base, filepath.Join(sdir, "consumer.log"))
		t.Cleanup(func() { h.consumer.close(2 * time.Second) })
		s.shards = append(s.shards, h)
		s.links = append(s.links, nil)
		t.Logf("shards: shard %d: PostgreSQL %s, prefix %s, topic %s, stream %s, files in %s", k, h.pg.addr(), h.prefix, h.topic, b.stream, sdir)
	}

	for i := range prof.relays() {
		var dbs strings.Builder
		for k, h := range s.shards {
			p, err := tcpproxy.New(h.db.hosts()[0])
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(p.Close)
			s.links[k] = append(s.links[k], p)
			fmt.Fprintf(&dbs, "  - url: %q\n    prefix: %q\n", h.db.relayURL([]string{p.Addr()}, i), h.prefix)
		}
		yaml := s.shards[0].broker.relayConfig() + fmt.Sprintf(`relay:
  lease: %s
  batch_deadline: %s
  backoff_base: 100ms
  backoff_max: 2s
  poll_interval: 50ms
  batch_size: 200
  lanes: 2
  max_crashes: %d
log:
  level: info
databases:
`, prof.Lease, prof.BatchDeadline, maxCrashes) + dbs.String()
		cfg := filepath.Join(dir, fmt.Sprintf("relay%d.yaml", i))
		if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		env := append(append([]string(nil), base...), "POSTBOX_CONFIG="+cfg, "POSTBOX_ADMIN_LISTEN=off", "POSTBOX_NATS_URL="+srv.url())
		s.daemons = append(s.daemons, newRelayProc(i, bin, env, filepath.Join(dir, fmt.Sprintf("relay%d.log", i))))
	}
	t.Cleanup(func() {
		for _, r := range s.daemons {
			r.close(2 * time.Second)
		}
	})
	for _, h := range s.shards {
		h.relays = s.daemons
	}
	return s
}

// run starts every shard's watcher and consumer and the daemons, runs
// every shard's writers and the faults, waits until every shard has
// settled, and stops everything, as harness.run does for one database.
func (s *shardRun) run(ctx context.Context, sched []*fault) {
	t := s.t
	bg, stopBG := context.WithCancel(ctx)
	defer stopBG()
	var bgWG sync.WaitGroup
	for _, h := range s.shards {
		bgWG.Add(1)
		go func() {
			defer bgWG.Done()
			h.watcherErr = h.broker.watch(bg, h.watch)
		}()
		if err := h.consumer.start(); err != nil {
			t.Fatalf("start a consumer: %v", err)
		}
	}
	for _, r := range s.daemons {
		if err := r.start(); err != nil {
			t.Fatalf("start daemon %d: %v", r.n, err)
		}
	}

	s.started = time.Now()
	until := s.started.Add(s.prof.WriteFor)
	var wg sync.WaitGroup
	for _, h := range s.shards {
		h.started, h.sched = s.started, sched
		h.injecting.Store(true)
		for n := range s.prof.Writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				h.writer(ctx, n, until)
			}()
		}
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.inject(ctx, sched)
		sleep(ctx, 5*time.Second)
		for _, h := range s.shards {
			h.injecting.Store(false)
		}
	}()
	wg.Wait()
	s.writersDone = time.Now()
	for k, h := range s.shards {
		h.writersDone = s.writersDone
		t.Logf("shards: shard %d: writers done after %s: %d transactions, %d write errors", k, s.writersDone.Sub(s.started).Round(time.Millisecond), h.hist.transactions(), h.writeErrs.Load())
		h.resolveUnknown(ctx)
	}
	for k, h := range s.shards {
		h.settled = h.waitSettled(ctx)
		h.settledAt = time.Now()
		t.Logf("shards: shard %d: settled=%v %s after the writers stopped", k, h.settled, h.settledAt.Sub(s.writersDone).Round(time.Millisecond))
		if d, ok := h.broker.(describer); ok && !h.settled {
			t.Logf("shards: shard %d: the broker after the drain limit: %s", k, d.describe(ctx))
		}
	}
	for _, r := range s.daemons {
		s.cleanStops = append(s.cleanStops, r.close(20*time.Second))
	}
	for _, h := range s.shards {
		h.cleanStops = s.cleanStops
		h.catchUp(ctx)
		h.consumerClean = h.consumer.close(20 * time.Second)
	}
	stopBG()
	bgWG.Wait()
	for k, h := range s.shards {
		if err := h.hist.close(); err != nil {
			t.Errorf("shard %d: history: %v", k, err)
		}
	}
}

// inject runs the schedule, each fault after the one before it has been
// lifted and MinGap has passed. Every fault is lifted, also when ctx
// ends.
func (s *shardRun) inject(ctx context.Context, sched []*fault) {
	v := s.shards[s.victim]
	var lifted time.Time
	for _, f := range sched {
		sleep(ctx, time.Until(s.started.Add(f.At)))
		sleep(ctx, time.Until(lifted.Add(s.prof.MinGap)))
		if ctx.Err() != nil {
			return
		}
		f.Start = time.Now()
		switch f.Kind {
		case faultShardCut:
			links := s.links[s.victim]
			before := 0
			for _, p := range links {
				before += p.Accepts()
				p.Refuse(true)
			}
			cut := 0
			for _, p := range links {
				cut += p.Reset()
			}
			sleep(ctx, f.Hold)
			after := 0
			for _, p := range links {
				p.Refuse(false)
				after += p.Accepts()
			}
			f.Note = fmt.Sprintf("reset %d connections, refused %d new ones", cut, after-before)
		case faultShardStall:
			lifts := make([]func(), 0, len(s.links[s.victim]))
			for _, p := range s.links[s.victim] {
				lifts = append(lifts, p.Blackhole())
			}
			sleep(ctx, f.Hold)
			for _, lift := range lifts {
				lift()
			}
		case faultShardTerminate:
			f.Note = fmt.Sprintf("terminated %d connections", v.terminateLoop(ctx, f.Hold, f.Consumer))
		case faultShardLock:
			f.Note = lockOutbox(ctx, v, f.Hold)
		case faultShardRestart:
			if err := v.db.restart(ctx, f.Mode, f.Hold); err != nil {
				f.Note = err.Error()
			}
		case faultDaemonKill:
			all := make([]int, len(s.daemons))
			for i := range all {
				all[i] = i
			}
			f.Note = v.killMany(ctx, all, f.Hold)
		}
		f.Lifted = time.Now()
		lifted = f.Lifted
		s.t.Logf("shards: %s done %s", f, f.Note)
	}
}

// lockOutbox takes the ACCESS EXCLUSIVE lock of h's outbox in a
// transaction and holds it for hold, then rolls back: the shard's relay
// can neither read nor mark, its writers cannot insert, until then.
func lockOutbox(ctx context.Context, h *harness, hold time.Duration) string {
	// The database may still be coming back from an earlier fault: try
	// for a while, so that the fault tests what it says.
	var note string
	for try := time.Now(); time.Since(try) < 10*time.Second && ctx.Err() == nil; sleep(ctx, 200*time.Millisecond) {
		tx, err := h.pool.Begin(ctx)
		if err != nil {
			note = "lock: " + err.Error()
			continue
		}
		asked := time.Now()
		if _, err := tx.Exec(ctx, `LOCK TABLE `+h.prefix+`outbox IN ACCESS EXCLUSIVE MODE`); err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
			note = "lock: " + err.Error()
			continue
		}
		waited := time.Since(asked)
		sleep(ctx, hold)
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return fmt.Sprintf("outbox locked after %s, held %s", waited.Round(time.Microsecond), hold.Round(time.Millisecond))
	}
	return note
}

// shardsReport is a TestShards run: each shard judged by the checker on
// its own, the daemons, and the isolation figures.
type shardsReport struct {
	Pass       bool           `json:"pass"`
	Seed       uint64         `json:"seed"`
	Profile    shardProfile   `json:"profile"`
	Victim     int            `json:"victim"`
	Dedupe     string         `json:"dedupe"`
	Started    time.Time      `json:"started"`
	Elapsed    string         `json:"elapsed"`
	Dir        string         `json:"dir"`
	LoadBefore string         `json:"loadavg_before"` // /proc/loadavg at the start
	LoadAfter  string         `json:"loadavg_after"`  // and at the end
	Faults     []*fault       `json:"faults"`         // as run; each shard's report has its own recovery figures
	Daemons    []procStats    `json:"daemons"`
	Shards     []*shardResult `json:"shards"`
	Isolation  *isolation     `json:"isolation"`
	// Violations of the run's own rules (daemon_exit), beside each
	// shard's.
	ViolationCount int         `json:"violation_count"`
	Violations     []violation `json:"violations"`
}

// shardResult is one shard's outcome: its figures, and the checker's
// whole report of it.
type shardResult struct {
	Shard        int      `json:"shard"`
	Role         string   `json:"role"` // victim or healthy
	Database     string   `json:"database"`
	Topic        string   `json:"topic"`
	Stream       string   `json:"stream"`
	Committed    int      `json:"committed"`
	Stored       int      `json:"stored"` // distinct messages in the stream
	Duplicates   int      `json:"stream_duplicates"`
	Applied      int      `json:"applied"` // the consumer's effects
	ConsumerDead int      `json:"consumer_dead_letters"`
	WriteErrors  int64    `json:"write_errors"`
	Lag          lagStats `json:"lag"`
	// RelayWarnings counts the warnings the daemons logged for this
	// shard's relay (paused, could not renew, stopped listening, down):
	// a healthy shard's count says whether the victim's faults reached
	// it, beside the daemon's kill.
	RelayWarnings int            `json:"relay_warnings"`
	Violations    int            `json:"violations"`
	ByRule        map[string]int `json:"violations_by_rule"`
	Pass          bool           `json:"pass"`
	Report        *report        `json:"report"`
}

func (r *shardsReport) add(rule, guarantee, format string, args ...any) {
	r.ViolationCount++
	r.Violations = append(r.Violations, violation{Rule: rule, Guarantee: guarantee, Detail: fmt.Sprintf(format, args...)})
}

// Summary is the run's one line.
func (r *shardsReport) Summary() string {
	verdict := "PASS"
	if !r.Pass {
		verdict = "FAIL"
	}
	var b strings.Builder
	starts, exits := 0, 0
	for _, d := range r.Daemons {
		starts += d.Starts
		exits += len(d.UnexpectedExits)
	}
	fmt.Fprintf(&b, "%s seed=%d profile=%s shards=%d daemons=%d victim=%d dedupe=%s elapsed=%s | faults %d, daemon starts %d, unexpected exits %d",
		verdict, r.Seed, r.Profile.Name, len(r.Shards), len(r.Daemons), r.Victim, r.Dedupe, r.Elapsed, len(r.Faults), starts, exits)
	for _, s := range r.Shards {
		fmt.Fprintf(&b, " | shard %d (%s): committed %d, stored %d, applied %d, consumer dead %d, relay warnings %d, violations %d",
			s.Shard, s.Role, s.Committed, s.Stored, s.Applied, s.ConsumerDead, s.RelayWarnings, s.Violations)
	}
	if iso := r.Isolation; iso != nil {
		fmt.Fprintf(&b, " | healthy shards during the victim's faults: worst wait %dms (%s), %d messages stored meanwhile; victim's worst %dms; healthy without faults p99 %dms max %dms",
			iso.HealthyWorstMs, iso.HealthyWorstFault, iso.HealthyStoredDuring, iso.VictimWorstMs, iso.HealthyQuiet.P99Ms, iso.HealthyQuiet.MaxMs)
	}
	fmt.Fprintf(&b, " | violations %d", r.ViolationCount)
	return b.String()
}

// check judges each shard with the checker, on copies of the schedule
// (the recovery figures are each shard's), then the daemons and the
// isolation figures.
func (s *shardRun) check(ctx context.Context, sched []*fault) *shardsReport {
	rep := &shardsReport{Seed: s.seed, Profile: s.prof, Victim: s.victim, Started: s.started, Dir: s.dir, Faults: sched}
	obs := make([]shardObs, len(s.shards))
	logs := make([]string, 0, len(s.daemons))
	for _, d := range s.daemons {
		logs = append(logs, d.logs)
	}
	warnings, err := shardWarnings(logs)
	if err != nil {
		s.t.Fatalf("shards: daemon logs: %v", err)
	}
	for k, h := range s.shards {
		h.sched = make([]*fault, len(sched))
		for i, f := range sched {
			c := *f
			c.Recovery = nil
			h.sched[i] = &c
		}
		r := h.check(ctx)
		r.Seed = s.seed
		role := "healthy"
		if k == s.victim {
			role = "victim"
		}
		c := r.Counts
		rep.Shards = append(rep.Shards, &shardResult{
			Shard: k, Role: role, Database: h.pg.addr(), Topic: h.topic, Stream: r.Stream,
			Committed: c.Committed, Stored: c.StreamDistinct, Duplicates: c.StreamDuplicates, Applied: c.Effects,
			ConsumerDead: c.ConsumerDead, WriteErrors: c.WriteErrors, Lag: r.Lag, RelayWarnings: warnings[k],
			Violations: r.ViolationCount, ByRule: r.ByRule, Pass: r.Pass, Report: r,
		})
		// The figures read what the checker read: the history file and
		// the stream as the watcher saw it.
		hist, err := readHistory(h.hist.path)
		if err != nil {
			s.t.Fatalf("shards: shard %d: %v", k, err)
		}
		o := shardObs{commits: map[string]time.Time{}, stored: map[string]time.Time{}}
		for id, hr := range hist {
			if hr.Outcome == committed {
				o.commits[id] = hr.At
			}
		}
		for _, m := range h.watch.snapshot() {
			if _, ok := o.stored[m.MsgID]; !ok {
				o.stored[m.MsgID] = m.Stored
			}
		}
		obs[k] = o
	}
	for i, d := range s.daemons {
		starts, exits, crashes := d.stats()
		clean := i < len(s.cleanStops) && s.cleanStops[i]
		rep.Daemons = append(rep.Daemons, procStats{Starts: starts, UnexpectedExits: exits, Crashes: crashes, CleanStop: clean})
		// One shard's faults must stop that shard's relay, never the
		// process that serves the others.
		for _, e := range exits {
			rep.add("daemon_exit", "isolation", "daemon %d %s (see relay%d.log)", i, e, i)
		}
	}
	rep.Isolation = isolationFigures(sched, s.victim, obs)
	rep.Pass = rep.ViolationCount == 0
	for _, sr := range rep.Shards {
		rep.Pass = rep.Pass && sr.Pass
	}
	return rep
}

// shardObs is what the isolation figures need of one shard: when each
// committed message was committed (the writer saw the commit) and when
// its first copy was stored in the stream.
type shardObs struct {
	commits map[string]time.Time
	stored  map[string]time.Time
}

// isolation is how the shards fared while the faults held: the healthy
// shards' waits against the victim's, per fault.
type isolation struct {
	Victim int               `json:"victim"`
	Faults []*isolationFault `json:"faults"`
	// HealthyWorstMs is the longest commit-to-stored wait of a healthy
	// shard's message that waited while a fault held the victim alone
	// (daemon_kill, which stops every shard, left out); HealthyWorstFault
	// names that fault, and HealthyStoredDuring counts the healthy
	// shards' messages first stored while those faults held.
	HealthyWorstMs      int64  `json:"healthy_worst_ms"`
	HealthyWorstFault   string `json:"healthy_worst_fault"`
	HealthyStoredDuring int    `json:"healthy_stored_during"`
	// VictimWorstMs is the same for the victim, over the same faults.
	VictimWorstMs int64 `json:"victim_worst_ms"`
	// HealthyQuiet is the healthy shards' commit-to-stored wait of the
	// messages that waited during no fault nor in the 2s after one: the
	// baseline to read the figures above against.
	HealthyQuiet lagStats `json:"healthy_quiet"`
}

// isolationFault is one fault's window, from its start to its lift, as
// each shard lived it.
type isolationFault struct {
	Fault  string      `json:"fault"`
	Kind   string      `json:"kind"`
	HoldMs int64       `json:"hold_ms"` // from the start to the lift
	Shards []shardWait `json:"shards"`
}

// shardWait is one shard during one fault's window. Waiting counts its
// committed messages that waited for the stream at some time in the
// window (committed before the lift, first stored after the start);
// MaxWaitMs and P99WaitMs are their commit-to-stored waits; Unstored
// those of them never stored (the checker names each);
// StoredDuring counts its messages first stored inside the window.
type shardWait struct {
	Shard        int    `json:"shard"`
	Role         string `json:"role"`
	Waiting      int    `json:"waiting"`
	MaxWaitMs    int64  `json:"max_wait_ms"`
	P99WaitMs    int64  `json:"p99_wait_ms"`
	Unstored     int    `json:"unstored,omitempty"`
	StoredDuring int    `json:"stored_during"`
}

func (f *isolationFault) line() string {
	parts := make([]string, 0, len(f.Shards))
	for _, w := range f.Shards {
		parts = append(parts, fmt.Sprintf("shard %d (%s): %d waiting, worst %dms, p99 %dms, %d stored meanwhile",
			w.Shard, w.Role, w.Waiting, w.MaxWaitMs, w.P99WaitMs, w.StoredDuring))
	}
	return fmt.Sprintf("%s, held %dms: %s", f.Fault, f.HoldMs, strings.Join(parts, "; "))
}

// isolationFigures computes the isolation section from the faults as run
// and each shard's commits and stores. It is a pure function of them.
func isolationFigures(faults []*fault, victim int, obs []shardObs) *isolation {
	iso := &isolation{Victim: victim}
	var quiet []int64
	for k, o := range obs {
		if k == victim {
			continue
		}
		for id, at := range o.commits {
			st, ok := o.stored[id]
			if !ok {
				continue
			}
			calm := true
			for _, f := range faults {
				if !f.Start.IsZero() && at.Before(f.Lifted.Add(2*time.Second)) && st.After(f.Start) {
					calm = false
					break
				}
			}
			if calm {
				quiet = append(quiet, max(st.Sub(at).Milliseconds(), 0))
			}
		}
	}
	iso.HealthyQuiet = percentiles(quiet)
	for _, f := range faults {
		if f.Start.IsZero() {
			continue
		}
		fi := &isolationFault{Fault: f.String(), Kind: f.Kind, HoldMs: f.Lifted.Sub(f.Start).Milliseconds()}
		for k, o := range obs {
			w := shardWait{Shard: k, Role: "healthy"}
			if k == victim {
				w.Role = "victim"
			}
			var waits []int64
			for id, at := range o.commits {
				if !at.Before(f.Lifted) {
					continue
				}
				st, ok := o.stored[id]
				switch {
				case !ok:
					w.Unstored++
					continue
				case !st.After(f.Start):
					continue
				}
				waits = append(waits, max(st.Sub(at).Milliseconds(), 0))
				if !st.After(f.Lifted) {
					w.StoredDuring++
				}
			}
			w.Waiting = len(waits)
			p := percentiles(waits)
			w.MaxWaitMs, w.P99WaitMs = p.MaxMs, p.P99Ms
			fi.Shards = append(fi.Shards, w)
			if f.Kind == faultDaemonKill {
				continue
			}
			if k == victim {
				iso.VictimWorstMs = max(iso.VictimWorstMs, w.MaxWaitMs)
				continue
			}
			iso.HealthyStoredDuring += w.StoredDuring
			if iso.HealthyWorstFault == "" || w.MaxWaitMs > iso.HealthyWorstMs {
				iso.HealthyWorstMs, iso.HealthyWorstFault = w.MaxWaitMs, f.String()
			}
		}
		iso.Faults = append(iso.Faults, fi)
	}
	return iso
}

// shardWarning is a warning the daemon logged for one shard's relay, and
// the shard's index (the daemon adds shard=N to each shard's lines).
var shardWarning = regexp.MustCompile(`^time=\S+ level=WARN msg="[^"]*" shard=(\d+) `)

// shardWarnings counts the warnings in the daemons' logs, per shard.
func shardWarnings(paths []string) (map[int]int, error) {
	out := map[int]int{}
	err := eachLogLine(paths, func(line string) {
		if m := shardWarning.FindStringSubmatch(line); m != nil {
			k, _ := strconv.Atoi(m[1])
			out[k]++
		}
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// loadAvg is the machine's load average, as /proc/loadavg says it.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown: " + err.Error()
	}
	return strings.TrimSpace(string(b))
}

// TestShardsSchedule checks that a seed draws the same victim and faults
// twice, every fault of the mix once, all on the victim but the daemon's
// kill.
func TestShardsSchedule(t *testing.T) {
	for _, p := range shardProfiles {
		draw := func(seed uint64) (int, string) {
			victim, sched := shardSchedule(seeded(seed), p)
			var s string
			kinds := map[string]int{}
			for _, f := range sched {
				s += f.String() + fmt.Sprint(f.Consumer) + "\n"
				kinds[f.Kind]++
				if want := fmt.Sprintf("shard %d", victim); f.Kind != faultDaemonKill && !strings.HasPrefix(f.Target, want) {
					t.Errorf("%s: seed %d: %s does not hit the victim, %s", p.Name, seed, f, want)
				}
			}
			for k, n := range p.Mix {
				if kinds[k] != n {
					t.Errorf("%s: seed %d: %d of %s scheduled, want %d", p.Name, seed, kinds[k], k, n)
				}
			}
			return victim, s
		}
		va, a := draw(42)
		vb, b := draw(42)
		_, c := draw(43)
		if a == "" || a != b || va != vb {
			t.Errorf("%s: seed 42 drew different schedules:\n%d %s\n%d %s", p.Name, va, a, vb, b)
		}
		if a == c {
			t.Errorf("%s: seeds 42 and 43 drew the same schedule", p.Name)
		}
	}
}

// TestShardsIsolationFigures feeds isolationFigures a made-up run: a
// healthy shard that kept publishing and a victim that stopped.
func TestShardsIsolationFigures(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	faults := []*fault{
		{Kind: faultShardLock, Relay: -1, Target: "shard 1", Start: at(10_000), Lifted: at(14_000)},
		{Kind: faultDaemonKill, Relay: -1, Target: "the daemon", Start: at(20_000), Lifted: at(21_000)},
	}
	healthy := shardObs{
		commits: map[string]time.Time{"a": at(1_000), "b": at(9_990), "c": at(12_000), "d": at(19_990), "e": at(30_000)},
		stored:  map[string]time.Time{"a": at(1_020), "b": at(10_030), "c": at(12_015), "d": at(24_000), "e": at(30_010)},
	}
	victim := shardObs{
		commits: map[string]time.Time{"v": at(11_000), "w": at(13_000)},
		stored:  map[string]time.Time{"v": at(14_500), "w": at(14_600)},
	}
	iso := isolationFigures(faults, 1, []shardObs{healthy, victim})
	if iso.HealthyWorstMs != 40 || iso.HealthyStoredDuring != 2 || iso.VictimWorstMs != 3500 {
		t.Errorf("healthy worst %dms, stored during %d, victim worst %dms; want 40ms, 2, 3500ms", iso.HealthyWorstMs, iso.HealthyStoredDuring, iso.VictimWorstMs)
	}
	if !strings.HasPrefix(iso.HealthyWorstFault, faultShardLock) {
		t.Errorf("healthy worst fault %q, want the lock", iso.HealthyWorstFault)
	}
	// a and e waited during no fault; d waited through the daemon's kill.
	if iso.HealthyQuiet.MaxMs != 20 {
		t.Errorf("healthy quiet max %dms, want 20ms", iso.HealthyQuiet.MaxMs)
	}
	if k := iso.Faults[1].Shards[0]; k.MaxWaitMs != 4010 || k.Waiting != 1 {
		t.Errorf("the daemon's kill: healthy shard %+v, want one waiting 4010ms", k)
	}
}

// TestShardsWarnings checks that the daemon's warnings are counted for
// the shard that logged them, and nothing else is.
func TestShardsWarnings(t *testing.T) {
	path := filepath.Join(t.TempDir(), "relay0.log")
	lines := `=== harness: start 1 at 2026-12-02T13:39:33.221877673Z
time=2026-12-02T13:39:33.413Z level=INFO msg="postbox relay started" shard=0 relay=fxr00s1-4be2f726798f partitions=64
time=2026-12-02T13:39:38.344Z level=WARN msg="postbox relay paused" shard=1 relay=fxr00s1-4be2f726798f lane=0 during=fetch error="write failed"
time=2026-12-02T13:39:38.346Z level=WARN msg="postbox relay stopped listening for change signals; it polls meanwhile" shard=1 relay=fxr00s1-4be2f726798f error="listen: shard=0 x"
time=2026-12-02T13:39:38.714Z level=WARN msg="postbox relay could not renew its leases" shard=0 relay=fxr00s1-4be2f726798f retry=50ms
time=2026-12-02T13:39:39.714Z level=WARN msg="postbox relay: something of the daemon's" error="x"
`
	if err := os.WriteFile(path, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := shardWarnings([]string{path})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0] != 1 || got[1] != 2 {
		t.Errorf("warnings per shard %v, want map[0:1 1:2]", got)
	}
}
