package bench_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/postbox-go/postbox/cmd/postbox/internal/bench"
)

// A small drain, so the benchmark's own checks (the stream holds exactly
// the backlog) run in CI against the real PostgreSQL and NATS.
func TestDrainSmall(t *testing.T) {
	res := runBench(t, bench.Drain, bench.DrainOptions{Messages: 3000, Keys: 50})
	if res.RawRate <= 0 || res.RawPlainRate <= 0 || res.DrainRate <= 0 || res.Ratio <= 0 || res.RatioPlain <= 0 {
		t.Fatalf("result %+v", res)
	}
	if m := bench.Median([]bench.DrainResult{res, res, res}); m.Ratio != res.Ratio || m.RatioPlain != res.RatioPlain || m.RawPlainCPU != res.RawPlainCPU {
		t.Fatalf("median of equal runs = %+v", m)
	}
}

// The drain from the log read by snapshot bands (--storage log), whole
// and split into chunks of 1,000 seqs (--log-chunk): the stream must hold
// exactly the backlog, as for the outbox.
//
// With --memprofile, the drain's allocations are written, with those up to
// its start beside them, and readable as profiles.
func TestDrainSmallLog(t *testing.T) {
	for _, chunk := range []int64{0, 1000} {
		mem := filepath.Join(t.TempDir(), "allocs.prof")
		res := runBench(t, bench.Drain, bench.DrainOptions{Messages: 3000, Keys: 50, Storage: "log", LogChunk: chunk, MemProfile: mem})
		if res.Storage != "log" || res.DrainRate <= 0 || res.Ratio <= 0 {
			t.Fatalf("--log-chunk %d: result %+v", chunk, res)
		}
		for _, f := range []string{mem + ".base", mem} {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			if len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
				t.Fatalf("%s: not a gzipped profile (%d bytes)", f, len(b))
			}
		}
	}
	wantRejected(t, bench.Drain, bench.DrainOptions{Messages: 10, Storage: "chunks"}, "--storage", "chunks")
	wantRejected(t, bench.Drain, bench.DrainOptions{Messages: 10, Storage: "log", LogChunk: -1}, "--log-chunk", "-1")
	wantRejected(t, bench.Drain, bench.DrainOptions{Messages: 10, LogChunk: 1000}, "--log-chunk", "--storage log")
}
