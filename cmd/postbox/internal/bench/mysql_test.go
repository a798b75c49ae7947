package bench_test

import (
	"testing"
	"time"

	"github.com/postbox-go/postbox/cmd/postbox/internal/bench"
	"github.com/postbox-go/postbox/internal/mysqltest"
)

// The drain and write benchmarks on MySQL or MariaDB (a mysql:// URL):
// the same code as on PostgreSQL, with the database's part chosen by the
// URL, and the same checks (the stream holds exactly the backlog; the
// tables hold exactly the rows committed).
func TestDrainSmallMySQL(t *testing.T) {
	res := runBench(t, bench.Drain, bench.DrainOptions{DatabaseURL: mysqltest.DSN(), Messages: 2000, Keys: 50})
	if res.DrainRate <= 0 || res.Ratio <= 0 || res.Database == "" || res.Database == "PostgreSQL" {
		t.Fatalf("result %+v", res)
	}
}

func TestWriteSmallMySQL(t *testing.T) {
	res := runBench(t, bench.Write, bench.WriteOptions{
		DatabaseURL: mysqltest.DSN(),
		Duration:    200 * time.Millisecond, Runs: 1, Writers: []int{2}, Batch: 5, BatchWriters: 2, Warmup: -1,
	})
	if len(res.Cases) != 2 {
		t.Fatalf("%d cases, want 2: %+v", len(res.Cases), res)
	}
	for _, c := range res.Cases {
		r := c.Runs[0]
		if r.Without <= 0 || r.With <= 0 || r.Bare <= 0 || r.RatioToBare <= 0 {
			t.Fatalf("case %d writers × %d rows: run %+v", c.Writers, c.Rows, r)
		}
	}
	if res.OutboxRows == 0 || res.BareRows == 0 || res.DomainRows <= res.OutboxRows+res.BareRows {
		t.Fatalf("rows: %d domain, %d outbox, %d bare", res.DomainRows, res.OutboxRows, res.BareRows)
	}
}

func TestDrainRefusesTheLogOnMySQL(t *testing.T) {
	wantRejected(t, bench.Drain, bench.DrainOptions{DatabaseURL: mysqltest.DSN(), Storage: "log"}, "--storage", "PostgreSQL")
}

func TestWriteRefusesPostgresOptionsOnMySQL(t *testing.T) {
	wantRejected(t, bench.Write, bench.WriteOptions{DatabaseURL: mysqltest.DSN(), SynchronousCommit: "off"}, "--synchronous-commit")
	wantRejected(t, bench.Write, bench.WriteOptions{DatabaseURL: mysqltest.DSN(), Pipeline: true}, "--pipeline")
	wantRejected(t, bench.Write, bench.WriteOptions{DatabaseURL: mysqltest.DSN(), Emit: true}, "--emit")
	wantRejected(t, bench.Write, bench.WriteOptions{DatabaseURL: mysqltest.DSN(), Storage: "log"}, "--storage")
	wantRejected(t, bench.Write, bench.WriteOptions{DatabaseURL: "mongodb://127.0.0.1/test"}, "--database-url")
}
