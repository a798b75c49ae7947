//go:build faults

package faults

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"time"
)

// The fault kinds.
const (
	faultKill          = "sigkill"          // SIGKILL a relay, restart it after Hold
	faultStop          = "sigstop"          // SIGSTOP a relay for Hold (past its lease), then SIGCONT
	faultPGTerm        = "pg_terminate"     // pg_terminate_backend the relays' (and, drawn, the consumer's) connections in a loop for Hold
	faultBlackhole     = "broker_blackhole" // the proxy between relays and the broker forwards nothing for Hold
	faultReset         = "broker_reset"     // the proxy resets every relay connection to the broker (RST)
	faultXmin          = "xmin_hold"        // a transaction holds xmin back for Hold
	faultBrokerRestart = "broker_restart"   // stop the broker (cleanly), start it again after Hold
	faultPGRestart     = "pg_restart"       // stop PostgreSQL (Mode fast or immediate, a crash), start it again after Hold
	faultPGBlackhole   = "pg_blackhole"     // the proxy between one relay and PostgreSQL forwards nothing for Hold (past its lease)
	faultPGReset       = "pg_reset"         // the proxy resets every connection between one relay and PostgreSQL (RST)
	faultCrashRelay    = "crash_relay"      // commit a message whose publish ends the relay process (crash.go)
	faultCrashConsumer = "crash_consumer"   // commit a message whose handler ends the consumer process

	// The fleet's (TestFleet).
	faultRolling  = "rolling_deploy" // SIGTERM each relay in turn and start its replacement, waiting until it holds a lease
	faultKillMany = "kill_many"      // SIGKILL several relays at once, restart them after Hold
	faultPause    = "sigstop_short"  // SIGSTOP a relay for Hold, shorter than its lease, then SIGCONT
	faultPGStall  = "pg_stall"       // the proxy between one relay and PostgreSQL forwards nothing for Hold, shorter than its lease
)

// guarantees lists what each fault puts to the test, for the report.
var guarantees = map[string]string{
	faultKill:          "G2 G3 G4 G6 G7: a crash between publish and mark re-sends the same id; lease expiry hands the partitions on",
	faultStop:          "G4 G2: a paused relay outlives its lease; on SIGCONT its stale publishes and marks must change nothing",
	faultPGTerm:        "G2 G5 G6: lost database connections during fetch, mark, heartbeat (and the consumer's commit); reconnect, lose nothing, apply once",
	faultBlackhole:     "G3 G2 G4: no PubAck arrives; nothing is marked, order holds when the stalled bytes arrive late",
	faultReset:         "G3 G2: connections reset under in-flight publishes; reconnect, re-send with the same id",
	faultXmin:          "G2 G4: a long snapshot (dead tuples, late-visible rows) must not skip or reorder rows",
	faultBrokerRestart: "G2 G3 G4 G6: the broker goes away and comes back with its store; relays pause, spend no attempt, re-send by id; the consumer resumes",
	faultPGRestart:     "G1 G2 G5 G6: the database stops or crashes and recovers from its WAL; every committed row survives, no rolled-back one appears, relays and the consumer reconnect",
	faultPGBlackhole:   "G4 G2 G3: one relay is cut off from the database past its lease while its broker link works; its stalled fetch, mark and renewal arrive after the partitions moved on and must change nothing",
	faultPGReset:       "G2 G3 G6: one relay's database connections reset mid-statement (a mark whose outcome it never hears); it reconnects, loses nothing, and what it re-sends is absorbed",
	faultCrashRelay:    "G2 G4: a message that kills every relay publishing it is a dead message after a bounded number of deaths; its key moves on, the other keys never wait",
	faultCrashConsumer: "G2 G6: a message that kills the consumer whenever its handler runs is a consumer dead message after a bounded number of exits; its key moves on, nothing else is lost or applied twice",
	faultRolling:       "G2 G3 G4: every relay replaced in turn; each hands its partitions on when its batches are marked, so nothing waits for a lease and little is sent twice",
	faultKillMany:      "G2 G3 G4: several relays crash at once; their partitions are taken within about a lease, and only what they had in flight is sent again",
	faultPause:         "G4: a relay paused for less than its lease keeps its partitions; nobody takes them early",
	faultPGStall:       "G4 G2: a relay's database link stalls for less than its lease; it keeps its partitions, and its stalled statements change nothing twice",
}

