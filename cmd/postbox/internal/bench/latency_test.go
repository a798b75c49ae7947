package bench_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/postbox-go/postbox/cmd/postbox/internal/bench"
)

// A short latency run at a low rate, in both writing modes and over the
// log: every message written is acknowledged exactly once and the stream
// holds them all (Latency checks the ids and the stream), the percentiles
// are ordered, and the idle relay's statements were counted. Over the log,
// the relay's small batches are recorded with its next reads. The first
// run measures a short same-run floor first; the others skip it.
func TestLatencySmall(t *testing.T) {
	for _, tc := range []struct {
		separate bool
		storage  string
		pipeline bool
		baseline time.Duration
	}{{false, "table", false, 500 * time.Millisecond}, {true, "table", false, -1}, {false, "log", true, -1}} {
		separate := tc.separate
		var out bytes.Buffer
		res, err := bench.Latency(context.Background(), bench.LatencyOptions{
			Rate: 200, Duration: 2 * time.Second, Warmup: 200 * time.Millisecond, Writers: 2, Keys: 10,
			SeparateWriter: separate, Idle: time.Second, Storage: tc.storage, Pipeline: tc.pipeline,
			Baseline: tc.baseline,
		}, &out)
		if err != nil {
			t.Fatalf("separate writer %v: %v\n%s", separate, err, out.String())
		}
		// A message is sent twice only after the relay lost a lease or a
		// record, which it reports: a clean run has no duplicate, and one
		// that met a stall of the machine says why it sent some again.
		if res.Written != 400 || res.Acked != 400 || res.Duplicates > 0 && res.RelayWarnings == 0 {
			t.Fatalf("separate writer %v, storage %s, pipeline %v: written %d, acked %d, duplicates %d %+v with %d relay warnings; the relay's statements: %v",
				separate, tc.storage, tc.pipeline, res.Written, res.Acked, res.Duplicates, res.DuplicateAcks, res.RelayWarnings, res.BusyStatements)
		}
		if res.RelayWarnings > 0 {
			t.Logf("separate writer %v, storage %s: %d duplicates %+v after %d relay warnings: %q",
				separate, tc.storage, res.Duplicates, res.DuplicateAcks, res.RelayWarnings, res.RelayWarningLines)
		}
		if res.Storage != tc.storage {
			t.Fatalf("the result names storage %q, want %q", res.Storage, tc.storage)
		}
		if res.Measured != 400-40 {
			t.Fatalf("measured %d, want 360 (the warm-up left out)", res.Measured)
		}
		p := res.Latency
		if p.P50 > p.P90 || p.P90 > p.P99 || p.P99 > p.P999 || p.P999 > p.Max || p.Min > p.P50 {
			t.Fatalf("percentiles out of order: %+v", p)
		}
		switch b := res.Baseline; {
		case tc.baseline < 0 && res.BaselineMeasured != 0:
			t.Fatalf("the floor was measured (%d messages) though skipped", res.BaselineMeasured)
		case tc.baseline > 0 && res.BaselineMeasured != 100-20:
			t.Fatalf("the floor measured %d messages, want 80 (100 at 200 msg/s for 500ms, the warm-up left out)", res.BaselineMeasured)
		case tc.baseline > 0 && (b.Min <= 0 || b.P50 > b.P99 || b.P99 > b.Max):
			t.Fatalf("the floor's percentiles: %+v", b)
		}
		if n := len(res.CDF); n == 0 || res.CDF[n-1].Fraction != 1 || res.CDF[n-1].Millis != p.Max {
			t.Fatalf("cdf ends %+v, max %v", res.CDF[len(res.CDF)-1], p.Max)
		}
		if res.IdleQueriesPerSec <= 0 || len(res.IdleStatements) == 0 {
			t.Fatalf("idle statements not counted: %+v", res.IdleStatements)
		}
		if tc.storage == "log" && res.BusyStatements["batch: log: record and read"] == 0 {
			t.Fatalf("over the log, no batch was recorded with the next read: %+v", res.BusyStatements)
		}
		if jit := res.BusyPerMessage - res.BusyPerMessageExceptJIT; tc.storage == "log" && jit <= 0 || tc.storage == "table" && jit != 0 {
			t.Fatalf("%s: %.2f statements a message, %.2f but for the log's JIT settings", tc.storage, res.BusyPerMessage, res.BusyPerMessageExceptJIT)
		}
	}
}

func TestLatencyRejectsBadOptions(t *testing.T) {
	for _, tc := range []struct {
		opts bench.LatencyOptions
		flag string
	}{
		{bench.LatencyOptions{Rate: -1}, "--rate"},
		{bench.LatencyOptions{Writers: -1}, "--writers"},
		{bench.LatencyOptions{Keys: -3}, "--keys"},
		{bench.LatencyOptions{PollInterval: time.Microsecond}, "--poll-interval"},
		{bench.LatencyOptions{Lanes: 100}, "--lanes"},
		{bench.LatencyOptions{Storage: "wal"}, "--storage"},
	} {
		wantRejected(t, bench.Latency, tc.opts, tc.flag)
	}
}

// The drain's timeline, which the plot of drain throughput reads: it
// starts at the whole backlog, never grows, and ends empty at the drain's
// end.
func TestDrainTimeline(t *testing.T) {
	res := runBench(t, bench.Drain, bench.DrainOptions{Messages: 3000, Keys: 50, SampleEvery: 20 * time.Millisecond})
	tl := res.Timeline
	if len(tl) < 2 || tl[0].Remaining != 3000 || tl[0].Seconds != 0 {
		t.Fatalf("timeline %+v", tl)
	}
	last := tl[len(tl)-1]
	if last.Remaining != 0 || last.Seconds != res.DrainElapsed.Seconds() {
		t.Fatalf("timeline ends %+v, drain took %s", last, res.DrainElapsed)
	}
	for i := 1; i < len(tl); i++ {
		if tl[i].Seconds < tl[i-1].Seconds || tl[i].Remaining > tl[i-1].Remaining {
			t.Fatalf("timeline goes back at %d: %+v then %+v", i, tl[i-1], tl[i])
		}
	}
}
