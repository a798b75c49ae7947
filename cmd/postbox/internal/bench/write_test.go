package bench_test

import (
	"testing"
	"time"

	"github.com/postbox-go/postbox/cmd/postbox/internal/bench"
)

// A short write benchmark: both phases of every case run, and the tables
// hold exactly the rows the writers counted (Write checks it).
func TestWriteSmall(t *testing.T) {
	res := runBench(t, bench.Write, bench.WriteOptions{
		Duration: 300 * time.Millisecond, Runs: 2, Writers: []int{1, 3}, Batch: 10, BatchWriters: 2, Warmup: 100 * time.Millisecond,
		SynchronousCommit: "off",
	})
	if len(res.Cases) != 3 {
		t.Fatalf("%d cases, want 3: %+v", len(res.Cases), res)
	}
	for _, c := range res.Cases {
		if len(c.Runs) != 2 {
			t.Fatalf("case %+v: %d runs, want 2", c, len(c.Runs))
		}
		for _, r := range c.Runs {
			if r.Without <= 0 || r.With <= 0 || r.Ratio <= 0 {
				t.Fatalf("case %d writers × %d rows: run %+v", c.Writers, c.Rows, r)
			}
		}
	}
	if res.Cases[2].Rows != 10 || res.Cases[2].Writers != 2 {
		t.Fatalf("batched case %+v", res.Cases[2])
	}
	if res.OutboxRowBytes <= 0 || res.DomainRowBytes <= 0 {
		t.Fatalf("row sizes %v, %v", res.DomainRowBytes, res.OutboxRowBytes)
	}
	if res.OutboxRows == 0 || res.DomainRows <= res.OutboxRows {
		t.Fatalf("rows: %d domain, %d outbox", res.DomainRows, res.OutboxRows)
	}
}

func TestWriteRejectsBadOptions(t *testing.T) {
	for _, tc := range []struct {
		opts bench.WriteOptions
		flag string
	}{
		{bench.WriteOptions{Duration: -time.Second}, "--duration"},
		{bench.WriteOptions{Runs: -1}, "--runs"},
		{bench.WriteOptions{Writers: []int{8, 0}}, "--writers"},
		{bench.WriteOptions{Batch: 1_000_000}, "--batch"},
		{bench.WriteOptions{BatchWriters: 1000}, "--batch-writers"},
		{bench.WriteOptions{PayloadBytes: -5}, "--payload"},
		{bench.WriteOptions{SynchronousCommit: "sometimes"}, "--synchronous-commit"},
		{bench.WriteOptions{Storage: "heap"}, "--storage"},
	} {
		wantRejected(t, bench.Write, tc.opts, tc.flag)
	}
}

// The write into the log read by snapshot bands (--storage log), with a
// statement of its own and with the COMMIT (--pipeline): the log holds
// exactly the messages committed (Write checks it).
func TestWriteSmallLog(t *testing.T) {
	for _, pipeline := range []bool{false, true} {
		res := runBench(t, bench.Write, bench.WriteOptions{
			Duration: 300 * time.Millisecond, Runs: 1, Writers: []int{2}, Batch: 10, BatchWriters: 2, Warmup: 100 * time.Millisecond,
			Storage: "log", Pipeline: pipeline,
		})
		if res.OutboxRows == 0 || res.OutboxRowBytes <= 0 || res.Cases[0].Runs[0].With <= 0 {
			t.Fatalf("pipeline %v: result %+v", pipeline, res)
		}
	}
}
