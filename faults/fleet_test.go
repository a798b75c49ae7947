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
	"sync"
	"testing"
	"time"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/postboxdriver"
)

// The fleet profiles: many relay processes on one database, at the
// relay's default lease, under steady writes; a rolling deploy, several
// relays killed at once, single crashes, and pauses shorter than the
// lease. The checker judges the guarantees as in TestFaults; the fleet's
// figures (how long partitions went without an owner, how long a key
// waited, how many copies were sent twice) go in the report's "fleet"
// section, each against its target. Figures are reported, not asserted:
// they depend on the machine's load.
var fleetProfiles = map[string]profile{
	"fleet": {
		Name: "fleet", WriteFor: 110 * time.Second, Relays: 16, Dedupe: "none",
		Mix:     map[string]int{faultRolling: 1, faultKillMany: 1, faultKill: 6, faultPause: 1, faultPGStall: 1},
		Writers: 6, Keys: 200, Pace: 20 * time.Millisecond, Rollback: 0.1, Poison: 0.002,
		DrainLimit: 60 * time.Second, MinGap: 6 * time.Second,
	},
	// The lease's trade: crashes, pauses and stalls only, at the lease
	// POSTBOX_FLEET_LEASE sets.
	"fleet-trade": {
		Name: "fleet-trade", WriteFor: 100 * time.Second, Relays: 16, Dedupe: "none",
		Mix:     map[string]int{faultKill: 8, faultPause: 3, faultPGStall: 3},
		Writers: 6, Keys: 200, Pace: 20 * time.Millisecond, Rollback: 0.1, Poison: 0.002,
		DrainLimit: 60 * time.Second, MinGap: 6 * time.Second,
	},
	"fleet-long": {
		Name: "fleet-long", WriteFor: 300 * time.Second, Relays: 16, Dedupe: "none",
		Mix:     map[string]int{faultRolling: 1, faultKillMany: 1, faultKill: 20, faultPause: 3, faultPGStall: 3},
		Writers: 6, Keys: 200, Pace: 20 * time.Millisecond, Rollback: 0.1, Poison: 0.002,
		DrainLimit: 90 * time.Second, MinGap: 6 * time.Second,
	},
}

func TestFleet(t *testing.T) {
	prof := chosen(t, "POSTBOX_FLEET_PROFILE", "fleet", fleetProfiles)
	if v := os.Getenv("POSTBOX_FLEET_LEASE"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 100*time.Millisecond {
			t.Fatalf("POSTBOX_FLEET_LEASE=%q: want a duration of at least 100ms", v)
		}
		prof.Lease, prof.BatchDeadline = d, d/3
		prof.MinGap = d + 2*time.Second
	}
	runProfile(t, prof, fleetSchedule, &fleetWatch{})
}

// fleetSchedule lays out a fleet run: the rolling deploy first, then the
// mass kill, then the single kills, pauses and stalls in an order drawn
// from rng. A gap after each fault lets a lease run out before the next.
// The times are the earliest each fault starts; a fault that runs long
// (a deploy waits for each replacement to take its share) pushes the
// rest back, and the writers go on until the last fault is over.
func fleetSchedule(rng *rand.Rand, p profile) []*fault {
	n := p.relays()
	lease := p.lease()
	at := 5 * time.Second
	var out []*fault
	add := func(f *fault, took time.Duration) {
		f.At, f.Tests = at, guarantees[f.Kind]
		out = append(out, f)
		at += took + lease + jitter(rng, time.Second, 2*time.Second)
	}
	for range p.Mix[faultRolling] {
		add(&fault{Kind: faultRolling, Relay: -1, Hold: time.Second}, time.Duration(n)*3*time.Second)
	}
	for range p.Mix[faultKillMany] {
		victims := rng.Perm(n)[:min(4, n)]
		slices.Sort(victims)
		add(&fault{Kind: faultKillMany, Relay: -1, Relays: victims, Hold: time.Second}, time.Second)
	}
	var bag []string
	for _, k := range []string{faultKill, faultPause, faultPGStall} {
		for range p.Mix[k] {
			bag = append(bag, k)
		}
	}
	rng.Shuffle(len(bag), func(i, j int) { bag[i], bag[j] = bag[j], bag[i] })
	for _, k := range bag {
		f := &fault{Kind: k, Relay: rng.IntN(n)}
		switch k {
		case faultKill:
			f.Hold = jitter(rng, 500*time.Millisecond, 1500*time.Millisecond)
		case faultPause, faultPGStall:
			f.Hold = 2 * time.Second
		}
		add(f, f.Hold)
	}
	return out
}

