//go:build faults

package faults

import (
	"bytes"
	"encoding/json"
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
		// An order violation says how far apart the two were stored and
		// committed, which tells a late commit from a read that skipped.
		const order = "stream seq 2: key k1 seq 1 first stored after seq 2 (stream seq 1): stored 1ms after it, committed 1ms before it"
		for _, v := range r.Violations {
			if v.Rule == "stream_order" && v.Detail != order {
				t.Errorf("stream_order: %q, want %q", v.Detail, order)
			}
		}
		// A row stored late that also committed late: "after".
		if got := beforeOrAfter(-3 * time.Millisecond); got != "3ms after" {
			t.Errorf("beforeOrAfter(-3ms) = %q, want \"3ms after\"", got)
		}
	})
	// The crash-looping messages: rk kills every relay publishing it,
	// ck the consumer whenever its handler runs.
	crash := func(id, key string, seq int, kind string, ms int) histRec {
		h := rec(id, key, seq, committed, false, ms)
		h.Crash = kind
		return h
	}
	deaths := func(id, proc string, n int) []crashRec {
		out := make([]crashRec, n)
		for i := range out {
			out[i] = crashRec{ID: id, Proc: proc, Life: fmt.Sprintf("fx%ss%d", proc, i), At: at(100 + i)}
		}
		return out
	}
	// The consumer's deaths, each on a delivery with the count given.
	consumerDeaths := func(id string, counts ...int) []crashRec {
		out := deaths(id, "consumer", len(counts))
		for i, n := range counts {
			out[i].Life, out[i].Delivered = "", n
		}
		return out
	}

	t.Run("crashes", func(t *testing.T) {
		// Each crash-looping message dead after its bound of deaths, or
		// fewer; its key's later message applied. x1 and x2, in the
		// stream before the consumer's deaths, applied out of order
		// after them: excused; so are z1 and z2, stored just after the
		// last death was reaped, before the broker could notice it.
		rk := crash("rk", "k3", 1, crashRelay, 5)
		r2 := rec("r2", "k3", 2, committed, false, 6)
		ck := crash("ck", "k4", 1, crashConsumer, 7)
		c2 := rec("c2", "k4", 2, committed, false, 8)
		x1 := rec("x1", "k9", 1, committed, false, 9)
		x2 := rec("x2", "k9", 2, committed, false, 10)
		z1 := rec("z1", "k11", 1, committed, false, 11)
		z2 := rec("z2", "k11", 2, committed, false, 12)
		h := maps.Clone(hist)
		h["rk"], h["r2"], h["ck"], h["c2"], h["x1"], h["x2"], h["z1"], h["z2"] = rk, r2, ck, c2, x1, x2, z1, z2
		o := observed{
			hist:         h,
			stream:       []seen{msg(1, "a", a, 10), msg(2, "b", b, 11), msg(3, "p", p, 12), msg(4, "d", d, 13), msg(5, "r2", r2, 14), msg(6, "ck", ck, 15), msg(7, "c2", c2, 16), msg(8, "x1", x1, 90), msg(9, "x2", x2, 91), msg(10, "z1", z1, 300), msg(11, "z2", z2, 301)},
			effects:      []effectRow{eff(a, 20), eff(b, 21), eff(d, 22), eff(r2, 23), eff(c2, 24), eff(x2, 110), eff(x1, 111), eff(z2, 400), eff(z1, 401)},
			consumerDead: []string{"p", "ck"},
			relayDead:    []string{"rk"},
			// One death more than the bound, in a relay that had given
			// up its crash marks before; and one more than the bound
			// for ck, on what the broker sent again as a first delivery.
			crashes: append(append(deaths("rk", "relay0", 3), deaths("rk", "relay2", relayCrashBound-2)...), consumerDeaths("ck", 1, 1, 2, 3, 4)...),
			giveUps: map[string][]time.Time{"fxrelay0s2": {at(99)}},
		}
		r := judge(o, nil)
		if r.ViolationCount != 0 {
			t.Fatalf("%d violations: %+v", r.ViolationCount, r.Violations)
		}
		c := r.Counts
		if c.RelayCrashMessages != 1 || c.ConsumerCrashMessages != 1 || c.RelayCrashKills != relayCrashBound+1 || c.ConsumerCrashExits != consumerCrashBound+1 || c.ApplyOrderAcrossRestart != 2 {
			t.Errorf("counts: %+v", c)
		}
		if len(r.Crashes) != 2 || r.Crashes[0].ID != "ck" || r.Crashes[0].LaterApplied != 1 || r.Crashes[0].Resent != 1 || r.Crashes[0].Bound != consumerCrashBound+1 ||
			r.Crashes[1].Deaths != relayCrashBound+1 || r.Crashes[1].Unmarked != 1 || !r.Crashes[1].Dead {
			t.Errorf("crash outcomes: %+v", r.Crashes)
		}
	})

	t.Run("crashes broken", func(t *testing.T) {
		// r1 reached the broker and is not dead; r2 killed one relay too
		// many and its key's next message was never applied; r3 is dead
		// without a death; c1 was applied; a relay died for an id nobody
		// wrote; c2 killed the consumer once too often, on redeliveries;
		// y1 and y2, in the stream after the consumer's death and after
		// the broker noticed it, applied out of order.
		y1 := rec("y1", "k9", 1, committed, false, 10)
		y2 := rec("y2", "k9", 2, committed, false, 11)
		r1 := crash("r1", "k5", 1, crashRelay, 5)
		r2 := crash("r2", "k6", 1, crashRelay, 6)
		l2 := rec("l2", "k6", 2, committed, false, 7)
		r3 := crash("r3", "k7", 1, crashRelay, 8)
		c1 := crash("c1", "k8", 1, crashConsumer, 9)
		c2 := crash("c2", "k10", 1, crashConsumer, 9)
		h := map[string]histRec{"r1": r1, "r2": r2, "l2": l2, "r3": r3, "c1": c1, "c2": c2, "y1": y1, "y2": y2}
		o := observed{
			hist:         h,
			stream:       []seen{msg(1, "r1", r1, 10), msg(2, "l2", l2, 11), msg(3, "c1", c1, 12), msg(4, "y1", y1, 700), msg(5, "y2", y2, 701), msg(6, "c2", c2, 13)},
			effects:      []effectRow{eff(c1, 20), eff(y2, 710), eff(y1, 711)},
			consumerDead: []string{"c1", "c2"},
			relayDead:    []string{"r2", "r3"},
			crashes: slices.Concat(deaths("r1", "relay0", 1), deaths("r2", "relay1", relayCrashBound+1), deaths("c1", "consumer", 1), deaths("zz", "relay2", 1),
				consumerDeaths("c2", 1, 2, 3, 4, 5)),
			// Given up after the deaths: excuses none.
			giveUps: map[string][]time.Time{"fxrelay1s0": {at(200)}},
		}
		r := judge(o, nil)
		want := []string{"apply_order", "crash_applied", "crash_bound", "crash_key_stuck", "crash_not_dead", "crash_published", "crash_unknown", "crash_untested", "not_applied"}
		var got []string
		for rule := range r.ByRule {
			got = append(got, rule)
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("rules fired:\n got %v\nwant %v\n%+v", got, want, r.Violations)
		}
		i := slices.IndexFunc(r.Crashes, func(co crashOutcome) bool { return co.ID == "c2" })
		if i < 0 || r.Crashes[i].Deaths != consumerCrashBound+1 || r.Crashes[i].Bound != consumerCrashBound || r.Crashes[i].Resent != 0 {
			t.Errorf("c2, one death over the bound on redeliveries: %+v", r.Crashes)
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

// TestFaultsFleetWait checks that a fault's wait stops at the next
// fault's start when that cut its window short, and only then.
func TestFaultsFleetWait(t *testing.T) {
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	for _, c := range []struct {
		name                 string
		commit, stored, next time.Time
		want                 int64
	}{
		{"published in the window", at(100), at(400), at(1000), 300},
		{"waiting when the next fault began", at(900), at(5000), at(1000), 100},
		{"window not cut short", at(900), at(5000), time.Time{}, 4100},
		{"stored before its commit's clock", at(100), at(90), time.Time{}, 0},
	} {
		if got := faultWait(c.commit, c.stored, c.next); got != c.want {
			t.Errorf("%s: %dms, want %dms", c.name, got, c.want)
		}
	}
}

// TestFaultsFleetWindow checks where a fault's window ends, and that its
// waits are counted until the next fault began also when that was after
// the window's end: a message committed just before the end of a rolling
// deploy's window, whose relay the mass kill that followed took, counted
// the kill's lease for the deploy.
func TestFaultsFleetWindow(t *testing.T) {
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	const lease = 4 * time.Second
	for _, c := range []struct {
		name                   string
		nextStart, writersDone time.Time
		wantEnd, wantNext      time.Time
	}{
		{"a lease and two seconds after the lift", at(60_000), at(90_000), at(6_000), at(60_000)},
		{"the next fault sooner", at(3_000), at(90_000), at(3_000), at(3_000)},
		{"the next fault just after the window", at(6_100), at(90_000), at(6_000), at(6_100)},
		{"the writers done sooner", at(60_000), at(2_000), at(2_000), at(60_000)},
		{"the last fault", time.Time{}, at(90_000), at(6_000), time.Time{}},
	} {
		end, next := faultWindow(t0, lease, c.nextStart, c.writersDone)
		if !end.Equal(c.wantEnd) || !next.Equal(c.wantNext) {
			t.Errorf("%s: end +%v next %v, want +%v and %v", c.name, end.Sub(t0), next, c.wantEnd.Sub(t0), c.wantNext)
		}
	}
	// The deploy's message of the third case: committed 50ms before the
	// window's end, stored after the next fault's lease.
	if got := faultWait(at(5_950), at(10_200), at(6_100)); got != 150 {
		t.Errorf("a wait into the next fault: %dms, want 150ms", got)
	}
}

// TestFaultsCrashInspector checks that a relay's bytes holding a payload
// that kills it are stopped, also when the payload is split between two
// chunks, and that other payloads go through.
func TestFaultsCrashInspector(t *testing.T) {
	body := func(crash string) []byte {
		b, err := json.Marshal(payload{ID: "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", Key: "k0001", Seq: 7, Crash: crash})
		if err != nil {
			t.Fatal(err)
		}
		return append([]byte("HPUB fx.changed 40 140\r\nNATS/1.0\r\nNats-Msg-Id: x\r\n\r\n"), append(b, "\r\n"...)...)
	}
	look := crashInspector(&proc{})
	for _, c := range [][]byte{body(""), body(crashConsumer)} {
		if !look(c) {
			t.Fatalf("stopped %q", c)
		}
	}
	bad := body(crashRelay)
	end := bytes.Index(bad, []byte(`"crash"`)) + len(`"crash":"relay"}`)
	for cut := 1; cut < len(bad); cut++ {
		look := crashInspector(&proc{})
		// Stopped at the chunk that holds the payload's end.
		if first := look(bad[:cut]); first != (cut < end) {
			t.Errorf("split at %d: first chunk forwarded %v", cut, first)
		} else if first && look(bad[cut:]) {
			t.Errorf("split at %d: second chunk forwarded", cut)
		}
	}
}
