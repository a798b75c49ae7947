package keyorder

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

type rec struct {
	Entry
	name string
}

func pos(n uint64) Pos { return Pos{Hi: n} }

func names(o *Order[*rec]) []string {
	var out []string
	for x := range o.All() {
		out = append(out, x.name)
	}
	slices.Sort(out)
	return out
}

func mustNext(t *testing.T, o *Order[*rec], key, want string) *rec {
	t.Helper()
	x, ok := o.Next(key)
	if !ok || x.name != want {
		t.Fatalf("Next(%q) = %v, %t; want %s", key, x, ok, want)
	}
	return x
}

func mustNoNext(t *testing.T, o *Order[*rec], key string) {
	t.Helper()
	if x, ok := o.Next(key); ok {
		t.Fatalf("Next(%q) = %s, want nothing", key, x.name)
	}
}

func TestPos(t *testing.T) {
	if !(Pos{1, 9}).Before(Pos{2, 0}) || !(Pos{2, 0}).Before(Pos{2, 1}) || (Pos{2, 1}).Before(Pos{2, 1}) {
		t.Fatal("Pos.Before does not order by Hi, then Lo")
	}
}

// TestOneAtATimeInOrder: deliveries that arrive out of order run in stream
// order, one at a time per key, and keys do not wait for each other.
func TestOneAtATimeInOrder(t *testing.T) {
	o := New[*rec](10, 0)
	o.Add("k", pos(3), &rec{name: "k3"})
	o.Add("k", pos(1), &rec{name: "k1"})
	o.Add("k", pos(2), &rec{name: "k2"})
	o.Add("j", pos(5), &rec{name: "j5"})
	if o.Held() != 4 {
		t.Fatalf("Held = %d, want 4", o.Held())
	}
	k1 := mustNext(t, o, "k", "k1")
	mustNoNext(t, o, "k")
	mustNext(t, o, "j", "j5")
	if o.Held() != 2 {
		t.Fatalf("Held = %d with two active, want 2", o.Held())
	}
	if a, ok := o.Active("k"); !ok || a != k1 {
		t.Fatalf("Active(k) = %v, %t", a, ok)
	}
	o.Remove(k1)
	k2 := mustNext(t, o, "k", "k2")
	// An older delivery arriving while k2 runs (a claim from a dead
	// subscriber) runs next, after k2.
	o.Add("k", pos(0), &rec{name: "k0"})
	mustNoNext(t, o, "k")
	if f, _ := o.First("k"); f.name != "k0" {
		t.Fatalf("First(k) = %s, want k0 filed before the active k2", f.name)
	}
	o.Remove(k2)
	o.Remove(mustNext(t, o, "k", "k0"))
	o.Remove(mustNext(t, o, "k", "k3"))
	if _, ok := o.First("k"); ok {
		t.Fatal("the emptied line is still there")
	}
	for key := range o.Keys() {
		if key == "k" {
			t.Fatal("Keys lists the emptied line")
		}
	}
}

// TestAddSamePos: a second delivery at a place already filed is not filed;
// the one there is returned, in whatever state it is.
func TestAddSamePos(t *testing.T) {
	o := New[*rec](10, 0)
	first := &rec{name: "first"}
	o.Add("k", pos(1), first)
	if got := o.Add("k", pos(1), &rec{name: "copy"}); got != first {
		t.Fatalf("Add at a filed place returned %s, want the filed one", got.name)
	}
	mustNext(t, o, "k", "first")
	if got := o.Add("k", pos(1), &rec{name: "copy"}); got != first || got.State() != Active {
		t.Fatalf("Add of the active's copy returned %s in %d", got.name, got.State())
	}
	if o.Held() != 0 || len(names(o)) != 1 {
		t.Fatalf("a copy was counted or filed: Held %d, entries %v", o.Held(), names(o))
	}
}

