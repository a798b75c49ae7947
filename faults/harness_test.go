//go:build faults

package faults

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-go/postbox/internal/tcpproxy"
)

const (
	topic        = "fx.changed"
	consumerName = "fx"
)

// harness owns everything a run starts; every piece is stopped by run or
// by the test's cleanups.
type harness struct {
	t     *testing.T
	prof  profile
	seed  uint64
	dir   string
	runID string

	prefix string
	// topic is what the writers write to; empty for topic (TestShards
	// gives each shard its own, and each its own stream).
	topic string
	// db is the run's database (POSTBOX_FAULTS_DB); dbURL, replica,
	// replLink, pooler, pool and pg are PostgreSQL's (newPGDatabase).
	db    database
	dbURL string
	// replica, when the profile asks for one, is promoted by pg_failover.
	replica *pgCluster
	// replLink carries the replica's stream from the primary.
	replLink *tcpproxy.Proxy
	pooler   string        // "" or pgbouncer (POSTBOX_FAULTS_POOLER)
	storage  string        // table or log (POSTBOX_FAULTS_STORAGE)
	pool     *pgxpool.Pool // writers and the harness (application_name fx<run>writer)
	pg       *pgCluster
	broker   broker
	// Each relay reaches the broker and PostgreSQL through proxies of its
	// own (the broker's shows the relay's bytes to crashInspector); the
	// writers, the consumer and the watcher connect directly.
	proxies  []*tcpproxy.Proxy // relay i ↔ broker
	dbProx   []*tcpproxy.Proxy // relay i ↔ PostgreSQL
	relays   []*proc
	consumer *proc
	hist     *history
	watch    *watcher
	sched    []*fault
	// monitor, when set, runs beside the watcher for the whole run.
	monitor func(ctx context.Context)

	killedAt      time.Time // when the failover killed the primary
	promotedAt    time.Time // when the failover's promotion returned
	writeErrs     atomic.Int64
	injecting     atomic.Bool
	started       time.Time
	writersDone   time.Time
	settledAt     time.Time
	settled       bool
	cleanStops    []bool
	consumerClean bool
	watcherErr    error
}

