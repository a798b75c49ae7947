package bench_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/postbox-go/postbox/internal/bench"
)

// Small consumer benchmarks, one transaction per message and batched, so
// that their own exactly-once checks run in CI against the real PostgreSQL
// and NATS.
func TestInboxSmall(t *testing.T) {
	for _, batch := range []int{0, 16} {
		var out bytes.Buffer
		res, err := bench.Inbox(context.Background(), bench.InboxOptions{Messages: 1500, Keys: 40, Batch: batch, PerKey: batch > 0}, &out)
		if err != nil {
			t.Fatalf("batch %d: %v\n%s", batch, err, out.String())
		}
		if res.RawRate <= 0 || res.PlainRate <= 0 || res.InboxRate <= 0 || res.Ratio <= 0 || res.RawRatio <= 0 || res.InboxCommits <= 0 {
			t.Fatalf("batch %d: result %+v", batch, res)
		}
		if m := bench.MedianInbox([]bench.InboxResult{res, res, res}); m.Ratio != res.Ratio {
			t.Fatalf("median of equal runs = %+v", m)
		}
	}
}