// TestRetryMarker: an active delivery to be redelivered becomes a marker
// in its place; the key waits for it, and when it is filled again it runs
// before the deliveries behind it.
func TestRetryMarker(t *testing.T) {
	o := New[*rec](10, 0)
	now := time.Now()
	o.Add("k", pos(1), &rec{name: "k1"})
	o.Add("k", pos(2), &rec{name: "k2"})
	k1 := mustNext(t, o, "k", "k1")
	o.ToMarker(k1, now, time.Second, time.Minute)
	if k1.State() != Marker || o.Markers() != 1 || o.Held() != 1 {
		t.Fatalf("state %d, %d markers, %d held", k1.State(), o.Markers(), o.Held())
	}
	if !k1.Due().Equal(now.Add(time.Second)) {
		t.Fatalf("Due = %s, want the delay from now", k1.Due())
	}
	if _, ok := o.Active("k"); ok {
		t.Fatal("the marker kept its key's turn")
	}
	mustNoNext(t, o, "k") // the marker heads the line
	if h, ok := o.Head("k"); !ok || h != k1 {
		t.Fatalf("Head(k) = %v, %t; want the marker", h, ok)
	}
	o.Fill(k1)
	if o.Markers() != 0 || o.Held() != 2 {
		t.Fatalf("after Fill: %d markers, %d held", o.Markers(), o.Held())
	}
	o.Remove(mustNext(t, o, "k", "k1"))
	mustNext(t, o, "k", "k2")
}

// TestActivateMarker: a marker at the head can be made active directly,
// for a subscriber that fetches it back itself.
func TestActivateMarker(t *testing.T) {
	o := New[*rec](10, 0)
	k1 := o.Add("k", pos(1), &rec{name: "k1"})
	o.ToMarker(k1, time.Now(), 0, 0)
	h, ok := o.Head("k")
	if !ok || h != k1 {
		t.Fatal("the marker is not the head")
	}
	o.Activate(h)
	if o.Markers() != 0 || k1.State() != Active {
		t.Fatalf("%d markers, state %d", o.Markers(), k1.State())
	}
	if _, ok := o.Head("k"); ok {
		t.Fatal("Head reported a line whose key is active")
	}
}

// TestCrowded: past half the window held deliveries crowd it, until the
// bound on markers is reached.
func TestCrowded(t *testing.T) {
	o := New[*rec](4, 1)
	o.Add("k", pos(1), &rec{name: "k1"})
	o.Add("k", pos(2), &rec{name: "k2"})
	if o.Crowded() {
		t.Fatal("two held in a window of 4: crowded")
	}
	k3 := o.Add("k", pos(3), &rec{name: "k3"})
	if !o.Crowded() {
		t.Fatal("three held in a window of 4: not crowded")
	}
	o.ToMarker(k3, time.Now(), 0, 0)
	o.Add("k", pos(4), &rec{name: "k4"})
	if o.Crowded() {
		t.Fatal("crowded although the one marker allowed is taken")
	}
	unbounded := New[*rec](2, 0)
	for i := range 10 {
		x := unbounded.Add("k", pos(uint64(i)), &rec{})
		if unbounded.Crowded() {
			unbounded.ToMarker(x, time.Now(), 0, 0)
		}
	}
	if unbounded.Markers() != 9 || unbounded.Held() != 1 {
		t.Fatalf("no bound on markers: %d markers, %d held", unbounded.Markers(), unbounded.Held())
	}
}

