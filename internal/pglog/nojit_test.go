package pglog

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/postbox-go/postbox/internal/testdb"
	"github.com/postbox-go/postbox/postboxdriver"
)

// A statement through noJIT is planned without JIT compilation on a
// server set to compile everything, in one round trip of its own, and
// leaves the connection as it found it.
func TestNoJITPlansWithoutCompiling(t *testing.T) {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(testdb.PostgresURL())
	if err != nil {
		t.Fatal(err)
	}
	// One connection, so that the statements after noJIT's run on the
	// connection it ran on.
	cfg.MaxConns = 1
	cfg.ConnConfig.RuntimeParams["jit"] = "on"
	cfg.ConnConfig.RuntimeParams["jit_above_cost"] = "0"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	const explain = `EXPLAIN (ANALYZE, FORMAT JSON) SELECT count(*) FROM generate_series(1, 1000)`
	plan := func(q interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}) string {
		t.Helper()
		var out string
		if err := q.QueryRow(ctx, explain).Scan(&out); err != nil {
			t.Fatal(err)
		}
		if n := pool.Stat().AcquiredConns(); n != 0 {
			t.Fatalf("%d connections still acquired after the statement", n)
		}
		return out
	}
	if !strings.Contains(plan(pool), `"JIT"`) {
		t.Skip("this server does not compile with JIT (no LLVM support)")
	}
	db := noJIT{pool}
	if p := plan(db); strings.Contains(p, `"JIT"`) {
		t.Fatalf("planned with JIT through noJIT: %s", p)
	}
	if !strings.Contains(plan(pool), `"JIT"`) {
		t.Fatal("JIT stayed off on the connection after noJIT's statement")
	}

	var setting string
	rows, err := db.Query(ctx, `SELECT current_setting('jit') FROM generate_series(1, 3)`)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for rows.Next() {
		if err := rows.Scan(&setting); err != nil || setting != "off" {
			t.Fatalf("row %d: jit = %q, %v", n, setting, err)
		}
		n++
	}
	if err := rows.Err(); err != nil || n != 3 {
		t.Fatalf("Query read %d rows, %v; want 3", n, err)
	}
	c := pool.Stat().AcquiredConns()
	rows.Close()
	if c != 0 {
		t.Fatalf("%d connections still acquired after reading past the last row", c)
	}
	if tag, err := db.Exec(ctx, `SELECT set_config('application_name', 'x', true)`); err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("Exec = %v, %v", tag, err)
	}
	// The setting's statement gives the transaction no id: a read's id is
	// assigned after its own snapshot, as its position needs.
	var unassigned bool
	if err := db.QueryRow(ctx, `SELECT pg_current_xact_id_if_assigned() IS NULL`).Scan(&unassigned); err != nil || !unassigned {
		t.Fatalf("a transaction id assigned before the statement: %v, %v", unassigned, err)
	}
	if err := db.QueryRow(ctx, `SELECT 1 WHERE false`).Scan(&n); !errors.Is(err, pgx.ErrNoRows) {
		t.Fatalf("QueryRow of no row = %v, want pgx.ErrNoRows", err)
	}

	// A read runs with bitmap scans off too (ReadSettings), and its
	// connection keeps its own settings after it, as after any other.
	settings := `SELECT current_setting('jit') || ' ' || current_setting('enable_bitmapscan')`
	rows, err = db.Read(ctx, settings)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(got) != 1 || got[0] != "off off" {
		t.Fatalf("Read ran with jit and enable_bitmapscan %q, %v; want off off", got, err)
	}
	var after string
	if err := pool.QueryRow(ctx, settings).Scan(&after); err != nil || after != "on on" {
		t.Fatalf("the connection after Read: jit and enable_bitmapscan %q, %v; want on on", after, err)
	}

	// A failing statement reports the server's error and gives the
	// connection back.
	var pe *pgconn.PgError
	if _, err := db.Exec(ctx, `SELECT * FROM postbox_no_such_table`); !errors.As(err, &pe) || pe.Code != "42P01" {
		t.Fatalf("Exec of a missing table = %v, want undefined_table", err)
	}
	if _, err := db.Query(ctx, `SELECT * FROM postbox_no_such_table`); !errors.As(err, &pe) || pe.Code != "42P01" {
		t.Fatalf("Query of a missing table = %v, want undefined_table", err)
	}
	if c := pool.Stat().AcquiredConns(); c != 0 {
		t.Fatalf("%d connections still acquired after the failures", c)
	}
}

