package postboxsqlite_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/postbox-go/postbox/postboxdriver"
)

func TestAcquireLeases(t *testing.T) {
	f := migrated(t)
	ctx := context.Background()

	if ls, err := f.store.AcquireLeases(ctx, "a", nil, time.Minute); err != nil || len(ls) != 0 {
		t.Fatalf("no partitions: %v, %v", ls, err)
	}
	// Out-of-range partitions are not there to take.
	if ls, err := f.store.AcquireLeases(ctx, "a", []int{-1, 64, 1000}, time.Minute); err != nil || len(ls) != 0 {
		t.Fatalf("out of range: %v, %v", ls, err)
	}

	before := f.dbNow(t)
	a, err := f.store.AcquireLeases(ctx, "a", []int{5, 1, 3}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	after := f.dbNow(t)
	if fmt.Sprint(partsOf(a)) != "[1 3 5]" {
		t.Fatalf("a holds %v, want [1 3 5] sorted", partsOf(a))
	}
	for _, l := range a {
		if l.Generation != 1 {
			t.Fatalf("first owner of %d at generation %d, want 1", l.Partition, l.Generation)
		}
		exp := l.ExpiresAt.UnixMilli()
		if exp < before+60_000 || exp > after+60_000 {
			t.Fatalf("expiry %d outside [%d, %d] + 1m", exp, before, after)
		}
	}

	// Held partitions are not taken; free ones are.
	b, err := f.store.AcquireLeases(ctx, "b", []int{1, 2, 3}, time.Minute)
	if err != nil || fmt.Sprint(partsOf(b)) != "[2]" {
		t.Fatalf("b = %v, %v; want only 2", b, err)
	}

	// Renewal keeps the generation and moves the expiry on; the result
	// lists only the partitions asked about.
	renewed, err := f.store.AcquireLeases(ctx, "a", []int{1}, 2*time.Minute)
	if err != nil || len(renewed) != 1 || renewed[0].Generation != 1 || !renewed[0].ExpiresAt.After(a[0].ExpiresAt) {
		t.Fatalf("renewal = %v, %v", renewed, err)
	}

	// An expired lease passes to another owner at the next generation.
	if _, err := f.store.AcquireLeases(ctx, "a", []int{7}, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	waitDB(t, f, 2)
	c, err := f.store.AcquireLeases(ctx, "c", []int{7}, time.Minute)
	if err != nil || len(c) != 1 || c[0].Generation != 2 {
		t.Fatalf("c over an expired lease = %v, %v; want generation 2", c, err)
	}
	var owner string
	if err := f.db.QueryRow(`SELECT owner FROM ` + prefix + `leases WHERE partition = 7`).Scan(&owner); err != nil || owner != "c" {
		t.Fatalf("owner of 7 = %q, %v", owner, err)
	}
	// The previous owner coming back to its own expired lease while nobody
	// took it keeps the generation: the owner did not change.
	if _, err := f.store.AcquireLeases(ctx, "a", []int{9}, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	waitDB(t, f, 2)
	again, err := f.store.AcquireLeases(ctx, "a", []int{9}, time.Minute)
	if err != nil || len(again) != 1 || again[0].Generation != 1 {
		t.Fatalf("a back on its expired lease = %v, %v; want generation 1", again, err)
	}
}

func TestReleaseLeases(t *testing.T) {
	f := migrated(t)
	ctx := context.Background()
	if _, err := f.store.AcquireLeases(ctx, "a", []int{0, 1}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.AcquireLeases(ctx, "b", []int{2}, time.Hour); err != nil {
		t.Fatal(err)
	}
	// Releasing another owner's partition, or one not asked about, does
	// nothing.
	if err := f.store.ReleaseLeases(ctx, "a", []int{1, 2}); err != nil {
		t.Fatal(err)
	}
	if err := f.store.ReleaseLeases(ctx, "a", nil); err != nil {
		t.Fatal(err)
	}
	if n := f.count(t, "leases", "owner IS NULL AND partition IN (0, 1, 2)"); n != 1 {
		t.Fatalf("%d of partitions 0-2 free, want only 1", n)
	}
	// A released partition is free at once, at the next generation.
	b, err := f.store.AcquireLeases(ctx, "b", []int{0, 1}, time.Hour)
	if err != nil || fmt.Sprint(partsOf(b)) != "[1]" || b[0].Generation != 2 {
		t.Fatalf("b after release = %v, %v", b, err)
	}
	// The same owner taking back what it released is a new generation too:
	// a fence from before the release must not match.
	if err := f.store.ReleaseLeases(ctx, "a", []int{0}); err != nil {
		t.Fatal(err)
	}
	a, err := f.store.AcquireLeases(ctx, "a", []int{0}, time.Hour)
	if err != nil || len(a) != 1 || a[0].Generation != 2 {
		t.Fatalf("a re-taking its released lease = %v, %v; want generation 2", a, err)
	}
}

func TestCoordinateHeartbeat(t *testing.T) {
	f := migrated(t)
	ctx := context.Background()
	live, err := heartbeat(ctx, f, "r2", time.Minute)
	if err != nil || fmt.Sprint(live) != "[r2]" {
		t.Fatalf("live = %v, %v", live, err)
	}
	if _, err := heartbeat(ctx, f, "r1", time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := heartbeat(ctx, f, "gone", time.Millisecond); err != nil {
		t.Fatal(err)
	}
	waitDB(t, f, 2)
	// Sorted, without the expired relay; a caller whose own ttl has run
	// out is still in the list it gets back.
	live, err = heartbeat(ctx, f, "r3", 0)
	if err != nil || fmt.Sprint(live) != "[r1 r2 r3]" {
		t.Fatalf("live = %v, %v; want [r1 r2 r3]", live, err)
	}
	// A heartbeat extends the expiry and keeps the start time.
	var started, expires int64
	if err := f.db.QueryRow(`SELECT started_at, expires_at FROM `+prefix+`relays WHERE id = 'r1'`).Scan(&started, &expires); err != nil {
		t.Fatal(err)
	}
	if _, err := heartbeat(ctx, f, "r1", time.Hour); err != nil {
		t.Fatal(err)
	}
	var started2, expires2 int64
	if err := f.db.QueryRow(`SELECT started_at, expires_at FROM `+prefix+`relays WHERE id = 'r1'`).Scan(&started2, &expires2); err != nil {
		t.Fatal(err)
	}
	if started2 != started || expires2 < expires+3_000_000 {
		t.Fatalf("after renewal started %d->%d, expires %d->%d", started, started2, expires, expires2)
	}
	if n := f.count(t, "relays", "1"); n != 4 {
		t.Fatalf("%d relay rows, want 4 (expired ones stay until Unregister purges them)", n)
	}
}

func TestUnregister(t *testing.T) {
	f := migrated(t)
	ctx := context.Background()
	for _, id := range []string{"a", "b"} {
		if _, err := heartbeat(ctx, f, id, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	now := f.dbNow(t)
	// Expired two hours ago, and a minute ago.
	if _, err := f.db.Exec(`INSERT INTO `+prefix+`relays (id, expires_at) VALUES ('old', ?), ('recent', ?)`, now-2*3_600_000, now-60_000); err != nil {
		t.Fatal(err)
	}
	if err := f.store.Unregister(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if err := f.store.Unregister(ctx, "never-registered"); err != nil {
		t.Fatal(err)
	}
	var ids []string
	rows, err := f.db.Query(`SELECT id FROM ` + prefix + `relays ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rows.Close() }()
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if fmt.Sprint(ids) != "[b recent]" {
		t.Fatalf("relays after unregister = %v, want [b recent]: the caller and relays expired over an hour ago go", ids)
	}
	live, err := heartbeat(ctx, f, "b", time.Minute)
	if err != nil || fmt.Sprint(live) != "[b]" {
		t.Fatalf("live = %v, %v", live, err)
	}
}

func TestPartitionsAndDialect(t *testing.T) {
	f := migrated(t)
	if d := f.store.Dialect(); d != "sqlite" {
		t.Fatalf("dialect %q", d)
	}
	n, err := f.store.Partitions(context.Background())
	if err != nil || n != 64 {
		t.Fatalf("partitions = %d, %v", n, err)
	}
	if got := f.count(t, "leases", "partition BETWEEN 0 AND 63 AND owner IS NULL AND generation = 0"); got != 64 {
		t.Fatalf("%d fresh leases, want 64", got)
	}
}

func partsOf(ls []postboxdriver.Lease) []int {
	out := make([]int, len(ls))
	for i, l := range ls {
		out[i] = l.Partition
	}
	return out
}

// waitDB waits until the database clock has moved on by at least ms, so
// that leases given a ttl shorter than that have expired.
func waitDB(t *testing.T, f *fixture, ms int64) {
	t.Helper()
	start := f.dbNow(t)
	deadline := time.Now().Add(5 * time.Second)
	for f.dbNow(t) < start+ms {
		if time.Now().After(deadline) {
			t.Fatal("database clock did not move")
		}
		time.Sleep(time.Millisecond)
	}
}

// heartbeat registers id through Coordinate, asking for no lease, and
// returns the live set.
func heartbeat(ctx context.Context, f *fixture, id string, ttl time.Duration) ([]string, error) {
	m, err := f.store.Coordinate(ctx, id, ttl, nil, nil, nil)
	return m.Live, err
}
