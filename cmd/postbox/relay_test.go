package main

import (
	"runtime/debug"
	"testing"
)

// The daemon runs its collector at daemonGCPercent, unless GOGC is set in
// its environment, which then stands.
func TestSetDaemonGC(t *testing.T) {
	was := debug.SetGCPercent(100)
	defer debug.SetGCPercent(was)

	if setDaemonGC(func(string) (string, bool) { return "50", true }) {
		t.Fatal("set the collector although GOGC is set")
	}
	if got := debug.SetGCPercent(100); got != 100 {
		t.Fatalf("GOGC set in the environment: the collector runs at %d, want it left at 100", got)
	}
	if !setDaemonGC(func(string) (string, bool) { return "", false }) {
		t.Fatal("left the collector alone although GOGC is not set")
	}
	if got := debug.SetGCPercent(100); got != daemonGCPercent {
		t.Fatalf("GOGC not set: the collector runs at %d, want %d", got, daemonGCPercent)
	}
}