// rollingDeploy stops each relay with SIGTERM in turn and starts its
// replacement, waiting until the replacement holds a lease (a deploy
// waits for each new pod to be ready), then pausing for hold.
func (h *harness) rollingDeploy(ctx context.Context, hold time.Duration) string {
	var notes []string
	for _, r := range h.relays {
		if ctx.Err() != nil {
			break
		}
		if !r.term(20 * time.Second) {
			notes = append(notes, fmt.Sprintf("relay %d did not stop cleanly", r.n))
		}
		if err := r.start(); err != nil {
			notes = append(notes, fmt.Sprintf("relay %d: start: %v", r.n, err))
			continue
		}
		id := r.current()
		deadline := time.Now().Add(15 * time.Second)
		for time.Now().Before(deadline) && ctx.Err() == nil {
			var n int
			_ = h.pool.QueryRow(ctx, `SELECT count(*) FROM `+h.prefix+`leases WHERE owner LIKE $1 AND expires_at > now()`, id+"-%").Scan(&n)
			if n > 0 {
				break
			}
			sleep(ctx, 50*time.Millisecond)
		}
		sleep(ctx, hold)
	}
	return strings.Join(notes, "; ")
}

// killMany SIGKILLs the relays at once and starts them again after hold.
func (h *harness) killMany(ctx context.Context, which []int, hold time.Duration) string {
	var notes []string
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, i := range which {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := h.relays[i].kill(); err != nil {
				mu.Lock()
				notes = append(notes, fmt.Sprintf("relay %d: kill: %v", i, err))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	sleep(ctx, hold)
	for _, i := range which {
		if err := h.relays[i].start(); err != nil {
			notes = append(notes, fmt.Sprintf("relay %d: start: %v", i, err))
		}
	}
	return strings.Join(notes, "; ")
}

// fleetWatch reads the leases table every 50ms for the whole run: who
// owned each partition, and whether the lease was still running.
type fleetWatch struct {
	mu    sync.Mutex
	snaps []leaseSnap
	err   error
}

type leaseSnap struct {
	At      time.Time
	Owner   []string // by partition; "" for none
	Running []bool   // the lease had not expired
}

func (w *fleetWatch) attach(h *harness) {
	h.monitor = func(ctx context.Context) {
		q := `SELECT coalesce(owner, ''), expires_at > now() FROM ` + h.prefix + `leases ORDER BY partition`
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			before := time.Now()
			rows, err := h.pool.Query(ctx, q)
			s := leaseSnap{}
			for err == nil && rows.Next() {
				var o string
				var run bool
				if err = rows.Scan(&o, &run); err == nil {
					s.Owner, s.Running = append(s.Owner, o), append(s.Running, run)
				}
			}
			if err == nil {
				rows.Close()
				err = rows.Err()
			}
			// The read's moment: halfway through the round trip.
			s.At = before.Add(time.Since(before) / 2)
			w.mu.Lock()
			if err == nil {
				w.snaps = append(w.snaps, s)
			} else if ctx.Err() == nil && w.err == nil {
				w.err = err
			}
			w.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}
}

// fleetReport is the fleet's figures, per fault and against the targets.
type fleetReport struct {
	Relays     int           `json:"relays"`
	Partitions int           `json:"partitions"`
	Polls      int           `json:"lease_polls"`
	PollError  string        `json:"poll_error,omitempty"`
	Faults     []*fleetFault `json:"faults"`
	// Kills: the time until a crashed relay's partitions had a running
	// owner again, and until each had a message stored, over every kill.
	TakeoverMs        lagStats `json:"takeover_ms"`
	PublishTakeoverMs lagStats `json:"publish_takeover_ms"`
	Targets           []target `json:"targets"`
}

// fleetFault is what one fault did to the fleet, from its start until
// the next fault or a lease after its lift, whichever comes first.
type fleetFault struct {
	Fault   string   `json:"fault"`
	Kind    string   `json:"kind"`
	Victims []string `json:"victims,omitempty"` // relay ids the fault hit
	// VictimPartitions counts the partitions the victims held when it
	// began.
	VictimPartitions int   `json:"victim_partitions"`
	WindowMs         int64 `json:"window_ms"`
	// LongestOrphanMs is the longest any partition went without a running
	// owner (no owner, an expired lease, or an owner whose process had
	// exited); OwnedAgainMs the time from the fault until the last such
	// gap closed.
	LongestOrphanMs int64 `json:"longest_orphan_ms"`
	OwnedAgainMs    int64 `json:"owned_again_ms"`
	// Kills: TakeoverMs is the time until every partition the victims held
	// had a running owner again; PublishTakeoverMs the time until each of
	// them on which a message waited for the takeover had one stored.
	TakeoverMs        int64 `json:"takeover_ms,omitempty"`
	PublishTakeoverMs int64 `json:"publish_takeover_ms,omitempty"`
	// Moved counts partitions whose owner changed in the window;
	// MovedEarly, for a pause or a stall, those of the victim's that
	// another relay took before the fault was lifted and a second passed.
	Moved      int `json:"moved"`
	MovedEarly int `json:"moved_early"`
	// StallMs is the longest commit-to-stored wait of a message that was
	// waiting during the window, counted until the next fault began when
	// that cut the window short (faultWait); P99WaitMs the 99th
	// percentile of those.
	StallMs   int64 `json:"stall_ms"`
	P99WaitMs int64 `json:"p99_wait_ms"`
	// Copies stored in the window, the first copies among them, and the
	// rest: duplicates the relays sent (the stream keeps copies more than
	// 100ms apart).
	Copies     int     `json:"copies"`
	Duplicates int     `json:"duplicates"`
	DupPercent float64 `json:"dup_percent"`
	// InFlightBound, for kills, is what the victims could have had in
	// flight: their publish windows, and on each lane a small batch whose
	// mark waits for the lane's next read (8 rows).
	InFlightBound int `json:"in_flight_bound,omitempty"`
}

type target struct {
	Name string `json:"name"`
	Want string `json:"want"`
	Got  string `json:"got"`
	Met  bool   `json:"met"`
}

// judge computes the fleet's figures from the lease polls, the relays'
// lives, the history and the stream.
func (w *fleetWatch) judge(h *harness, rep *report) *fleetReport {
	w.mu.Lock()
	snaps := w.snaps
	fr := &fleetReport{Relays: len(h.relays), Polls: len(snaps)}
	if w.err != nil {
		fr.PollError = w.err.Error()
	}
	w.mu.Unlock()
	if len(snaps) == 0 {
		rep.add("harness", "-", "", "", "the lease watch read nothing")
		return fr
	}
	nparts := len(snaps[0].Owner)
	fr.Partitions = nparts
	if err := writeJSONLines(filepath.Join(h.dir, "leases.jsonl"), snaps); err != nil {
		h.t.Logf("fleet: %v", err)
	}

	// Which process each owner name was, and when it ran.
	lives := map[string]life{}
	for _, r := range h.relays {
		for _, l := range r.history() {
			lives[l.ID] = l
		}
	}
	procOf := func(owner string) string {
		if i := strings.LastIndexByte(owner, '-'); i > 0 {
			return owner[:i]
		}
		return owner
	}
	owned := func(s leaseSnap, p int) bool {
		if s.Owner[p] == "" || !s.Running[p] {
			return false
		}
		l, ok := lives[procOf(s.Owner[p])]
		return ok && (l.Ended.IsZero() || s.At.Before(l.Ended))
	}
	snapAt := func(t time.Time) int { // the first poll at or after t
		i, _ := slices.BinarySearchFunc(snaps, t, func(s leaseSnap, t time.Time) int { return s.At.Compare(t) })
		return i
	}

	hist, err := readHistory(h.hist.path)
	if err != nil {
		rep.add("harness", "-", "", "", "fleet: %v", err)
		return fr
	}
	stream := h.watch.snapshot()
	first := map[string]seen{}
	for _, s := range stream {
		if _, ok := first[s.MsgID]; !ok {
			first[s.MsgID] = s
		}
	}

	sched := h.faults()
	var takeovers, pubTakeovers []int64
	for i, f := range sched {
		if f.Start.IsZero() {
			continue
		}
		var nextStart time.Time
		if i+1 < len(sched) {
			nextStart = sched[i+1].Start
		}
		end, next := faultWindow(f.Lifted, h.prof.lease(), nextStart, h.writersDone)
		ff := &fleetFault{Fault: f.String(), Kind: f.Kind, WindowMs: end.Sub(f.Start).Milliseconds()}
		fr.Faults = append(fr.Faults, ff)

		// The victims, and what they held at the start.
		var victims []int
		switch f.Kind {
		case faultKill, faultPause, faultPGStall:
			victims = []int{f.Relay}
		case faultKillMany:
			victims = f.Relays
		}
		vprocs := map[string]bool{}
		for _, v := range victims {
			for _, l := range h.relays[v].history() {
				if !l.Started.After(f.Start) && (l.Ended.IsZero() || !l.Ended.Before(f.Start)) {
					vprocs[l.ID] = true
					ff.Victims = append(ff.Victims, l.ID)
				}
			}
		}
		i0 := max(snapAt(f.Start)-1, 0)
		iEnd := snapAt(end)
		vparts := map[int]bool{}
		for p := range nparts {
			if o := snaps[i0].Owner[p]; o != "" && vprocs[procOf(o)] {
				vparts[p] = true
			}
		}
		ff.VictimPartitions = len(vparts)

		// Ownership through the window; regained is when each of the
		// victims' partitions first had a running owner again.
		var takeover int64
		regained := map[int]time.Time{}
		for p := range nparts {
			var gapStart time.Time
			prev := snaps[i0].Owner[p]
			for j := i0 + 1; j < iEnd && j < len(snaps); j++ {
				s := snaps[j]
				if s.Owner[p] != prev {
					ff.Moved++
					if s.Owner[p] != "" && vparts[p] && (f.Kind == faultPause || f.Kind == faultPGStall) &&
						!vprocs[procOf(s.Owner[p])] && s.At.Before(f.Lifted.Add(time.Second)) {
						ff.MovedEarly++
					}
					prev = s.Owner[p]
				}
				switch ok := owned(s, p); {
				case !ok && gapStart.IsZero():
					gapStart = s.At
				case ok && !gapStart.IsZero():
					ff.LongestOrphanMs = max(ff.LongestOrphanMs, s.At.Sub(gapStart).Milliseconds())
					ff.OwnedAgainMs = max(ff.OwnedAgainMs, s.At.Sub(f.Start).Milliseconds())
					if vparts[p] {
						takeover = max(takeover, s.At.Sub(f.Start).Milliseconds())
						if regained[p].IsZero() {
							regained[p] = s.At
						}
					}
					gapStart = time.Time{}
				}
			}
			if !gapStart.IsZero() {
				ff.OwnedAgainMs = -1 // still without an owner when the window closed
			}
		}

		// Messages: the waits, the copies, and the first store per
		// partition after a kill.
		var waits []int64
		pubFirst := map[int]time.Time{}
		for id, s := range first {
			hr, ok := hist[id]
			if !ok || hr.Outcome != committed {
				continue
			}
			if hr.At.Before(end) && s.Stored.After(f.Start) {
				waits = append(waits, faultWait(hr.At, s.Stored, next))
			}
			// A victim's partition is published again at the first copy
			// stored after the kill of a message that waited for the
			// takeover (committed before its partition had an owner
			// again), leaving out the victim's own last publishes still on
			// the wire when it died (stored within 50ms of the kill, of a
			// message committed before it). A partition nothing waited on
			// has no such figure.
			if s.Stored.After(f.Start) && (!hr.At.Before(f.Start) || s.Stored.After(f.Start.Add(50*time.Millisecond))) {
				p := postboxdriver.PartitionOf(hr.Key, id, nparts)
				if vparts[p] && !regained[p].IsZero() && hr.At.Before(regained[p]) && (pubFirst[p].IsZero() || s.Stored.Before(pubFirst[p])) {
					pubFirst[p] = s.Stored
				}
			}
		}
		slices.Sort(waits)
		if n := len(waits); n > 0 {
			ff.StallMs, ff.P99WaitMs = waits[n-1], waits[min(n-1, n*99/100)]
		}
		for _, s := range stream {
			if s.Stored.Before(f.Start) || !s.Stored.Before(end) {
				continue
			}
			ff.Copies++
			if first[s.MsgID].StreamSeq != s.StreamSeq {
				ff.Duplicates++
			}
		}
		if firsts := ff.Copies - ff.Duplicates; firsts > 0 {
			ff.DupPercent = float64(ff.Duplicates) * 100 / float64(firsts)
		}
		if f.Kind == faultKill || f.Kind == faultKillMany {
			ff.TakeoverMs = takeover
			ff.InFlightBound = len(victims) * (postbox.DefaultPublishWindow + postbox.DefaultLanes*8)
			var pt int64
			for p := range vparts {
				if at, ok := pubFirst[p]; ok {
					pt = max(pt, at.Sub(f.Start).Milliseconds())
				}
			}
			ff.PublishTakeoverMs = pt
			if f.Kind == faultKill {
				takeovers, pubTakeovers = append(takeovers, takeover), append(pubTakeovers, pt)
			}
		}
	}
	fr.TakeoverMs, fr.PublishTakeoverMs = percentiles(takeovers), percentiles(pubTakeovers)
	fr.Targets = fleetTargets(fr)
	return fr
}

// faultWindow is where the window of a fault lifted at lifted ends: a
// lease and two seconds later, or when the next fault began (nextStart,
// zero for none) if that came sooner, or when the writers stopped
// (writersDone: the relays stop once the writers have, which is no
// fault's doing) if sooner still. next is the next fault's start, until
// which the window's waits are counted (faultWait) wherever the window
// ends: a message committed just before the window's end can wait on
// into the next fault, and that wait is the next fault's.
func faultWindow(lifted time.Time, lease time.Duration, nextStart, writersDone time.Time) (end, next time.Time) {
	end = lifted.Add(lease + 2*time.Second)
	if !nextStart.IsZero() && nextStart.Before(end) {
		end = nextStart
	}
	if writersDone.Before(end) {
		end = writersDone
	}
	return end, nextStart
}

// faultWait is how long a message committed at commit and first stored
// at stored waited in a fault's window, in milliseconds: until the next
// fault began (next, zero for the last fault) if it was still waiting
// then. A message committed just before the next fault would
// otherwise count however long that fault made it wait (a mass kill's
// lease) for the fault before it.
func faultWait(commit, stored, next time.Time) int64 {
	if !next.IsZero() && stored.After(next) {
		stored = next
	}
	return max(stored.Sub(commit).Milliseconds(), 0)
}

func percentiles(v []int64) lagStats {
	slices.Sort(v)
	n := len(v)
	if n == 0 {
		return lagStats{}
	}
	return lagStats{P50Ms: v[n/2], P99Ms: v[min(n-1, n*99/100)], MaxMs: v[n-1]}
}

// fleetTargets holds the figures to the targets of docs/design.md §6.
func fleetTargets(fr *fleetReport) []target {
	var out []target
	for _, f := range fr.Faults {
		switch f.Kind {
		case faultRolling:
			out = append(out,
				target{Name: "rolling deploy: copies sent twice", Want: "≤ 0.1%", Got: fmt.Sprintf("%.3f%% (%d of %d)", f.DupPercent, f.Duplicates, f.Copies-f.Duplicates), Met: f.DupPercent <= 0.1},
				target{Name: "rolling deploy: longest wait of a message", Want: "≤ 1000ms", Got: fmt.Sprintf("%dms", f.StallMs), Met: f.StallMs <= 1000})
		case faultKill, faultKillMany:
			out = append(out, target{Name: "crash (" + f.Fault + "): copies sent twice", Want: fmt.Sprintf("≤ %d (the victims' publish windows and marks waiting)", f.InFlightBound),
				Got: fmt.Sprint(f.Duplicates), Met: f.Duplicates <= f.InFlightBound})
		case faultPause, faultPGStall:
			out = append(out, target{Name: f.Fault + ": partitions taken early", Want: "0", Got: fmt.Sprint(f.MovedEarly), Met: f.MovedEarly == 0})
		}
	}
	if fr.PublishTakeoverMs.MaxMs > 0 {
		out = append(out, target{Name: "crash takeover, publish (p99 over the single kills)", Want: "≤ 5000ms",
			Got: fmt.Sprintf("%dms (ownership p99 %dms)", fr.PublishTakeoverMs.P99Ms, fr.TakeoverMs.P99Ms), Met: fr.PublishTakeoverMs.P99Ms <= 5000})
	}
	return out
}