// A read is planned once on its connection and its generic plan kept:
// PostgreSQL's default plans a prepared statement afresh for each of its
// first five executions, and for good where the generic plan's estimate
// comes out above the custom plans', as a read's arrays of unknown length
// make it. Planning the log's read and record costs more than running
// them: among 16 relays on two cores, ten thousand plans of the record
// with the next read took 450 s of PostgreSQL's time in two minutes
// (SCALING.md, "Over the log").
func TestReadKeepsItsGenericPlan(t *testing.T) {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(testdb.PostgresURL())
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1 // the statements after the reads see their connection's prepared statements
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	db := noJIT{pool}
	mode := func() string {
		t.Helper()
		var m string
		if err := pool.QueryRow(ctx, `SELECT current_setting('plan_cache_mode')`).Scan(&m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	before := mode()
	const read = `SELECT count(*) FROM unnest($1::int[]) AS a(p) WHERE p > 1 /* postbox read plan test */`
	const runs = 8
	for i := range runs {
		rows, err := db.Read(ctx, read, []int32{1, 2, int32(i)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pgx.CollectRows(rows, pgx.RowTo[int64]); err != nil {
			t.Fatal(err)
		}
	}
	var generic, custom int64
	if err := pool.QueryRow(ctx, `SELECT generic_plans, custom_plans FROM pg_prepared_statements
		WHERE statement = $1`, read).Scan(&generic, &custom); err != nil {
		t.Fatalf("the read's prepared statement: %v", err)
	}
	if generic != runs || custom != 0 {
		t.Fatalf("%d reads ran %d generic and %d custom plans; want %d and 0", runs, generic, custom, runs)
	}
	// The setting ends with each read's transaction: the connection's own
	// statements plan as before.
	if after := mode(); after != before {
		t.Fatalf("plan_cache_mode on the connection after the reads = %q, want %q as before them", after, before)
	}
}

// TestWarmReadiesDistinctConnections: Warm prepares, on as many distinct
// connections as it is asked for up to half the pool, the statements a
// relay's first read of its partitions takes (the positions' load and the
// small read statement, whatever the number of partitions), the read
// given its generic plan there.
func TestWarmReadiesDistinctConnections(t *testing.T) {
	ctx := context.Background()
	_, prefix := migratedLog(t)
	cfg, err := pgxpool.ParseConfig(testdb.PostgresURL())
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 6
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(ctx, ChunkLog(prefix)); err != nil {
		t.Fatal(err)
	}
	s, err := (&Driver[pgx.Tx]{pool: pool, chunks: chunking{width: 4, ahead: 4}}).Open(prefix)
	if err != nil {
		t.Fatal(err)
	}
	st := s.(*logStore[pgx.Tx])
	p := postboxdriver.FetchParams{Limit: 50, Topics: []string{"orders.*"}}
	if err := st.Warm(ctx, p, 4); err != nil {
		t.Fatal(err)
	}
	// The statement of the first read of five partitions (short: none
	// read yet), as the read would make it.
	first := st.plan(p, []int{1, 2, 3, 4, 5}, nil)
	if !first.shape.small {
		t.Fatal("a first read does not take the small statement")
	}
	read := st.statement(st.reads, first.shape, readSQL)
	conns := pool.AcquireAllIdle(ctx)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	readied := 0
	for _, c := range conns {
		var reads, generic, loads int64
		if err := c.QueryRow(ctx, `SELECT count(*) FILTER (WHERE statement = $1), coalesce(sum(generic_plans) FILTER (WHERE statement = $1), 0),
			count(*) FILTER (WHERE statement = $2) FROM pg_prepared_statements`, read, st.load).Scan(&reads, &generic, &loads); err != nil {
			t.Fatal(err)
		}
		if reads == 1 && generic == 1 && loads == 1 {
			readied++
		}
	}
	if len(conns) != 3 || readied != 3 {
		t.Fatalf("%d connections in the pool, %d readied (the read prepared with its generic plan, the load prepared); want 3 of 3 (half the pool)", len(conns), readied)
	}
}
