package bench_test

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"testing"
	"time"

	"github.com/postbox-go/postbox/cmd/postbox/internal/bench"
	"github.com/postbox-go/postbox/cmd/postbox/internal/relayd"
)

// TestRelayDaemonHelper is the relay daemon when the test binary runs
// itself as one (the smoke test below): the same relayd code `postbox
// relay` runs, configured from the environment.
func TestRelayDaemonHelper(t *testing.T) {
	if os.Getenv("POSTBOX_BENCH_RELAY_HELPER") != "1" {
		t.Skip("runs as the relay of TestRSSSmall")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	cfg, err := relayd.Load("", os.Getenv)
	if err != nil {
		t.Fatal(err)
	}
	d, err := relayd.Start(ctx, cfg, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		t.Fatal(err)
	}
	<-ctx.Done()
	if err := d.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// A tiny RSS run: the daemon drains the backlog exactly (the stream holds
// it all), stops on SIGTERM, and every phase was sampled.
func TestRSSSmall(t *testing.T) {
	t.Setenv("POSTBOX_BENCH_RELAY_HELPER", "1")
	res := runBench(t, bench.RSS, bench.RSSOptions{
		Command:  []string{os.Args[0], "-test.run=^TestRelayDaemonHelper$"},
		Messages: 2000, Keys: 20, Warmup: 500 * time.Millisecond, Idle: time.Second, Sample: 50 * time.Millisecond,
	})
	phases := map[string]int{}
	for _, s := range res.Samples {
		phases[s.Phase]++
	}
	if phases["warmup"] == 0 || phases["drain"] == 0 || phases["idle"] == 0 {
		t.Errorf("samples by phase %v", phases)
	}
	if res.Peak < res.HWM || res.Peak < res.DrainMaxRSS || res.Peak < res.SteadyRSS || res.SteadyRSS <= 0 {
		t.Errorf("result %+v", res)
	}
}

func TestRSSBadOptions(t *testing.T) {
	wantRejected(t, bench.RSS, bench.RSSOptions{Command: []string{"x"}, Messages: -1, Idle: time.Millisecond}, "--messages", "--idle")
}