func newHarness(t *testing.T, ctx context.Context, prof profile, seed uint64, dir, brokerKind string, dupWindow time.Duration) *harness {
	t.Helper()
	run := fmt.Sprintf("%d%d", os.Getpid()%100000, time.Now().UnixNano()%1_000_000)
	h := &harness{t: t, prof: prof, seed: seed, dir: dir, runID: run, prefix: "fx" + run + "_"}
	kind, err := databaseName()
	if err != nil {
		t.Fatal(err)
	}
	if h.storage, err = storageName(); err != nil {
		t.Fatal(err)
	}
	if kind == dbMariaDB {
		h.db = newMariaDatabase(ctx, h)
	} else {
		h.db = newPGDatabase(ctx, h)
	}
	p := h.prefix

	switch brokerKind {
	case "rabbitmq":
		h.broker = newRabbitBroker(t, ctx, run)
	case "nats-cluster":
		h.broker = newNATSClusterBroker(t, ctx, dir, run, dupWindow)
	default:
		h.broker = newNATSBroker(t, ctx, dir, run, dupWindow)
	}

	if kinds := prof.crashKinds(); kinds[crashRelay] > 0 && brokerKind == "nats-cluster" {
		t.Fatalf("faults: the %s fault needs the relays to reach the broker through the harness's proxies, which nats-cluster does not do", faultCrashRelay)
	}
	bin := buildPostbox(t, dir)
	cfg := filepath.Join(dir, "relay.yaml")
	// A profile without a lease runs the relays at the defaults.
	var tuning string
	if prof.Lease > 0 {
		tuning = fmt.Sprintf("  lease: %s\n  batch_deadline: %s\n", prof.Lease, prof.BatchDeadline)
	}
	yaml := h.broker.relayConfig() + `relay:
` + tuning + `  backoff_base: 100ms
  backoff_max: 2s
  poll_interval: 50ms
  batch_size: 200
  lanes: 2
  max_crashes: ` + fmt.Sprint(maxCrashes) + `
log:
  level: info
`
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	base := make([]string, 0, len(os.Environ()))
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "POSTBOX_") {
			base = append(base, e)
		}
	}
	for i := range prof.relays() {
		// A proxy per host, the first of which the relay's faults use.
		var via []string
		for j, host := range h.db.hosts() {
			dp, err := tcpproxy.New(host)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(dp.Close)
			if j == 0 {
				h.dbProx = append(h.dbProx, dp)
			}
			via = append(via, dp.Addr())
		}
		env := append(append([]string(nil), base...),
			"POSTBOX_CONFIG="+cfg,
			"POSTBOX_DATABASE_URL="+h.db.relayURL(via, i),
			"POSTBOX_PREFIX="+p,
			"POSTBOX_STORAGE="+h.storage,
			"POSTBOX_ADMIN_LISTEN=off",
		)
		bp, err := tcpproxy.New(h.broker.addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(bp.Close)
		h.proxies = append(h.proxies, bp)
		env = append(env, h.broker.relayEnv(bp.Addr())...)
		r := newRelayProc(i, bin, env, filepath.Join(dir, fmt.Sprintf("relay%d.log", i)))
		bp.Inspect(func() tcpproxy.Inspector { return crashInspector(r) })
		h.relays = append(h.relays, r)
	}
	h.consumer = newConsumerProc(t, consumerCase{
		DB:     h.db.consumer(),
		Prefix: p, Broker: brokerKind, Vars: h.broker.consumerVars(), AckWait: prof.ackWait(),
		CrashFile: filepath.Join(dir, "consumer.crash"),
	}, base, filepath.Join(dir, "consumer.log"))
	t.Cleanup(func() { h.consumer.close(2 * time.Second) })
	t.Cleanup(func() {
		for _, r := range h.relays {
			r.close(2 * time.Second)
		}
	})

	h.hist, err = newHistory(filepath.Join(dir, "history.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	h.watch = &watcher{first: map[string]time.Time{}}
	t.Logf("faults: %s, prefix %s, %s %s, files in %s", h.db.name(), p, h.broker.name(), h.broker.where(), dir)
	return h
}

func (h *harness) openPool(ctx context.Context, role string, conns int32) *pgxpool.Pool {
	h.t.Helper()
	cfg, err := pgxpool.ParseConfig(withAppName(h.dbURL, appName(h.runID, role)))
	if err != nil {
		h.t.Fatal(err)
	}
	cfg.MaxConns = conns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		h.t.Fatalf("PostgreSQL: %v", err)
	}
	if err := pool.Ping(ctx); err != nil {
		h.t.Fatalf("PostgreSQL at %s: %v", h.dbURL, err)
	}
	h.t.Cleanup(pool.Close)
	return pool
}

// run starts the consumer, the watcher and the relays, runs the writers
// and the faults, waits for the system to settle, and stops everything.
func (h *harness) run(ctx context.Context, sched []*fault) {
	t := h.t
	h.sched = sched
	bg, stopBG := context.WithCancel(ctx)
	defer stopBG()
	var bgWG sync.WaitGroup
	bgWG.Add(1)
	if h.monitor != nil {
		bgWG.Add(1)
		go func() {
			defer bgWG.Done()
			h.monitor(bg)
		}()
	}
	go func() {
		defer bgWG.Done()
		h.watcherErr = h.broker.watch(bg, h.watch)
	}()
	if err := h.consumer.start(); err != nil {
		t.Fatalf("start the consumer: %v", err)
	}
	for _, r := range h.relays {
		if err := r.start(); err != nil {
			t.Fatalf("start relay %d: %v", r.n, err)
		}
	}

	h.started = time.Now()
	until := h.started.Add(h.prof.WriteFor)
	var wg sync.WaitGroup
	for n := range h.prof.Writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h.writer(ctx, n, until)
		}()
	}
	// The writers go on while faults remain (a fault may run past its
	// slot), and a few seconds more.
	h.injecting.Store(true)
	wg.Add(1)
	go func() {
		defer wg.Done()
		h.inject(ctx, sched)
		sleep(ctx, 5*time.Second)
		h.injecting.Store(false)
	}()
	wg.Wait()
	h.writersDone = time.Now()
	t.Logf("faults: writers done after %s: %d transactions, %d write errors", h.writersDone.Sub(h.started).Round(time.Millisecond), h.hist.transactions(), h.writeErrs.Load())
	h.resolveUnknown(ctx)

	h.settled = h.waitSettled(ctx)
	h.settledAt = time.Now()
	t.Logf("faults: settled=%v %s after the writers stopped", h.settled, h.settledAt.Sub(h.writersDone).Round(time.Millisecond))
	if d, ok := h.broker.(describer); ok && !h.settled {
		t.Logf("faults: the broker after the drain limit: %s", d.describe(ctx))
	}

	for _, r := range h.relays {
		h.cleanStops = append(h.cleanStops, r.close(20*time.Second))
	}
	// The watcher reads the whole stream before it stops, so the checker
	// sees every copy that was ever stored.
	h.catchUp(ctx)
	h.consumerClean = h.consumer.close(20 * time.Second)
	stopBG()
	bgWG.Wait()
	if err := h.hist.close(); err != nil {
		t.Errorf("history: %v", err)
	}
}

