package relayd

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/postbox-go/postbox"
)

type nopMetrics struct{ batches int }

func (n *nopMetrics) RelayBatch(*postbox.BatchReport)                     { n.batches++ }
func (n *nopMetrics) InboxHandled(string, postbox.Verdict, time.Duration) {}

// A pause is logged once when it starts, and a line says when publishing
// resumes, with the pause's cause; every report reaches the metrics.
func TestPauseLogLogsResume(t *testing.T) {
	var buf bytes.Buffer
	m := &nopMetrics{}
	p := &pauseLog{Metrics: m, log: slog.New(slog.NewTextHandler(&buf, nil))}
	down := errors.New("nats: no responders")
	for _, r := range []*postbox.BatchReport{
		{Relay: "a", Published: map[string]int{"t": 1}},
		{Relay: "a", Infrastructure: down},
		{Relay: "a", Infrastructure: down},
		{Relay: "b", Published: map[string]int{"t": 1}},
		{Relay: "a"}, // an empty read is no resumption
		{Relay: "a", Published: map[string]int{"t": 3, "u": 2}},
		{Relay: "a", Published: map[string]int{"t": 1}},
	} {
		p.RelayBatch(r)
	}
	out := buf.String()
	if m.batches != 7 || strings.Count(out, "publishing paused") != 1 || strings.Count(out, "publishing resumed") != 1 ||
		!strings.Contains(out, "published=5") || !strings.Contains(out, `cause="nats: no responders"`) || !strings.Contains(out, "paused_for=") {
		t.Fatalf("%d batches, log:\n%s", m.batches, out)
	}
}