// TestExpire: a marker with a wait is given up once it ends, the wait
// pushed out by PushOut, and a marker without one is never given up.
func TestExpire(t *testing.T) {
	o := New[*rec](10, 0)
	now := time.Now()
	waited := o.Add("k", pos(1), &rec{name: "waited"})
	o.ToMarker(waited, now, time.Second, time.Minute)
	forever := o.Add("j", pos(1), &rec{name: "forever"})
	o.ToMarker(forever, now, time.Second, 0)
	o.Add("k", pos(2), &rec{name: "behind"})

	if got := o.Expire(now.Add(time.Minute)); len(got) != 0 {
		t.Fatalf("expired %d markers before their wait ended", len(got))
	}
	o.PushOut(now.Add(time.Hour))
	if got := o.Expire(now.Add(2 * time.Minute)); len(got) != 0 {
		t.Fatal("a marker pushed out expired at its old end")
	}
	o.PushOut(now) // never pulls a wait in
	got := o.Expire(now.Add(2 * time.Hour))
	if len(got) != 1 || got[0] != waited {
		t.Fatalf("expired %v, want the waited marker alone", got)
	}
	if o.Markers() != 1 {
		t.Fatalf("%d markers, want the one without a wait", o.Markers())
	}
	mustNext(t, o, "k", "behind")
	if want := []string{"behind", "forever"}; !slices.Equal(names(o), want) {
		t.Fatalf("entries %v, want %v", names(o), want)
	}
}

// TestOverdue: an overdue marker stays in its line, holding its key,
// until the caller removes it or extends its wait; a marker filled by its
// redelivery is a marker no more.
func TestOverdue(t *testing.T) {
	o := New[*rec](10, 0)
	now := time.Now()
	late := o.Add("k", pos(1), &rec{name: "late"})
	o.ToMarker(late, now, time.Second, time.Minute)
	o.Add("k", pos(2), &rec{name: "behind"})
	filled := o.Add("j", pos(1), &rec{name: "filled"})
	o.ToMarker(filled, now, time.Second, time.Minute)

	if got := o.Overdue(now.Add(time.Minute)); len(got) != 0 {
		t.Fatalf("%d overdue before their wait ended", len(got))
	}
	got := o.Overdue(now.Add(2 * time.Minute))
	if len(got) != 2 || !o.IsMarker(late) || !o.IsMarker(filled) {
		t.Fatalf("overdue %v, want both markers, still in their lines", got)
	}
	mustNoNext(t, o, "k")
	o.Fill(filled)
	if o.IsMarker(filled) {
		t.Fatal("a filled marker is still a marker")
	}

	o.Extend(late, now.Add(time.Hour))
	if got := o.Overdue(now.Add(2 * time.Minute)); len(got) != 0 {
		t.Fatalf("overdue %v after the wait was extended", got)
	}
	o.Remove(late)
	if o.IsMarker(late) || o.Markers() != 0 {
		t.Fatalf("removed marker: still one %v, %d markers", o.IsMarker(late), o.Markers())
	}
	mustNext(t, o, "k", "behind")
}

func TestClear(t *testing.T) {
	o := New[*rec](10, 0)
	x := o.Add("k", pos(1), &rec{})
	o.Add("k", pos(2), &rec{})
	o.ToMarker(x, time.Now(), 0, 0)
	o.Clear()
	if o.Held() != 0 || o.Markers() != 0 || len(names(o)) != 0 {
		t.Fatal("Clear left something")
	}
}

// TestAhead: what is before a delivery in its key's line, head first, the
// active one and markers included, and nothing of other keys.
func TestAhead(t *testing.T) {
	o := New[*rec](10, 0)
	k1 := o.Add("k", pos(1), &rec{name: "k1"})
	k2 := o.Add("k", pos(2), &rec{name: "k2"})
	k3 := o.Add("k", pos(3), &rec{name: "k3"})
	o.Add("j", pos(0), &rec{name: "j0"})
	mustNext(t, o, "k", "k1")
	o.ToMarker(k2, time.Now(), time.Second, 0)
	names := func(x *rec) []string {
		var out []string
		for y := range o.Ahead(x) {
			out = append(out, y.name)
		}
		return out
	}
	if got := names(k3); fmt.Sprint(got) != "[k1 k2]" {
		t.Fatalf("Ahead(k3) = %v, want [k1 k2]", got)
	}
	if got := names(k1); len(got) != 0 {
		t.Fatalf("Ahead(k1) = %v, want nothing before the head", got)
	}
}
