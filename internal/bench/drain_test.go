package bench_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/postbox-go/postbox/internal/bench"
)

// A small drain, so the benchmark's own checks (the stream holds exactly
// the backlog) run in CI against the real PostgreSQL and NATS.
func TestDrainSmall(t *testing.T) {
	var out bytes.Buffer
	res, err := bench.Drain(context.Background(), bench.DrainOptions{Messages: 3000, Keys: 50}, &out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if res.RawRate <= 0 || res.DrainRate <= 0 || res.Ratio <= 0 {
		t.Fatalf("result %+v", res)
	}
	if m := bench.Median([]bench.DrainResult{res, res, res}); m.Ratio != res.Ratio {
		t.Fatalf("median of equal runs = %+v", m)
	}
}
