package bench_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/postbox-go/postbox/cmd/postbox/internal/bench"
)

// A short held-snapshot study: every phase is sampled, the holder shows up
// as the oldest snapshot while it holds, and every written message reaches
// the stream.
func TestSnapshotSmall(t *testing.T) {
	var out bytes.Buffer
	res, err := bench.Snapshot(context.Background(), bench.SnapshotOptions{
		Before: time.Second, Hold: 2 * time.Second, After: time.Second, Rate: 200, Keys: 20,
	}, &out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if len(res.Samples) != 4 || len(res.Phases) != 3 {
		t.Fatalf("%d samples, %d phases\n%s", len(res.Samples), len(res.Phases), out.String())
	}
	if res.Samples[2].Phase != "hold" || res.Samples[2].OldestXactS < 0.5 {
		t.Errorf("sample during the hold: %+v", res.Samples[2])
	}
	if res.Written == 0 || res.Streamed < uint64(res.Written) {
		t.Errorf("written %d, streamed %d", res.Written, res.Streamed)
	}
}

func TestSnapshotBadOptions(t *testing.T) {
	wantRejected(t, bench.Snapshot, bench.SnapshotOptions{Hold: time.Millisecond, Rate: -1}, "--hold", "--rate")
}
