package bench

import (
	"strings"
	"testing"
)

// A run's relay warnings: WARN and above counted, the first maxListed
// kept whole, the rest of the relay's log dropped.
func TestWarningsKeepTheFirst(t *testing.T) {
	var w warnings
	log := w.logger().With("relay", "r1")
	log.Info("postbox relay started")
	for i := range maxListed + 5 {
		log.Warn("postbox relay paused", "lane", i)
	}
	log.Error("postbox relay stopped with an error")
	n, lines := w.result()
	if n != maxListed+6 || len(lines) != maxListed {
		t.Fatalf("%d warnings, %d lines kept; want %d and %d", n, len(lines), maxListed+6, maxListed)
	}
	if !strings.Contains(lines[0], `msg="postbox relay paused" relay=r1 lane=0`) || strings.Contains(lines[0], "\n") {
		t.Fatalf("first line %q", lines[0])
	}
}
