package postbox

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/postbox-go/postbox/postboxdriver"
)

func TestLaneCountFollowsTheShare(t *testing.T) {
	for _, c := range []struct{ lanes, share, nparts, want int }{
		{4, 64, 64, 4}, // the whole table: Config.Lanes
		{4, 32, 64, 2}, // two relays: together as many as one
		{4, 22, 64, 2}, // three relays: rounded up
		{4, 21, 64, 2},
		{4, 16, 64, 1},
		{4, 1, 64, 1}, // at least one
		{4, 0, 64, 1},
		{8, 32, 64, 4},
		{1, 64, 64, 1},
		{64, 64, 64, 64},
		{64, 1, 64, 1},
	} {
		if got := laneCount(c.lanes, c.share, c.nparts); got != c.want {
			t.Errorf("laneCount(%d, %d, %d) = %d, want %d", c.lanes, c.share, c.nparts, got, c.want)
		}
	}
}

// newLaneRelay is a relay holding every one of nparts partitions, with
// lanes lanes, all reading, and no database behind it: enough for fence
// and claim.
func newLaneRelay(lanes, nparts int) *relay {
	r := &relay{nparts: nparts, held: map[int]int64{}, busy: map[int]int{}, validUntil: time.Now().Add(time.Hour)}
	for i := range lanes {
		r.lanes = append(r.lanes, &lane{r: r, n: i, wake: newWakeup()})
	}
	r.active = lanes
	for p := range nparts {
		r.held[p] = 1
	}
	return r
}

// Whatever the number of lanes reading, their fences split the held
// partitions between them, and the lanes that do not read get none.
func TestLaneFencesSplitTheHeldPartitions(t *testing.T) {
	r := newLaneRelay(4, 64)
	now := time.Now()
	for active := 1; active <= 4; active++ {
		r.active = active
		seen := map[int]int{}
		for n := range r.lanes {
			f, _ := r.fence(now, n)
			if n >= active && len(f.Generations) > 0 {
				t.Fatalf("%d lanes reading: lane %d, not reading, got %d partitions", active, n, len(f.Generations))
			}
			for p := range f.Generations {
				if m, dup := seen[p]; dup {
					t.Fatalf("%d lanes reading: partition %d in lanes %d and %d", active, p, m, n)
				}
				seen[p] = n
			}
		}
		if len(seen) != 64 {
			t.Fatalf("%d lanes reading: %d of 64 partitions in a fence", active, len(seen))
		}
	}
}

// A partition that passes to another lane when the number of lanes
// reading changes is not read by the new lane while the old lane's batch
// on it is in flight: the new lane takes it after that batch is done.
func TestLaneChangeWaitsForTheBatchInFlight(t *testing.T) {
	r := newLaneRelay(4, 64)
	now := time.Now()
	old, _ := r.claim(now, 3, nil) // partitions 3, 7, 11, …
	if _, ok := old.Generations[7]; !ok {
		t.Fatalf("lane 3 of 4 claimed %v, want partition 7 among them", sortedKeys(old.Generations))
	}
	r.active = 2 // the share halved: lane 1 now reads 1, 3, 5, 7, …
	f, _ := r.claim(now, 1, nil)
	for p := range f.Generations {
		if p%4 == 3 {
			t.Fatalf("lane 1 claimed partition %d while lane 3's batch on it is in flight", p)
		}
	}
	if len(f.Generations) != 16 {
		t.Fatalf("lane 1 claimed %d partitions, want the 16 not in flight elsewhere", len(f.Generations))
	}
	if g, _ := r.claim(now, 3, nil); len(g.Generations) > 0 {
		t.Fatalf("lane 3, no longer reading, claimed %v", sortedKeys(g.Generations))
	}
	r.done(f)
	r.done(old)
	f, _ = r.claim(now, 1, nil)
	if len(f.Generations) != 32 {
		t.Fatalf("lane 1 claimed %d partitions once lane 3's batch was done, want 32", len(f.Generations))
	}
	r.done(f)
}

// A change signal naming partitions wakes exactly the lanes whose fences
// hold them, whatever the relay holds; nil wakes every reading lane.
func TestWakeForWakesTheLanesThatReadThePartitions(t *testing.T) {
	r := newLaneRelay(4, 64)
	for p := range 64 {
		if p%3 == 0 {
			delete(r.held, p) // a relay holding part of the table
		}
	}
	r.active = 3
	drain := func() (woken []int) {
		for _, l := range r.lanes {
			select {
			case <-l.wake.ch:
				woken = append(woken, l.n)
			default:
			}
		}
		return woken
	}
	for p := range 64 {
		r.wakeFor([]int{p}, wakeEarly, nil)
		woken := drain()
		if _, held := r.held[p]; !held {
			if len(woken) != 0 {
				t.Fatalf("partition %d, not held, woke lanes %v", p, woken)
			}
			continue
		}
		if len(woken) != 1 {
			t.Fatalf("partition %d woke lanes %v, want one", p, woken)
		}
		f, _ := r.fence(time.Now(), woken[0])
		if _, ok := f.Generations[p]; !ok {
			t.Fatalf("partition %d woke lanes %v, whose fence does not hold it", p, woken)
		}
	}
	r.wakeFor(nil, wakeEarly, nil)
	if woken := drain(); len(woken) != 3 {
		t.Fatalf("a signal for every partition woke lanes %v, want the 3 reading", woken)
	}
}

