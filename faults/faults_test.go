//go:build faults

package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/postbox-go/postbox"
)

// profile sizes a run.
type profile struct {
	Name string `json:"name"`
	// WriteFor is how long the writers run; the faults fit inside it.
	WriteFor time.Duration `json:"write_for"`
	// Rounds of the fault mix; each round is every fault of Mix once, in
	// an order drawn from the seed. 0 repeats rounds while time remains.
	Rounds int `json:"rounds"`
	// Mix counts each fault kind in one round.
	Mix map[string]int `json:"mix"`
	// Writers, keys, pace and the share of rollbacks and poison.
	Writers    int           `json:"writers"`
	Keys       int           `json:"keys"`
	Pace       time.Duration `json:"pace"` // the most a writer sleeps between transactions
	Rollback   float64       `json:"rollback"`
	Poison     float64       `json:"poison"`
	DrainLimit time.Duration `json:"drain_limit"`
	// Relay settings (relay: section of the daemon's YAML).
	// No lease: the relays run at the defaults.
	Lease         time.Duration `json:"lease"`
	BatchDeadline time.Duration `json:"batch_deadline"`
	// Relays counts the relay processes; default 3.
	Relays int `json:"relays"`
	// AckWait is the consumer's JetStream AckWait; default 30s. A
	// consumer process that dies leaves what it had pulled to it, and
	// postboxnats gives up waiting for a retried message after twice it,
	// moving its key on: short enough for a message that kills the
	// consumer to reach its bound within a run, long enough for the
	// broker's outages in the profile.
	AckWait time.Duration `json:"ack_wait,omitempty"`
	// MinGap is the least time between one fault's lift and the next
	// fault's start, however late the first ran.
	MinGap time.Duration `json:"min_gap,omitempty"`
	// Dedupe, when set, replaces the draw: broker, inbox or none.
	Dedupe string `json:"dedupe,omitempty"`
	// Replica: a streaming replica of the database, "sync" or "async",
	// for the failover (TestFailover).
	Replica string `json:"replica,omitempty"`
	// Tolerate lists the checker's rules whose violations the profile
	// expects and counts instead of failing on (an asynchronous
	// failover's losses).
	Tolerate []string `json:"tolerate,omitempty"`
}

// lease is the relays' lease: the profile's, or the default.
func (p profile) lease() time.Duration {
	if p.Lease > 0 {
		return p.Lease
	}
	return postbox.DefaultLeaseDuration
}

// crashKinds counts the crash-looping messages of each kind (crashRelay,
// crashConsumer) one round of the mix writes.
func (p profile) crashKinds() map[string]int {
	return map[string]int{crashRelay: p.Mix[faultCrashRelay], crashConsumer: p.Mix[faultCrashConsumer]}
}

func (p profile) ackWait() time.Duration {
	if p.AckWait > 0 {
		return p.AckWait
	}
	return 30 * time.Second
}

func (p profile) relays() int {
	if p.Relays > 0 {
		return p.Relays
	}
	return 3
}

var profiles = map[string]profile{
	"short": {
		Name: "short", WriteFor: 90 * time.Second, Rounds: 1,
		Mix: map[string]int{
			faultKill: 4, faultStop: 2, faultPGTerm: 2, faultBlackhole: 1, faultReset: 1, faultXmin: 1,
			faultBrokerRestart: 1, faultPGRestart: 1, faultPGBlackhole: 1, faultPGReset: 1,
			faultCrashRelay: 1, faultCrashConsumer: 1,
		},
		Writers: 4, Keys: 40, Pace: 40 * time.Millisecond, Rollback: 0.15, Poison: 0.01,
		DrainLimit: 60 * time.Second, Lease: 3 * time.Second, BatchDeadline: time.Second,
		AckWait: 5 * time.Second,
	},
	"soak": {
		Name: "soak", WriteFor: 20 * time.Minute, Rounds: 0,
		Mix: map[string]int{
			faultKill: 4, faultStop: 2, faultPGTerm: 2, faultBlackhole: 1, faultReset: 1, faultXmin: 1,
			faultBrokerRestart: 1, faultPGRestart: 1, faultPGBlackhole: 1, faultPGReset: 1,
			faultCrashRelay: 1, faultCrashConsumer: 1,
		},
		Writers: 4, Keys: 200, Pace: 40 * time.Millisecond, Rollback: 0.15, Poison: 0.005,
		DrainLimit: 3 * time.Minute, Lease: 3 * time.Second, BatchDeadline: time.Second,
		AckWait: 5 * time.Second,
	},
}

func TestFaults(t *testing.T) {
	runProfile(t, chosen(t, "POSTBOX_FAULTS_PROFILE", "short", profiles), schedule, nil)
}

// chosen is the profile the variable names, or the default.
func chosen(t *testing.T, variable, def string, from map[string]profile) profile {
	t.Helper()
	name := os.Getenv(variable)
	if name == "" {
		name = def
	}
	prof, ok := from[name]
	if !ok {
		names := make([]string, 0, len(from))
		for n := range from {
			names = append(names, n)
		}
		slices.Sort(names)
		t.Fatalf("%s=%q: want one of %v", variable, name, names)
	}
	return prof
}