// fault is one scheduled fault and, once run, what happened.
type fault struct {
	Kind  string `json:"kind"`
	Relay int    `json:"relay"` // -1 when the fault targets no single relay
	// Relays lists the relays a kill_many ends.
	Relays []int `json:"relays,omitempty"`
	// Target names what the fault hits when no other field does (one
	// shard's database: shards_test.go).
	Target string `json:"target,omitempty"`
	// Consumer: pg_terminate also kills the consumer's connections.
	Consumer bool `json:"consumer,omitempty"`
	// Key: the crash-looping message's (crash_relay, crash_consumer).
	Key    string        `json:"key,omitempty"`
	At     time.Duration `json:"at"` // from the start of the writers
	Hold   time.Duration `json:"hold"`
	Mode   string        `json:"mode,omitempty"` // pg_restart: fast or immediate
	Tests  string        `json:"tests"`
	Start  time.Time     `json:"start"`
	Lifted time.Time     `json:"lifted"`
	Note   string        `json:"note,omitempty"`
	// Filled in by the checker.
	Recovery *recovery `json:"recovery,omitempty"`
}

func (f *fault) String() string {
	target := "all relays"
	if f.Consumer {
		target += " and the consumer"
	}
	if f.Relay >= 0 {
		target = fmt.Sprintf("relay %d", f.Relay)
	}
	if len(f.Relays) > 0 {
		target = fmt.Sprintf("relays %v", f.Relays)
	}
	if f.Key != "" {
		target = "key " + f.Key
	}
	if f.Target != "" {
		target = f.Target
	}
	kind := f.Kind
	if f.Mode != "" {
		kind += " (" + f.Mode + ")"
	}
	return fmt.Sprintf("%s on %s at +%s for %s", kind, target, f.At.Round(time.Millisecond), f.Hold.Round(time.Millisecond))
}

// schedule draws the faults from rng: rounds of the profile's mix, each
// in a shuffled order, one fault at a time with a gap after each, all
// ending well before the writers stop. The same seed gives the same
// schedule.
func schedule(rng *rand.Rand, p profile) []*fault {
	kinds := make([]string, 0, len(p.Mix))
	for k := range p.Mix {
		kinds = append(kinds, k)
	}
	slices.Sort(kinds) // map order is random; the draw must not be
	at := 5 * time.Second
	end := p.WriteFor - 8*time.Second
	var out []*fault
	for round := 0; p.Rounds == 0 || round < p.Rounds; round++ {
		var bag []string
		for _, k := range kinds {
			for range p.Mix[k] {
				bag = append(bag, k)
			}
		}
		rng.Shuffle(len(bag), func(i, j int) { bag[i], bag[j] = bag[j], bag[i] })
		for _, k := range bag {
			f := &fault{Kind: k, Relay: rng.IntN(p.relays()), Tests: guarantees[k]}
			switch k {
			case faultKill:
				f.Hold = jitter(rng, 500*time.Millisecond, 2500*time.Millisecond)
			case faultStop:
				f.Hold = p.Lease + jitter(rng, time.Second, 2*time.Second)
			case faultPGTerm:
				f.Relay = -1
				f.Consumer = rng.IntN(2) == 0
				f.Hold = jitter(rng, 2*time.Second, 4*time.Second)
			case faultBlackhole:
				f.Relay = -1
				f.Hold = jitter(rng, 2*time.Second, 5*time.Second)
			case faultReset:
				f.Relay = -1
			case faultXmin:
				f.Relay = -1
				f.Hold = jitter(rng, 5*time.Second, 10*time.Second)
			case faultBrokerRestart:
				f.Relay = -1
				f.Hold = jitter(rng, time.Second, 4*time.Second)
			case faultPGBlackhole:
				f.Hold = p.Lease + jitter(rng, time.Second, 2*time.Second)
			case faultPGReset:
				// One relay, no hold.
			case faultCrashRelay, faultCrashConsumer:
				// One message, written at once; its crashes go on
				// under the faults after it.
				f.Relay = -1
				f.Key = fmt.Sprintf("k%04d", rng.IntN(p.Keys))
			case faultNATSLeaderKill:
				f.Relay = -1
				f.Hold = jitter(rng, time.Second, 3*time.Second)
			case faultNATSFreeze:
				f.Relay = -1
				f.Hold = jitter(rng, 3*time.Second, 6*time.Second)
			case faultNATSCut:
				f.Relay = -1
				f.Hold = jitter(rng, 4*time.Second, 8*time.Second)
			case faultPGRestart:
				f.Relay = -1
				f.Mode = []string{"fast", "immediate"}[rng.IntN(2)]
				f.Hold = jitter(rng, 500*time.Millisecond, 3*time.Second)
			}
			if at+f.Hold > end {
				return out
			}
			f.At = at
			out = append(out, f)
			at += f.Hold + jitter(rng, time.Second, 3*time.Second)
		}
	}
	return out
}

func jitter(rng *rand.Rand, lo, hi time.Duration) time.Duration {
	return lo + time.Duration(rng.Int64N(int64(hi-lo)+1))
}
