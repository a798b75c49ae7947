package postboxsqlite_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/postbox-go/postbox/postboxdriver"
	"github.com/postbox-go/postbox/postboxmigrate"
	"github.com/postbox-go/postbox/postboxsqlite"
)

func TestInsertTxBatches(t *testing.T) {
	f := migrated(t)
	ctx := context.Background()
	// Over two chunks' worth, so the batch spans several statements.
	rows := make([]postboxdriver.Row, 1234)
	for i := range rows {
		rows[i] = row("t.bulk", fmt.Sprintf("k%d", i%7), fmt.Sprint(i))
	}
	before := f.dbNow(t)
	seqs := f.insert(t, rows...)
	after := f.dbNow(t)
	for i := 1; i < len(seqs); i++ {
		if seqs[i] <= seqs[i-1] {
			t.Fatalf("row %d has seq %d after %d: insert order lost", i, seqs[i], seqs[i-1])
		}
	}
	recs := f.fetch(t, postboxdriver.FetchParams{Fence: f.lease(t, "o"), Limit: 5000})
	if len(recs) != len(rows) {
		t.Fatalf("fetched %d of %d", len(recs), len(rows))
	}
	for i, r := range recs {
		if r.ID != rows[i].ID || string(r.Payload) != fmt.Sprint(i) || r.Partition != postboxdriver.PartitionOf(rows[i].Key, r.ID, 64) {
			t.Fatalf("record %d = %+v", i, r)
		}
		if ms := r.CreatedAt.UnixMilli(); ms < before || ms > after {
			t.Fatalf("created_at %d outside [%d, %d]", ms, before, after)
		}
	}
	// available_at starts at created_at: fresh rows are available at once.
	if n := f.count(t, "outbox", "available_at != created_at OR attempts != 0 OR last_error IS NOT NULL"); n != 0 {
		t.Fatalf("%d fresh rows with retry state", n)
	}
	if n, err := f.markPublished(ctx, f.lease(t, "o"), seqs); err != nil || n != len(seqs) {
		t.Fatalf("mark all = %d, %v", n, err)
	}
	// seqs never come back, even once the outbox is empty.
	next := f.insert(t, row("t", "", ""))
	if next[0] <= seqs[len(seqs)-1] {
		t.Fatalf("seq %d reused after an emptied outbox (last was %d)", next[0], seqs[len(seqs)-1])
	}
}

func TestInsertTxNormalizes(t *testing.T) {
	f := migrated(t)
	upper := strings.ToUpper("0190a4b8-7c1e-7d3a-9f00-0123456789ab")
	r := postboxdriver.Row{ID: upper, Topic: "t", Payload: nil, Headers: []byte(`{}`)}
	f.insert(t, r)
	recs := f.fetch(t, postboxdriver.FetchParams{Fence: f.lease(t, "o")})
	if len(recs) != 1 {
		t.Fatalf("fetched %d", len(recs))
	}
	got := recs[0]
	if got.ID != strings.ToLower(upper) {
		t.Fatalf("id stored as %q, want lower case", got.ID)
	}
	// The partition comes from the stored id, as PostgreSQL computes it.
	if want := postboxdriver.PartitionOf("", got.ID, 64); got.Partition != want {
		t.Fatalf("partition %d, want %d", got.Partition, want)
	}
	if got.Payload == nil || len(got.Payload) != 0 || got.Key != "" {
		t.Fatalf("payload %#v key %q", got.Payload, got.Key)
	}
}

