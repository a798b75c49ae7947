package bench_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/postbox-go/postbox/cmd/postbox/internal/bench"
)

// A tiny history run, so the benchmark's own checks (every fetch finds
// rows, every mark moves its whole batch) run against the real PostgreSQL.
func TestHistorySmall(t *testing.T) {
	res := runBench(t, bench.History, bench.HistoryOptions{Max: 3000, Pending: 1200, Reps: 5, Keys: 100, FillChunk: 1000, Explain: true})
	if len(res.Steps) != 4 {
		t.Fatalf("%d steps, want 4", len(res.Steps))
	}
	// Each step's marks move the backlog into the history too.
	for i, want := range []int64{0, 300 + 1200, 900 + 2*1200, 3000 + 3*1200} {
		if got := res.Steps[i].Published; got != want {
			t.Errorf("step %d: %d published rows, want %d", i, got, want)
		}
	}
	if !strings.Contains(res.ExplainFirst, "Index Scan") || res.ExplainLast == "" {
		t.Errorf("explain output:\n%s\n%s", res.ExplainFirst, res.ExplainLast)
	}
}

func TestHistoryBadOptions(t *testing.T) {
	_, err := bench.History(context.Background(), bench.HistoryOptions{Max: 5, Pending: -1}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "--max") || !strings.Contains(err.Error(), "--pending") {
		t.Fatalf("err = %v, want one naming --max and --pending", err)
	}
}
