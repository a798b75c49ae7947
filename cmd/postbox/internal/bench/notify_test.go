package bench_test

import (
	"testing"
	"time"

	"github.com/postbox-go/postbox/cmd/postbox/internal/bench"
)

// A short NOTIFY study: every mode runs in every run, and the listener
// receives exactly the notifications sent: one per notifying commit, one
// per round of the coalesced notifier (Notify checks it, and that the
// table holds every committed row).
func TestNotifySmall(t *testing.T) {
	res := runBench(t, bench.Notify, bench.NotifyOptions{
		Writers: 4, Duration: 300 * time.Millisecond, Runs: 2, Warmup: 150 * time.Millisecond,
	})
	if len(res.Runs) != 2 {
		t.Fatalf("%d runs, want 2", len(res.Runs))
	}
	for _, r := range res.Runs {
		for _, m := range bench.NotifyModes {
			if r.Rate[m] <= 0 || r.Ratio[m] <= 0 {
				t.Fatalf("run %+v: mode %s", r, m)
			}
		}
		if r.Ratio[bench.NotifyNone] != 1 {
			t.Fatalf("run %+v: the baseline's ratio is not 1", r)
		}
	}
	if res.Notifications == 0 || res.Rows <= res.Notifications {
		t.Fatalf("notifications %d, rows %d", res.Notifications, res.Rows)
	}
}

func TestNotifyRejectsBadOptions(t *testing.T) {
	for _, tc := range []struct {
		opts bench.NotifyOptions
		flag string
	}{
		{bench.NotifyOptions{Writers: -1}, "--writers"},
		{bench.NotifyOptions{Writers: 1000}, "--writers"},
		{bench.NotifyOptions{Duration: time.Millisecond}, "--duration"},
		{bench.NotifyOptions{Runs: -2}, "--runs"},
	} {
		wantRejected(t, bench.Notify, tc.opts, tc.flag)
	}
}
