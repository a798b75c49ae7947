package compare_test

import (
	"bytes"
	"context"
	"net"
	"testing"
	"time"

	"github.com/postbox-go/postbox/bench/compare"
)

// TestRunSmall runs a small version of the comparison to keep it working;
// it measures nothing. It needs the loopback PostgreSQL and NATS servers
// and skips without them.
func TestRunSmall(t *testing.T) {
	for _, addr := range []string{"127.0.0.1:5432", "127.0.0.1:4222"} {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			t.Skipf("no server at %s: %v", addr, err)
		}
		_ = c.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	res, err := compare.Run(ctx, compare.Options{Messages: 2000, Keys: 10, SyncSample: 200}, &out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if res.RawRate <= 0 || res.RawSyncRate <= 0 || res.PostboxRate <= 0 || res.WatermillRate <= 0 {
		t.Fatalf("a rate is missing: %+v\n%s", res, out.String())
	}
	if res.WatermillCapped || res.WatermillReached != 2000 {
		t.Fatalf("the forwarder reached %d of 2000 (capped %v)\n%s", res.WatermillReached, res.WatermillCapped, out.String())
	}
	med, ratios := compare.Median([]compare.Result{res})
	if med.PostboxRate != res.PostboxRate || ratios.Speedup != res.Speedup() {
		t.Fatalf("the median of one run is not that run: %+v %+v", med, ratios)
	}
}
