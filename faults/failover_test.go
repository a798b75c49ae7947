//go:build faults

package faults

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// faultFailover: the primary's machine dies (every PostgreSQL process
// SIGKILLed at once), and the replica is promoted after Hold, as an HA
// manager would once it noticed.
const faultFailover = "pg_failover"

func init() {
	guarantees[faultFailover] = "G1 G2 G4 G5 G6: the primary dies mid-load and its replica is promoted; writers, relays and the consumer find the new primary through their multi-host URL without a restart; with synchronous replication every commit a writer saw survives and is published once per effect in key order; with asynchronous replication what is lost is counted"
}

// failoverProfiles: writers, three relays and the consumer on a primary
// with one streaming replica; the primary is killed half-way through and
// the replica promoted. POSTBOX_FAILOVER_PROFILE picks one.
var failoverProfiles = map[string]profile{
	"failover-sync": {
		Name: "failover-sync", WriteFor: 40 * time.Second, Replica: "sync",
		Writers: 4, Keys: 40, Pace: 40 * time.Millisecond, Rollback: 0.15, Poison: 0.01,
		DrainLimit: 60 * time.Second, Lease: 3 * time.Second, BatchDeadline: time.Second,
	},
	"failover-async": {
		Name: "failover-async", WriteFor: 40 * time.Second, Replica: "async",
		Writers: 4, Keys: 40, Pace: 40 * time.Millisecond, Rollback: 0.15, Poison: 0.01,
		DrainLimit: 60 * time.Second, Lease: 3 * time.Second, BatchDeadline: time.Second,
		// What an asynchronous failover may cost, counted in the report:
		// commits the new primary never received, and what the consumer
		// committed on the old primary for messages it acknowledged (an
		// effect, a dead letter), which is gone with it.
		Tolerate: []string{"forgotten_commit", "not_applied", "poison_not_dead"},
	},
}

// TestFailover kills the primary under load and promotes its replica
// (SCALING.md, "PostgreSQL failover").
func TestFailover(t *testing.T) {
	runProfile(t, chosen(t, "POSTBOX_FAILOVER_PROFILE", "failover-sync", failoverProfiles), failoverSchedule, nil)
}

// failoverSchedule is the one failover, half-way through the writes; the
// promotion follows 1–2 s after the kill.
func failoverSchedule(rng *rand.Rand, p profile) []*fault {
	return []*fault{{
		Kind: faultFailover, Relay: -1, At: p.WriteFor / 2,
		Hold: time.Second + time.Duration(rng.Int64N(int64(time.Second))), Tests: guarantees[faultFailover],
	}}
}

// pgURL is a connection URL over hosts (host:port each, tried in order),
// with params added.
func pgURL(hosts []string, params string) string {
	u := fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable", strings.Join(hosts, ","))
	if params != "" {
		u += "&" + params
	}
	return u
}

// replicate makes the primary's commits wait for the replica ("sync") or
// not ("async"), and waits until the replica streams in that state. The
// setting is made after the base backup, on the primary alone, so that the
// promoted replica does not wait for a standby it will never have.
func (h *harness) replicate(ctx context.Context, mode string) error {
	conn, err := pgx.Connect(ctx, h.pg.url())
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	want := "async"
	if mode == "sync" {
		want = "sync"
		for _, q := range []string{`ALTER SYSTEM SET synchronous_standby_names = '*'`, `SELECT pg_reload_conf()`} {
			if _, err := conn.Exec(ctx, q); err != nil {
				return fmt.Errorf("replication %s: %w", mode, err)
			}
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming' AND sync_state = $1`, want).Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the replica is not streaming (%s) after 60s", want)
		}
		sleep(ctx, 100*time.Millisecond)
	}
}

// replicaCut is how long the replica's link is cut before the primary
// dies.
const replicaCut = 2 * time.Second

