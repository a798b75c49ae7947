package relayd_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/postbox-go/postbox/cmd/postbox/internal/relayd"
)

// startDaemon starts a daemon from a YAML configuration and the POSTBOX_*
// variables vars, quiet, and stops it when the test ends.
func startDaemon(t *testing.T, yaml string, vars map[string]string) *relayd.Daemon {
	t.Helper()
	cfg, err := relayd.Parse([]byte(yaml), env(vars))
	if err != nil {
		t.Fatal(err)
	}
	d, err := relayd.Start(context.Background(), cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Stop(context.Background()) })
	return d
}

// shardsWait returns a wait for a condition, failing t with label, what
// it waited for and d's shards when limit passes first.
func shardsWait(t *testing.T, d *relayd.Daemon, limit time.Duration, label string) func(what string, ok func() bool) {
	return func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(limit)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("%swaited in vain: %s; shards %+v", label, what, d.Shards())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}