// Every bad row fails the batch, and the caller's transaction is left as
// it was: rows written before the batch survive, none of the batch does.
func TestInsertTxRejects(t *testing.T) {
	f := migrated(t)
	ctx := context.Background()
	long := strings.Repeat("a", 256)
	cases := map[string]func(r *postboxdriver.Row){
		"id not a uuid":      func(r *postboxdriver.Row) { r.ID = "not-a-uuid" },
		"topic with a space": func(r *postboxdriver.Row) { r.Topic = "a b" },
		"topic with a quote": func(r *postboxdriver.Row) { r.Topic = "t'; DROP TABLE x; --" },
		"topic empty":        func(r *postboxdriver.Row) { r.Topic = "" },
		"topic too long":     func(r *postboxdriver.Row) { r.Topic = long },
		"topic not ascii":    func(r *postboxdriver.Row) { r.Topic = "caf\u00e9" },
		"key too long":       func(r *postboxdriver.Row) { r.Key = strings.Repeat("\u00e9", 128) }, // 256 bytes
		"headers an array":   func(r *postboxdriver.Row) { r.Headers = []byte(`[]`) },
		"headers not json":   func(r *postboxdriver.Row) { r.Headers = []byte(`{nope`) },
		"headers empty":      func(r *postboxdriver.Row) { r.Headers = nil },
		"headers a string":   func(r *postboxdriver.Row) { r.Headers = []byte(`"x"`) },
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			// The bad row sits in the third chunk of a large batch.
			rows := make([]postboxdriver.Row, 1100)
			for i := range rows {
				rows[i] = row("t.ok", "k", "")
			}
			mutate(&rows[1050])
			tx, err := f.db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback() }()
			kept := row("t.kept", "", "")
			if err := f.store.UnwrapExecutor(tx).Insert(ctx, []postboxdriver.Row{kept}); err != nil {
				t.Fatal(err)
			}
			if err := f.store.UnwrapExecutor(tx).Insert(ctx, rows); err == nil {
				t.Fatal("bad batch accepted")
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			if n := f.count(t, "outbox", "topic = 't.ok'"); n != 0 {
				t.Fatalf("%d rows of the failed batch committed", n)
			}
			if n := f.count(t, "outbox", "id = ?", kept.ID); n != 1 {
				t.Fatal("the row written before the failed batch is gone")
			}
		})
	}

	// The edges of what is allowed.
	ok := row(strings.Repeat("Az09._:-", 31)+"abcdefg", strings.Repeat("\u00e9", 127)+"x", "")
	ok.Headers = []byte(`{"a":"b"}`)
	f.insert(t, ok)

	dup := row("t", "", "")
	f.insert(t, dup)
	err := f.store.InTx(ctx, func(tx *sql.Tx) error { return f.store.UnwrapExecutor(tx).Insert(ctx, []postboxdriver.Row{dup}) })
	if err == nil {
		t.Fatal("duplicate id accepted")
	}
	// Rows written straight into the table are checked too.
	for name, q := range map[string]string{
		"upper-case id": `INSERT INTO pb_outbox (id, topic, payload, partition) VALUES ('0190A4B8-7C1E-7D3A-9F00-0123456789AB', 't', x'', 0)`,
		"partition 64":  `INSERT INTO pb_outbox (id, topic, payload, partition) VALUES ('0190a4b8-7c1e-7d3a-9f00-0123456789ab', 't', x'', 64)`,
		"text payload":  `INSERT INTO pb_outbox (id, topic, payload, partition) VALUES ('0190a4b8-7c1e-7d3a-9f00-0123456789ab', 't', 'text', 0)`,
	} {
		if _, err := f.db.Exec(q); err == nil {
			t.Errorf("%s accepted", name)
		}
	}
}

func TestInTx(t *testing.T) {
	f := migrated(t)
	ctx := context.Background()
	boom := errors.New("boom")
	err := f.store.InTx(ctx, func(tx *sql.Tx) error {
		if err := f.store.UnwrapExecutor(tx).Insert(ctx, []postboxdriver.Row{row("t", "", "")}); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want fn's error", err)
	}
	if st := f.stats(t); st.Pending != 0 {
		t.Fatalf("pending %d after a rolled-back InTx", st.Pending)
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("panic swallowed")
			}
		}()
		_ = f.store.InTx(ctx, func(*sql.Tx) error { panic("fn panicked") })
	}()
	// The panicking transaction was rolled back: the write lock is free.
	if err := f.store.InTx(ctx, func(tx *sql.Tx) error {
		return f.store.UnwrapExecutor(tx).Insert(ctx, []postboxdriver.Row{row("t", "", "")})
	}); err != nil {
		t.Fatal(err)
	}
	if st := f.stats(t); st.Pending != 1 {
		t.Fatalf("pending %d, want 1", st.Pending)
	}
}

