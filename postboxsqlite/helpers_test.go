package postboxsqlite_test

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/postbox-go/postbox"
	"github.com/postbox-go/postbox/postboxdriver"
	"github.com/postbox-go/postbox/postboxdriver/postboxdrivertest"
	"github.com/postbox-go/postbox/postboxmigrate"
	"github.com/postbox-go/postbox/postboxsqlite"
)

func TestMain(m *testing.M) {
	postboxdrivertest.Child(func(path string) (postboxdriver.Driver[*sql.Tx], error) {
		db, err := postboxsqlite.Open(path)
		if err != nil {
			return nil, err
		}
		return postboxsqlite.New(db)
	})
	goleak.VerifyTestMain(m)
}

const prefix = "pb_"

// openDB opens a fresh database file in the test's temporary directory.
func openDB(t *testing.T) (*sql.DB, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "postbox.db")
	db, err := postboxsqlite.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db, path
}

type fixture struct {
	db    *sql.DB
	path  string
	d     *postboxsqlite.Driver
	store postboxdriver.Store[*sql.Tx]
}

// unmigrated returns a store over a fresh file without tables.
func unmigrated(t *testing.T) *fixture {
	t.Helper()
	db, path := openDB(t)
	d, err := postboxsqlite.New(db)
	if err != nil {
		t.Fatal(err)
	}
	st, err := d.Open(prefix)
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{db: db, path: path, d: d, store: st}
}

// migrated returns a store over a fresh file with the tables in place.
func migrated(t *testing.T) *fixture {
	t.Helper()
	f := unmigrated(t)
	m, err := postboxmigrate.New(f.d, &postboxmigrate.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Up(context.Background()); err != nil {
		t.Fatal(err)
	}
	return f
}

// row returns a valid row; the id is fresh.
func row(topic, key, payload string) postboxdriver.Row {
	return postboxdriver.Row{ID: postbox.NewID(), Topic: topic, Key: key, Payload: []byte(payload), Headers: []byte(`{"ce-source":"test"}`)}
}

// insert writes rows in a transaction of the store's own and returns
// their seqs, in row order.
func (f *fixture) insert(t *testing.T, rows ...postboxdriver.Row) []int64 {
	t.Helper()
	ctx := context.Background()
	if err := f.store.InTx(ctx, func(tx *sql.Tx) error { return f.store.UnwrapExecutor(tx).Insert(ctx, rows) }); err != nil {
		t.Fatal(err)
	}
	seqs := make([]int64, len(rows))
	for i, r := range rows {
		if err := f.db.QueryRow(`SELECT seq FROM `+prefix+`outbox WHERE id = lower(?)`, r.ID).Scan(&seqs[i]); err != nil {
			t.Fatalf("row %d (%s): %v", i, r.ID, err)
		}
	}
	return seqs
}

// markPublished settles a batch whose rows were all published.
func (f *fixture) markPublished(ctx context.Context, fence postboxdriver.Fence, seqs []int64) (int, error) {
	s, err := f.store.Settle(ctx, fence, postboxdriver.Outcome{Read: seqs, Published: seqs}, 25)
	return s.Published, err
}

// markFailed settles a batch whose rows all failed.
func (f *fixture) markFailed(ctx context.Context, fence postboxdriver.Fence, fails []postboxdriver.Failure, maxAttempts int) ([]postboxdriver.FailResult, error) {
	read := make([]int64, len(fails))
	for i, fl := range fails {
		read[i] = fl.Seq
	}
	s, err := f.store.Settle(ctx, fence, postboxdriver.Outcome{Read: read, Failed: fails}, maxAttempts)
	return s.Failed, err
}

// lease takes every partition for owner and returns the fence.
func (f *fixture) lease(t *testing.T, owner string) postboxdriver.Fence {
	t.Helper()
	ls, err := f.store.AcquireLeases(context.Background(), owner, allPartitions(), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if len(ls) != 64 {
		t.Fatalf("%s got %d leases, want 64", owner, len(ls))
	}
	return fenceOf(owner, ls)
}

func (f *fixture) fetch(t *testing.T, p postboxdriver.FetchParams) []postboxdriver.Record {
	t.Helper()
	if p.Limit == 0 {
		p.Limit = 1000
	}
	recs, err := f.store.Fetch(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

func (f *fixture) stats(t *testing.T) postboxdriver.Stats {
	t.Helper()
	st, err := f.store.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// dbNow reads the database clock in unix milliseconds.
func (f *fixture) dbNow(t *testing.T) int64 {
	t.Helper()
	var ms int64
	if err := f.db.QueryRow(`SELECT CAST(ROUND((julianday('now') - 2440587.5) * 86400000) AS INTEGER)`).Scan(&ms); err != nil {
		t.Fatal(err)
	}
	return ms
}

// count counts the rows of one of the prefix's tables matching where.
func (f *fixture) count(t *testing.T, table, where string, args ...any) int {
	t.Helper()
	var n int
	q := fmt.Sprintf(`SELECT count(*) FROM %s%s WHERE %s`, prefix, table, where)
	if err := f.db.QueryRow(q, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func allPartitions() []int {
	out := make([]int, 64)
	for i := range out {
		out[i] = i
	}
	return out
}

func fenceOf(owner string, ls []postboxdriver.Lease) postboxdriver.Fence {
	f := postboxdriver.Fence{Owner: owner, Generations: map[int]int64{}}
	for _, l := range ls {
		f.Generations[l.Partition] = l.Generation
	}
	return f
}

func seqsOf(recs []postboxdriver.Record) []int64 {
	out := make([]int64, len(recs))
	for i, r := range recs {
		out[i] = r.Seq
	}
	return out
}

// holdWriteLock takes SQLite's write lock on another connection until the
// returned function is called.
func holdWriteLock(t *testing.T, db *sql.DB) func() {
	t.Helper()
	ctx := context.Background()
	c, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	released := false
	release := func() {
		if released {
			return
		}
		released = true
		_, _ = c.ExecContext(ctx, "ROLLBACK")
		_ = c.Close()
	}
	t.Cleanup(release)
	return release
}
