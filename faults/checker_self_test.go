//go:build faults

package faults

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"
)

// TestFaultsChecker feeds the checker made-up histories, so that a
// checker that sees nothing cannot pass for a system that breaks nothing:
// a clean history passes, and every rule fires on its own breakage.
func TestFaultsChecker(t *testing.T) {
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	rec := func(id, key string, seq int, outcome string, poison bool, ms int) histRec {
		return histRec{ID: id, Key: key, Seq: seq, Outcome: outcome, Poison: poison, At: at(ms)}
	}
	msg := func(sseq uint64, id string, h histRec, ms int) seen {
		return seen{StreamSeq: sseq, MsgID: id, P: payload{ID: h.ID, Key: h.Key, Seq: h.Seq, Poison: h.Poison}, Stored: at(ms)}
	}
	eff := func(h histRec, ms int) effectRow { return effectRow{ID: h.ID, Key: h.Key, Seq: h.Seq, At: at(ms)} }

	a := rec("a", "k1", 1, committed, false, 0)
	b := rec("b", "k1", 2, committed, false, 1)
	c := rec("c", "k1", 3, rolledBack, false, 2)
	p := rec("p", "k1", 3, committed, true, 3)
	d := rec("d", "k2", 1, committed, false, 4)
	hist := map[string]histRec{"a": a, "b": b, "c": c, "p": p, "d": d}

	t.Run("clean", func(t *testing.T) {
		o := observed{
			hist:         hist,
			stream:       []seen{msg(1, "a", a, 10), msg(2, "b", b, 11), msg(3, "p", p, 12), msg(4, "d", d, 13), msg(5, "a", a, 14)},
			effects:      []effectRow{eff(a, 20), eff(b, 21), eff(d, 22)},
			consumerDead: []string{"p"},
		}
		r := judge(o, []*fault{{Kind: faultKill, Start: at(5), Lifted: at(9)}})
		if r.ViolationCount != 0 {
			t.Fatalf("clean history: %d violations: %+v", r.ViolationCount, r.Violations)
		}
		if r.Counts.StreamDuplicates != 1 || r.Counts.Committed != 4 || r.Counts.RolledBack != 1 {
			t.Errorf("counts: %+v", r.Counts)
		}
		if rc := r.Faults[0].Recovery; rc == nil || rc.BacklogAtStart != 4 || rc.BacklogDrainMs != 8 || rc.DrainAfterLiftMs != 4 {
			t.Errorf("recovery: %+v", rc)
		}
	})

	t.Run("forgotten", func(t *testing.T) {
		// After an asynchronous failover the database forgot b and p (k1
		// seqs 2 and 3), published, b applied; a new commit e reuses
		// seq 2.
		e := rec("e", "k1", 2, committed, false, 30)
		h := maps.Clone(hist)
		h["e"] = e
		o := observed{
			hist:      h,
			stream:    []seen{msg(1, "a", a, 10), msg(2, "b", b, 11), msg(3, "p", p, 12), msg(4, "d", d, 13), msg(5, "e", e, 31)},
			effects:   []effectRow{eff(a, 20), eff(b, 21), eff(d, 22), eff(e, 32)},
			forgotten: map[string]bool{"b": true, "p": true},
		}
		r := judge(o, nil)
		if r.ViolationCount != 2 || r.ByRule["forgotten_commit"] != 2 {
			t.Fatalf("want the two forgotten commits alone, got %d: %+v", r.ViolationCount, r.Violations)
		}
		if hist["b"].Outcome != committed {
			t.Error("judge changed the caller's history")
		}
	})

	t.Run("broken", func(t *testing.T) {
		wrongID := msg(5, "p", p, 14)
		wrongID.P.ID = "not-p"
		o := observed{
			hist: hist,
			// b before a; c of a rolled-back transaction; d never.
			stream:       []seen{msg(1, "b", b, 10), msg(2, "a", a, 11), msg(3, "c", c, 12), msg(4, "x", histRec{ID: "x"}, 13), wrongID},
			effects:      []effectRow{eff(b, 20), eff(a, 21), eff(c, 22), eff(p, 23)},
			dups:         []string{"a"},
			consumerDead: []string{"b"},
			relayDead:    []string{"d"},
		}
		r := judge(o, nil)
		want := []string{
			"applied_twice", "apply_order", "committed_not_published", "identity", "not_applied",
			"poison_applied", "poison_not_dead", "relay_dead", "rolled_back_applied", "rolled_back_published",
			"stream_order", "unexpected_dead_letter", "unknown_published",
		}
		var got []string
		for rule := range r.ByRule {
			got = append(got, rule)
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("rules fired:\n got %v\nwant %v", got, want)
		}
	})
}

// TestFaultsSchedule checks that a seed reproduces its schedule.
func TestFaultsSchedule(t *testing.T) {
	for _, p := range profiles {
		draw := func(seed uint64) string {
			rng := seeded(seed)
			var s string
			for _, f := range schedule(rng, p) {
				s += f.String() + fmt.Sprint(f.Consumer) + "\n"
			}
			return s
		}
		a, b, c := draw(42), draw(42), draw(43)
		if a == "" || a != b {
			t.Errorf("%s: seed 42 drew different schedules:\n%s\n%s", p.Name, a, b)
		}
		if a == c {
			t.Errorf("%s: seeds 42 and 43 drew the same schedule", p.Name)
		}
	}
}
