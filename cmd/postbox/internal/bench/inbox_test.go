package bench_test

import (
	"bytes"
	"context"
	"reflect"
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
		if res.RawRate <= 0 || res.PlainRate <= 0 || res.SingleRate <= 0 || res.BatchRate <= 0 || res.BatchCommits <= 0 {
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