// failover cuts the replica's link, kills the primary's every process at
// once replicaCut later, waits hold, and promotes the replica, which
// becomes h.pg.
func (h *harness) failover(ctx context.Context, f *fault, hold time.Duration) error {
	if h.replica == nil {
		return fmt.Errorf("no replica to promote")
	}
	// The replica falls behind first: its link is cut for a while before
	// the primary dies, as when the network between them fails first.
	// Synchronous commits wait meanwhile; asynchronous ones go on
	// without it.
	lift := h.replLink.Blackhole()
	defer lift()
	sleep(ctx, replicaCut)
	h.pg.crash()
	sleep(ctx, hold)
	conn, err := pgx.Connect(ctx, h.replica.url())
	if err != nil {
		return fmt.Errorf("connect to the replica: %w", err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	var ok bool
	if err := conn.QueryRow(ctx, `SELECT pg_promote(true, 60)`).Scan(&ok); err != nil {
		return fmt.Errorf("promote: %w", err)
	}
	if !ok {
		return fmt.Errorf("promote: not done within 60s")
	}
	h.promotedAt = time.Now()
	f.Note = fmt.Sprintf("replica cut %s before the kill, promoted %s after it", replicaCut, h.promotedAt.Sub(f.Start.Add(replicaCut)).Round(time.Millisecond))
	h.killedAt = f.Start.Add(replicaCut)
	h.pg, h.replica = h.replica, nil
	return nil
}

// failoverReport is what a failover run adds to the report.
type failoverReport struct {
	Replication string `json:"replication"` // sync or async
	// KillToPromoteMs is the hold: how long the HA manager took.
	KillToPromoteMs int64 `json:"kill_to_promote_ms"`
	// FirstCommitMs and FirstPublishMs run from the promotion to the
	// first writer commit and the first message stored in the stream
	// that were committed on the new primary.
	FirstCommitMs  int64 `json:"first_commit_after_promote_ms"`
	FirstPublishMs int64 `json:"first_publish_after_promote_ms"`
	// Forgotten counts commits a writer saw that the new primary does not
	// have; ForgottenPublished those of them in the stream: events about
	// a change the database forgot.
	Forgotten          int `json:"forgotten_commits"`
	ForgottenPublished int `json:"forgotten_published"`
	// EffectsLost counts messages acknowledged by the consumer whose
	// effect the new primary does not have.
	EffectsLost int `json:"effects_lost"`
	// AsyncWarning: the relays' start-up warned about asynchronous
	// replicas.
	AsyncWarning bool `json:"async_warning"`
}

// judgeFailover fills the failover's figures into rep.
func (h *harness) judgeFailover(o observed, rep *report) {
	if h.prof.Replica == "" {
		return
	}
	fr := &failoverReport{Replication: h.prof.Replica, FirstCommitMs: -1, FirstPublishMs: -1}
	if !h.promotedAt.IsZero() {
		fr.KillToPromoteMs = h.promotedAt.Sub(h.killedAt).Milliseconds()
	}
	fr.Forgotten = len(o.forgotten)
	stored := map[string]time.Time{}
	for _, s := range o.stream {
		if _, ok := stored[s.MsgID]; ok {
			continue
		}
		stored[s.MsgID] = s.Stored
		if o.forgotten[s.MsgID] {
			fr.ForgottenPublished++
		}
	}
	if !h.promotedAt.IsZero() {
		var commits, publishes []time.Duration
		for id, r := range o.hist {
			if r.Outcome != committed || r.At.Before(h.promotedAt) {
				continue
			}
			commits = append(commits, r.At.Sub(h.promotedAt))
			if at, ok := stored[id]; ok {
				publishes = append(publishes, at.Sub(h.promotedAt))
			}
		}
		if len(commits) > 0 {
			fr.FirstCommitMs = slices.Min(commits).Milliseconds()
		}
		if len(publishes) > 0 {
			fr.FirstPublishMs = slices.Min(publishes).Milliseconds()
		}
	}
	fr.EffectsLost = rep.ByRule["not_applied"] + rep.ByRule["poison_not_dead"]
	for i := range h.relays {
		b, _ := os.ReadFile(filepath.Join(h.dir, fmt.Sprintf("relay%d.log", i)))
		if strings.Contains(string(b), "asynchronously") {
			fr.AsyncWarning = true
		}
	}
	if h.prof.Replica == "async" && !fr.AsyncWarning {
		rep.add("harness", "-", "", "", "no relay warned at start that the replica is asynchronous")
	}
	if h.prof.Replica == "sync" && fr.AsyncWarning {
		rep.add("harness", "-", "", "", "a relay warned of an asynchronous replica, but replication is synchronous")
	}
	rep.Failover = fr
}
