package postboxidem_test

import (
	"database/sql"
	"maps"
	"net/http"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/postbox-go/postbox/postboxidem"
)

// outcomes counts what the middleware reports to Config.Metrics.
type outcomes struct {
	mu sync.Mutex
	n  map[string]int
}

func (o *outcomes) IdempotencyOutcome(outcome string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.n[outcome]++
}

func TestMetricsOutcomes(t *testing.T) {
	each(t, testMetricsOutcomes[pgx.Tx], testMetricsOutcomes[*sql.Tx])
}

// Each request is counted once, under the outcome its answer says.
func testMetricsOutcomes[TTx any](t *testing.T, e *env[TTx]) {
	a := newApp(e)
	o := &outcomes{n: map[string]int{}}
	cfg := testConfig()
	cfg.Metrics = o
	root := http.NewServeMux()
	root.Handle("/", e.middleware(t, cfg).Handler(a.routes()))
	srv := serve(t, a, root)
	for _, r := range []struct {
		path, body string
		keys       []string
		status     int
	}{
		{"/orders", `{"a":1}`, []string{"m1"}, 201},       // completed
		{"/orders", `{"a":1}`, []string{"m1"}, 201},       // replayed
		{"/orders", `{"a":2}`, []string{"m1"}, 422},       // mismatch
		{"/fail", `{}`, []string{"m2"}, 500},              // released
		{"/orders", `{"a":3}`, nil, 201},                  // no_key
		{"/orders", `{"a":4}`, []string{"m3", "m4"}, 400}, // invalid: two keys
	} {
		if got := send(srv.URL, "POST", r.path, r.body, r.keys...); got.status != r.status {
			t.Fatalf("POST %s %v: %s, want %d", r.path, r.keys, got, r.status)
		}
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	want := map[string]int{postboxidem.OutcomeCompleted: 1, postboxidem.OutcomeReplayed: 1, postboxidem.OutcomeMismatch: 1,
		postboxidem.OutcomeReleased: 1, postboxidem.OutcomeNoKey: 1, postboxidem.OutcomeInvalid: 1}
	if !maps.Equal(o.n, want) {
		t.Fatalf("outcomes %v, want %v ", o.n, want)
	}
}
