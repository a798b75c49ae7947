package bench_test

import (
	"bytes"
	"context"
	"reflect"
	"regexp"
	"strconv"
	"testing"

	"github.com/postbox-go/postbox/cmd/postbox/internal/bench"
)

// Small consumer benchmarks, one transaction per message and batched, so
// that their own exactly-once checks run in CI against the real PostgreSQL
// and NATS.
func TestInboxSmall(t *testing.T) {
	for _, perKey := range []bool{false, true} {
		var out bytes.Buffer
		res, err := bench.Inbox(context.Background(), bench.InboxOptions{Messages: 1500, Keys: 40, Batch: 16, PerKey: perKey}, &out)
		if err != nil {
			t.Fatalf("per key %v: %v\n%s", perKey, err, out.String())
		}
		if res.RawRate <= 0 || res.PlainRate <= 0 || res.SingleRate <= 0 || res.BatchRate <= 0 || res.BatchCommits <= 0 || res.CallRate <= 0 || res.CallCommits <= 0 {
			t.Fatalf("per key %v: result %+v", perKey, res)
		}
		if u, ok := res.CPU["batch"]; ok && u.Total() <= 0 {
			t.Fatalf("per key %v: the batched phase's CPU %+v", perKey, u)
		}
		if m := bench.MedianInbox([]bench.InboxResult{res, res, res}); !reflect.DeepEqual(m, res) {
			t.Fatalf("median of equal runs = %+v, want %+v", m, res)
		}
	}
}

// With a failing first delivery now and then, every message is still
// applied exactly once (the benchmark's own checks), the failed runs
// rolled back: in a batch, the first pass's transaction with the runs
// before the failure, and the failed handler's savepoint in the second;
// in a batch applied in one call, that call, and then the failed
// delivery's own call in its savepoint.
func TestInboxSmallWithFailures(t *testing.T) {
	var out bytes.Buffer
	res, err := bench.Inbox(context.Background(), bench.InboxOptions{Messages: 1500, Keys: 40, Batch: 16, FailEvery: 50}, &out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if res.SingleRate <= 0 || res.BatchRate <= 0 || res.CallRate <= 0 {
		t.Fatalf("result %+v", res)
	}
	for _, phase := range []string{"single", "batch", "call"} {
		m := regexp.MustCompile(`(?m)^  ` + phase + `: (\d+) handler runs failed on purpose`).FindStringSubmatch(out.String())
		if m == nil {
			t.Fatalf("%s: no count of the failed runs in\n%s", phase, out.String())
		}
		// About 1,500 / 50 = 30, by the ids' hashes.
		if n, _ := strconv.Atoi(m[1]); n < 5 || n > 100 {
			t.Fatalf("%s: %d runs failed on purpose, want about 30\n%s", phase, n, out.String())
		}
	}
}