// On a *sql.DB whose transactions begin DEFERRED, InTx still takes the
// write lock at the start, so transactions that read before they write
// queue up instead of failing their upgrade with SQLITE_BUSY.
func TestInTxLocksAtStartOnDeferredDB(t *testing.T) {
	f := migrated(t)
	ctx := context.Background()
	db, err := sql.Open("sqlite", "file:"+f.path+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = db.Close() }()
	d, err := postboxsqlite.New(db)
	if err != nil {
		t.Fatal(err)
	}
	st, err := d.Open(prefix)
	if err != nil {
		t.Fatal(err)
	}

	inside := make(chan struct{})
	release := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- st.InTx(ctx, func(*sql.Tx) error {
			close(inside)
			<-release
			return nil
		})
	}()
	<-inside
	c, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err = c.ExecContext(short, "BEGIN IMMEDIATE")
	cancel()
	if err == nil {
		_, _ = c.ExecContext(ctx, "ROLLBACK")
		t.Error("another writer got the write lock while InTx ran")
	}
	_ = c.Close()
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	var wg sync.WaitGroup
	errs := make(chan error, 4*25)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 25 {
				errs <- st.InTx(ctx, func(tx *sql.Tx) error {
					var n int
					if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM `+prefix+`outbox`).Scan(&n); err != nil {
						return err
					}
					return st.UnwrapExecutor(tx).Insert(ctx, []postboxdriver.Row{row("t", "k", fmt.Sprint(n))})
				})
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("read-then-write transaction failed: %v", err)
		}
	}
	if s := f.stats(t); s.Pending != 100 {
		t.Fatalf("pending %d, want 100", s.Pending)
	}
}

// The relay's writes and the application's transactions share one file;
// with the busy timeout they take turns and none of them fails.
func TestWritersAndRelayTakeTurns(t *testing.T) {
	f := migrated(t)
	ctx := context.Background()
	fence := f.lease(t, "o")
	var wg sync.WaitGroup
	errs := make(chan error, 1000)
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 30 {
				errs <- f.store.InTx(ctx, func(tx *sql.Tx) error {
					return f.store.UnwrapExecutor(tx).Insert(ctx, []postboxdriver.Row{row("t", fmt.Sprintf("k%d", i%5), "x")})
				})
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range 60 {
			recs, err := f.store.Fetch(ctx, postboxdriver.FetchParams{Fence: fence, Limit: 10})
			if err != nil {
				errs <- err
				return
			}
			if len(recs) > 0 {
				_, err = f.markPublished(ctx, fence, seqsOf(recs[:1]))
				errs <- err
			}
			if len(recs) > 1 {
				_, err = f.markFailed(ctx, fence, []postboxdriver.Failure{{Seq: recs[1].Seq, Error: "x"}}, 3)
				errs <- err
			}
			if _, err := f.store.Coordinate(ctx, "o", time.Minute, nil, nil, nil); err != nil {
				errs <- err
			}
			if _, err := f.store.AcquireLeases(ctx, "o", allPartitions(), time.Minute); err != nil {
				errs <- err
			}
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	st := f.stats(t)
	if st.Pending+st.Published+st.Dead != 90 {
		t.Fatalf("stats %+v do not add up to the 90 rows written", st)
	}
}

func TestMigrations(t *testing.T) {
	f := unmigrated(t)
	ctx := context.Background()
	migs := f.store.Migrations()
	if len(migs) == 0 || migs[0].Version != 1 || migs[0].Name != "outbox" {
		t.Fatalf("migrations = %+v", migs)
	}
	for i, m := range migs {
		if strings.Contains(m.SQL, "{prefix}") || !strings.Contains(m.SQL, "CREATE TABLE "+prefix+"outbox") && i == 0 {
			t.Fatalf("migration %d not bound to the prefix", m.Version)
		}
		if i > 0 && m.Version <= migs[i-1].Version {
			t.Fatal("migrations out of order")
		}
	}
	if v, err := f.store.AppliedMigrations(ctx); err != nil || v != nil {
		t.Fatalf("applied on a fresh file = %v, %v", v, err)
	}
	for range 2 {
		if err := f.store.ApplyMigration(ctx, migs[0]); err != nil {
			t.Fatal(err)
		}
	}
	if v, err := f.store.AppliedMigrations(ctx); err != nil || fmt.Sprint(v) != "[1]" {
		t.Fatalf("applied = %v, %v", v, err)
	}
	for _, table := range []string{"outbox", "published", "dead", "leases", "relays", "migrations"} {
		var n int
		if err := f.db.QueryRow(`SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = ?`, prefix+table).Scan(&n); err != nil || n != 1 {
			t.Fatalf("table %s%s: %d, %v", prefix, table, n, err)
		}
	}

	// A failing migration leaves nothing behind and is not recorded.
	bad := postboxdriver.Migration{Version: 99, Name: "bad", SQL: `CREATE TABLE ` + prefix + `half (a INTEGER); SELECT * FROM no_such_table;`}
	if err := f.store.ApplyMigration(ctx, bad); err == nil || !strings.Contains(err.Error(), "migration 99 (bad)") {
		t.Fatalf("bad migration: %v", err)
	}
	var n int
	if err := f.db.QueryRow(`SELECT count(*) FROM sqlite_schema WHERE name = ?`, prefix+"half").Scan(&n); err != nil || n != 0 {
		t.Fatalf("half-applied migration left its table (%d, %v)", n, err)
	}
	if v, _ := f.store.AppliedMigrations(ctx); fmt.Sprint(v) != "[1]" {
		t.Fatalf("applied = %v after a failed migration", v)
	}

	// Another prefix in the same file is a schema of its own.
	other, err := f.d.Open("other_")
	if err != nil {
		t.Fatal(err)
	}
	m, err := postboxmigrate.New(f.d, &postboxmigrate.Config{Prefix: "other_"})
	if err != nil {
		t.Fatal(err)
	}
	var all []int
	for _, mig := range migs {
		all = append(all, mig.Version)
	}
	if done, err := m.Up(ctx); err != nil || fmt.Sprint(done) != fmt.Sprint(all) {
		t.Fatalf("up other_ = %v, %v", done, err)
	}
	if _, err := other.AcquireLeases(ctx, "x", allPartitions(), time.Minute); err != nil {
		t.Fatal(err)
	}
	if got := f.count(t, "leases", "owner IS NOT NULL"); got != 0 {
		t.Fatalf("leases under other_ changed %d of %s's", got, prefix)
	}
	if !strings.Contains(m.SQL(), "(sqlite)") {
		t.Fatal("printed migrations do not name the dialect")
	}
}

func TestNotMigrated(t *testing.T) {
	f := unmigrated(t)
	ctx := context.Background()
	fence := postboxdriver.Fence{Owner: "o", Generations: map[int]int64{0: 1}}
	calls := map[string]func() error{
		"Partitions": func() error { _, err := f.store.Partitions(ctx); return err },
		"Coordinate": func() error { _, err := f.store.Coordinate(ctx, "r", time.Second, nil, nil, nil); return err },
		"Unregister": func() error { return f.store.Unregister(ctx, "r") },
		"Acquire":    func() error { _, err := f.store.AcquireLeases(ctx, "o", []int{0}, time.Second); return err },
		"Release":    func() error { return f.store.ReleaseLeases(ctx, "o", []int{0}) },
		"Fetch": func() error {
			_, err := f.store.Fetch(ctx, postboxdriver.FetchParams{Fence: fence, Limit: 1})
			return err
		},
		"Published": func() error {
			_, err := f.markPublished(ctx, fence, []int64{1})
			return err
		},
		"Failed": func() error {
			_, err := f.markFailed(ctx, fence, []postboxdriver.Failure{{Seq: 1}}, 1)
			return err
		},
		"Stats": func() error { _, err := f.store.Stats(ctx); return err },
		"Insert": func() error {
			return f.store.InTx(ctx, func(tx *sql.Tx) error {
				return f.store.UnwrapExecutor(tx).Insert(ctx, []postboxdriver.Row{row("t", "", "")})
			})
		},
	}
	for name, call := range calls {
		if err := call(); !errors.Is(err, postboxdriver.ErrNotMigrated) {
			t.Errorf("%s: err = %v, want ErrNotMigrated", name, err)
		}
	}
	if v, err := f.store.AppliedMigrations(ctx); err != nil || v != nil {
		t.Fatalf("applied = %v, %v", v, err)
	}
}

func TestOpenPrefix(t *testing.T) {
	f := unmigrated(t)
	for _, p := range []string{"", "Bad_", "1x_", "x-y", "x y", "x;drop", strings.Repeat("a", postboxdriver.MaxPrefixLen+1)} {
		if _, err := f.d.Open(p); err == nil {
			t.Errorf("prefix %q accepted", p)
		}
	}
	for _, p := range []string{"x", "_", "postbox_", strings.Repeat("a", postboxdriver.MaxPrefixLen)} {
		if _, err := f.d.Open(p); err != nil {
			t.Errorf("prefix %q: %v", p, err)
		}
	}
}

type otherDriver struct{}

func (otherDriver) Open(string) (driver.Conn, error) { return nil, errors.New("not a database") }

func init() { sql.Register("postboxsqlite-test-other", otherDriver{}) }

func TestNewRejectsOtherDrivers(t *testing.T) {
	db, err := sql.Open("postboxsqlite-test-other", "")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = db.Close() }()
	if _, err := postboxsqlite.New(db); !errors.Is(err, postboxsqlite.ErrUnsupportedDriver) {
		t.Fatalf("err = %v, want ErrUnsupportedDriver", err)
	}
}

func TestOpenSettings(t *testing.T) {
	ctx := context.Background()
	// Characters that mean something in a URI stay part of the name.
	path := filepath.Join(t.TempDir(), "we?ird #1 100%.db")
	db, err := postboxsqlite.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = db.Close() }()
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("database file not at its path: %v", err)
	}
	c, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	var mode string
	var busy, sync int
	if err := c.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil || mode != "wal" {
		t.Fatalf("journal_mode %q, %v", mode, err)
	}
	if err := c.QueryRowContext(ctx, "PRAGMA busy_timeout").Scan(&busy); err != nil || busy != postboxsqlite.BusyTimeoutMillis || busy < 1000 {
		t.Fatalf("busy_timeout %d, %v", busy, err)
	}
	if err := c.QueryRowContext(ctx, "PRAGMA synchronous").Scan(&sync); err != nil || sync != 2 {
		t.Fatalf("synchronous %d, %v; want 2 (FULL)", sync, err)
	}
	// Transactions begin IMMEDIATE: an open one, even before its first
	// statement, holds the write lock.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if _, err := c.ExecContext(short, "BEGIN IMMEDIATE"); err == nil {
		_, _ = c.ExecContext(ctx, "ROLLBACK")
		t.Fatal("write lock free while a transaction is open")
	}
	if !strings.Contains(postboxsqlite.DSN("/x.db"), "_txlock=immediate") {
		t.Fatal("DSN without _txlock=immediate")
	}

	if _, err := postboxsqlite.Open(filepath.Join(t.TempDir(), "missing", "dir", "x.db")); err == nil {
		t.Fatal("Open in a missing directory succeeded")
	}
}