// waitSettled waits until every committed message is in the stream, every
// committed message applied, and every poison or crash-looping one dead
// where it must be, or the drain limit passes. A message that kills the
// relay never reaches the stream.
func (h *harness) waitSettled(ctx context.Context) bool {
	deadline := time.Now().Add(h.prof.DrainLimit)
	committed := map[string]bool{}
	var poison, relayCrash, consumerCrash int
	for id, r := range h.hist.committedRecs() {
		switch {
		case r.Crash == crashRelay:
			relayCrash++
			continue
		case r.Crash == crashConsumer:
			consumerCrash++
		case r.Poison:
			poison++
		}
		committed[id] = true
	}
	want := len(committed) - poison - consumerCrash
	lossy := h.prof.Replica == "async"
	if lossy {
		// After an asynchronous failover, what the new primary does not
		// have is never published, and some effects the consumer made
		// on the old primary are gone: wait for the rest, and for the
		// effects to stop changing.
		kept, err := h.db.column(ctx, "writes", "message_id", "")
		if err == nil {
			keep := map[string]bool{}
			for _, id := range kept {
				keep[id] = true
			}
			for id := range committed {
				if !keep[id] {
					delete(committed, id)
				}
			}
		}
	}
	lastEffects, stableSince := -1, time.Now()
	for time.Now().Before(deadline) && ctx.Err() == nil {
		missing := 0
		for id := range committed {
			if !h.watch.has(id) {
				missing++
			}
		}
		var effects, dead, relayDead int
		effects, _ = h.db.count(ctx, "effects")
		dead, _ = h.db.count(ctx, "consumer_dead")
		relayDead, _ = h.db.count(ctx, "dead")
		if missing == 0 && effects >= want && dead >= poison+consumerCrash && relayDead >= relayCrash {
			return true
		}
		if effects != lastEffects {
			lastEffects, stableSince = effects, time.Now()
		}
		if lossy && missing == 0 && time.Since(stableSince) > 3*time.Second {
			return true
		}
		sleep(ctx, 250*time.Millisecond)
	}
	return false
}

// catchUp waits (bounded) until the watcher has read everything the
// broker stored.
func (h *harness) catchUp(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	for ctx.Err() == nil {
		if h.broker.caughtUp(ctx, h.watch) {
			return
		}
		sleep(ctx, 100*time.Millisecond)
	}
	h.t.Logf("faults: the watcher did not catch up with the broker")
}