// runSetup reads the run's seed (POSTBOX_FAULTS_SEED, else the clock),
// its directory (POSTBOX_FAULTS_DIR's run-<seed>, else a temporary one,
// removed when the test passes and kept for its logs when it fails) and
// its report's path (POSTBOX_FAULTS_REPORT, else report.json there).
func runSetup(t *testing.T) (seed uint64, dir, reportPath string) {
	t.Helper()
	seed = uint64(time.Now().UnixNano())
	if s := os.Getenv("POSTBOX_FAULTS_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("POSTBOX_FAULTS_SEED=%q: want an unsigned integer", s)
		}
		seed = v
	}
	dir = os.Getenv("POSTBOX_FAULTS_DIR")
	if dir == "" {
		d, err := os.MkdirTemp("", "postbox-faults-")
		if err != nil {
			t.Fatal(err)
		}
		dir = d
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("faults: the run's files are kept in %s", dir)
				return
			}
			if err := os.RemoveAll(dir); err != nil {
				t.Errorf("faults: remove the run's files: %v", err)
			}
		})
	} else {
		dir = filepath.Join(dir, fmt.Sprintf("run-%d", seed))
		if err := os.MkdirAll(dir, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	reportPath = os.Getenv("POSTBOX_FAULTS_REPORT")
	if reportPath == "" {
		reportPath = filepath.Join(dir, "report.json")
	}
	return seed, dir, reportPath
}

// writeReport writes a run's report, as indented JSON, to path.
func writeReport(t *testing.T, path string, rep any) {
	t.Helper()
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatalf("write report: %v", err)
	}
}

// runProfile runs one profile: the schedule drawn by plan, the writers,
// the relays and the consumer, then the checker, and writes the report.
// fleet, when set, watches the leases during the run and adds its
// figures to the report.
func runProfile(t *testing.T, prof profile, plan func(*rand.Rand, profile) []*fault, fleet *fleetWatch) {
	seed, dir, reportPath := runSetup(t)
	t.Logf("faults: profile %s, seed %d (rerun with POSTBOX_FAULTS_SEED=%d)", prof.Name, seed, seed)

	// Everything the run does is bounded: the writers by WriteFor, the
	// drain by DrainLimit, the rest by this.
	// Setting up (building the binary, starting the servers) has a bound
	// of its own, and the run starts its clock after it.
	setup, cancelSetup := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancelSetup()

	rng := seeded(seed)
	sched := plan(rng, prof)
	db, err := databaseName()
	if err != nil {
		t.Fatal(err)
	}
	if why := refuseOnMariaDB(prof, sched, fleet != nil); db == dbMariaDB && why != "" {
		t.Fatalf("POSTBOX_FAULTS_DB=mariadb: profile %s cannot run on MariaDB: %s", prof.Name, why)
	}
	for _, f := range sched {
		t.Logf("faults: scheduled %s", f)
	}

	// The stream's duplicate window: "broker" (10 minutes) lets JetStream
	// drop the relays' re-sends by Nats-Msg-Id; "inbox" (1 second, below
	// the lease) lets the copies through, so that the inbox must absorb
	// them, as with a broker that has no dedupe. Drawn from the seed
	// unless POSTBOX_FAULTS_DEDUPE says.
	dedupe := []string{"broker", "inbox"}[rng.IntN(2)]
	if prof.Dedupe != "" {
		dedupe = prof.Dedupe
	}
	if v := os.Getenv("POSTBOX_FAULTS_DEDUPE"); v != "" {
		dedupe = v
	}
	kind, err := brokerName()
	if err != nil {
		t.Fatal(err)
	}
	if kind == "rabbitmq" {
		dedupe = "inbox" // RabbitMQ drops no copy: every re-send reaches the consumer
	}
	// "none" (100ms) keeps nearly every copy a relay sends, so that the
	// fleet's figures count them.
	window := map[string]time.Duration{"broker": 10 * time.Minute, "inbox": time.Second, "none": 100 * time.Millisecond}[dedupe]
	if window == 0 {
		t.Fatalf("POSTBOX_FAULTS_DEDUPE=%q: want broker, inbox or none", dedupe)
	}
	t.Logf("faults: dedupe by the %s (stream duplicate window %s)", dedupe, window)

	h := newHarness(t, setup, prof, seed, dir, kind, window)
	cancelSetup()
	if fleet != nil {
		fleet.attach(h)
	}
	budget := prof.WriteFor + prof.DrainLimit + 2*time.Minute
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	start := time.Now()
	h.run(ctx, sched)
	rep := h.check(ctx)
	rep.Elapsed = time.Since(start).Round(time.Millisecond).String()
	rep.Dedupe = dedupe
	rep.Pooler = h.pooler
	if fleet != nil {
		rep.Fleet = fleet.judge(h, rep)
	}

	writeReport(t, reportPath, rep)
	t.Logf("faults: report written to %s", reportPath)
	t.Logf("faults: %s", rep.Summary())
	shown := 0
	for _, v := range rep.Violations {
		if slices.Contains(prof.Tolerate, v.Rule) {
			continue
		}
		shown++
		t.Errorf("violation %s (%s): %s", v.Rule, v.Guarantee, v.Detail)
	}
	if more := rep.ViolationCount - rep.tolerated(prof.Tolerate) - shown; more > 0 {
		t.Errorf("... and %d more violations (see the report)", more)
	}
	if !rep.Pass {
		t.Errorf("faults: FAIL with seed %d; files in %s", seed, dir)
	}
}

// appName is a PostgreSQL application_name: letters and digits only, so
// that it can sit in a LIKE pattern as it is.
func appName(run, role string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return -1
	}, "fx"+run+role)
}

// withAppName adds application_name to a postgres:// URL.
func withAppName(url, name string) string {
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	return url + sep + "application_name=" + name
}

// seeded is the run's generator: the schedule and the dedupe mode come
// from it, in that order.
func seeded(seed uint64) *rand.Rand {
	return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
}