// A wake-up for committed rows names them to the lane reading their
// partition, and the lane reads for it unless its recent reads returned
// every row it names. Any other wake-up, or one naming no rows, calls for
// a read.
func TestNamedWakeUpsForRowsAlreadyReadWakeNoRead(t *testing.T) {
	r := newLaneRelay(2, 4) // lane 0 reads partitions 0 and 2, lane 1 reads 1 and 3
	l0, l1 := r.lanes[0], r.lanes[1]
	l0.recent.add([]postboxdriver.Record{{ID: "a"}, {ID: "b"}})
	cases := []struct {
		name  string
		wake  func()
		owed0 bool // lane 0 reads
		owed1 bool
	}{
		{"rows lane 0 read", func() { r.wakeFor([]int{0, 2}, wakeCommitted, []written{{"a", 0}, {"b", 2}}) }, false, false},
		{"one row it did not read", func() { r.wakeFor([]int{0, 2}, wakeCommitted, []written{{"a", 0}, {"c", 2}}) }, true, false},
		{"a row of lane 1's", func() { r.wakeFor([]int{0, 1}, wakeCommitted, []written{{"a", 0}, {"b", 1}}) }, false, true},
		{"committed rows not named", func() { r.wakeFor([]int{0}, wakeCommitted, nil) }, true, false},
		{"an early wake-up", func() { r.wakeFor([]int{0}, wakeEarly, nil) }, true, false},
		{"rows read, then a renewal", func() {
			r.wakeFor([]int{0}, wakeCommitted, []written{{"a", 0}})
			l0.notify(wakeOther)
		}, true, false},
		{"nothing", func() {}, false, false},
	}
	for _, c := range cases {
		c.wake()
		if _, owed := l0.look(); owed != c.owed0 {
			t.Errorf("%s: lane 0 reads %v, want %v", c.name, owed, c.owed0)
		}
		if _, owed := l1.look(); owed != c.owed1 {
			t.Errorf("%s: lane 1 reads %v, want %v", c.name, owed, c.owed1)
		}
	}
}

// Past maxNamed rows between two looks, a wake-up names none, and the
// lane reads.
func TestTooManyNamedRowsCallForARead(t *testing.T) {
	w := newWakeup()
	ids := make([]written, maxNamed)
	for i := range ids {
		ids[i] = written{id: "x"}
	}
	w.send(wakeCommitted, 1, ids)
	if o := w.take(); len(o.ids) != maxNamed {
		t.Fatalf("%d rows: %d ids named, want all", maxNamed, len(o.ids))
	}
	w.send(wakeCommitted, 1, ids)
	w.send(wakeCommitted, 1, ids[:1])
	if o := w.take(); o.ids != nil || !o.sent || o.kind != wakeCommitted {
		t.Fatalf("%d rows: %+v, want sent, committed and not named", maxNamed+1, o)
	}
}

// A lane resting after a batch waits on through a wake-up for rows it
// read, and ends its wait on one for a row it did not.
func TestIdleWaitsThroughWakeUpsForRowsRead(t *testing.T) {
	l := newLaneRelay(1, 1).lanes[0]
	l.recent.add([]postboxdriver.Record{{ID: "a"}})
	l.wake.send(wakeCommitted, 1, []written{{"a", 0}})
	if _, ok := l.idle(context.Background(), 20*time.Millisecond); ok {
		t.Fatal("a wake-up for a row the lane read ended its wait")
	}
	l.wake.send(wakeCommitted, 1, []written{{"a", 0}})
	l.wake.send(wakeCommitted, 1, []written{{"b", 0}})
	if kind, ok := l.idle(context.Background(), time.Hour); !ok || kind != wakeCommitted {
		t.Fatalf("a wake-up for a row not read: woken %v, kind %v", ok, kind)
	}
}

// The recent reads keep the last recentMax ids.
func TestRecentReadsKeepTheLatest(t *testing.T) {
	var s recentRead
	recs := make([]postboxdriver.Record, recentMax+10)
	for i := range recs {
		recs[i].ID = fmt.Sprint(i)
	}
	s.add(recs[:5])
	s.add(recs[5:])
	if s.hasAll([]written{{id: "9"}}) {
		t.Fatal("an id read more than recentMax rows ago is still recent")
	}
	if !s.hasAll([]written{{id: "10"}, {id: fmt.Sprint(recentMax + 9)}}) {
		t.Fatal("the latest recentMax ids are not all recent")
	}
}
