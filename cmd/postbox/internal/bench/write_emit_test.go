package bench_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/postbox-go/postbox/cmd/postbox/internal/bench"
)

// The WAL phase (--emit) on a server with wal_level = logical: every
// message an emitted phase committed is decoded from the WAL, with its
// bytes, and nothing else under the prefix. .ci/run starts that server
// (POSTBOX_LOGICAL_DATABASE_URL) and sets POSTBOX_REQUIRE_LOGICAL, so
// that in CI the test runs rather than skips.
func TestWriteEmit(t *testing.T) {
	url := os.Getenv("POSTBOX_LOGICAL_DATABASE_URL")
	if url == "" {
		if os.Getenv("POSTBOX_REQUIRE_LOGICAL") != "" {
			t.Fatal("POSTBOX_REQUIRE_LOGICAL is set but POSTBOX_LOGICAL_DATABASE_URL is not")
		}
		t.Skip("no server with wal_level = logical: set POSTBOX_LOGICAL_DATABASE_URL")
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	// A slot made before the run sees every message the run emits; it is
	// dropped at the end, since a slot keeps the server's WAL.
	slot := fmt.Sprintf("bench_emit_%d", time.Now().UnixNano())
	if _, err := conn.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'test_decoding')", slot); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = conn.Exec(context.Background(), "SELECT pg_drop_replication_slot($1)", slot) })

	var emitted int64
	for _, pipeline := range []bool{false, true} {
		res := runBench(t, bench.Write, bench.WriteOptions{
			DatabaseURL: url, Emit: true, Pipeline: pipeline, NoBare: true,
			Duration: 200 * time.Millisecond, Runs: 1, Writers: []int{2}, Batch: 5, BatchWriters: 2, Warmup: -1,
			SynchronousCommit: "off",
		})
		for _, c := range res.Cases {
			if r := c.Runs[0]; r.Emitted <= 0 || r.RatioEmitted <= 0 {
				t.Fatalf("pipeline %v, %d writers × %d rows: run %+v", pipeline, c.Writers, c.Rows, r)
			}
		}
		if res.EmittedMessages == 0 {
			t.Fatalf("pipeline %v: no message emitted", pipeline)
		}
		emitted += res.EmittedMessages
	}
	// test_decoding renders a message as "message: transactional: 1
	// prefix: postbox, sz: N content:…" (the content as it is, NULs and
	// all: hence the binary form), at its transaction's commit.
	var decoded, others int64
	if err := conn.QueryRow(ctx, `WITH m AS (
  SELECT position('message: transactional: 1 prefix: postbox,'::bytea IN data) = 1 AND position('\000orders.created\000'::bytea IN data) > 0 AS ours
  FROM pg_logical_slot_get_binary_changes($1, NULL, NULL)
  WHERE position('message:'::bytea IN data) = 1
)
SELECT count(*) FILTER (WHERE ours), count(*) FILTER (WHERE NOT ours) FROM m`, slot).Scan(&decoded, &others); err != nil {
		t.Fatal(err)
	}
	if decoded != emitted || others != 0 {
		t.Fatalf("decoded %d of the runs' messages (and %d others), the runs committed %d", decoded, others, emitted)
	}
	t.Logf("decoded the %d messages the runs committed", decoded)
}

// --emit needs a WAL that can be decoded: a server with wal_level below
// logical is refused, before anything is written.
func TestWriteEmitNeedsLogicalWAL(t *testing.T) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(ctx) }()
	var level string
	if err := conn.QueryRow(ctx, "SHOW wal_level").Scan(&level); err != nil {
		t.Fatal(err)
	}
	if level == "logical" {
		t.Skip("the test database has wal_level = logical")
	}
	wantRejected(t, bench.Write, bench.WriteOptions{Emit: true}, "--emit", "wal_level = logical", "wal_level = "+level)
}