// inject runs the schedule. Every fault is lifted, also when ctx ends.
func (h *harness) inject(ctx context.Context, sched []*fault) {
	var lifted time.Time
	for _, f := range sched {
		sleep(ctx, time.Until(h.started.Add(f.At)))
		// A fault that ran past its slot pushes the next one back, so
		// that each is measured apart.
		sleep(ctx, time.Until(lifted.Add(h.prof.MinGap)))
		if ctx.Err() != nil {
			return
		}
		f.Start = time.Now()
		switch f.Kind {
		case faultKill:
			r := h.relays[f.Relay]
			if err := r.kill(); err != nil {
				f.Note = "kill: " + err.Error()
			}
			sleep(ctx, f.Hold)
			if err := r.start(); err != nil {
				f.Note += " restart: " + err.Error()
			}
		case faultStop, faultPause:
			r := h.relays[f.Relay]
			if _, err := r.signal(syscall.SIGSTOP); err != nil {
				f.Note = "stop: " + err.Error()
			}
			sleep(ctx, f.Hold)
			if _, err := r.signal(syscall.SIGCONT); err != nil {
				f.Note += " cont: " + err.Error()
			}
		case faultPGTerm:
			f.Note = fmt.Sprintf("terminated %d connections", h.terminateLoop(ctx, f.Hold, f.Consumer))
		case faultBlackhole:
			lifts := make([]func(), len(h.proxies))
			for i, p := range h.proxies {
				lifts[i] = p.Blackhole()
			}
			sleep(ctx, f.Hold)
			for _, lift := range lifts {
				lift()
			}
		case faultReset:
			n := 0
			for _, p := range h.proxies {
				n += p.Reset()
			}
			f.Note = fmt.Sprintf("reset %d connections", n)
		case faultCrashRelay, faultCrashConsumer:
			f.Note = h.writeCrash(ctx, f.Key, map[string]string{faultCrashRelay: crashRelay, faultCrashConsumer: crashConsumer}[f.Kind])
		case faultPGBlackhole, faultPGStall:
			lift := h.dbProx[f.Relay].Blackhole()
			sleep(ctx, f.Hold)
			lift()
		case faultPGReset:
			f.Note = fmt.Sprintf("reset %d connections", h.dbProx[f.Relay].Reset())
		case faultRolling:
			f.Note = h.rollingDeploy(ctx, f.Hold)
		case faultKillMany:
			f.Note = h.killMany(ctx, f.Relays, f.Hold)
		case faultNATSLeaderKill, faultNATSFreeze, faultNATSCut:
			h.clusterFault(ctx, f)
		case faultFailover:
			if err := h.failover(ctx, f, f.Hold); err != nil {
				f.Note = "failover: " + err.Error()
			}
		case faultXmin:
			if err := h.holdXmin(ctx, f.Hold); err != nil {
				f.Note = "xmin: " + err.Error()
			}
		case faultBrokerRestart:
			if err := h.broker.stop(); err != nil {
				f.Note = "stop: " + err.Error()
			}
			sleep(ctx, f.Hold)
			if err := h.broker.start(context.WithoutCancel(ctx)); err != nil {
				f.Note += " start: " + err.Error()
			}
		case faultPGRestart:
			if err := h.db.restart(ctx, f.Mode, f.Hold); err != nil {
				f.Note = err.Error()
			}
		}
		f.Lifted = time.Now()
		lifted = f.Lifted
		h.t.Logf("faults: %s done %s", f, f.Note)
	}
}

// terminateLoop kills the relays' database connections, and the
// consumer's too when asked, every 150ms for d.
func (h *harness) terminateLoop(ctx context.Context, d time.Duration, consumer bool) int {
	end := time.Now().Add(d)
	total := 0
	for time.Now().Before(end) && ctx.Err() == nil {
		if n, err := h.db.terminate(ctx, consumer); err == nil {
			total += n
		}
		sleep(ctx, 150*time.Millisecond)
	}
	return total
}

// holdXmin keeps a transaction with a snapshot open for d: on PostgreSQL
// it holds an xid and xmin back, on MariaDB InnoDB's purge.
func (h *harness) holdXmin(ctx context.Context, d time.Duration) error {
	// The database may still be coming back from an earlier fault (a
	// restart, or PgBouncer's pause before it logs in again): try for a
	// while, so that the fault tests what it says.
	var release func()
	var err error
	for try := time.Now(); ; {
		if release, err = h.db.snapshot(ctx); err == nil || time.Since(try) > 10*time.Second || ctx.Err() != nil {
			break
		}
		sleep(ctx, 200*time.Millisecond)
	}
	if err != nil {
		return err
	}
	defer release()
	sleep(ctx, d)
	return nil
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

var errPoison = errors.New("poison: this consumer always rejects this message")
